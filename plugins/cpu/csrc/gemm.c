/* Q4, Q8 and I8 GEMMs over tile-interleaved weights (layouts in tp.h) and int8 activations.
 *
 * One 64-byte load holds 16 output rows x 4 (Q8, I8) or 8 (Q4, two nibbles) k; the activation's
 * 4 int8 values for those k are broadcast, and one u8 x s8 dot-accumulate (gemm_isa.h: AVX-512
 * VNNI vpdpbusd; AVX2 vpmaddubsw + vpmaddwd) adds 4 products per row. A group of activation
 * rows shares each weight load and unpack: up to 8 rows with the block's weights held in
 * registers for M <= 16 on AVX-512 (tile_wide), else groups of up to 4 (tile_pairs). Integer
 * sums are exact; each block's result is scaled in fp32. A library of the int16 form (TP_ACT_I16,
 * AVX2: tp.h) runs levels = 2 through tile_i16 instead, one vpmaddwd pass, groups of up to 6 rows.
 *
 * Batch invariance: a row's arithmetic is the same whatever its group's size, the group it
 * lands in, M, or the thread count (per block: the integer dots, then t = s1 * a1 [+ s2 * a2],
 * acc = t * d + acc, [acc = m * asum + acc] for Q4, over blocks in order; one fp32 accumulator
 * per output), so a row's logits are bit-identical in any batch (tests/plugins/test_cpu_kernels.py).
 *
 * I8 (GGUF's kernel form) runs the Q8 code path (the same codes, DOT8 and offset term) with fp32
 * scales: G = 32 as Q8 with s for d, then o * asum as Q4's minimum term unless the weight is
 * symmetric (offset NULL); G = 16 as two sub-blocks per 32-block, each half's 4 weight vectors
 * dotted, offset-corrected (qhalf sums) and scaled (acc = t_h * s_h + acc, half 0 then half 1).
 * Kinds are compile-time constants of each instantiation (KIND_*), so Q4 / Q8 code is unchanged.
 */
#include <omp.h>
#include <string.h>

#include "gemm_isa.h"
#include "tp.h"

const char *tp_isa(void) { return ISA_NAME; }

#if defined(TP_ACT_I16)
const char *tp_act_form(void) { return "int16"; }
#else
const char *tp_act_form(void) { return "int8x2"; }
#endif

#ifndef PF_BYTES
#define PF_BYTES 2048 /* measured on a Zen 4: 1-3 KB ahead alike, 20-25 % off 5- and 8-row GEMMs */
#endif

/* compile-time weight kinds of the tile functions: the tp.h kinds, I8 split by group and offset */
enum { KIND_Q4, KIND_Q8, KIND_I8, KIND_I8_SYM, KIND_I8_G16, NKINDS };
#define IS_I8(kd) ((kd) >= KIND_I8)
#define SUBS(kd) ((kd) == KIND_I8_G16 ? 2 : 1)         /* scale groups per 32-block */
#define HAS_M(kd) ((kd) == KIND_Q4 || (kd) == KIND_I8) /* a minimum / offset term o * asum */

/* the rows of one group: row r's q1 / q2 codes at q1[r * K], its block scalars at s1[r * nb] */
typedef struct {
  const int8_t *q1, *q2;
  const float *s1, *s2, *asum;
  const int32_t *qsum1, *qsum2;
  const int32_t *qh1, *qh2; /* per-16 sums (I8 of group 16 only; else NULL): row r's at qh1[2 * r * nb] */
  const int16_t *q16;       /* the int16 form's codes (tp.h): row r's at q16[r * K] */
  int K, nb;
  int prefetch; /* the group's pass over the tile prefetches the weight stream (the first group) */
} rows_t;

static inline rows_t group_rows(const tp_qact *a, int m0, int halves) {
  const int K = a->K, nb = K / TP_GROUP;
  const size_t o = (size_t)m0 * nb;
  return (rows_t){a->q1 + (size_t)m0 * K, a->q2 + (size_t)m0 * K, a->s1 + o, a->s2 + o, a->asum + o,
                  a->qsum1 + o, a->qsum2 + o, halves ? a->qhalf1 + 2 * o : NULL,
                  halves && a->levels == 2 ? a->qhalf2 + 2 * o : NULL, a->q16 ? a->q16 + (size_t)m0 * K : NULL, K,
                  nb, m0 == 0};
}

static inline void store_rows(float *y, int ldy, int h, const vf *acc, int mr, int accumulate) {
  for (int r = 0; r < mr; r++) {
    float *yp = y + (size_t)r * ldy + h * LANES;
    FSTOREU(yp, accumulate ? FADD(FLOADU(yp), acc[r]) : acc[r]);
  }
}

/* Software prefetch of the weight stream PF_BYTES ahead of block b (past a tile's end: the next
 * tile's, contiguous); the hardware prefetcher alone leaves the small-M kernels stalled on memory.
 * Only a tile's first row group prefetches: later groups find its weights in L1, and lines of the
 * next tile fetched again per group only evict the activations (measured: K = 1536 at M = 512).
 * I8's fp32 scales (and offsets) are fetched as many blocks ahead as its codes. */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *wc, const void *d, const void *mn,
                                                                 int b, const int kd) {
  const size_t blk = kd == KIND_Q4 ? 256 : 512;
  for (size_t c = 0; c < blk; c += 64) _mm_prefetch((const char *)(wc + b * blk + PF_BYTES + c), _MM_HINT_T0);
  if (!IS_I8(kd)) {
    _mm_prefetch((const char *)((const uint16_t *)d + b * 16) + PF_BYTES / 8, _MM_HINT_T0);
    if (kd == KIND_Q4) _mm_prefetch((const char *)((const uint16_t *)mn + b * 16) + PF_BYTES / 8, _MM_HINT_T0);
    return;
  }
  const size_t sb = 64 * SUBS(kd), ahead = PF_BYTES / blk * sb; /* scale bytes per block */
  for (size_t c = 0; c < sb; c += 64) _mm_prefetch((const char *)d + b * sb + ahead + c, _MM_HINT_T0);
  if (HAS_M(kd)) _mm_prefetch((const char *)mn + b * 64 + ahead, _MM_HINT_T0);
}

/* the scales (or minimums / offsets) of scale group g: 16 rows (AVX2: half h's 8) as fp32 */
static inline __attribute__((always_inline)) vf scale_vec(const void *p, int g, int h, const int kd) {
  return IS_I8(kd) ? FLOADU((const float *)p + g * 16 + h * LANES) : LOADH((const uint16_t *)p + g * 16 + h * LANES);
}

/* the fp32 steps of one row's block (sub-block s of G = 16) from its integer dots a1, a2 (tp.h;
 * the same for every row); o: the row's block index r * nb + b */
static inline __attribute__((always_inline)) vf scale_block(vi a1, vi a2, const rows_t *x, int o, int s, const int lv,
                                                            const int kd, vf dv, vf mv, vf acc) {
  if (kd != KIND_Q4 && Q8_OFFSET) {
    a1 = ISUB(a1, SET1(128 * (kd == KIND_I8_G16 ? x->qh1[2 * o + s] : x->qsum1[o])));
    if (lv == 2) a2 = ISUB(a2, SET1(128 * (kd == KIND_I8_G16 ? x->qh2[2 * o + s] : x->qsum2[o])));
  }
  vf t = FMUL(CVT(a1), FSET1(x->s1[o]));
  if (lv == 2) t = FMA(CVT(a2), FSET1(x->s2[o]), t);
  acc = FMA(t, dv, acc);
  if (HAS_M(kd)) acc = FMA(mv, FSET1(x->asum[o]), acc);
  return acc;
}

/* weight vector j (of 8) of block b: 16 (AVX2: 8, half h) output rows x 4 k as u8 */
static inline __attribute__((always_inline)) vi weights(const uint8_t *wc, int b, int j, int h, const int kd) {
  if (kd != KIND_Q4) return VLOADU(wc + (size_t)b * 512 + j * 64 + h * 32);
  const vi v = VLOADU(wc + (size_t)b * 256 + (j / 2) * 64 + h * 32), mask = SET1B(0x0F);
  return (j & 1) ? AND(SRLI16(v, 4), mask) : AND(v, mask); /* the compiler shares the load of a pair */
}

#define WDOT(kd, acc, w, x) ((kd) == KIND_Q4 ? DOT(acc, w, x) : DOT8(acc, w, x))

#if defined(TP_ISA_AVX512)
#define RB 4
/* Small M (AVX-512): one tile (16 output rows) x the group's mr <= 8 rows (mr, lv, kd constants
 * per instantiation). Per block the 8 weight vectors are loaded (Q4: unpacked) once into
 * registers, then the group's rows run against them, RB rows interleaved (2 RB independent
 * chains of 8 dots hide the dot latency; G = 16: 4 per half). */
static inline __attribute__((always_inline)) void tile_wide(const uint8_t *wc, const void *d, const void *mn,
                                                            const rows_t *x, const int mr, const int lv, const int kd,
                                                            float *y, int ldy, int accumulate) {
  const int K4 = x->K / 4, nb = x->nb, JS = 8 / SUBS(kd); /* K4: a row's stride in 4-byte groups */
  vf acc[WIDE];
  for (int r = 0; r < mr; r++) acc[r] = VFZERO();
  for (int b = 0; b < nb; b++) {
    if (x->prefetch) prefetch_block(wc, d, mn, b, kd);
    vi w[8];
    for (int j = 0; j < 8; j++) w[j] = weights(wc, b, j, 0, kd);
    const int32_t *x1 = (const int32_t *)(x->q1 + b * TP_GROUP), *x2 = (const int32_t *)(x->q2 + b * TP_GROUP);
    for (int s = 0; s < SUBS(kd); s++) {
      const vf dv = scale_vec(d, b * SUBS(kd) + s, 0, kd), mv = HAS_M(kd) ? scale_vec(mn, b, 0, kd) : dv;
      for (int r0 = 0; r0 < mr; r0 += RB) {
        vi a1[RB], a2[RB];
        for (int i = 0; i < RB; i++) a1[i] = a2[i] = VZERO();
        for (int j = s * JS; j < (s + 1) * JS; j++)
          for (int i = 0; i < RB && r0 + i < mr; i++) {
            const int r = r0 + i;
            a1[i] = WDOT(kd, a1[i], w[j], SET1(x1[r * K4 + j]));
            if (lv == 2) a2[i] = WDOT(kd, a2[i], w[j], SET1(x2[r * K4 + j]));
          }
        for (int i = 0; i < RB && r0 + i < mr; i++)
          acc[r0 + i] = scale_block(a1[i], a2[i], x, (r0 + i) * nb + b, s, lv, kd, dv, mv, acc[r0 + i]);
      }
    }
  }
  store_rows(y, ldy, 0, acc, mr, accumulate);
}
#endif

/* Large M (and every M on AVX2, 16 ymm): each NV-th of a tile x the group's mr <= 4 rows, the
 * weights loaded two vectors at a time and used by every row before the next two; a tile's
 * weights stay in L1 while the row groups pass. G = 16: a half's 4 vectors, then its scaling. */
static inline __attribute__((always_inline)) void tile_pairs(const uint8_t *wc, const void *d, const void *mn,
                                                             const rows_t *x, const int mr, const int lv,
                                                             const int kd, float *y, int ldy, int accumulate) {
  const int K4 = x->K / 4, nb = x->nb, JS = 8 / SUBS(kd);
  for (int h = 0; h < NV; h++) {
    vf acc[PAIRS];
    for (int r = 0; r < mr; r++) acc[r] = VFZERO();
    for (int b = 0; b < nb; b++) {
      if (h == 0 && x->prefetch) prefetch_block(wc, d, mn, b, kd);
      const int32_t *x1 = (const int32_t *)(x->q1 + b * TP_GROUP), *x2 = (const int32_t *)(x->q2 + b * TP_GROUP);
      for (int s = 0; s < SUBS(kd); s++) {
        vi a1[PAIRS], a2[PAIRS];
        for (int r = 0; r < mr; r++) a1[r] = a2[r] = VZERO();
        for (int j = s * JS; j < (s + 1) * JS; j += 2) {
          const vi w0 = weights(wc, b, j, h, kd), w1 = weights(wc, b, j + 1, h, kd);
          for (int r = 0; r < mr; r++) {
            a1[r] = WDOT(kd, WDOT(kd, a1[r], w0, SET1(x1[r * K4 + j])), w1, SET1(x1[r * K4 + j + 1]));
            if (lv == 2) a2[r] = WDOT(kd, WDOT(kd, a2[r], w0, SET1(x2[r * K4 + j])), w1, SET1(x2[r * K4 + j + 1]));
          }
        }
        const vf dv = scale_vec(d, b * SUBS(kd) + s, h, kd), mv = HAS_M(kd) ? scale_vec(mn, b, h, kd) : dv;
        for (int r = 0; r < mr; r++) acc[r] = scale_block(a1[r], a2[r], x, r * nb + b, s, lv, kd, dv, mv, acc[r]);
      }
    }
    store_rows(y, ldy, h, acc, mr, accumulate);
  }
}

#if defined(TP_ACT_I16)
/* int16 activations (tp.h's int16 form, AVX2): each NV-th of a tile x the group's mr <= I16_ROWS (6)
 * rows in one pass of vpmaddwd. A weight vector's 32-bit lane is one output row's 4 bytes, so its
 * even and odd bytes (Q4: nibbles 0, 2 / 1, 3 / 4, 6 / 5, 7) as int16 pairs meet the row's
 * activation pairs (x0, x2), (x1, x3) (q16's 4-group order) and each lane sums its own row: no
 * horizontal step. A row's block: sum of 32 products |15 or 128| x 32767 (exact in int32), then
 * scale_block's fp32 steps (one level), the same for every row in any group. */
static inline __attribute__((always_inline)) void tile_i16(const uint8_t *wc, const void *d, const void *mn,
                                                           const rows_t *x, const int mr, const int lv,
                                                           const int kd, float *y, int ldy, int accumulate) {
  (void)lv;
  const int K = x->K, nb = x->nb, JS = 8 / SUBS(kd);
  const vi lo4 = _mm256_set1_epi16(0x0F), flip = SET1B((char)0x80);
  for (int h = 0; h < NV; h++) {
    vf acc[I16_ROWS];
    for (int r = 0; r < mr; r++) acc[r] = VFZERO();
    for (int b = 0; b < nb; b++) {
      if (h == 0 && x->prefetch) prefetch_block(wc, d, mn, b, kd);
      const int32_t *xq = (const int32_t *)(x->q16 + b * TP_GROUP); /* row r's pair p at xq[r * K / 2 + p] */
      for (int s = 0; s < SUBS(kd); s++) {
        vi a[I16_ROWS];
        for (int r = 0; r < mr; r++) a[r] = VZERO();
        for (int j = s * JS; j < (s + 1) * JS; j += (kd == KIND_Q4 ? 2 : 1)) {
          vi w[4]; /* int16 pairs of k (4j, 4j+2), (4j+1, 4j+3) [, (4j+4, 4j+6), (4j+5, 4j+7): Q4] */
          if (kd == KIND_Q4) {
            const vi v = VLOADU(wc + (size_t)b * 256 + (j / 2) * 64 + h * 32);
            w[0] = AND(v, lo4), w[1] = AND(_mm256_srli_epi16(v, 8), lo4);
            w[2] = AND(_mm256_srli_epi16(v, 4), lo4), w[3] = _mm256_srli_epi16(v, 12);
          } else { /* u = c + 128: c's bytes sign-extended */
            const vi v = _mm256_xor_si256(VLOADU(wc + (size_t)b * 512 + j * 64 + h * 32), flip);
            w[0] = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8), w[1] = _mm256_srai_epi16(v, 8);
          }
          for (int r = 0; r < mr; r++)
            for (int p = 0; p < (kd == KIND_Q4 ? 4 : 2); p++)
              a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(w[p], SET1(xq[r * K / 2 + 2 * j + p])));
        }
        const vf dv = scale_vec(d, b * SUBS(kd) + s, h, kd), mv = HAS_M(kd) ? scale_vec(mn, b, h, kd) : dv;
        for (int r = 0; r < mr; r++) acc[r] = scale_block(a[r], a[r], x, r * nb + b, s, 1, kd, dv, mv, acc[r]);
      }
    }
    store_rows(y, ldy, h, acc, mr, accumulate);
  }
}
#endif

/* tile t's codes, scales and minimums / offsets (tp.h layouts) */
static inline __attribute__((always_inline)) const uint8_t *tile_codes(const tp_weight *w, int t, size_t nb,
                                                                      const int kd) {
  return w->codes + t * nb * (kd == KIND_Q4 ? 256 : 512);
}
static inline __attribute__((always_inline)) const void *tile_scales(const tp_weight *w, int t, size_t nb,
                                                                    const int kd) {
  return IS_I8(kd) ? (const void *)(w->scale + t * nb * SUBS(kd) * 16) : (const void *)(w->d + t * nb * 16);
}
static inline __attribute__((always_inline)) const void *tile_mins(const tp_weight *w, int t, size_t nb, const int kd) {
  return kd == KIND_Q4 ? (const void *)(w->m + t * nb * 16) : kd == KIND_I8 ? (const void *)(w->offset + t * nb * 16)
                                                                            : NULL;
}

/* one function per (structure, kind, levels, rows): tile t of w against the group's rows */
typedef void (*tile_fn)(const tp_weight *w, int t, const rows_t *x, float *y, int ldy, int accumulate);

#define FN1(S, R, LV, KN, KD)                                                                                   \
  static void S##_##KN##_l##LV##_r##R(const tp_weight *w, int t, const rows_t *x, float *y, int ldy, int acc) { \
    const size_t nb = (size_t)x->nb;                                                                          \
    tile_##S(tile_codes(w, t, nb, KD), tile_scales(w, t, nb, KD), tile_mins(w, t, nb, KD), x, R, LV, KD,      \
             y + t * TP_TILE, ldy, acc);                                                                      \
  }
#define FN(S, R, LV)                                                                  \
  FN1(S, R, LV, q4, KIND_Q4) FN1(S, R, LV, q8, KIND_Q8) FN1(S, R, LV, i8, KIND_I8) \
  FN1(S, R, LV, i8s, KIND_I8_SYM) FN1(S, R, LV, i8h, KIND_I8_G16)
#define FNS(S, R) FN(S, R, 1) FN(S, R, 2)
#define ROW4(S, K, LV) NULL, S##_##K##_l##LV##_r1, S##_##K##_l##LV##_r2, S##_##K##_l##LV##_r3, S##_##K##_l##LV##_r4
#define ROW8(S, K, LV) ROW4(S, K, LV), S##_##K##_l##LV##_r5, S##_##K##_l##LV##_r6, S##_##K##_l##LV##_r7, S##_##K##_l##LV##_r8
#define KIND_ROWS(S, ROW, K) {{ROW(S, K, 1)}, {ROW(S, K, 2)}}
#define TABLE(S, ROW) \
  {KIND_ROWS(S, ROW, q4), KIND_ROWS(S, ROW, q8), KIND_ROWS(S, ROW, i8), KIND_ROWS(S, ROW, i8s), KIND_ROWS(S, ROW, i8h)}

/* [kind: KIND_*][levels - 1][rows] */
FNS(pairs, 1) FNS(pairs, 2) FNS(pairs, 3) FNS(pairs, 4)
static const tile_fn PAIRS_FNS[NKINDS][2][PAIRS + 1] = TABLE(pairs, ROW4);
#if defined(TP_ISA_AVX512)
FNS(wide, 1) FNS(wide, 2) FNS(wide, 3) FNS(wide, 4) FNS(wide, 5) FNS(wide, 6) FNS(wide, 7) FNS(wide, 8)
static const tile_fn WIDE_FNS[NKINDS][2][WIDE + 1] = TABLE(wide, ROW8);
#endif
#if defined(TP_ACT_I16)
#define I16_KIND(K) {ROW4(i16, K, 2), i16_##K##_l2_r5, i16_##K##_l2_r6}
FN(i16, 1, 2) FN(i16, 2, 2) FN(i16, 3, 2) FN(i16, 4, 2) FN(i16, 5, 2) FN(i16, 6, 2)
static const tile_fn I16_FNS[NKINDS][I16_ROWS + 1] = {I16_KIND(q4), I16_KIND(q8), I16_KIND(i8), I16_KIND(i8s),
                                                       I16_KIND(i8h)};
#endif

/* M rows in mg groups of as equal size as can be (9 rows: 4 + 5, not 8 + 1: a lone row runs
 * latency-bound); group g holds rows [group_start(g), group_start(g + 1)). */
static inline int group_start(int g, int M, int mg) { return (int)(((long)g * M) / mg); }

static int kind_of(const tp_weight *w) {
  if (w->kind == TP_W_Q4) return KIND_Q4;
  if (w->kind == TP_W_Q8) return KIND_Q8;
  return w->group == 16 ? KIND_I8_G16 : w->offset ? KIND_I8 : KIND_I8_SYM;
}

/* An I8 weight of group 16 reads a->qhalf1 / qhalf2 (tp_quant_act_halves) where Q8_OFFSET is set
 * (AVX-512); its offset must be NULL (tp.h). */
void tp_gemm(const tp_weight *w, const tp_qact *a, float *y, int ldy, int accumulate) {
  const int nt = w->N / TP_TILE, M = a->M, kind = kind_of(w), lv = a->levels == 2 ? 1 : 0;
  const int halves = kind == KIND_I8_G16 && Q8_OFFSET;
  const tile_fn *fns = PAIRS_FNS[kind][lv];
  int rows = PAIRS;
#if defined(TP_ACT_I16)
  if (a->levels == 2) { /* the int16 form at every M: a row's arithmetic does not depend on M */
    fns = I16_FNS[kind];
    rows = I16_ROWS;
  }
#endif
#if defined(TP_ISA_AVX512)
  if (M <= WIDE_MAX_M) { /* measured (bench/native_gemm.py): wide groups win to 16 rows, lose at 128 */
    fns = WIDE_FNS[kind][lv];
    rows = WIDE;
  }
#endif
  const int mg = (M + rows - 1) / rows;
  /* tiles outer (a tile's weights stay in L1 while every activation row group passes) */
#pragma omp parallel for schedule(static) collapse(2) if (nt * mg > 1)
  for (int t = 0; t < nt; t++)
    for (int g = 0; g < mg; g++) {
      const int m0 = group_start(g, M, mg), m1 = group_start(g + 1, M, mg);
      const rows_t x = group_rows(a, m0, halves);
      fns[m1 - m0](w, t, &x, y + (size_t)m0 * ldy, ldy, accumulate);
    }
}

static int g_threads = 0;
void tp_set_threads(int n) {
  g_threads = n;
  if (n > 0) omp_set_num_threads(n);
}
int tp_get_threads(void) { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

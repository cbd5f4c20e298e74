/* Q4 and Q8 GEMMs over tile-interleaved weights (layouts in tp.h) and int8 activations.
 *
 * One 64-byte load holds 16 output rows x 4 (Q8) or 8 (Q4, two nibbles) k; the activation's
 * 4 int8 values for those k are broadcast, and one u8 x s8 dot-accumulate (AVX-512 VNNI
 * vpdpbusd; AVX2: vpmaddubsw + vpmaddwd) adds 4 products per row. MR activation rows share each
 * weight load. Integer sums are exact; each block's result is scaled in fp32.
 */
#include <immintrin.h>
#include <omp.h>
#include <string.h>

#include "tp.h"

#define MR 4

#if defined(TP_ISA_AVX512)
typedef __m512i vi;
typedef __m512 vf;
#define NV 1 /* vectors per tile row set */
#define VLOADU(p) _mm512_loadu_si512((const void *)(p))
#define VZERO() _mm512_setzero_si512()
#define VFZERO() _mm512_setzero_ps()
#define DOT(acc, w, x) _mm512_dpbusd_epi32((acc), (w), (x))
#define SET1(v) _mm512_set1_epi32(v)
#define AND(a, b) _mm512_and_si512(a, b)
#define SRLI16(a, n) _mm512_srli_epi16(a, n)
#define SET1B(v) _mm512_set1_epi8(v)
#define CVT(a) _mm512_cvtepi32_ps(a)
#define FSET1(v) _mm512_set1_ps(v)
#define FMUL(a, b) _mm512_mul_ps(a, b)
#define FADD(a, b) _mm512_add_ps(a, b)
#define ISUB(a, b) _mm512_sub_epi32(a, b)
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define LOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define FLOADU(p) _mm512_loadu_ps(p)
#define FSTOREU(p, v) _mm512_storeu_ps(p, v)
#define LANES 16
const char *tp_isa(void) { return "avx512_vnni"; }
#else
typedef __m256i vi;
typedef __m256 vf;
#define NV 2
#define VLOADU(p) _mm256_loadu_si256((const __m256i *)(p))
#define VZERO() _mm256_setzero_si256()
#define VFZERO() _mm256_setzero_ps()
static inline __m256i dot_avx2(__m256i acc, __m256i w, __m256i x) {
  __m256i p = _mm256_maddubs_epi16(w, x); /* Q4: |2 * 15 * 127| fits int16 (no saturation) */
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
#define DOT(acc, w, x) dot_avx2((acc), (w), (x))
#define SET1(v) _mm256_set1_epi32(v)
#define AND(a, b) _mm256_and_si256(a, b)
#define SRLI16(a, n) _mm256_srli_epi16(a, n)
#define SET1B(v) _mm256_set1_epi8(v)
#define CVT(a) _mm256_cvtepi32_ps(a)
#define FSET1(v) _mm256_set1_ps(v)
#define FMUL(a, b) _mm256_mul_ps(a, b)
#define FADD(a, b) _mm256_add_ps(a, b)
#define ISUB(a, b) _mm256_sub_epi32(a, b)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define FLOADU(p) _mm256_loadu_ps(p)
#define FSTOREU(p, v) _mm256_storeu_ps(p, v)
#define LANES 8
const char *tp_isa(void) { return "avx2"; }
#endif

/* Q4 tile: rows [16] x activation rows m0..m0+mr-1 (mr <= MR, a compile-time constant per call) */
static inline __attribute__((always_inline)) void q4_tile(const uint8_t *wc, const uint16_t *d, const uint16_t *mn,
                                                          const tp_qact *a, int m0, const int mr, const int lv,
                                                          float *y, int ldy, int accumulate) {
  const int K = a->K, nb = K / TP_GROUP;
  const vi mask = SET1B(0x0F);
  for (int h = 0; h < NV; h++) { /* AVX2: rows 0-7, then 8-15 */
    vf acc[MR];
    for (int r = 0; r < mr; r++) acc[r] = VFZERO();
    for (int b = 0; b < nb; b++) {
      vi a1[MR], a2[MR];
      for (int r = 0; r < mr; r++) a1[r] = a2[r] = VZERO();
      const uint8_t *wb = wc + (size_t)b * 4 * 64 + h * 32;
      for (int g = 0; g < 4; g++) {
        vi v = VLOADU(wb + g * 64);
        vi lo = AND(v, mask), hi = AND(SRLI16(v, 4), mask);
        for (int r = 0; r < mr; r++) {
          const int32_t *x1 = (const int32_t *)(a->q1 + (size_t)(m0 + r) * K + b * TP_GROUP);
          a1[r] = DOT(a1[r], lo, SET1(x1[2 * g]));
          a1[r] = DOT(a1[r], hi, SET1(x1[2 * g + 1]));
          if (lv == 2) {
            const int32_t *x2 = (const int32_t *)(a->q2 + (size_t)(m0 + r) * K + b * TP_GROUP);
            a2[r] = DOT(a2[r], lo, SET1(x2[2 * g]));
            a2[r] = DOT(a2[r], hi, SET1(x2[2 * g + 1]));
          }
        }
      }
      vf dv = LOADH(d + b * 16 + h * 8), mv = LOADH(mn + b * 16 + h * 8);
      for (int r = 0; r < mr; r++) {
        const size_t o = (size_t)(m0 + r) * nb + b;
        vf t = FMUL(CVT(a1[r]), FSET1(a->s1[o]));
        if (lv == 2) t = FMA(CVT(a2[r]), FSET1(a->s2[o]), t);
        acc[r] = FMA(t, dv, acc[r]);
        acc[r] = FMA(mv, FSET1(a->asum[o]), acc[r]);
      }
    }
    for (int r = 0; r < mr; r++) {
      float *yp = y + (size_t)(m0 + r) * ldy + h * LANES;
      FSTOREU(yp, accumulate ? FADD(FLOADU(yp), acc[r]) : acc[r]);
    }
  }
}

/* Q8: the dot of codes u = q + 128 with x. AVX-512: vpdpbusd(u, x) - 128 * sum(x) (exact).
 * AVX2: vpmaddubsw(|q|, sign(x, q)) (|2 * 128 * 127| fits int16), no offset term. */
#if defined(TP_ISA_AVX512)
#define DOT8(acc, u, x) DOT(acc, u, x)
#define Q8_OFFSET 1
#else
static inline __m256i dot8_avx2(__m256i acc, __m256i u, __m256i x) {
  __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
  return dot_avx2(acc, _mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
}
#define DOT8(acc, u, x) dot8_avx2((acc), (u), (x))
#define Q8_OFFSET 0
#endif

static inline __attribute__((always_inline)) void q8_tile(const uint8_t *wc, const uint16_t *d, const tp_qact *a,
                                                          int m0, const int mr, const int lv, float *y, int ldy,
                                                          int accumulate) {
  const int K = a->K, nb = K / TP_GROUP;
  for (int h = 0; h < NV; h++) {
    vf acc[MR];
    for (int r = 0; r < mr; r++) acc[r] = VFZERO();
    for (int b = 0; b < nb; b++) {
      vi a1[MR], a2[MR];
      for (int r = 0; r < mr; r++) a1[r] = a2[r] = VZERO();
      const uint8_t *wb = wc + (size_t)b * 8 * 64 + h * 32;
      for (int j = 0; j < 8; j++) {
        vi v = VLOADU(wb + j * 64);
        for (int r = 0; r < mr; r++) {
          const int32_t *x1 = (const int32_t *)(a->q1 + (size_t)(m0 + r) * K + b * TP_GROUP);
          a1[r] = DOT8(a1[r], v, SET1(x1[j]));
          if (lv == 2) {
            const int32_t *x2 = (const int32_t *)(a->q2 + (size_t)(m0 + r) * K + b * TP_GROUP);
            a2[r] = DOT8(a2[r], v, SET1(x2[j]));
          }
        }
      }
      vf dv = LOADH(d + b * 16 + h * 8);
      for (int r = 0; r < mr; r++) {
        const size_t o = (size_t)(m0 + r) * nb + b;
        if (Q8_OFFSET) {
          a1[r] = ISUB(a1[r], SET1(128 * a->qsum1[o]));
          if (lv == 2) a2[r] = ISUB(a2[r], SET1(128 * a->qsum2[o]));
        }
        vf t = FMUL(CVT(a1[r]), FSET1(a->s1[o]));
        if (lv == 2) t = FMA(CVT(a2[r]), FSET1(a->s2[o]), t);
        acc[r] = FMA(t, dv, acc[r]);
      }
    }
    for (int r = 0; r < mr; r++) {
      float *yp = y + (size_t)(m0 + r) * ldy + h * LANES;
      FSTOREU(yp, accumulate ? FADD(FLOADU(yp), acc[r]) : acc[r]);
    }
  }
}

#define DISPATCH(CALL_MR, mr)           \
  switch (mr) {                         \
    case 4: CALL_MR(4); break;          \
    case 3: CALL_MR(3); break;          \
    case 2: CALL_MR(2); break;          \
    default: CALL_MR(1); break;         \
  }

static void tile_rows(const tp_weight *w, const tp_qact *a, int t, int m0, int mr, float *y, int ldy,
                      int accumulate) {
  const int K = w->K, nb = K / TP_GROUP;
  float *yt = y + (size_t)t * TP_TILE;
  const uint16_t *d = w->d + (size_t)t * nb * 16;
  if (w->kind == TP_W_Q4) {
    const uint8_t *wc = w->codes + (size_t)t * nb * 256;
    const uint16_t *mn = w->m + (size_t)t * nb * 16;
#define Q4_CALL(R)                                                       \
  if (a->levels == 2) q4_tile(wc, d, mn, a, m0, R, 2, yt, ldy, accumulate); \
  else q4_tile(wc, d, mn, a, m0, R, 1, yt, ldy, accumulate)
    DISPATCH(Q4_CALL, mr)
  } else {
    const uint8_t *wc = w->codes + (size_t)t * nb * 512;
#define Q8_CALL(R)                                                   \
  if (a->levels == 2) q8_tile(wc, d, a, m0, R, 2, yt, ldy, accumulate); \
  else q8_tile(wc, d, a, m0, R, 1, yt, ldy, accumulate)
    DISPATCH(Q8_CALL, mr)
  }
}

void tp_gemm(const tp_weight *w, const tp_qact *a, float *y, int ldy, int accumulate) {
  const int nt = w->N / TP_TILE, M = a->M, mg = (M + MR - 1) / MR;
  /* tiles outer (a tile's weights stay in L1 while every activation row group passes) */
#pragma omp parallel for schedule(static) collapse(2) if (nt * mg > 1)
  for (int t = 0; t < nt; t++)
    for (int g = 0; g < mg; g++) {
      int m0 = g * MR, mr = M - m0 < MR ? M - m0 : MR;
      tile_rows(w, a, t, m0, mr, y, ldy, accumulate);
    }
}

static int g_threads = 0;
void tp_set_threads(int n) {
  g_threads = n;
  if (n > 0) omp_set_num_threads(n);
}
int tp_get_threads(void) { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

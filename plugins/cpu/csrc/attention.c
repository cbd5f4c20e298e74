/* Paged attention over the head-major pool (docs/contracts.md; the NumPy reference that defines
 * it: plugins/ops/paged_attention/reference.py): this step's K/V encoded in the pool's dtype and
 * written at slot_mapping, then causal GQA attention with the Hugging Face sliding-window
 * convention. The pool may hold fp32, fp16, bf16 or int8 with per token-head scales (tp.h;
 * plugins/core/kv_codec.py defines the encodings): attention decodes each key block once to fp32
 * (int8 rows times their scale), shared by every query row of the work item. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "tp.h"
#include "vmath.h"

static inline size_t kv_elem_bytes(int dtype) { return dtype == TP_KV_F32 ? 4 : dtype == TP_KV_I8 ? 1 : 2; }

/* one row x[D] in the pool's dtype at dst (and its int8 scale at *scale); scalar: a step writes
 * T x KVH rows per layer, a trifle next to the reads. Each float32 operation is the one
 * kv_codec.kv_encode names (ISO C, no contraction), so the codes match it bit for bit. */
static void encode_row(int dtype, const float *x, int D, void *dst, float *scale) {
  if (dtype == TP_KV_F32) {
    memcpy(dst, x, sizeof(float) * D);
  } else if (dtype == TP_KV_F16) {
    for (int d = 0; d < D; d++) ((uint16_t *)dst)[d] = _cvtss_sh(x[d], _MM_FROUND_TO_NEAREST_INT);
  } else if (dtype == TP_KV_BF16) {
    for (int d = 0; d < D; d++) {
      uint32_t u;
      memcpy(&u, x + d, 4);
      ((uint16_t *)dst)[d] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
  } else {
    float amax = 0.f;
    for (int d = 0; d < D; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int d = 0; d < D; d++) {
      float q = nearbyintf(x[d] * inv); /* round half to even (the default rounding mode) */
      q = q > 127.f ? 127.f : (q < -127.f ? -127.f : q);
      ((int8_t *)dst)[d] = (int8_t)q;
    }
    *scale = amax / 127.f;
  }
}

void tp_kv_write(const tp_kv *kv, const float *k, const float *v, int ld, const int64_t *slot_mapping, int T,
                 int KVH, int NB, int BS, int D) {
  const size_t head = (size_t)NB * BS, eb = kv_elem_bytes(kv->dtype);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < KVH; h++) {
      const size_t row = h * head + (size_t)slot_mapping[t]; /* token-head row index */
      const float *kr = k + (size_t)t * ld + (size_t)h * D, *vr = v + (size_t)t * ld + (size_t)h * D;
      encode_row(kv->dtype, kr, D, (char *)kv->k + row * D * eb, kv->k_scale ? kv->k_scale + row : NULL);
      encode_row(kv->dtype, vr, D, (char *)kv->v + row * D * eb, kv->v_scale ? kv->v_scale + row : NULL);
    }
}

/* VL consecutive pool elements (fp16 / bf16 / int8) as fp32 */
static inline fv load_kv(int dtype, const void *p) {
#if defined(TP_ISA_AVX512)
  if (dtype == TP_KV_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
  if (dtype == TP_KV_BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#else
  if (dtype == TP_KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  if (dtype == TP_KV_BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#endif
}

static inline float decode_one(int dtype, const void *p, size_t i) {
  if (dtype == TP_KV_F16) return _cvtsh_ss(((const uint16_t *)p)[i]);
  if (dtype == TP_KV_BF16) {
    const uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  return (float)((const int8_t *)p)[i];
}

/* dst[n][D] = n pool rows (fp16 / bf16 / int8) as fp32, int8 rows times scale[row] */
static void decode_rows(int dtype, const void *src, const float *scale, int n, int D, float *dst) {
  const size_t eb = kv_elem_bytes(dtype);
  for (int j = 0; j < n; j++) {
    const char *row = (const char *)src + (size_t)j * D * eb;
    float *out = dst + (size_t)j * D;
    const float f = scale ? scale[j] : 1.f;
    int d = 0;
    if (scale) {
      const fv fs = FV_SET1(f);
      for (; d + VL <= D; d += VL) FV_STORE(out + d, FV_MUL(load_kv(dtype, row + d * eb), fs));
    } else {
      for (; d + VL <= D; d += VL) FV_STORE(out + d, load_kv(dtype, row + d * eb));
    }
    for (; d < D; d++) out[d] = decode_one(dtype, row, d) * f;
  }
}

/* p[i] = exp(p[i] - m) for i < n in place (vmath.h), returning the sum; -inf gives 0 */
static float exp_sum(float *p, int64_t n, float m) {
  fv acc = FV_ZERO();
  const fv mv = FV_SET1(m);
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    const fv y = tp_vexp(FV_SUB(FV_LOAD(p + i), mv));
    FV_STORE(p + i, y);
    acc = FV_ADD(acc, y);
  }
  float s = tp_vsum(acc);
  for (; i < n; i++) s += (p[i] = expf(p[i] - m));
  return s;
}

/* the largest lane of v */
static inline float vmax_lanes(fv v) {
#if defined(TP_ISA_AVX512)
  return _mm512_reduce_max_ps(v);
#else
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
#endif
}

#if defined(TP_ISA_AVX512)
#define FV_MAX(a, b) _mm512_max_ps(a, b)
#else
#define FV_MAX(a, b) _mm256_max_ps(a, b)
#endif

/* max of p[0..n) (exact, in any order) */
static inline float max_of(const float *p, int n) {
  int i = 0;
  float m = -INFINITY;
  if (n >= VL) {
    fv v = FV_LOAD(p);
    for (i = VL; i + VL <= n; i += VL) v = FV_MAX(v, FV_LOAD(p + i));
    m = vmax_lanes(v);
  }
  for (; i < n; i++) m = p[i] > m ? p[i] : m;
  return m;
}


/* sc[j] = sum_d qs[d] kt[d][j] for j < BS (kt is K^T of a block, [D][BS]): four accumulators
 * over d per VL keys when BS % VL == 0 and D % 4 == 0, else plain loops */
static inline void block_scores(const float *qs, const float *kt, int D, int BS, float *sc) {
  if (BS % VL == 0 && D % 4 == 0) {
    for (int c = 0; c < BS; c += VL) {
      fv a0 = FV_ZERO(), a1 = FV_ZERO(), a2 = FV_ZERO(), a3 = FV_ZERO();
      for (int d = 0; d < D; d += 4) {
        a0 = FV_FMA(FV_SET1(qs[d]), FV_LOAD(kt + (size_t)d * BS + c), a0);
        a1 = FV_FMA(FV_SET1(qs[d + 1]), FV_LOAD(kt + (size_t)(d + 1) * BS + c), a1);
        a2 = FV_FMA(FV_SET1(qs[d + 2]), FV_LOAD(kt + (size_t)(d + 2) * BS + c), a2);
        a3 = FV_FMA(FV_SET1(qs[d + 3]), FV_LOAD(kt + (size_t)(d + 3) * BS + c), a3);
      }
      FV_STORE(sc + c, FV_ADD(FV_ADD(a0, a1), FV_ADD(a2, a3)));
    }
    return;
  }
  for (int j = 0; j < BS; j++) sc[j] = 0.f;
  for (int d = 0; d < D; d++)
    for (int j = 0; j < BS; j++) sc[j] += qs[d] * kt[(size_t)d * BS + j];
}

/* lane i of the result = the sum of acc[i]'s lanes (VL accumulators in, one vector out): a
 * transpose-and-add tree, ~3 instructions per key instead of a full reduction each */
static inline fv hsum_lanes(const fv *acc) {
#if defined(TP_ISA_AVX512)
  __m512 t[8], u[4];
  for (int i = 0; i < 8; i++) /* 128-bit lane L: [a0 a1 a0 a1] partial sums of keys 2i, 2i+1 */
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]), _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
  for (int i = 0; i < 4; i++) { /* lane L: [k0 k1 k2 k3] of keys 4i.. */
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x88), _mm512_shuffle_f32x4(v01, v23, 0xDD));
#else
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
#endif
}

/* sc[j] = sum_d qs[d] k[j][d] for j < BS (k: BS rows of D, as the pool holds them): VL keys at a
 * time, one accumulator each, reduced together (hsum_lanes). Every row's path where BS % VL == 0
 * and D % VL == 0 (decode rows and prompt chunks alike): no transpose of the block. */
static inline void block_scores_rows(const float *qs, const float *k, int D, int BS, float *sc) {
  for (int c = 0; c < BS; c += VL) {
    fv acc[VL];
    const fv q0 = FV_LOAD(qs);
    for (int i = 0; i < VL; i++) acc[i] = FV_MUL(FV_LOAD(k + (size_t)(c + i) * D), q0);
    for (int d = VL; d < D; d += VL) {
      const fv qd = FV_LOAD(qs + d);
      for (int i = 0; i < VL; i++) acc[i] = FV_FMA(FV_LOAD(k + (size_t)(c + i) * D + d), qd, acc[i]);
    }
    FV_STORE(sc + c, hsum_lanes(acc));
  }
}

/* orow[d] += sum_j p[j] v[j][d] (v: BS rows of D), the row held in registers per 4 VL-chunk */
static inline void block_pv(const float *p, const float *v, int D, int BS, float *orow) {
  if (D % (4 * VL) == 0) {
    for (int c = 0; c < D; c += 4 * VL) {
      fv o0 = FV_LOAD(orow + c), o1 = FV_LOAD(orow + c + VL), o2 = FV_LOAD(orow + c + 2 * VL),
         o3 = FV_LOAD(orow + c + 3 * VL);
      for (int j = 0; j < BS; j++) {
        if (p[j] == 0.f) continue;
        const fv pj = FV_SET1(p[j]);
        const float *vr = v + (size_t)j * D + c;
        o0 = FV_FMA(pj, FV_LOAD(vr), o0);
        o1 = FV_FMA(pj, FV_LOAD(vr + VL), o1);
        o2 = FV_FMA(pj, FV_LOAD(vr + 2 * VL), o2);
        o3 = FV_FMA(pj, FV_LOAD(vr + 3 * VL), o3);
      }
      FV_STORE(orow + c, o0);
      FV_STORE(orow + c + VL, o1);
      FV_STORE(orow + c + 2 * VL, o2);
      FV_STORE(orow + c + 3 * VL, o3);
    }
    return;
  }
  for (int j = 0; j < BS; j++)
    for (int d = 0; d < D; d++) orow[d] += p[j] * v[(size_t)j * D + d];
}

/* Work item: one sequence, one kv head, a block of QB query tokens (x the kv head's H/KVH query
 * heads). Per key block of the sequence: the block as fp32 once (the pool's rows in place for an
 * fp32 pool, else decoded: decode_rows), then per row the block's scores (block_scores_rows
 * straight from the pool's rows; K^T of the block, [D][BS], only for shapes that path cannot take:
 * either way every row of every item, a decode row or a prompt chunk's, sums in the same order, so
 * a token's output does not depend on its chunk: speculative verification relies on it), then
 * online softmax (running max and sum, rescaled when the max grows) and P V (over
 * D). Masked keys (after the row's position, before its window, past the context) score -inf
 * and weigh 0. */
#define QB 16

void tp_attention(const float *q, int ldq, const tp_kv *kv, const int64_t *block_tables, int MB,
                  const int64_t *context_lens, const int64_t *query_start_loc, int S, int H, int KVH, int NB, int BS,
                  int D, float scale, int W, float *out) {
  const size_t head = (size_t)NB * BS * D, eb = kv_elem_bytes(kv->dtype);
  const int group = H / KVH, rows_fast = BS % VL == 0 && D % VL == 0;
  /* items: for each sequence, KVH x ceil(n / QB) */
  int64_t *first = malloc(sizeof(int64_t) * (S + 1));
  first[0] = 0;
  for (int s = 0; s < S; s++) {
    const int64_t n = query_start_loc[s + 1] - query_start_loc[s];
    first[s + 1] = first[s] + (int64_t)KVH * ((n + QB - 1) / QB);
  }
  const int64_t items = first[S];
#pragma omp parallel
  {
    const int R = QB * group;
    float *o = malloc(sizeof(float) * (2 * (size_t)R * D + 3 * (size_t)D * BS + 3 * (size_t)R + 2 * BS));
    float *kt = o + (size_t)R * D, *kbuf = kt + (size_t)D * BS, *vbuf = kbuf + (size_t)D * BS;
    float *mx = vbuf + (size_t)D * BS, *l = mx + R, *sc = l + R, *qrows = sc + 2 * BS; /* qrows: [R][D] scaled */
    int64_t *lo_pos = malloc(sizeof(int64_t) * 2 * R);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; item++) {
      int s = 0;
      while (first[s + 1] <= item) s++;
      const int64_t local = item - first[s], nqb = (first[s + 1] - first[s]) / KVH;
      const int g = (int)(local / nqb);
      const int64_t qb = local % nqb;
      const int64_t n = query_start_loc[s + 1] - query_start_loc[s], ctx = context_lens[s];
      const int64_t t0 = query_start_loc[s] + qb * QB, nt = (n - qb * QB) < QB ? (n - qb * QB) : QB;
      const int rows = (int)nt * group, transpose = !rows_fast;
      int64_t pmax = -1, lomin = INT64_MAX;
      for (int r = 0; r < rows; r++) {
        const int64_t pos = ctx - n + qb * QB + r / group;
        const int64_t lo = (W > 0 && pos - W + 1 > 0) ? pos - W + 1 : 0;
        lo_pos[2 * r] = lo;
        lo_pos[2 * r + 1] = pos;
        pmax = pos > pmax ? pos : pmax;
        lomin = lo < lomin ? lo : lomin;
        mx[r] = -INFINITY;
        l[r] = 0.f;
        memset(o + (size_t)r * D, 0, sizeof(float) * D);
        const float *qv = q + (size_t)(t0 + r / group) * ldq + (size_t)(g * group + r % group) * D;
        for (int d = 0; d < D; d++) qrows[(size_t)r * D + d] = qv[d] * scale;
      }
      const char *kh = (const char *)kv->k + g * head * eb, *vh = (const char *)kv->v + g * head * eb;
      const int64_t *bt = block_tables + (size_t)s * MB;
      for (int64_t kb = lomin / BS; kb * BS <= pmax; kb++) {
        const int64_t base = kb * BS;
        const size_t row0 = (size_t)bt[kb] * BS; /* the block's first token-head row */
        const float *kblk = (const float *)(kh + row0 * D * eb), *vblk = (const float *)(vh + row0 * D * eb);
        if (kv->dtype != TP_KV_F32) {
          const size_t srow = g * (size_t)NB * BS + row0;
          decode_rows(kv->dtype, kblk, kv->k_scale ? kv->k_scale + srow : NULL, BS, D, kbuf);
          decode_rows(kv->dtype, vblk, kv->v_scale ? kv->v_scale + srow : NULL, BS, D, vbuf);
          kblk = kbuf;
          vblk = vbuf;
        }
        if (transpose)
          for (int j = 0; j < BS; j++)
            for (int d = 0; d < D; d++) kt[(size_t)d * BS + j] = kblk[(size_t)j * D + d];
        for (int r = 0; r < rows; r++) {
          const int64_t lo = lo_pos[2 * r], pos = lo_pos[2 * r + 1];
          if (base > pos || base + BS <= lo) continue;
          const float *qs = qrows + (size_t)r * D;
          if (transpose)
            block_scores(qs, kt, D, BS, sc);
          else
            block_scores_rows(qs, kblk, D, BS, sc);
          if (base < lo || base + BS - 1 > pos) /* a block on the window's or the causal edge */
            for (int j = 0; j < BS; j++)
              if (base + j > pos || base + j < lo) sc[j] = -INFINITY;
          const float bm = max_of(sc, BS);
          float *orow = o + (size_t)r * D;
          if (bm > mx[r]) { /* the running max grows: rescale what was summed */
            const float f = expf(mx[r] - bm);
            l[r] *= f;
            int d = 0;
            for (; d + VL <= D; d += VL) FV_STORE(orow + d, FV_MUL(FV_LOAD(orow + d), FV_SET1(f)));
            for (; d < D; d++) orow[d] *= f;
            mx[r] = bm;
          }
          l[r] += exp_sum(sc, BS, mx[r]);
          block_pv(sc, vblk, D, BS, orow);
        }
      }
      for (int r = 0; r < rows; r++) {
        const int h = g * group + r % group;
        float *dst = out + (size_t)(t0 + r / group) * H * D + (size_t)h * D;
        const float inv = 1.f / l[r];
        for (int d = 0; d < D; d++) dst[d] = o[(size_t)r * D + d] * inv;
      }
    }
    free(lo_pos);
    free(o);
  }
  free(first);
}

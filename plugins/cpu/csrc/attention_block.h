/* One key block's arithmetic for attention.c: pool rows decoded to fp32, scores of a query row,
 * online-softmax helpers and P V, for the ISA's float vector (vmath.h). Static inline: included by
 * attention.c only. */
#ifndef TP_ATTENTION_BLOCK_H
#define TP_ATTENTION_BLOCK_H
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "tp.h"
#include "vmath.h"

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
  const size_t eb = tp_kv_elem_bytes(dtype);
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

#endif

/* Activation quantization (tp.h: one or two int8 levels per 32-block, fp32 block sums; integer
 * code sums per block and, for tp_quant_act_halves, per 16-half). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>

#include "tp.h"

/* One 32-block, vectorized: max |x| and sum (the sum's order is the vector's, not sequential),
 * codes rint(x / s) (round half to even, as the NumPy reference) clipped to +-127, the residual
 * x - q s (a multiply, then a subtract: ISO C, no contraction). */
#if defined(TP_ISA_AVX512)
static inline void quant_block(const float *xb, int levels, int8_t *q1, int8_t *q2, float *s1, float *s2,
                               float *asum, int32_t *qs1, int32_t *qs2, int32_t *qh1, int32_t *qh2) {
  const __m512 lim = _mm512_set1_ps(127.f), nlim = _mm512_set1_ps(-127.f);
  __m512 x[2] = {_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)};
  const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x[0]), _mm512_abs_ps(x[1])));
  *asum = _mm512_reduce_add_ps(_mm512_add_ps(x[0], x[1]));
  float sc = mx / 127.f, inv = sc > 0.f ? 1.f / sc : 0.f;
  for (int lv = 0; lv < levels; lv++) {
    int8_t *q = lv ? q2 : q1;
    const __m512 vi = _mm512_set1_ps(inv), vs = _mm512_set1_ps(sc);
    __m512i tot = _mm512_setzero_si512();
    __m512 rmax = _mm512_setzero_ps();
    int32_t *qh = lv ? qh2 : qh1;
    for (int h = 0; h < 2; h++) {
      __m512 qf = _mm512_roundscale_ps(_mm512_mul_ps(x[h], vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      qf = _mm512_min_ps(_mm512_max_ps(qf, nlim), lim);
      __m512i qi = _mm512_cvtps_epi32(qf);
      _mm_storeu_si128((__m128i *)(q + 16 * h), _mm512_cvtsepi32_epi8(qi));
      tot = _mm512_add_epi32(tot, qi);
      if (qh) qh[h] = _mm512_reduce_add_epi32(qi); /* the 16-half's sum */
      x[h] = _mm512_sub_ps(x[h], _mm512_mul_ps(qf, vs)); /* residual */
      rmax = _mm512_max_ps(rmax, _mm512_abs_ps(x[h]));
    }
    if (lv) {
      *s2 = sc;
      *qs2 = _mm512_reduce_add_epi32(tot);
    } else {
      *s1 = sc;
      *qs1 = _mm512_reduce_add_epi32(tot);
    }
    sc = _mm512_reduce_max_ps(rmax) / 127.f;
    inv = sc > 0.f ? 1.f / sc : 0.f;
  }
}
#else
static inline float hmax8(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}
static inline float hadd8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}
static inline int32_t hadd8i(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
  return _mm_cvtsi128_si32(h);
}
static inline void quant_block(const float *xb, int levels, int8_t *q1, int8_t *q2, float *s1, float *s2,
                               float *asum, int32_t *qs1, int32_t *qs2, int32_t *qh1, int32_t *qh2) {
  const __m256 sign = _mm256_set1_ps(-0.f), lim = _mm256_set1_ps(127.f), nlim = _mm256_set1_ps(-127.f);
  __m256 x[4];
  __m256 am = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
  for (int h = 0; h < 4; h++) {
    x[h] = _mm256_loadu_ps(xb + 8 * h);
    am = _mm256_max_ps(am, _mm256_andnot_ps(sign, x[h]));
    sm = _mm256_add_ps(sm, x[h]);
  }
  *asum = hadd8(sm);
  float sc = hmax8(am) / 127.f, inv = sc > 0.f ? 1.f / sc : 0.f;
  for (int lv = 0; lv < levels; lv++) {
    int8_t *q = lv ? q2 : q1;
    const __m256 vi = _mm256_set1_ps(inv), vs = _mm256_set1_ps(sc);
    __m256i qi[4], tot = _mm256_setzero_si256();
    __m256 rmax = _mm256_setzero_ps();
    for (int h = 0; h < 4; h++) {
      __m256 qf = _mm256_round_ps(_mm256_mul_ps(x[h], vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      qf = _mm256_min_ps(_mm256_max_ps(qf, nlim), lim);
      qi[h] = _mm256_cvtps_epi32(qf);
      tot = _mm256_add_epi32(tot, qi[h]);
      x[h] = _mm256_sub_ps(x[h], _mm256_mul_ps(qf, vs));
      rmax = _mm256_max_ps(rmax, _mm256_andnot_ps(sign, x[h]));
    }
    /* 32 int32 -> 32 int8 in order: packs work per 128-bit lane, a permute restores the order */
    __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p8);
    int32_t *qh = lv ? qh2 : qh1;
    if (qh) { /* the 16-halves' sums */
      qh[0] = hadd8i(_mm256_add_epi32(qi[0], qi[1]));
      qh[1] = hadd8i(_mm256_add_epi32(qi[2], qi[3]));
    }
    if (lv) {
      *s2 = sc;
      *qs2 = hadd8i(tot);
    } else {
      *s1 = sc;
      *qs1 = hadd8i(tot);
    }
    sc = hmax8(rmax) / 127.f;
    inv = sc > 0.f ? 1.f / sc : 0.f;
  }
}
#endif

#if defined(TP_ACT_I16)
#if defined(TP_ISA_AVX512)
#error "the int16 activation form is written for AVX2 (plugins/cpu/isa.py: ACT_FORMS)"
#endif
/* One 32-block in the int16 form (tp.h): s = max|x| / 32767, q = rint(x / s) clipped to +-32767,
 * stored with each 4-group as (0, 2, 1, 3); the code sums (whole block, per 16) as the int8 form's. */
static inline void quant_block16(const float *xb, int16_t *q, float *s, float *asum, int32_t *qs, int32_t *qh) {
  const __m256 sign = _mm256_set1_ps(-0.f), lim = _mm256_set1_ps(32767.f), nlim = _mm256_set1_ps(-32767.f);
  __m256 x[4], am = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
  for (int h = 0; h < 4; h++) {
    x[h] = _mm256_loadu_ps(xb + 8 * h);
    am = _mm256_max_ps(am, _mm256_andnot_ps(sign, x[h]));
    sm = _mm256_add_ps(sm, x[h]);
  }
  *asum = hadd8(sm);
  const float sc = hmax8(am) / 32767.f, inv = sc > 0.f ? 1.f / sc : 0.f;
  const __m256 vi = _mm256_set1_ps(inv);
  __m256i qi[4], tot = _mm256_setzero_si256();
  for (int h = 0; h < 4; h++) {
    __m256 qf = _mm256_round_ps(_mm256_mul_ps(x[h], vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    qi[h] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(qf, nlim), lim));
    tot = _mm256_add_epi32(tot, qi[h]);
    qi[h] = _mm256_shuffle_epi32(qi[h], 0xD8); /* each 4-group as (0, 2, 1, 3) */
  }
  for (int p = 0; p < 2; p++) { /* packs interleave the 128-bit lanes; a 64-bit permute restores the order */
    const __m256i v = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2 * p], qi[2 * p + 1]), 0xD8);
    _mm256_storeu_si256((__m256i *)(q + 16 * p), v);
  }
  *s = sc;
  *qs = hadd8i(tot);
  if (qh) {
    qh[0] = hadd8i(_mm256_add_epi32(qi[0], qi[1])); /* a sum: the order within the lanes does not matter */
    qh[1] = hadd8i(_mm256_add_epi32(qi[2], qi[3]));
  }
}
#endif

/* one row; qh1, qh2: the row's per-16 sums [K/16], or NULL (not wanted) */
static void quant_row(const float *x, int K, int levels, int8_t *q1, int8_t *q2, float *s1, float *s2, float *asum,
                      int32_t *qs1, int32_t *qs2, int32_t *qh1, int32_t *qh2) {
  for (int b = 0; b < K / TP_GROUP; b++)
    quant_block(x + b * TP_GROUP, levels, q1 + b * TP_GROUP, q2 + b * TP_GROUP, s1 + b, s2 + b, asum + b, qs1 + b,
                qs2 + b, qh1 ? qh1 + 2 * b : NULL, qh2 ? qh2 + 2 * b : NULL);
}

static void quant_act(const float *x, int M, int K, int levels, tp_qact *a, int halves) {
  a->M = M;
  a->K = K;
  a->levels = levels;
  const int nb = K / TP_GROUP;
#pragma omp parallel for schedule(static) if (M > 4)
  for (int m = 0; m < M; m++) {
    const size_t o = (size_t)m * nb;
#if defined(TP_ACT_I16)
    if (levels == 2) {
      for (int b = 0; b < nb; b++)
        quant_block16(x + (size_t)m * K + b * TP_GROUP, a->q16 + (size_t)m * K + b * TP_GROUP, a->s1 + o + b,
                      a->asum + o + b, a->qsum1 + o + b, halves ? a->qhalf1 + 2 * (o + b) : NULL);
      continue;
    }
#endif
    int32_t *qh1 = halves ? a->qhalf1 + 2 * o : NULL, *qh2 = halves && levels == 2 ? a->qhalf2 + 2 * o : NULL;
    quant_row(x + (size_t)m * K, K, levels, a->q1 + (size_t)m * K, a->q2 + (size_t)m * K, a->s1 + o, a->s2 + o,
              a->asum + o, a->qsum1 + o, a->qsum2 + o, qh1, qh2);
  }
}

/* the per-16 sums are a separate entry point: callers that never hold a group-16 weight (and
 * allocate no qhalf buffers) keep calling tp_quant_act */
void tp_quant_act(const float *x, int M, int K, int levels, tp_qact *a) { quant_act(x, M, K, levels, a, 0); }
void tp_quant_act_halves(const float *x, int M, int K, int levels, tp_qact *a) { quant_act(x, M, K, levels, a, 1); }

/* Vector helpers shared by the kernels: the ISA's float vector (VL lanes) and an exp.
 *
 * tp_vexp: Cephes expf (x = k ln2 + r, |r| <= ln2/2, a degree-6 polynomial, times 2^k), ~1 ulp
 * over [-87.3, 88.7]; below it 0, above it 2^128 (+inf for the uses here: silu's 1 + e^-x). */
#ifndef TP_VMATH_H
#define TP_VMATH_H
#include <immintrin.h>

#if defined(TP_ISA_AVX512)
#define VL 16
typedef __m512 fv;
#define FV_ZERO() _mm512_setzero_ps()
#define FV_LOAD(p) _mm512_loadu_ps(p)
#define FV_STORE(p, v) _mm512_storeu_ps(p, v)
#define FV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define FV_SET1(x) _mm512_set1_ps(x)
#define FV_ADD(a, b) _mm512_add_ps(a, b)
#define FV_MUL(a, b) _mm512_mul_ps(a, b)
#define FV_SUB(a, b) _mm512_sub_ps(a, b)
#define FV_DIV(a, b) _mm512_div_ps(a, b)
#else
#define VL 8
typedef __m256 fv;
#define FV_ZERO() _mm256_setzero_ps()
#define FV_LOAD(p) _mm256_loadu_ps(p)
#define FV_STORE(p, v) _mm256_storeu_ps(p, v)
#define FV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define FV_SET1(x) _mm256_set1_ps(x)
#define FV_ADD(a, b) _mm256_add_ps(a, b)
#define FV_MUL(a, b) _mm256_mul_ps(a, b)
#define FV_SUB(a, b) _mm256_sub_ps(a, b)
#define FV_DIV(a, b) _mm256_div_ps(a, b)
#endif

static inline fv tp_vexp(fv x) {
#if defined(TP_ISA_AVX512)
  const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  const fv k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const fv k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
  fv r = FV_FMA(k, FV_SET1(-0.693359375f), x);
  r = FV_FMA(k, FV_SET1(2.12194440e-4f), r);
  fv y = FV_SET1(1.9875691500e-4f);
  y = FV_FMA(y, r, FV_SET1(1.3981999507e-3f));
  y = FV_FMA(y, r, FV_SET1(8.3334519073e-3f));
  y = FV_FMA(y, r, FV_SET1(4.1665795894e-2f));
  y = FV_FMA(y, r, FV_SET1(1.6666665459e-1f));
  y = FV_FMA(y, r, FV_SET1(5.0000001201e-1f));
  y = FV_FMA(y, FV_MUL(r, r), FV_ADD(r, FV_SET1(1.f)));
#if defined(TP_ISA_AVX512)
  return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_scalef_ps(y, k));
#else
  /* 2^k through the exponent bits (k in [-126, 128]: 2^128 overflows to +inf, as expf would) */
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
#endif
}

static inline float tp_vsum(fv v) {
#if defined(TP_ISA_AVX512)
  return _mm512_reduce_add_ps(v);
#else
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
#endif
}
#endif

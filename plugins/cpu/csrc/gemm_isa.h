/* Vector vocabulary of the GEMM kernels (gemm.c) for the two target ISAs (tp.h):
 * AVX-512 VNNI works on 16 output rows per zmm, AVX2 on 8 per ymm (NV = 2 halves of a tile).
 * DOT(acc, w, x) adds, per 32-bit lane, the four products of u8 w and s8 x. */
#ifndef GEMM_ISA_H
#define GEMM_ISA_H

#include <immintrin.h>

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
#define WIDE 8        /* rows per group of the small-M kernel (gemm.c) */
#define WIDE_MAX_M 16 /* the largest M it runs */
#define PAIRS 4       /* rows per group of the large-M kernel */
#define ISA_NAME "avx512_vnni"
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
#define PAIRS 4 /* 16 ymm: 4 rows x (2 levels + 1 fp32 accumulator) + 2 weight vectors + mask */
/* rows per group of the int16-form kernel (TP_ACT_I16): 6 rows x (int32 + fp32 accumulator) + 4 weight
 * pairs + 2 is 18 ymm, the fp32 accumulators (once per block) spill; measured (Zen 3, one thread, Q4
 * gate_up / down of SmolLM2 at M = 16 and 128): 0.6-0.9x the time of 4 rows, M = 1 alike */
#define I16_ROWS 6
#define ISA_NAME "avx2"
#endif

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

#endif

/* Scores of an int8 KV pool as integer dot products (AVX-512 VNNI; attention.c's int8 path).
 *
 * The pool holds key j as codes c[j][d] in -127..127 times one fp32 scale sk[j] (tp.h). Instead
 * of decoding a key block to fp32 and running D fp32 FMAs per key and query row, a query row q
 * (already times the softmax scale) is quantized to two int8 levels with a fixed step ratio,
 *
 *   q[d] ~ s * (256 a[d] + b[d]),  s = max|q| / (127 * 256),  a = rint(q / (256 s)) clipped to
 *   +-127,  b = rint((q - a * 256 s) / s) clipped to +-127   (|q - s (256 a + b)| <= s: half a
 *   step from rounding, up to a whole one where a residual of 128 steps is clipped to 127),
 *
 * and the score is exact integer arithmetic on those codes, scaled once:
 *
 *   score[j] = float(256 A[j] + B[j] - 128 (256 sum a + sum b)) * s * sk[j],
 *   A[j] = sum_d (c[j][d] + 128) a[d],  B[j] likewise with b   (vpdpbusd: u8 x s8, exact)
 *
 * |256 A + B| < 2^31 for D <= I8_MAX_D (256 D 255 127 + D 255 127), so int32 cannot overflow; float() rounds to
 * 24 bits (relative 6e-8). The query's own error is at most max|q| / 32,512 per element (~15
 * bits, as the two-level GEMM activations), against the int8 keys' max|k| / 254.
 *
 * A key block is transposed once per work item and block (i8_block_t): 4-byte groups of 16 keys
 * side by side, so that one vpdpbusd with a broadcast group of the query adds 4 products for 16
 * keys at once and no horizontal sums are needed. Used for blocks of 16 keys (BS % 16 == 0, a
 * block in 16-key parts) and D % 64 == 0 (heads of 64, 128, 192 or 256); every row of every item takes the same path, so a
 * token's output does not depend on its chunk (speculative verification relies on it). */
#ifndef TP_ATTENTION_I8_H
#define TP_ATTENTION_I8_H
#if defined(TP_ISA_AVX512)
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define I8_MAX_D 256

/* whether the int8 score path serves a pool of this dtype and shape */
static inline int i8_scores_apply(int dtype, int D, int BS) {
  return dtype == 3 /* TP_KV_I8 */ && D % 64 == 0 && D <= I8_MAX_D && BS % 16 == 0;
}

/* one query row q[D] as the two levels a, b (module doc); *step = s, *offset = 128 (256 sum a + sum b).
 * Each float32 operation is written out (ISO C, no contraction), rint rounds half to even. */
static inline void i8_quant_query(const float *q, int D, int8_t *a, int8_t *b, float *step, int32_t *offset) {
  float mx = 0.f;
  for (int d = 0; d < D; d++) mx = fabsf(q[d]) > mx ? fabsf(q[d]) : mx;
  const int zero = !(mx >= FLT_MIN); /* a zero (or subnormal: 127 / mx would overflow) row: codes 0, step 0 */
  const float s1 = zero ? 0.f : mx / 127.f, inv1 = zero ? 0.f : 127.f / mx;
  const float s = s1 / 256.f, inv = inv1 * 256.f; /* exact: powers of two */
  int32_t sa = 0, sb = 0;
  for (int d = 0; d < D; d++) {
    float x = nearbyintf(q[d] * inv1);
    x = x > 127.f ? 127.f : (x < -127.f ? -127.f : x);
    const float r = q[d] - x * s1;
    float y = nearbyintf(r * inv);
    y = y > 127.f ? 127.f : (y < -127.f ? -127.f : y);
    a[d] = (int8_t)x;
    b[d] = (int8_t)y;
    sa += (int32_t)x;
    sb += (int32_t)y;
  }
  *step = s;
  *offset = 128 * (256 * sa + sb);
}

/* kt[g] (g < D/4) = bytes 4g..4g+3 of the 16 keys at k (rows of D int8) side by side, as u8
 * (code + 128): per 16 groups a 16 x 16 transpose of 32-bit elements in 64 shuffles (epi32 and
 * epi64 unpacks within 128-bit lanes, then two rounds of 128-bit lane shuffles) */
static inline void i8_block_t(const int8_t *k, int D, __m512i *kt) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  for (int g0 = 0; g0 < D / 4; g0 += 16) {
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; i++)
      r[i] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(k + (size_t)i * D + 4 * g0)), flip);
    for (int i = 0; i < 8; i++) { /* lane L: keys 2i, 2i+1 of groups 4L, 4L+1 (t[2i]) and 4L+2, 4L+3 */
      t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int m = 0; m < 4; m++) { /* u[4c + m], lane L: keys 4m..4m+3 of group 4L + c */
      u[m] = _mm512_unpacklo_epi64(t[4 * m], t[4 * m + 2]);
      u[4 + m] = _mm512_unpackhi_epi64(t[4 * m], t[4 * m + 2]);
      u[8 + m] = _mm512_unpacklo_epi64(t[4 * m + 1], t[4 * m + 3]);
      u[12 + m] = _mm512_unpackhi_epi64(t[4 * m + 1], t[4 * m + 3]);
    }
    for (int c = 0; c < 4; c++) { /* group 4L + c = lane L of u[4c .. 4c+3], one per key quad */
      const __m512i *U = u + 4 * c;
      const __m512i lo01 = _mm512_shuffle_i32x4(U[0], U[1], 0x88), hi01 = _mm512_shuffle_i32x4(U[0], U[1], 0xDD);
      const __m512i lo23 = _mm512_shuffle_i32x4(U[2], U[3], 0x88), hi23 = _mm512_shuffle_i32x4(U[2], U[3], 0xDD);
      kt[g0 + c] = _mm512_shuffle_i32x4(lo01, lo23, 0x88);
      kt[g0 + 4 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0x88);
      kt[g0 + 8 + c] = _mm512_shuffle_i32x4(lo01, lo23, 0xDD);
      kt[g0 + 12 + c] = _mm512_shuffle_i32x4(hi01, hi23, 0xDD);
    }
  }
}

/* sc[0..16) = the scores of 16 keys (kt: i8_block_t; sk: their 16 scales) for the query row of
 * levels a, b (i8_quant_query), in the module doc's arithmetic */
static inline void i8_scores16(const __m512i *kt, const float *sk, const int8_t *a, const int8_t *b, int D,
                               float step, int32_t offset, float *sc) {
  const int32_t *a4 = (const int32_t *)a, *b4 = (const int32_t *)b;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
  int g = 0;
  for (; g + 2 <= D / 4; g += 2) {
    a0 = _mm512_dpbusd_epi32(a0, kt[g], _mm512_set1_epi32(a4[g]));
    b0 = _mm512_dpbusd_epi32(b0, kt[g], _mm512_set1_epi32(b4[g]));
    a1 = _mm512_dpbusd_epi32(a1, kt[g + 1], _mm512_set1_epi32(a4[g + 1]));
    b1 = _mm512_dpbusd_epi32(b1, kt[g + 1], _mm512_set1_epi32(b4[g + 1]));
  }
  if (g < D / 4) {
    a0 = _mm512_dpbusd_epi32(a0, kt[g], _mm512_set1_epi32(a4[g]));
    b0 = _mm512_dpbusd_epi32(b0, kt[g], _mm512_set1_epi32(b4[g]));
  }
  const __m512i A = _mm512_add_epi32(a0, a1), B = _mm512_add_epi32(b0, b1);
  const __m512i I = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(A, 8), B), _mm512_set1_epi32(offset));
  const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_set1_ps(step));
  _mm512_storeu_ps(sc, _mm512_mul_ps(f, _mm512_loadu_ps(sk)));
}

#endif
#endif

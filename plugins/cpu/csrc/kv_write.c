/* This step's K/V rows written into the paged pool in its dtype (docs/contracts.md: KV
 * encodings; plugins/core/kv_codec.py defines them and tests/plugins/test_cpu_kernels.py holds the
 * codes and scales to it bit for bit). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "tp.h"

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
  const size_t head = (size_t)NB * BS, eb = tp_kv_elem_bytes(kv->dtype);
  for (int t = 0; t < T; t++)
    for (int h = 0; h < KVH; h++) {
      const size_t row = h * head + (size_t)slot_mapping[t]; /* token-head row index */
      const float *kr = k + (size_t)t * ld + (size_t)h * D, *vr = v + (size_t)t * ld + (size_t)h * D;
      encode_row(kv->dtype, kr, D, (char *)kv->k + row * D * eb, kv->k_scale ? kv->k_scale + row : NULL);
      encode_row(kv->dtype, vr, D, (char *)kv->v + row * D * eb, kv->v_scale ? kv->v_scale + row : NULL);
    }
}

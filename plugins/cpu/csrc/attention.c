/* Paged attention over the head-major fp32 pool (docs/contracts.md; the NumPy reference that
 * defines it: plugins/ops/paged_attention/reference.py): this step's K/V written at
 * slot_mapping, then causal GQA attention with the Hugging Face sliding-window convention. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "tp.h"

void tp_kv_write(float *kc, float *vc, const float *k, const float *v, int ld, const int64_t *slot_mapping, int T,
                 int KVH, int NB, int BS, int D) {
  const size_t head = (size_t)NB * BS * D;
  for (int t = 0; t < T; t++)
    for (int h = 0; h < KVH; h++) {
      memcpy(kc + h * head + (size_t)slot_mapping[t] * D, k + (size_t)t * ld + (size_t)h * D, sizeof(float) * D);
      memcpy(vc + h * head + (size_t)slot_mapping[t] * D, v + (size_t)t * ld + (size_t)h * D, sizeof(float) * D);
    }
}

static inline float dot(const float *a, const float *b, int D) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < D; i++) s += a[i] * b[i];
  return s;
}

void tp_attention(const float *q, int ldq, const float *kc, const float *vc, const int64_t *block_tables, int MB,
                  const int64_t *context_lens, const int64_t *query_start_loc, int S, int H, int KVH, int NB, int BS,
                  int D, float scale, int W, float *out) {
  const size_t head = (size_t)NB * BS * D;
  const int group = H / KVH;
  const int64_t T = query_start_loc[S];
  /* one work item per (token, head): balanced for prefill chunks and decode batches alike */
#pragma omp parallel
  {
    float *p = NULL;
    int64_t cap = 0;
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < T * H; item++) {
      const int64_t t = item / H;
      const int h = (int)(item % H), kvh = h / group;
      int s = 0;
      while (query_start_loc[s + 1] <= t) s++;
      const int64_t n = query_start_loc[s + 1] - query_start_loc[s];
      const int64_t pos = context_lens[s] - n + (t - query_start_loc[s]);
      const int64_t lo = (W > 0 && pos - W + 1 > 0) ? pos - W + 1 : 0;
      const int64_t L = pos - lo + 1;
      if (L > cap) {
        free(p);
        cap = L;
        p = (float *)malloc(sizeof(float) * cap);
      }
      const float *qv = q + (size_t)t * ldq + (size_t)h * D;
      const float *kh = kc + kvh * head, *vh = vc + kvh * head;
      const int64_t *bt = block_tables + (size_t)s * MB;
      float mx = -INFINITY;
      for (int64_t j = lo; j <= pos; j++) {
        const int64_t slot = bt[j / BS] * BS + j % BS;
        const float sc = dot(qv, kh + (size_t)slot * D, D) * scale;
        p[j - lo] = sc;
        mx = sc > mx ? sc : mx;
      }
      float sum = 0.f;
      for (int64_t j = 0; j < L; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
      }
      float *o = out + (size_t)t * H * D + (size_t)h * D;
      for (int i = 0; i < D; i++) o[i] = 0.f;
      for (int64_t j = lo; j <= pos; j++) {
        const int64_t slot = bt[j / BS] * BS + j % BS;
        const float *vr = vh + (size_t)slot * D, w = p[j - lo];
#pragma omp simd
        for (int i = 0; i < D; i++) o[i] += w * vr[i];
      }
      const float inv = 1.f / sum;
      for (int i = 0; i < D; i++) o[i] *= inv;
    }
    free(p);
  }
}

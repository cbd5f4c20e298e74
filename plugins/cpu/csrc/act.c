/* Activation quantization (tp.h: one or two int8 levels per 32-block, fp32 block sums). */
#include <math.h>
#include <omp.h>

#include "tp.h"

static void quant_row(const float *x, int K, int levels, int8_t *q1, int8_t *q2, float *s1, float *s2, float *asum,
                      int32_t *qs1, int32_t *qs2) {
  for (int b = 0; b < K / TP_GROUP; b++) {
    const float *xb = x + b * TP_GROUP;
    float mx = 0.f, sum = 0.f;
    for (int i = 0; i < TP_GROUP; i++) {
      float v = fabsf(xb[i]);
      mx = v > mx ? v : mx;
      sum += xb[i];
    }
    float sc = mx / 127.f, inv = sc > 0.f ? 1.f / sc : 0.f;
    float r[TP_GROUP], mr = 0.f;
    int32_t t1 = 0, t2 = 0;
    for (int i = 0; i < TP_GROUP; i++) {
      int q = (int)lrintf(xb[i] * inv);
      q = q > 127 ? 127 : (q < -127 ? -127 : q);
      q1[b * TP_GROUP + i] = (int8_t)q;
      t1 += q;
      r[i] = xb[i] - (float)q * sc;
      float v = fabsf(r[i]);
      mr = v > mr ? v : mr;
    }
    s1[b] = sc;
    asum[b] = sum;
    qs1[b] = t1;
    if (levels == 2) {
      float sc2 = mr / 127.f, inv2 = sc2 > 0.f ? 1.f / sc2 : 0.f;
      for (int i = 0; i < TP_GROUP; i++) {
        int q = (int)lrintf(r[i] * inv2);
        q = q > 127 ? 127 : (q < -127 ? -127 : q);
        q2[b * TP_GROUP + i] = (int8_t)q;
        t2 += q;
      }
      s2[b] = sc2;
      qs2[b] = t2;
    }
  }
}

void tp_quant_act(const float *x, int M, int K, int levels, tp_qact *a) {
  a->M = M;
  a->K = K;
  a->levels = levels;
  const int nb = K / TP_GROUP;
#pragma omp parallel for schedule(static) if (M > 4)
  for (int m = 0; m < M; m++)
    quant_row(x + (size_t)m * K, K, levels, a->q1 + (size_t)m * K, a->q2 + (size_t)m * K, a->s1 + (size_t)m * nb,
              a->s2 + (size_t)m * nb, a->asum + (size_t)m * nb, a->qsum1 + (size_t)m * nb,
              a->qsum2 + (size_t)m * nb);
}

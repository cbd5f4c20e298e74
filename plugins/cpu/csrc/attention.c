/* Paged attention over the head-major fp32 pool (docs/contracts.md; the NumPy reference that
 * defines it: plugins/ops/paged_attention/reference.py): this step's K/V written at
 * slot_mapping, then causal GQA attention with the Hugging Face sliding-window convention. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "tp.h"
#include "vmath.h"

void tp_kv_write(float *kc, float *vc, const float *k, const float *v, int ld, const int64_t *slot_mapping, int T,
                 int KVH, int NB, int BS, int D) {
  const size_t head = (size_t)NB * BS * D;
  for (int t = 0; t < T; t++)
    for (int h = 0; h < KVH; h++) {
      memcpy(kc + h * head + (size_t)slot_mapping[t] * D, k + (size_t)t * ld + (size_t)h * D, sizeof(float) * D);
      memcpy(vc + h * head + (size_t)slot_mapping[t] * D, v + (size_t)t * ld + (size_t)h * D, sizeof(float) * D);
    }
}

/* exp of p[0..n) in place (vmath.h), returning the sum; -inf gives 0 */
static float exp_sum(float *p, int64_t n) {
  fv acc = FV_ZERO();
  int64_t i = 0;
  for (; i + VL <= n; i += VL) {
    const fv y = tp_vexp(FV_LOAD(p + i));
    FV_STORE(p + i, y);
    acc = FV_ADD(acc, y);
  }
  float s = tp_vsum(acc);
  for (; i < n; i++) s += (p[i] = expf(p[i]));
  return s;
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
 * heads). Per key block of the sequence: K^T of the block once ([D][BS], shared by every row),
 * then per row the block's scores (vectorized over keys), online softmax (running max and sum,
 * rescaled when the max grows) and P V (vectorized over D). Masked keys (after the row's
 * position, before its window, past the context) score -inf and weigh 0. */
#define QB 16

void tp_attention(const float *q, int ldq, const float *kc, const float *vc, const int64_t *block_tables, int MB,
                  const int64_t *context_lens, const int64_t *query_start_loc, int S, int H, int KVH, int NB, int BS,
                  int D, float scale, int W, float *out) {
  const size_t head = (size_t)NB * BS * D;
  const int group = H / KVH;
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
    float *o = malloc(sizeof(float) * ((size_t)R * D + (size_t)D * BS + 3 * (size_t)R + 2 * BS + D));
    float *kt = o + (size_t)R * D, *mx = kt + (size_t)D * BS, *l = mx + R, *sc = l + R, *qs = sc + 2 * BS;
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
      const int rows = (int)nt * group;
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
      }
      const float *kh = kc + g * head, *vh = vc + g * head;
      const int64_t *bt = block_tables + (size_t)s * MB;
      for (int64_t kb = lomin / BS; kb * BS <= pmax; kb++) {
        const int64_t base = kb * BS;
        const float *kblk = kh + (size_t)bt[kb] * BS * D, *vblk = vh + (size_t)bt[kb] * BS * D;
        for (int j = 0; j < BS; j++)
          for (int d = 0; d < D; d++) kt[(size_t)d * BS + j] = kblk[(size_t)j * D + d];
        for (int r = 0; r < rows; r++) {
          const int64_t lo = lo_pos[2 * r], pos = lo_pos[2 * r + 1];
          if (base > pos || base + BS <= lo) continue;
          const int h = g * group + r % group;
          const float *qv = q + (size_t)(t0 + r / group) * ldq + (size_t)h * D;
          for (int d = 0; d < D; d++) qs[d] = qv[d] * scale;
          block_scores(qs, kt, D, BS, sc);
          float bm = -INFINITY;
          for (int j = 0; j < BS; j++) {
            const int64_t key = base + j;
            if (key > pos || key < lo) sc[j] = -INFINITY;
            bm = sc[j] > bm ? sc[j] : bm;
          }
          float *orow = o + (size_t)r * D;
          if (bm > mx[r]) { /* the running max grows: rescale what was summed */
            const float f = expf(mx[r] - bm);
            l[r] *= f;
            for (int d = 0; d < D; d++) orow[d] *= f;
            mx[r] = bm;
          }
          for (int j = 0; j < BS; j++) sc[j] -= mx[r];
          l[r] += exp_sum(sc, BS);
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

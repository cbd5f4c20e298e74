/* Paged attention over the head-major pool (docs/contracts.md; the NumPy reference that defines
 * it: plugins/ops/paged_attention/reference.py): causal GQA attention with the Hugging Face
 * sliding-window convention, after kv_write.c has written this step's K/V. The pool may hold fp32,
 * fp16, bf16 or int8 with per token-head scales (tp.h; plugins/core/kv_codec.py defines the
 * encodings): attention decodes each key block once to fp32 (int8 rows times their scale; on
 * AVX-512 VNNI an int8 pool's keys are scored from their codes, attention_i8.h), shared by every
 * query row of the work item; the block arithmetic is in attention_block.h. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attention_block.h"
#include "attention_i8.h"
#include "tp.h"
#include "vmath.h"
#include "workspace.h"

/* Work item: one sequence, one kv head, a block of QB query tokens (x the kv head's H/KVH query
 * heads) and one context partition: the keys [p PK, (p + 1) PK), PK = PART_KEYS rounded up to
 * whole blocks. Per key block of the partition: the block as fp32 once (the pool's rows in place
 * for an fp32 pool, else decoded: decode_rows; an int8 pool on AVX-512 VNNI scores from its codes:
 * attention_i8.h), then per row the block's scores (block_scores_rows straight from the pool's
 * rows; K^T of the block, [D][BS], only for shapes that path cannot take), then online softmax
 * (running max and sum, rescaled when the max grows) and P V (over D). Masked keys (after the
 * row's position, before its window, past the context) score -inf and weigh 0.
 *
 * Partitions bound an item's work, so that one long sequence's decode (KVH items otherwise: 3 on
 * SmolLM2, fewer than the cores of most hosts) spreads over every thread. A query block whose keys
 * span several partitions gets one item per partition, each leaving its rows' (max, sum, P V);
 * merge_parts combines them in partition order (flash-decoding's split-K). The cuts are absolute
 * key positions, so every row of every item - a decode row or a prompt chunk's, in any batch -
 * sums in the same order and a token's output does not depend on its chunk or batch (speculative
 * verification relies on it); a row whose keys fit one partition computes exactly what a single
 * online softmax does (the merge multiplies by exp(0) = 1 and adds +0). */
#define QB 16
#define PART_KEYS 1024

typedef struct {
  const float *q;
  const tp_kv *kv;
  const int64_t *block_tables, *context_lens, *query_start_loc;
  int ldq, MB, H, KVH, NB, BS, D, W, group, PB, transpose, i8; /* PB: blocks per partition */
  float scale;
  float *out;
} attn_t;

typedef struct {
  int s, g;
  int64_t qb;
  int p, np;    /* partition p of the np partitions (p0 .. p0 + np - 1) of this (s, qb) */
  int64_t slot; /* where it leaves its partials when np > 1 (consecutive within a query block); else -1 */
} item_t;

/* the rows of a query block: n tokens of sequence s, block qb (nt of them), their positions */
static inline void qblock_rows(const attn_t *a, int s, int64_t qb, int64_t *n, int64_t *nt, int64_t *pos0) {
  *n = a->query_start_loc[s + 1] - a->query_start_loc[s];
  *nt = (*n - qb * QB) < QB ? (*n - qb * QB) : QB;
  *pos0 = a->context_lens[s] - *n + qb * QB;
}

/* the first partition and the count of a query block's keys */
static inline void qblock_parts(const attn_t *a, int s, int64_t qb, int *p0, int *np) {
  int64_t n, nt, pos0;
  qblock_rows(a, s, qb, &n, &nt, &pos0);
  const int64_t lomin = (a->W > 0 && pos0 - a->W + 1 > 0) ? pos0 - a->W + 1 : 0;
  const int64_t pk = (int64_t)a->PB * a->BS;
  *p0 = (int)(lomin / pk);
  *np = (int)((pos0 + nt - 1) / pk) - *p0 + 1;
}

/* every item, (sequence, query block, kv head, partition) in that order; *count of them and
 * *slots of partials (items of query blocks over several partitions); NULL when out of memory */
static item_t *list_items(const attn_t *a, int S, int64_t *count, int64_t *slots) {
  int64_t c = 0;
  for (int s = 0; s < S; s++) {
    const int64_t n = a->query_start_loc[s + 1] - a->query_start_loc[s];
    for (int64_t qb = 0; qb * QB < n; qb++) {
      int p0, np;
      qblock_parts(a, s, qb, &p0, &np);
      c += (int64_t)a->KVH * np;
    }
  }
  item_t *it = malloc(sizeof(item_t) * (c > 0 ? c : 1));
  if (!it) return NULL;
  int64_t i = 0, slot = 0;
  for (int s = 0; s < S; s++) {
    const int64_t n = a->query_start_loc[s + 1] - a->query_start_loc[s];
    for (int64_t qb = 0; qb * QB < n; qb++) {
      int p0, np;
      qblock_parts(a, s, qb, &p0, &np);
      for (int g = 0; g < a->KVH; g++)
        for (int p = 0; p < np; p++) it[i++] = (item_t){s, g, qb, p0 + p, np, np > 1 ? slot++ : -1};
    }
  }
  *count = c;
  *slots = slot;
  return it;
}

/* per-thread scratch of attend_item */
typedef struct {
  float *o, *kt, *kbuf, *vbuf, *mx, *l, *sc, *qrows;
  int64_t *lo_pos;
  int8_t *qlv;
  float *qstep;
  int32_t *qoff;
  void *kt8;
} scratch_t;

/* a thread's scratch; ok false when an allocation failed (scratch_free frees what was taken) */
static scratch_t scratch_new(const attn_t *a, int *ok) {
  const int R = QB * a->group, D = a->D, BS = a->BS;
  scratch_t w = {0};
  *ok = 0;
  w.o = malloc(sizeof(float) * (2 * (size_t)R * D + 3 * (size_t)D * BS + 3 * (size_t)R + 2 * BS));
  if (!w.o) return w;
  w.kt = w.o + (size_t)R * D, w.kbuf = w.kt + (size_t)D * BS, w.vbuf = w.kbuf + (size_t)D * BS;
  w.mx = w.vbuf + (size_t)D * BS, w.l = w.mx + R, w.sc = w.l + R, w.qrows = w.sc + 2 * BS; /* qrows: [R][D] scaled */
  w.lo_pos = malloc(sizeof(int64_t) * 2 * R);
  if (a->i8) { /* the rows' two query levels, steps and offsets; a key block transposed (attention_i8.h) */
    w.qlv = malloc(2 * (size_t)R * D);
    w.qstep = malloc(sizeof(float) * R);
    w.qoff = malloc(sizeof(int32_t) * R);
    w.kt8 = aligned_alloc(64, ((size_t)BS * D + 63) & ~(size_t)63);
  }
  *ok = w.o && w.lo_pos && (!a->i8 || (w.qlv && w.qstep && w.qoff && w.kt8));
  return w;
}

static void scratch_free(scratch_t *w) {
  free(w->o);
  free(w->lo_pos);
  free(w->qlv);
  free(w->qstep);
  free(w->qoff);
  free(w->kt8);
}

/* the item's rows: their (lo, pos), running max and sum reset, scaled query (and its int8 levels) */
static int item_rows(const attn_t *a, const item_t *it, scratch_t *w, int64_t *lomin, int64_t *pmax) {
  int64_t n, nt, pos0;
  qblock_rows(a, it->s, it->qb, &n, &nt, &pos0);
  const int D = a->D, rows = (int)nt * a->group;
  const int64_t t0 = a->query_start_loc[it->s] + it->qb * QB;
  *pmax = -1, *lomin = INT64_MAX;
  for (int r = 0; r < rows; r++) {
    const int64_t pos = pos0 + r / a->group, lo = (a->W > 0 && pos - a->W + 1 > 0) ? pos - a->W + 1 : 0;
    w->lo_pos[2 * r] = lo, w->lo_pos[2 * r + 1] = pos;
    *pmax = pos > *pmax ? pos : *pmax, *lomin = lo < *lomin ? lo : *lomin;
    w->mx[r] = -INFINITY, w->l[r] = 0.f;
    memset(w->o + (size_t)r * D, 0, sizeof(float) * D);
    const float *qv = a->q + (size_t)(t0 + r / a->group) * a->ldq + (size_t)(it->g * a->group + r % a->group) * D;
    for (int d = 0; d < D; d++) w->qrows[(size_t)r * D + d] = qv[d] * a->scale;
#if defined(TP_ISA_AVX512)
    if (a->i8)
      i8_quant_query(w->qrows + (size_t)r * D, D, w->qlv + 2 * (size_t)r * D, w->qlv + (2 * (size_t)r + 1) * D,
                     w->qstep + r, w->qoff + r);
#endif
  }
  return rows;
}

/* the scores sc[0..BS) of row r against the key block (kblk: fp32 rows, kt its transpose; ksc set:
 * the int8 path's scales, w->kt8 the block's codes transposed) */
static inline void row_scores(const attn_t *a, scratch_t *w, int r, const float *kblk, const float *ksc) {
  const int D = a->D, BS = a->BS;
#if defined(TP_ISA_AVX512)
  if (ksc) {
    for (int p = 0; p < BS / 16; p++)
      i8_scores16((const __m512i *)w->kt8 + p * D / 4, ksc + p * 16, w->qlv + 2 * (size_t)r * D,
                  w->qlv + (2 * (size_t)r + 1) * D, D, w->qstep[r], w->qoff[r], w->sc + p * 16);
    return;
  }
#else
  (void)ksc;
#endif
  if (a->transpose)
    block_scores(w->qrows + (size_t)r * D, w->kt, D, BS, w->sc);
  else
    block_scores_rows(w->qrows + (size_t)r * D, kblk, D, BS, w->sc);
}

/* key block kb for every row of the item: scores, mask, online softmax, P V */
static void attend_block(const attn_t *a, const item_t *it, scratch_t *w, int rows, int64_t kb) {
  const int D = a->D, BS = a->BS, NB = a->NB;
  const size_t eb = tp_kv_elem_bytes(a->kv->dtype), head = (size_t)NB * BS * D;
  const int64_t base = kb * BS;
  const size_t row0 = (size_t)a->block_tables[(size_t)it->s * a->MB + kb] * BS; /* the block's first token-head row */
  const char *kh = (const char *)a->kv->k + it->g * head * eb, *vh = (const char *)a->kv->v + it->g * head * eb;
  const float *kblk = (const float *)(kh + row0 * D * eb), *vblk = (const float *)(vh + row0 * D * eb);
  const float *ksc = NULL; /* the int8 path: the block's key scales */
  if (a->kv->dtype != TP_KV_F32) {
    const size_t srow = it->g * (size_t)NB * BS + row0;
    if (a->i8) {
#if defined(TP_ISA_AVX512)
      for (int p = 0; p < BS / 16; p++)
        i8_block_t((const int8_t *)kblk + (size_t)p * 16 * D, D, (__m512i *)w->kt8 + p * D / 4);
#endif
      ksc = a->kv->k_scale + srow;
    } else {
      decode_rows(a->kv->dtype, kblk, a->kv->k_scale ? a->kv->k_scale + srow : NULL, BS, D, w->kbuf);
    }
    decode_rows(a->kv->dtype, vblk, a->kv->v_scale ? a->kv->v_scale + srow : NULL, BS, D, w->vbuf);
    kblk = w->kbuf, vblk = w->vbuf;
  }
  if (a->transpose && !ksc)
    for (int j = 0; j < BS; j++)
      for (int d = 0; d < D; d++) w->kt[(size_t)d * BS + j] = kblk[(size_t)j * D + d];
  for (int r = 0; r < rows; r++) {
    const int64_t lo = w->lo_pos[2 * r], pos = w->lo_pos[2 * r + 1];
    if (base > pos || base + BS <= lo) continue;
    row_scores(a, w, r, kblk, ksc);
    float *sc = w->sc, *orow = w->o + (size_t)r * D;
    if (base < lo || base + BS - 1 > pos) /* a block on the window's or the causal edge */
      for (int j = 0; j < BS; j++)
        if (base + j > pos || base + j < lo) sc[j] = -INFINITY;
    const float bm = max_of(sc, BS);
    if (bm > w->mx[r]) { /* the running max grows: rescale what was summed */
      const float f = expf(w->mx[r] - bm);
      w->l[r] *= f;
      int d = 0;
      for (; d + VL <= D; d += VL) FV_STORE(orow + d, FV_MUL(FV_LOAD(orow + d), FV_SET1(f)));
      for (; d < D; d++) orow[d] *= f;
      w->mx[r] = bm;
    }
    w->l[r] += exp_sum(sc, BS, w->mx[r]);
    block_pv(sc, vblk, D, BS, orow);
  }
}

/* one item: its partition's blocks; a query block of one partition writes its rows' outputs,
 * else the item leaves (max, sum, P V) per row at part [rows][D + 2] for merge_parts */
static void attend_item(const attn_t *a, const item_t *it, scratch_t *w, float *part) {
  int64_t lomin, pmax;
  const int rows = item_rows(a, it, w, &lomin, &pmax), D = a->D;
  const int64_t kb0 = (int64_t)it->p * a->PB, kb1 = kb0 + a->PB - 1; /* the partition's blocks */
  const int64_t first = lomin / a->BS > kb0 ? lomin / a->BS : kb0, last = pmax / a->BS < kb1 ? pmax / a->BS : kb1;
  for (int64_t kb = first; kb <= last; kb++) attend_block(a, it, w, rows, kb);
  const int64_t t0 = a->query_start_loc[it->s] + it->qb * QB;
  for (int r = 0; r < rows; r++) {
    const float *o = w->o + (size_t)r * D;
    if (it->np > 1) {
      float *dst = part + (size_t)r * (D + 2);
      dst[0] = w->mx[r], dst[1] = w->l[r];
      memcpy(dst + 2, o, sizeof(float) * D);
      continue;
    }
    float *dst = a->out + (size_t)(t0 + r / a->group) * a->H * D + (size_t)(it->g * a->group + r % a->group) * D;
    const float inv = 1.f / w->l[r];
    for (int d = 0; d < D; d++) dst[d] = o[d] * inv;
  }
}

/* the rows of a query block's np partitions (item it the first; their partials from parts on, stride
 * floats apart) combined in partition order: M = max m, L = sum l e^(m - M), out = sum (P V) e^(m - M) / L */
static void merge_parts(const attn_t *a, const item_t *it, const float *parts, size_t stride) {
  int64_t n, nt, pos0;
  qblock_rows(a, it->s, it->qb, &n, &nt, &pos0);
  const int D = a->D, rows = (int)nt * a->group, np = it->np;
  const int64_t t0 = a->query_start_loc[it->s] + it->qb * QB;
  for (int r = 0; r < rows; r++) {
    float M = -INFINITY, L = 0.f, e[64];
    for (int p = 0; p < np; p++) M = parts[p * stride + (size_t)r * (D + 2)] > M ? parts[p * stride + (size_t)r * (D + 2)] : M;
    float *dst = a->out + (size_t)(t0 + r / a->group) * a->H * D + (size_t)(it->g * a->group + r % a->group) * D;
    memset(dst, 0, sizeof(float) * D);
    for (int p0 = 0; p0 < np; p0 += 64) {
      const int pn = np - p0 < 64 ? np - p0 : 64;
      for (int p = 0; p < pn; p++) {
        const float *src = parts + (p0 + p) * stride + (size_t)r * (D + 2);
        e[p] = expf(src[0] - M);
        L += src[1] * e[p];
      }
      for (int p = 0; p < pn; p++) {
        const float *src = parts + (p0 + p) * stride + (size_t)r * (D + 2) + 2;
        for (int d = 0; d < D; d++) dst[d] += src[d] * e[p];
      }
    }
    const float inv = 1.f / L;
    for (int d = 0; d < D; d++) dst[d] *= inv;
  }
}

/* the partials of the multi-partition items in ws (grown on demand and kept: steps of one engine are
 * sequential, as forward.c's workspace), or in a buffer of this call when ws is NULL: rows x (D + 2)
 * floats a slot, ~12.7 KB on SmolLM2. NULL when out of memory. */
static float *parts_buffer(tp_workspace *ws, size_t floats, float **owned) {
  *owned = NULL;
  if (!ws) return *owned = malloc(sizeof(float) * (floats ? floats : 1));
  if (floats > ws->parts_cap) {
    free(ws->parts);
    ws->parts = malloc(sizeof(float) * floats);
    ws->parts_cap = ws->parts ? floats : 0;
  }
  return floats ? ws->parts : (float *)ws; /* no partials: any non-NULL pointer, never read */
}

int tp_attention(const float *q, int ldq, const tp_kv *kv, const int64_t *block_tables, int MB,
                 const int64_t *context_lens, const int64_t *query_start_loc, int S, int H, int KVH, int NB, int BS,
                 int D, float scale, int W, float *out, tp_workspace *ws) {
  attn_t a = {q, kv, block_tables, context_lens, query_start_loc, ldq, MB, H, KVH, NB, BS, D, W, H / KVH,
              (PART_KEYS + BS - 1) / BS, !(BS % VL == 0 && D % VL == 0), 0, scale, out};
#if defined(TP_ISA_AVX512)
  a.i8 = i8_scores_apply(kv->dtype, D, BS);
#endif
  int64_t items, slots;
  item_t *it = list_items(&a, S, &items, &slots);
  const size_t stride = (size_t)QB * a.group * (D + 2); /* one item's partials */
  float *owned = NULL, *parts = it ? parts_buffer(ws, (size_t)slots * stride, &owned) : NULL;
  if (!it || !parts) {
    free(it);
    return -1;
  }
  int failed = 0;
#pragma omp parallel
  {
    int ok;
    scratch_t w = scratch_new(&a, &ok);
    if (!ok) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; i++)
      if (ok) attend_item(&a, it + i, &w, it[i].slot < 0 ? NULL : parts + (size_t)it[i].slot * stride);
    scratch_free(&w);
#pragma omp barrier
    int any_failed;
#pragma omp atomic read
    any_failed = failed;
    if (slots > 0 && !any_failed) { /* the same for every thread: all or none meet the loop */
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < items; i++) /* each query block's first item of several partitions */
        if (it[i].np > 1 && (i == 0 || it[i - 1].s != it[i].s || it[i - 1].qb != it[i].qb || it[i - 1].g != it[i].g))
          merge_parts(&a, it + i, parts + (size_t)it[i].slot * stride, stride);
    }
  }
  free(it);
  free(owned);
  return failed ? -1 : 0;
}

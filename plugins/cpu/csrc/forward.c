/* The decoder forward of one step, a program over the model's description (tp_model, tp_layer:
 * which norms a layer has, QK-norm, activation, window and RoPE tables per layer, embedding scale,
 * logit soft-cap), every op a tp.h kernel. Hugging Face's LlamaModel / Qwen3Model / Gemma3TextModel
 * order; [..] marks a step a description may leave out:
 *
 *   h = embed(ids) [* embed_scale]
 *   per layer: x = rmsnorm(h); qkv = x Wqkv; [rmsnorm each q and k head]; rope(q, k) with the
 *              layer's tables; write k, v; a = attention(q) over the layer's window
 *              h += [rmsnorm](a Wo); x = rmsnorm(h); gu = x Wgate_up; h += [rmsnorm]((act(g) * u) Wdown)
 *   logits = rmsnorm(h[logit_indices]) Whead [softcapped]   (tp_forward: the last token of each
 *            sequence; tp_forward_rows: any rows, e.g. every position of a speculative verify chunk)
 *
 * Scratch memory is the engine's workspace (workspace.h), grown on demand (steps of one engine are
 * sequential). Every value of the step is checked first (check_step): a bad batch returns a code
 * and leaves the pool untouched. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tp.h"
#include "workspace.h"

int tp_abi_version(void) { return TP_ABI_VERSION; }

size_t tp_struct_size(const char *name) {
#define SIZE_OF(T) \
  if (!strcmp(name, #T)) return sizeof(T);
  SIZE_OF(tp_qact) SIZE_OF(tp_weight) SIZE_OF(tp_kv) SIZE_OF(tp_layer) SIZE_OF(tp_model) SIZE_OF(tp_step)
#undef SIZE_OF
  return 0;
}

tp_workspace *tp_workspace_new(void) { return calloc(1, sizeof(tp_workspace)); }

void tp_workspace_free(tp_workspace *ws) {
  if (!ws) return;
  free(ws->base);
  free(ws->parts);
  free(ws);
}

static void *ws_take(char **cur, size_t bytes) {
  void *p = *cur;
  *cur += (bytes + 63) & ~(size_t)63;
  return p;
}

static void qact_take(char **cur, tp_qact *a, int M, int K) {
  const int nb = K / TP_GROUP;
  a->q1 = ws_take(cur, (size_t)M * K);
  a->q2 = ws_take(cur, (size_t)M * K);
  a->s1 = ws_take(cur, sizeof(float) * M * nb);
  a->s2 = ws_take(cur, sizeof(float) * M * nb);
  a->asum = ws_take(cur, sizeof(float) * M * nb);
  a->qsum1 = ws_take(cur, sizeof(int32_t) * M * nb);
  a->qsum2 = ws_take(cur, sizeof(int32_t) * M * nb);
  a->qhalf1 = ws_take(cur, sizeof(int32_t) * M * 2 * nb);
  a->qhalf2 = ws_take(cur, sizeof(int32_t) * M * 2 * nb);
  a->q16 = ws_take(cur, sizeof(int16_t) * M * K);
}

static size_t qact_bytes(int M, int K) {
  return 4 * (size_t)M * K + 9 * sizeof(float) * M * (K / TP_GROUP) + 10 * 64;
}

/* x [M][K] quantized for weight w: an I8 weight of group 16 also needs the 16-halves' code sums */
static void quant_for(const tp_weight *w, const float *x, int M, int K, int levels, tp_qact *a) {
  if (w->kind == TP_W_I8 && w->group == 16)
    tp_quant_act_halves(x, M, K, levels, a);
  else
    tp_quant_act(x, M, K, levels, a);
}

/* h [T][hidden] += a W, or += rmsnorm(a W) with a post-norm (x: scratch of [T][hidden]) */
static void residual_add(const tp_model *m, const tp_weight *w, const tp_qact *a, const float *post_norm, float *h,
                         float *x, int T) {
  const int Hd = m->hidden;
  if (!post_norm) {
    tp_gemm(w, a, h, Hd, 1);
    return;
  }
  tp_gemm(w, a, x, Hd, 0);
  tp_rmsnorm(x, post_norm, m->eps, x, T, Hd); /* in place: each row's sum is taken before it is written */
  for (size_t i = 0; i < (size_t)T * Hd; i++) h[i] += x[i];
}

/* every value the kernels use as an address, checked before anything is read or written */
static int check_step(const tp_model *m, const tp_step *s) {
  if (s->T < 1 || s->S < 1 || s->S > s->T || s->MB < 1) return TP_E_SHAPE;
  const int64_t slots = (int64_t)m->num_blocks * m->block_size;
  for (int t = 0; t < s->T; t++) {
    if (s->input_ids[t] < 0 || s->input_ids[t] >= m->vocab) return TP_E_VOCAB;
    if (s->positions[t] < 0 || s->positions[t] >= m->max_positions) return TP_E_POSITION;
    if (s->slot_mapping[t] < 0 || s->slot_mapping[t] >= slots) return TP_E_POOL;
  }
  if (s->query_start_loc[0] != 0 || s->query_start_loc[s->S] != s->T) return TP_E_QUERY_LOC;
  for (int i = 0; i < s->S; i++) {
    const int64_t n = s->query_start_loc[i + 1] - s->query_start_loc[i], ctx = s->context_lens[i];
    if (n < 1) return TP_E_QUERY_LOC;
    if (ctx < n || ctx > m->max_positions) return TP_E_CONTEXT;
    const int64_t need = (ctx + m->block_size - 1) / m->block_size;
    if (need > s->MB) return TP_E_POOL;
    for (int64_t b = 0; b < need; b++) {
      const int64_t id = s->block_tables[(size_t)i * s->MB + b];
      if (id < 0 || id >= m->num_blocks) return TP_E_POOL;
    }
  }
  const int site_levels[3] = {s->levels_attention, s->levels_mlp, s->levels_head};
  for (int i = 0; i < 3; i++)
    if (site_levels[i] != 1 && site_levels[i] != 2) return TP_E_LEVELS;
  return 0;
}

int tp_forward_rows(const tp_model *m, const tp_step *s, tp_workspace *ws, int num_logits,
                    const int64_t *logit_indices, float *logits) {
  if (!ws) return TP_E_NOMEM;
  int rc = check_step(m, s);
  if (rc) return rc;
  if (num_logits < 0 || num_logits > s->T) return TP_E_LOGIT_ROW;
  for (int i = 0; i < num_logits; i++)
    if (logit_indices[i] < 0 || logit_indices[i] >= s->T) return TP_E_LOGIT_ROW;
  const int T = s->T, S = s->S, NL = num_logits;
  const int Hd = m->hidden, D = m->head_dim, H = m->num_heads, KVH = m->num_kv_heads;
  const int F = m->ffn, nqkv = (H + 2 * KVH) * D;
  const int kmax = Hd > F ? Hd : F;
  size_t need = sizeof(float) * ((size_t)T * (2 * Hd + nqkv + H * D + 2 * F + F) + (size_t)NL * 2 * Hd) +
                qact_bytes(T, kmax) + 16 * 64;
  if (need > ws->cap) {
    free(ws->base);
    ws->base = aligned_alloc(64, (need + 63) & ~(size_t)63);
    ws->cap = ws->base ? need : 0;
    if (!ws->base) return TP_E_NOMEM;
  }
  char *cur = ws->base;
  float *h = ws_take(&cur, sizeof(float) * T * Hd), *x = ws_take(&cur, sizeof(float) * T * Hd);
  float *qkv = ws_take(&cur, sizeof(float) * T * nqkv), *att = ws_take(&cur, sizeof(float) * T * H * D);
  float *gu = ws_take(&cur, sizeof(float) * T * 2 * F), *act = ws_take(&cur, sizeof(float) * T * F);
  float *hl = ws_take(&cur, sizeof(float) * NL * Hd), *xl = ws_take(&cur, sizeof(float) * NL * Hd);
  tp_qact qa;
  qact_take(&cur, &qa, T, kmax);

  tp_embed_q8(&m->embed, s->input_ids, T, h);
  if (m->embed_scale != 1.f)
    for (size_t i = 0; i < (size_t)T * Hd; i++) h[i] *= m->embed_scale;
  for (int l = 0; l < m->num_layers; l++) {
    const tp_layer *L = &m->layers[l];
    tp_rmsnorm(h, L->attn_norm, m->eps, x, T, Hd);
    quant_for(&L->qkv, x, T, Hd, s->levels_attention, &qa);
    tp_gemm(&L->qkv, &qa, qkv, nqkv, 0);
    if (L->q_norm) tp_head_rmsnorm(qkv, nqkv, T, H, D, L->q_norm, m->eps);
    if (L->k_norm) tp_head_rmsnorm(qkv + H * D, nqkv, T, KVH, D, L->k_norm, m->eps);
    tp_rope(qkv, nqkv, T, H + KVH, D, s->positions, L->rope_cos, L->rope_sin); /* q heads, then k heads */
    tp_kv_write(&L->kv, qkv + H * D, qkv + (H + KVH) * D, nqkv, s->slot_mapping, T, KVH, m->num_blocks,
                m->block_size, D);
    if (tp_attention(qkv, nqkv, &L->kv, s->block_tables, s->MB, s->context_lens, s->query_start_loc, S, H, KVH,
                     m->num_blocks, m->block_size, D, m->scale, L->sliding_window, att, ws))
      return TP_E_NOMEM;
    quant_for(&L->o, att, T, H * D, s->levels_attention, &qa);
    residual_add(m, &L->o, &qa, L->post_attn_norm, h, x, T);
    tp_rmsnorm(h, L->mlp_norm, m->eps, x, T, Hd);
    quant_for(&L->gate_up, x, T, Hd, s->levels_mlp, &qa);
    tp_gemm(&L->gate_up, &qa, gu, 2 * F, 0);
    if (m->activation == TP_ACT_GELU_TANH)
      tp_gelu_tanh_mul(gu, act, T, F);
    else
      tp_silu_mul(gu, act, T, F);
    quant_for(&L->down, act, T, F, s->levels_mlp, &qa);
    residual_add(m, &L->down, &qa, L->post_mlp_norm, h, x, T);
  }
  for (int i = 0; i < NL; i++) memcpy(hl + (size_t)i * Hd, h + (size_t)logit_indices[i] * Hd, sizeof(float) * Hd);
  tp_rmsnorm(hl, m->final_norm, m->eps, xl, NL, Hd);
  quant_for(&m->head, xl, NL, Hd, s->levels_head, &qa);
  tp_gemm(&m->head, &qa, logits, m->vocab, 0);
  if (m->final_softcap > 0.f)
    for (size_t i = 0; i < (size_t)NL * m->vocab; i++) logits[i] = m->final_softcap * tanhf(logits[i] / m->final_softcap);
  return 0;
}

int tp_forward(const tp_model *m, const tp_step *s, tp_workspace *ws, float *logits) {
  return tp_forward_rows(m, s, ws, s->S, s->last_token_indices, logits);
}

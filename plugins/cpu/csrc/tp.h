/* trtpipe host CPU kernels: shared declarations.
 *
 * Compiled per target ISA by plugins/cpu/compile.py into one shared library: TP_ISA_AVX512
 * (AVX-512 F/BW/VL + VNNI + F16C) or TP_ISA_AVX2 (AVX2 + FMA + F16C). The NumPy references the
 * tests hold these kernels to are in plugins/cpu/reference.py.
 *
 * Weight layouts (built in NumPy by plugins/cpu/layout.py; a "tile" = 16 consecutive output rows):
 *
 *   Q4 (blockwise 4-bit, group 32, w[n,k] = d[n,b] * q[n,k] + m[n,b], q in 0..15: GGUF Q4_1):
 *     codes  [N/16][K/8][16 rows][4 bytes]  byte i of row r in k-group g: low nibble q[r][8g+i],
 *                                           high nibble q[r][8g+4+i]
 *     d, m   [N/16][K/32][16] fp16          per tile, per block, the 16 rows' scale and minimum
 *   Q8 (blockwise 8-bit, group 32, w[n,k] = d[n,b] * (u[n,k] - 128), u in 0..255: GGUF Q8_0):
 *     codes  [N/16][K/4][16 rows][4 bytes]  u[r][4j + i]
 *     d      [N/16][K/32][16] fp16
 *   I8 (GGUF's kernel form, plugins/core/gguf_blocks: int8 codes c, fp32 scale s and offset o per
 *       group of G = 32 or 16 along K, w[n,k] = (s[n,g] * c[n,k]) + o[n,g], g = k / G; every GGUF
 *       block type read exactly: Q4_0..Q8_0 and Q4_K, Q5_K as G = 32, Q6_K as G = 16):
 *     codes  [N/16][K/4][16 rows][4 bytes]  u = c + 128, as Q8
 *     scale  [N/16][K/G][16] fp32           (k-quant scales d * sc need fp32)
 *     offset [N/16][K/G][16] fp32, or NULL: every offset -0.0 (a symmetric type: no asum term);
 *                                           G = 16 needs NULL (its activations have no per-16 asum)
 *   Per 32-block the I8 GEMM adds t * s (G = 16: each half's dots times its own s), then o * asum.
 *
 * Activations of a GEMM are quantized per 32-block to int8, in one or two levels:
 *   x[k] ~ s1 * q1[k] + s2 * q2[k],  s1 = max|x| / 127, q2 quantizes the residual x - s1 q1.
 * Two levels keep ~15 bits (relative error ~1e-5 of the block maximum), one level ~8 bits.
 * A library built with the int16 form (TP_ACT_I16: tp_act_form() "int16", the AVX2 default,
 * plugins/cpu/isa.py) runs levels = 2 as one int16 level instead, the same ~15 bits in one pass
 * (vpmaddwd): x[k] ~ s1 * q16[k], s1 = max|x| / 32767, q16 = rint(x / s1) (q1, q2, s2 unused).
 * q16 holds each 4-group of k in the order (0, 2, 1, 3), the pairs vpmaddwd multiplies (gemm.c).
 * The sum over a block of x itself (asum) stays fp32, so the Q4 minimum term m * sum(x) is exact.
 * Integer dot products are exact; scales and sums are fp32.
 */
#ifndef TP_H
#define TP_H

#include <stddef.h>
#include <stdint.h>

/* The ABI: this header is its one description. plugins/cpu/abi.py reads the structs, enums and
 * prototypes below into ctypes; tp_abi_version() and tp_struct_size() let the loader refuse a
 * library of another ABI. Bump TP_ABI_VERSION with any change to a struct or a prototype. */
#define TP_ABI_VERSION 5

#define TP_GROUP 32 /* weights per block along K */
#define TP_TILE 16  /* output rows per tile */

#ifdef __cplusplus
extern "C" {
#endif

/* one GEMM's quantized activations: M rows of K values (buffers owned by the caller) */
typedef struct {
  int M, K, levels;
  int8_t *q1, *q2;        /* [M][K] */
  float *s1, *s2, *asum;  /* [M][K/32] */
  int32_t *qsum1, *qsum2; /* [M][K/32]: sum of q1 (q2) over each block (the Q8 offset term) */
  /* [M][K/16]: sum of q1 (q2) over each 16-half of a block, written by tp_quant_act_halves only:
   * read by I8 weights of group 16 where the ISA's dot needs the offset term (AVX-512) */
  int32_t *qhalf1, *qhalf2;
  int16_t *q16; /* [M][K]: levels = 2 in the int16 form (above), each 4-group of k as (0, 2, 1, 3) */
} tp_qact;

enum { TP_W_Q4 = 1, TP_W_Q8 = 2, TP_W_I8 = 3 };

typedef struct {
  int kind, N, K;
  const uint8_t *codes;
  const uint16_t *d, *m;       /* Q4, Q8: fp16 scales (and Q4 minimums; NULL for Q8); NULL for I8 */
  int group;                   /* I8: weights per scale along K, 32 or 16 (unused by Q4, Q8) */
  const float *scale, *offset; /* I8: fp32 [N/16][K/group][16]; offset NULL when symmetric */
} tp_weight;

/* KV pool dtypes (plugins/core/kv_codec.py defines the encodings): fp32; fp16 (IEEE half) and
 * bf16 (top half of fp32) as 16-bit patterns, rounded to nearest even; int8 symmetric with one
 * fp32 scale per token and kv head (scale = max|x| / 127, q = rint(x * (127 / max|x|))). */
enum { TP_KV_F32 = 0, TP_KV_F16 = 1, TP_KV_BF16 = 2, TP_KV_I8 = 3 };
static inline size_t tp_kv_elem_bytes(int dtype) { return dtype == TP_KV_F32 ? 4 : dtype == TP_KV_I8 ? 1 : 2; }

/* one layer's pool: K and V [KVH][NB][BS][D] of the dtype, head-major; for int8 the scales
 * [KVH][NB][BS] fp32 (NULL otherwise) */
typedef struct {
  int dtype;
  void *k, *v;
  float *k_scale, *v_scale;
} tp_kv;

/* One decoder layer, its structure from the model's description (runtime ModelConfig): the norms
 * it has (NULL: absent), its window and its RoPE tables. Norm weights are stored with the model's
 * norm_weight_offset added (Gemma's 1 + w), so every RMSNorm here is y = w * x / rms(x). */
typedef struct {
  const float *attn_norm, *mlp_norm;           /* [hidden]: before attention, before the MLP */
  const float *post_attn_norm, *post_mlp_norm; /* [hidden] or NULL: on the attention / MLP output
                                                * before the residual add (Gemma's sandwich) */
  const float *q_norm, *k_norm;                /* [head_dim] or NULL: QK-norm of each head, before RoPE */
  tp_weight qkv;                               /* N = (H + 2 KVH) * D: q rows, then k, then v */
  tp_weight o;                                 /* N = hidden, K = H * D */
  tp_weight gate_up;                           /* N = 2F: gate rows, then up */
  tp_weight down;                              /* N = hidden, K = F */
  tp_kv kv;                                    /* this layer's paged KV pool */
  int sliding_window;                          /* 0: full attention; W: keys p - W < j <= p */
  const float *rope_cos, *rope_sin;            /* [max_positions][D] of this layer's RoPE base */
} tp_layer;

/* the gated MLP's activation: down(act(gate) * up) */
enum { TP_ACT_SILU = 0, TP_ACT_GELU_TANH = 1 };

typedef struct {
  int num_layers, hidden, num_heads, num_kv_heads, head_dim, ffn, vocab;
  int num_blocks, block_size, max_positions;
  int activation;     /* TP_ACT_* */
  float eps, scale;   /* RMSNorm epsilon; softmax scale on q.k */
  float embed_scale;  /* token embeddings times this (Gemma: sqrt(hidden)); 1: none */
  float final_softcap; /* logits = c tanh(logits / c); 0: none */
  tp_weight embed;    /* Q8 [vocab][hidden]: rows gathered and dequantized */
  const float *final_norm;
  tp_weight head;     /* [vocab][hidden] */
  const tp_layer *layers;
} tp_model;

typedef struct {
  int T, S, MB;
  const int64_t *input_ids, *positions, *slot_mapping; /* [T] */
  const int64_t *block_tables;                          /* [S][MB] */
  const int64_t *context_lens;                          /* [S]: tokens in the pool after this step */
  const int64_t *query_start_loc;                       /* [S+1] */
  const int64_t *last_token_indices;                    /* [S] */
  /* int8 activation levels (1 or 2) per GEMM site: the attention projections (QKV and output),
   * the MLP (gate/up and down) and the LM head */
  int levels_attention, levels_mlp, levels_head;
} tp_step;

/* one engine's scratch (the forward's activations, attention's partials), grown on demand; steps
 * that share one must be sequential. Opaque: its layout is private to the library. */
typedef struct tp_workspace tp_workspace;

int tp_abi_version(void);
/* sizeof the named ABI struct ("tp_model", "tp_step", ...), 0 for a name it does not know */
size_t tp_struct_size(const char *name);
tp_workspace *tp_workspace_new(void); /* NULL when out of memory */
void tp_workspace_free(tp_workspace *ws);

void tp_set_threads(int n);
int tp_get_threads(void);
const char *tp_isa(void);
/* how levels = 2 is held: "int8x2" (two int8 levels) or "int16" (one int16 level, TP_ACT_I16) */
const char *tp_act_form(void);

/* a tp_qact for M rows of K (in the int16 form, levels = 2 writes q16, s1, asum and the code sums) */
void tp_quant_act(const float *x, int M, int K, int levels, tp_qact *a);
/* tp_quant_act, plus a->qhalf1 (and qhalf2 for two levels): what an I8 weight of group 16 needs */
void tp_quant_act_halves(const float *x, int M, int K, int levels, tp_qact *a);
/* y [M][N] (+)= x @ W^T: a holds x quantized (tp_quant_act) */
void tp_gemm(const tp_weight *w, const tp_qact *a, float *y, int ldy, int accumulate);

void tp_rmsnorm(const float *x, const float *w, float eps, float *y, int M, int H);
void tp_rope(float *x, int ld, int T, int heads, int D, const int64_t *positions, const float *cos_t,
             const float *sin_t);
void tp_silu_mul(const float *gu, float *y, int M, int F);
/* y [M][F] = gelu_tanh(gate) * up of gu [M][2F] (gate, then up): GELU's tanh approximation */
void tp_gelu_tanh_mul(const float *gu, float *y, int M, int F);
/* RMSNorm of each of `heads` heads of D at the start of each of T rows of ld floats, in place */
void tp_head_rmsnorm(float *x, int ld, int T, int heads, int D, const float *w, float eps);
void tp_embed_q8(const tp_weight *table, const int64_t *ids, int T, float *h);

/* k, v rows of ld floats (KVH heads of D each) encoded in the pool's dtype and written at
 * slot_mapping into the head-major pool */
void tp_kv_write(const tp_kv *kv, const float *k, const float *v, int ld, const int64_t *slot_mapping, int T,
                 int KVH, int NB, int BS, int D);
/* causal GQA attention of q [T][ldq] (H heads of D) over the pool; out [T][H*D]; ws: the partials'
 * scratch (NULL: allocated for this call). The caller has checked the batch (tp_forward does:
 * query_start_loc, context lengths and block ids). Returns 0, or -1 out of memory */
int tp_attention(const float *q, int ldq, const tp_kv *kv, const int64_t *block_tables, int MB,
                 const int64_t *context_lens, const int64_t *query_start_loc, int S, int H, int KVH, int NB, int BS,
                 int D, float scale, int W, float *out, tp_workspace *ws);

/* the whole forward of one step: logits [S][vocab] of each sequence's last token, scratch from ws.
 * Every value of the step is checked before anything is read or written (the caller checks the
 * arrays' lengths: T, S, S + 1, [S][MB]). Returns 0, or a negative code (TP_E_*). */
enum {
  TP_E_NOMEM = -1,     /* out of memory for the step's scratch */
  TP_E_POSITION = -2,  /* a position outside the rotary table [0, max_positions) */
  TP_E_POOL = -3,      /* a slot or block id outside the pool, or a context longer than its block table */
  TP_E_VOCAB = -4,     /* an input id outside the vocabulary */
  TP_E_LOGIT_ROW = -5, /* a logits row index outside [0, T) */
  TP_E_LEVELS = -6,    /* an activation level that is not 1 or 2 */
  TP_E_SHAPE = -7,     /* T, S or MB out of range (T >= 1, 1 <= S <= T, MB >= 1) */
  TP_E_QUERY_LOC = -8, /* query_start_loc not 0 = q[0] < q[1] < ... < q[S] = T */
  TP_E_CONTEXT = -9    /* a context length shorter than its query tokens or past max_positions */
};
int tp_forward(const tp_model *m, const tp_step *s, tp_workspace *ws, float *logits);
/* the same forward with logits [num_logits][vocab] of the packed rows logit_indices[0..num_logits)
 * (any count, independent of S: a speculative verify chunk needs every position's logits);
 * tp_forward is this with (S, last_token_indices). */
int tp_forward_rows(const tp_model *m, const tp_step *s, tp_workspace *ws, int num_logits,
                    const int64_t *logit_indices, float *logits);

#ifdef __cplusplus
}
#endif
#endif

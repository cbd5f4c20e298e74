/* Elementwise pieces of the Llama forward: RMSNorm, rotary embedding, SiLU-gated product,
 * embedding-row gather. All fp32, following Hugging Face's LlamaRMSNorm / apply_rotary_pos_emb. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>

#include "tp.h"
#include "vmath.h"

void tp_rmsnorm(const float *x, const float *w, float eps, float *y, int M, int H) {
#pragma omp parallel for schedule(static) if (M > 8)
  for (int m = 0; m < M; m++) {
    const float *xr = x + (size_t)m * H;
    float *yr = y + (size_t)m * H;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < H; i++) ss += xr[i] * xr[i];
    const float r = 1.f / sqrtf(ss / (float)H + eps);
    for (int i = 0; i < H; i++) yr[i] = w[i] * (xr[i] * r);
  }
}

/* x*cos + rotate_half(x)*sin for `heads` heads of D at the start of each row of ld floats */
void tp_rope(float *x, int ld, int T, int heads, int D, const int64_t *positions, const float *cos_t,
             const float *sin_t) {
  const int half = D / 2;
#pragma omp parallel for schedule(static) if (T > 8)
  for (int t = 0; t < T; t++) {
    const float *c = cos_t + (size_t)positions[t] * D, *s = sin_t + (size_t)positions[t] * D;
    for (int h = 0; h < heads; h++) {
      float *v = x + (size_t)t * ld + (size_t)h * D;
      for (int i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

void tp_silu_mul(const float *gu, float *y, int M, int F) {
#pragma omp parallel for schedule(static) if (M > 8)
  for (int m = 0; m < M; m++) {
    const float *g = gu + (size_t)m * 2 * F, *u = g + F;
    float *yr = y + (size_t)m * F;
    int i = 0;
    for (; i + VL <= F; i += VL) {
      const fv gv = FV_LOAD(g + i);
      const fv e = tp_vexp(FV_SUB(FV_ZERO(), gv));
      FV_STORE(yr + i, FV_MUL(FV_DIV(gv, FV_ADD(FV_SET1(1.f), e)), FV_LOAD(u + i)));
    }
    for (; i < F; i++) yr[i] = g[i] / (1.f + expf(-g[i])) * u[i];
  }
}

/* rows ids[t] of a Q8 table (tiled layout, tp.h), dequantized: h[t][k] = d * (u - 128) */
void tp_embed_q8(const tp_weight *table, const int64_t *ids, int T, float *h) {
  const int K = table->K, nb = K / TP_GROUP;
  for (int t = 0; t < T; t++) {
    const int64_t n = ids[t];
    const size_t tile = (size_t)(n / TP_TILE), r = (size_t)(n % TP_TILE);
    const uint8_t *c = table->codes + tile * (size_t)K * TP_TILE;
    const uint16_t *d = table->d + tile * (size_t)nb * TP_TILE;
    for (int k = 0; k < K; k++) {
      const float dk = _cvtsh_ss(d[(k / TP_GROUP) * TP_TILE + r]);
      h[(size_t)t * K + k] = dk * (float)((int)c[((size_t)(k / 4) * TP_TILE + r) * 4 + k % 4] - 128);
    }
  }
}

/* gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), tanh(y) = 1 - 2 / (1 + e^(2y)):
 * e^(2y) overflows to +inf for large y (tanh -> 1) and underflows to 0 for very negative y (-> -1).
 * Hugging Face's GELUTanh / torch's gelu(approximate="tanh"), within a few fp32 ulps. */
void tp_gelu_tanh_mul(const float *gu, float *y, int M, int F) {
  const float c = 0.7978845608028654f, k = 0.044715f;
#pragma omp parallel for schedule(static) if (M > 8)
  for (int m = 0; m < M; m++) {
    const float *g = gu + (size_t)m * 2 * F, *u = g + F;
    float *yr = y + (size_t)m * F;
    int i = 0;
    for (; i + VL <= F; i += VL) {
      const fv gv = FV_LOAD(g + i);
      const fv inner = FV_MUL(FV_SET1(c), FV_ADD(gv, FV_MUL(FV_SET1(k), FV_MUL(gv, FV_MUL(gv, gv)))));
      const fv e = tp_vexp(FV_ADD(inner, inner));
      const fv th = FV_SUB(FV_SET1(1.f), FV_DIV(FV_SET1(2.f), FV_ADD(FV_SET1(1.f), e)));
      const fv gelu = FV_MUL(FV_MUL(FV_SET1(0.5f), gv), FV_ADD(FV_SET1(1.f), th));
      FV_STORE(yr + i, FV_MUL(gelu, FV_LOAD(u + i)));
    }
    for (; i < F; i++) {
      const float x = g[i], inner = c * (x + k * x * x * x);
      yr[i] = 0.5f * x * (1.f + tanhf(inner)) * u[i];
    }
  }
}

void tp_head_rmsnorm(float *x, int ld, int T, int heads, int D, const float *w, float eps) {
#pragma omp parallel for schedule(static) if (T > 8)
  for (int t = 0; t < T; t++)
    for (int h = 0; h < heads; h++) {
      float *v = x + (size_t)t * ld + (size_t)h * D, ss = 0.f;
      for (int i = 0; i < D; i++) ss += v[i] * v[i];
      const float r = 1.f / sqrtf(ss / (float)D + eps);
      for (int i = 0; i < D; i++) v[i] = w[i] * (v[i] * r);
    }
}

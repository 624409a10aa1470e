/* fuseflow: the kernels of a Llama-family transformer, forward and backward, on a backend
 * stream (include/fuseflow/backend.h). Every backend implements all of them; the CPU one
 * (kernels/cpu/) is the reference the others are tested against.
 *
 * Conventions:
 * - Matrices are row-major. A "[T, N] ld" operand has T rows of N used elements, row r
 *   starting at element r * ld (ld >= N), so a kernel can work on a column block of a wider
 *   matrix (the q, k, v parts of a fused qkv activation).
 * - Tensors are fp32 unless marked i32 or bf16 (an inference model's weights, a bf16 KV
 *   cache). Every pointer is an ff_dptr into device memory.
 * - Gradient outputs marked "+=" accumulate (gradient accumulation across micro-batches and
 *   the residual stream); outputs marked "=" are overwritten.
 * - Kernels do not allocate and do not fail; misuse (bad sizes) asserts. Token ids are
 *   checked by the model on the host before they reach a kernel.
 * - Heads: query head h reads key/value head h / (n_heads / n_kv_heads), as Hugging Face's
 *   repeat_kv does. The attention scale is 1/sqrt(head_dim).
 */
#ifndef FUSEFLOW_KERNELS_H
#define FUSEFLOW_KERNELS_H

#include <stdint.h>

#include "fuseflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef enum { FF_NO_TRANS = 0, FF_TRANS = 1 } ff_trans;

/* C[M, N] = alpha * op(A) @ op(B) + beta * C (cblas_sgemm semantics, row-major).
 * op(A) is [M, K] (A stored [M, K] lda, or [K, M] lda when ta == FF_TRANS); op(B) is
 * [K, N] (B stored [K, N] ldb, or [N, K] ldb when tb == FF_TRANS). beta == 0 ignores C's
 * old contents (NaN-safe). */
void ff_gemm(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, int lda,
             ff_dptr B, int ldb, float beta, ff_dptr C, int ldc);

/* bf16 weights (an inference model's, ff_model_opts.bf16_weights): tensors marked bf16 hold
 * uint16_t elements, the upper halves of fp32s, converted as include/fuseflow/dtype.h does
 * (fp32 -> bf16 to nearest even, a NaN stays a NaN; bf16 -> fp32 exactly). */
/* C [M, N] ldc = A [M, K] lda @ W^T + beta C, W bf16 [N, K] ldw: a linear's forward on bf16
 * weights, fp32 activations in and out, fp32 accumulation (beta == 0 ignores C's contents).
 * CPU: every element is the fixed-order product of cpu_gemm_fixed.c over the weights widened
 * exactly to fp32, so it equals bit for bit that product on the rounded weights, and a row
 * depends on nothing but itself (batch invariant). CUDA: A is rounded to bf16 as well (tensor
 * cores). */
void ff_gemm_bf16w(ff_stream *s, int M, int N, int K, ff_dptr A, int lda, ff_dptr W, int ldw, float beta, ff_dptr C,
                   int ldc);
/* C [M, N] = alpha op(A) op(B) + beta C (as ff_gemm) as a bf16 product: a16 / b16 say that A / B
 * hold bf16 elements (ld in elements), and an fp32 operand is rounded to bf16 first, so every
 * backend sums bf16(a) bf16(b), widened exactly, in fp32 (each in its own order). What a
 * trainable model multiplies with when its backend's products are bf16
 * (ff_backend_bf16_products): its weights' bf16 copy, made once per forward, and a gradient
 * rounded once for the two products that read it (docs/model.md "bf16 products"). CPU: a plain
 * loop, for tests; the cpu backend's own products are fp32. */
void ff_gemm_bf16(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, float alpha, ff_dptr A, bool a16, int lda,
                  ff_dptr B, bool b16, int ldb, float beta, ff_dptr C, int ldc);
/* C16 bf16 [M, N] ldc = op(A) op(B) rounded to bf16: ff_gemm_bf16's fp32 sums (alpha 1, beta 0,
 * K >= 1), stored as bf16. A product whose output is kept in bf16 (gate|up's in a training
 * forward with bf16 products, docs/model.md "bf16 products"): cuBLAS writes it so, without an
 * fp32 pass over memory. */
void ff_gemm_bf16_out(ff_stream *s, ff_trans ta, ff_trans tb, int M, int N, int K, ff_dptr A, bool a16, int lda,
                      ff_dptr B, bool b16, int ldb, ff_dptr C16, int ldc);
/* ff_embedding_fwd from a bf16 table [V, H]: out [T, H] fp32, token -1 a zero row. */
void ff_embedding_fwd_bf16(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H);
/* dst bf16 [n] = src fp32 [n] rounded (ff_f32_to_bf16); and back, exactly. */
void ff_cast_f32_bf16(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n);
void ff_cast_bf16_f32(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n);

/* out[t, :] = table[tokens[t], :]. tokens i32 [T] (each in [0, V), or -1: a token outside
 * this table, e.g. another rank's vocabulary rows under tensor parallelism, gives a zero
 * row), table [V, H], out [T, H]. */
void ff_embedding_fwd(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H);
/* dtable[tokens[t], :] += dout[t, :] (nothing for token -1). dout [T, H], dtable [V, H] +=.
 * Deterministic (no atomics: threads own column blocks). */
void ff_embedding_bwd(ff_stream *s, ff_dptr tokens, ff_dptr dout, ff_dptr dtable, int T, int H);

/* RMSNorm (Llama): rstd[t] = 1 / sqrt(mean_j x[t, j]^2 + eps); out = x * rstd * w.
 * x [T, H], w [H], out [T, H] (may not alias x), rstd [T] (saved for backward). */
void ff_rmsnorm_fwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, int T, int H, float eps);
/* Backward of ff_rmsnorm_fwd given dout [T, H]: dx [T, H] +=, dw [H] +=. */
void ff_rmsnorm_bwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr rstd, ff_dptr dout, ff_dptr dx, ff_dptr dw, int T,
                    int H);

/* Rotary embedding in place, Hugging Face's rotate_half layout: for head vector x of
 * head_dim D and i < D/2, with angle a = pos * inv_freq[i]:
 *   x[i]       <- x[i] cos a - x[i + D/2] sin a
 *   x[i + D/2] <- x[i + D/2] cos a + x[i] sin a
 * x [T, n_heads * D] ld; pos i32 [T]; cos, sin [max_pos, D/2] (tables the model fills from
 * rope_theta and rope scaling; every pos must be < max_pos). */
void ff_rope_fwd(ff_stream *s, ff_dptr x, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads,
                 int D);
/* Backward (the inverse rotation) in place on dx [T, n_heads * D] ld. */
void ff_rope_bwd(ff_stream *s, ff_dptr dx, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads,
                 int D);

/* x[t, :] += b for every row. x [T, N] ld, b [N]. */
void ff_bias_add(ff_stream *s, ff_dptr x, int ld, ff_dptr b, int T, int N);
/* db[:] += sum_t dy[t, :]. dy [T, N] ld, db [N] +=. */
void ff_bias_bwd(ff_stream *s, ff_dptr dy, int ld, ff_dptr db, int T, int N);

/* SwiGLU: h = silu(g) * u with silu(g) = g / (1 + exp(-g)). gu [T, 2 inter] holds g in columns
 * [0, inter) and u in [inter, 2 inter) (the fused gate|up projection); h [T, inter]. */
void ff_swiglu_fwd(ff_stream *s, ff_dptr gu, ff_dptr h, int T, int inter);
/* Backward: dgu [T, 2 inter] = (dg | du) given dh [T, inter]. dgu may alias gu (in place). */
void ff_swiglu_bwd(ff_stream *s, ff_dptr gu, ff_dptr dh, ff_dptr dgu, int T, int inter);
/* The same on bf16 storage: gu16 [T, 2 inter], h16 [T, inter], dh16 [T, inter] and dgu16
 * [T, 2 inter] hold bf16. Each computes in fp32 on the widened values and rounds its output
 * (dgu16 does not alias gu16). */
void ff_swiglu_fwd_bf16(ff_stream *s, ff_dptr gu16, ff_dptr h16, int T, int inter);
void ff_swiglu_bwd_bf16(ff_stream *s, ff_dptr gu16, ff_dptr dh16, ff_dptr dgu16, int T, int inter);

/* Causal grouped-query attention over packed variable-length sequences: token t of sequence
 * s (seq_start[s] <= t < seq_start[s+1]) attends to tokens seq_start[s] .. t only, never
 * across sequences.
 *   qkv [T, (Hq + 2 Hkv) D] ld: q in columns [0, Hq D), k in [Hq D, (Hq + Hkv) D), v after
 *   seq_start i32 [S + 1] (seq_start[0] = 0, seq_start[S] = T, non-decreasing)
 *   out [T, Hq D] (row stride Hq D), lse [T, Hq] (log-sum-exp of the scaled scores; saved) */
void ff_attention_fwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv, int D,
                      ff_dptr out, ff_dptr lse);
/* Backward of ff_attention_fwd given dout [T, Hq D]: dqkv [T, (Hq + 2 Hkv) D] ld (=, all
 * three parts written). delta [T, Hq] is workspace. seq_start_host mirrors seq_start on the
 * host ([S + 1]; kernels use it to schedule work, never to read tensors). */
void ff_attention_bwd(ff_stream *s, ff_dptr qkv, int ld, ff_dptr seq_start, const int32_t *seq_start_host, int S,
                      int T, int Hq, int Hkv, int D, ff_dptr out, ff_dptr lse, ff_dptr dout, ff_dptr delta,
                      ff_dptr dqkv);
/* The same on bf16 storage (a training forward's kept activations under bf16 products):
 * qkv16 [T, (Hq + 2 Hkv) D] ld, out16 and dout16 [T, Hq D] hold bf16. Each computes what the
 * fp32 kernel computes on the widened values (scores, softmax and sums in fp32); the forward
 * rounds out16 from its fp32 result, lse stays fp32. The backward reads qkv16 and out16 as the
 * forward left them; delta and dqkv are fp32. */
void ff_attention_fwd_bf16(ff_stream *s, ff_dptr qkv16, int ld, ff_dptr seq_start, int S, int T, int Hq, int Hkv, int D,
                           ff_dptr out16, ff_dptr lse);
void ff_attention_bwd_bf16(ff_stream *s, ff_dptr qkv16, int ld, ff_dptr seq_start, const int32_t *seq_start_host, int S,
                           int T, int Hq, int Hkv, int D, ff_dptr out16, ff_dptr lse, ff_dptr dout16, ff_dptr delta,
                           ff_dptr dqkv);

/* Attention of T query tokens against a paged KV cache (inference; no backward). The cache
 * is blocks of block_rows rows; position r of sequence s lives in cache row
 *   table[s * table_ld + r / block_rows] * block_rows + r % block_rows,
 * so sequences may share blocks (a common prompt) and grow block by block. Query token t
 * belongs to sequence seq[t] and attends to its positions 0 .. n_keys[t] - 1. One block of
 * max_seq rows per sequence (table_ld 1) is the contiguous, slot-per-sequence cache.
 *   q [T, Hq D] ldq; kcache, vcache [blocks * block_rows, Hkv D]; table i32 [S, table_ld];
 *   seq i32 [T] in [0, S); n_keys i32 [T] in [1, table_ld * block_rows]; out [T, Hq D] */
void ff_attention_cached(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                         int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                         ff_dptr out);
/* The same against a cache held in bf16 (ff_generator_config.kv_bf16): kcache, vcache bf16
 * [blocks * block_rows, Hkv D], widened exactly where they are read; the rest as above. */
void ff_attention_cached_bf16(ff_stream *s, ff_dptr q, int ldq, ff_dptr kcache, ff_dptr vcache, ff_dptr table, int S,
                              int table_ld, int block_rows, ff_dptr seq, ff_dptr n_keys, int T, int Hq, int Hkv, int D,
                              ff_dptr out);
/* Scatter rows: dst[rows[t], :] = src[t, :]. src [T, N] lds, dst [*, N], rows i32 [T]. */
void ff_scatter_rows(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N);
/* The same into bf16 rows, rounded (ff_f32_to_bf16): dst bf16 [*, N]. */
void ff_scatter_rows_bf16(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N);
/* Gather rows: dst[r, :] = src[rows[r], :]. src [*, N], rows i32 [R], dst [R, N]. */
void ff_gather_rows(ff_stream *s, ff_dptr src, ff_dptr rows, ff_dptr dst, int R, int N);

/* Per-token log-probs and entropy of softmax(logits * inv_temp):
 *   logits [T, V]; targets i32 [T] (-1: no target, logprob 0; -2: a target outside these V
 *   columns, another rank's vocabulary shard under tensor parallelism, logprob 0) or null;
 *   logprob [T] = log p[targets[t]] (or null), entropy [T] = -sum_v p log p (or null),
 *   lse [T] = logsumexp(logits * inv_temp) (saved for backward). */
void ff_logprob_fwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr logprob,
                    ff_dptr entropy, ff_dptr lse);
/* Backward into the logits, in place: logits [T, V] becomes dlogits [T, V] given
 * dlogprob [T] (or null) and dentropy [T] (or null; then entropy may be null too, else
 * entropy [T] from the forward). Rows with target -1 get no logprob gradient; rows with
 * target -2 get its -p part without the one-hot term (the target is in another shard).
 * lse and entropy may be those of a wider softmax than these V columns (the whole
 * vocabulary under tensor parallelism): dlogits is then this shard's part of its gradient. */
void ff_logprob_bwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                    ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy);
/* The same, dlogits rounded to bf16 and left in place in the first half of each fp32 row's
 * bytes: a bf16 matrix [T, V] with ld 2V elements, each element the fp32 result's rounding. For
 * the LM head's two backward products under bf16 products, which read it as it is (rounding
 * the fp32 dlogits in each product passes over [T, V] twice more). */
void ff_logprob_bwd_bf16(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                         ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy);

/* Elementwise: y[i] += x[i] (n elements). */
void ff_add(ff_stream *s, ff_dptr y, ff_dptr x, int64_t n);
/* x[i] *= alpha. */
void ff_scale(ff_stream *s, ff_dptr x, int64_t n, float alpha);
/* sum_i x[i]^2 accumulated in double; waits for the stream (a host value). NaN when the
 * kernel could not run (then ff_stream_sync says why). */
double ff_sumsq(ff_stream *s, ff_dptr x, int64_t n);

/* One AdamW update (PyTorch's torch.optim.AdamW, decoupled weight decay) of n parameters:
 *   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr * weight_decay * p
 *   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)        with bc1 = 1 - b1^t, bc2 = 1 - b2^t
 * param, m, v [n] updated; grad [n] read. */
void ff_adamw(ff_stream *s, ff_dptr param, ff_dptr grad, ff_dptr m, ff_dptr v, int64_t n, float lr, float b1,
              float b2, float eps, float weight_decay, float bc1, float bc2, float grad_scale);

/* Sampling, one row of logits [B, V] per sequence. Per row, params[b] (device memory):
 * temperature 0 picks the argmax (lowest id on ties). Otherwise p = softmax(logits / temp),
 * keep the top_k most likely tokens (top_k 0: all), then the smallest set of the most
 * likely tokens whose probability sums to >= top_p (top_p >= 1: all; the most likely token
 * always stays; ties in probability: lower id first), renormalise, and pick by inverse CDF
 * with `uniform` in [0, 1) over the kept tokens in increasing id (so no sort is needed
 * without top-k/top-p).
 * tokens i32 [B] = the pick; logprob [B] = its log-prob under the distribution that
 * logprob_mode names (ff_logprob_mode in include/fuseflow/model.h). */
typedef struct ff_sample_params {
    float temperature;
    float top_p;
    int32_t top_k;
    int32_t logprob_mode; /* 0 model (temperature 1), 1 temperature-scaled, 2 sampler */
    float uniform;        /* the random draw, in [0, 1), from the caller's seeded RNG */
} ff_sample_params;
/* params: ff_sample_params [B]; workspace: B * V floats + B * V i32 (the CPU backend sorts
 * there). */
void ff_sample(ff_stream *s, ff_dptr logits, int B, int V, ff_dptr params, ff_dptr workspace, ff_dptr tokens,
               ff_dptr logprob);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

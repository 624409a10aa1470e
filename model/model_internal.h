/* Inside the model library (model/ except model/io/): the model struct, shared by the
 * forward/backward code (model.c), the optimizer (optim.c) and generation (generate.c),
 * and the one decoder-layer forward both of them run (layer.c). */
#ifndef FF_MODEL_INTERNAL_H
#define FF_MODEL_INTERNAL_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/backend.h"
#include "fuseflow/kernels.h"
#include "fuseflow/model.h"

/* A view model's (ff_model_opts.view_of, model/view.c) piece of one tensor: units [lo, hi)
 * of the tensor along its TP axis, in this model's coordinates (rows for axis 0, columns for
 * axis 1, the whole tensor as the one unit of axis -1), stored row-major with row stride ld
 * from element off of buf: the viewed model's parameter buffer (read in place), or NULL:
 * this model's own buffer of gathered pieces (m->params), which comes and goes with
 * ff_model_release_params / ff_model_restore_params. */
typedef struct ffm_piece {
    int64_t lo, hi;
    ff_buffer *buf;
    size_t off;
    int64_t ld;
} ffm_piece;
#define FFM_MAX_PIECES 3 /* the viewed interval splits a tensor into at most three */

/* One Hugging Face tensor inside the flat parameter buffer. */
typedef struct ff_param_tensor {
    char name[96];
    size_t off; /* element offset in the flat buffers */
    int ndim;
    int64_t shape[2];
    int64_t numel;
    bool is_norm; /* initialised to 1 */
    bool is_bias; /* initialised to 0 */
    /* tensor parallelism (model/tp.c): shape is this rank's shard of the Hugging Face tensor
     * full, rows (split 0) or columns (split 1) [start, start + shape[split]) of it, or all of
     * it (split -1). rep ranks hold the same shard: 1, tp for a whole tensor, tp / kv heads for
     * a replicated key/value head. Without TP: split -1, full = shape, rep 1. */
    int split;
    int64_t full[2];
    int64_t start;
    int rep;
    /* the dimension tensor parallelism splits (0 rows, 1 columns, -1 none), whatever this
     * model's TP, and the tensor's place in the whole model's Hugging Face order
     * (ff_model_tensor_info) */
    int axis;
    int gidx;
    /* pipeline: a copy of a tensor another stage owns (the last stage's tied LM head): out of
     * the gradient norm and of exports */
    bool copy;
    /* a view model: the tensor's pieces in ascending order, covering it (npc 0: an ordinary
     * model, the tensor at off of m->params); off is then only its place in the flat layout
     * that ff_model_read_params gives. view_lo/view_hi: the viewed units (equal: none). */
    ffm_piece pc[FFM_MAX_PIECES];
    int npc;
    int64_t view_lo, view_hi;
} ff_param_tensor;

/* Element offsets of one layer's parameters. q|k|v rows are contiguous (one fused
 * projection [QKV, H]), so are gate|up ([2I, H]) and the q|k|v biases. */
typedef struct ff_layer_params {
    size_t wqkv;  /* [QKV, H] */
    size_t wo;    /* [H, Hq D] */
    size_t wgu;   /* [2I, H] */
    size_t wdown; /* [H, I] */
    size_t bqkv;  /* [QKV] (attention_bias) */
    size_t ln1;   /* [H] */
    size_t ln2;   /* [H] */
    /* the layer's tensors in ff_model.tensors: input_layernorm, q_proj (k and v follow), the
     * q bias (k, v follow; -1 without attention_bias), o_proj, post_attention_layernorm,
     * gate_proj (up follows), down_proj */
    int t_ln1, t_q, t_bq, t_o, t_ln2, t_gate, t_down;
} ff_layer_params;

/* What one forward keeps on its own buffer (byte offsets into buf), for up to cap tokens: the
 * residual stream and n_slots layer slots. A kept set (a training forward's) has a slot per
 * layer of its chunk and separate residuals x -> y (n_slots + 1 of them), read by the
 * backward; otherwise one slot that every layer reuses and one residual updated in place.
 * A kept set can also host a forward that is not kept (it then uses slot 0 in place). With
 * head, room for the final norm and the heads' per-token statistics. Sets are pooled per
 * model (ff_model.acts) and taken by (chunk, micro) for a forward. */
#define FFM_FREE INT32_MIN /* micro of a set that holds no forward */
#define FFM_MAIN (-1)      /* micro of ff_model_forward's training forward */
typedef struct ffm_acts {
    ff_buffer *buf;
    int32_t cap;
    int32_t n_slots;
    bool kept, head;
    int32_t chunk, micro; /* the forward it holds; micro FFM_FREE: none */
    size_t resid, resid_stride;                                       /* [T, H] each (SP: [ceil(T/tp), H]) */
    size_t xn1, rstd1, qkv, att, lse, mid, xn2, rstd2, gu, hm, layer_stride; /* per layer slot (SP: mid as resid) */
    /* in16 (any set of a model whose forwards hold bf16 activations, ffm_act16): the slots xn1, xn2 [T, H], qkv
     * [T, QKV], att [T, Hq D], gu [T, 2I] and hm [T, I] hold bf16 and not fp32 (layer_acts gives
     * them as ffm_layer_acts' xn1_16 ...; the forward writes the norms' and q|k|v's fp32 outputs
     * into the backward's scratch, which is free then) */
    bool in16;
    size_t part;                                                      /* SP: [T, H] row-parallel partial sums */
    size_t xf, rstdf;                                                 /* head: [T, H], [T] */
    size_t tok_lse, logprob, entropy, values;                         /* head: [T] each */
    size_t tokens, targets, pos, seq_start;                           /* i32 [T], [T], [T], [T + 1] */
    int32_t *seq_start_host;                                          /* [cap + 1] */
    /* the training forward it holds (kept and micro != FFM_FREE) */
    int32_t T, S;
    bool lm, has_targets, has_entropy, has_values;
    int32_t lm_chunk;
    float inv_temp;
} ffm_acts;

/* The model's scratch, shared by its forwards and backwards, for up to cap tokens: the LM
 * head's logits [chunk, V] (a forward's stay there for its backward when nothing else wrote
 * them since: logits_of) and, for a trainable model, the backward's gradients. */
typedef struct ffm_scratch {
    ff_buffer *buf;
    int32_t cap;
    bool bwd;
    size_t logits;                            /* [chunk, V] */
    size_t dlogprob, dentropy, dvalues;       /* [T] each */
    size_t dres, dxn, dqkv, datt, delta, dgu, dh; /* backward */
    size_t dy16;                              /* bf16 products: [T, max(H, QKV, HD, 2I)] bf16 */
    bool p16;                                 /* laid out with dy16 */
    bool f16;                                 /* laid out with dxn and dqkv: a backward's, or a forward's fp32 forms (ffm_act16) */
    int32_t *pos_host;                        /* [cap] */
    const ffm_acts *logits_of;
} ffm_scratch;

struct ff_model {
    ff_backend *be;
    ff_stream *st;
    ff_model_config cfg;
    /* QKV = (Hq + 2 Hkv) D. Under tensor parallelism Hq, Hkv, I and V are this rank's share
     * (cfg has the whole model's): its query heads, key/value heads, intermediate rows and
     * vocabulary rows. */
    int H, Hq, Hkv, D, I, V, L, QKV;
    bool tied, bias, vhead, lm_head;
    bool inference; /* ff_model_opts.inference: grads is NULL, no training forward */
    /* ff_model_opts.bf16_weights (an inference model of its own): the parameter buffer holds
     * the weight matrices, elements [0, n_decay) of the flat layout, as bf16 (2 bytes each
     * from byte 0), and the norms and biases, [n_decay, n_params), as fp32 from byte
     * vec_base on (ffm_param, ffm_param16) */
    bool w16;
    size_t vec_base;
    /* bf16 products (ff_model_set_bf16_products; a trainable model's default on a backend whose
     * products are bf16): a forward rounds the weight matrices, [0, n_decay), into w16c where
     * the weights changed since it was made (params_gen), and while w16c_live (inside a forward
     * or backward, never generation's) every product of the layers and heads is ff_gemm_bf16
     * reading it; the backward rounds each output gradient once (the scratch's dy16) for its
     * two products */
    bool p16, w16c_live;
    ff_buffer *w16c; /* bf16 [n_decay], NULL until the first forward with p16 */
    /* params_gen: bumped by every write of the weights (ffm_params_written); w16c_gen: params_gen
     * + 1 as it was when w16c was made (0: not made since the buffer was); w16c_made: copies made */
    uint64_t params_gen, w16c_gen;
    int64_t w16c_made;
    /* buffers_moved: bumped each time params or w16c is made anew or given back
     * (ffm_buffers_moved). A decode graph holds their addresses (generate.c): every rank of a
     * group makes them at the same calls, so this count, unlike the addresses, moves alike on
     * every rank */
    uint64_t buffers_moved;

    ff_param_tensor *tensors; /* Hugging Face tensors, in expected order */
    int n_tensors;
    int64_t n_params;
    int64_t n_decay; /* parameters [0, n_decay) get weight decay, the rest (norms, biases) not */
    ff_buffer *params, *grads; /* [n_own] and [n_params] (grads NULL for inference) */
    float *host_params; /* [n_own] the host copy of a frozen model's weights (ff_model_params_to_host), or NULL */
    size_t off_embed, off_lm, off_norm, off_score;
    int t_embed, t_lm, t_norm, t_score; /* their places in tensors (-1: not held; tied: t_lm = t_embed) */
    /* a view model (ff_model_opts.view_of, model/view.c): its tensors are pieces, some read in
     * place from `viewed`'s parameter buffer, the rest (n_own floats) from its own params.
     * An ordinary model: n_own = n_params, every npc 0. */
    const ff_model *viewed;
    /* a view whose generation step reads its in-place pieces from the viewed model's bf16 copy
     * (ffm_view_bf16) */
    bool v16;
    int64_t n_own;
    int32_t *view_ids; /* [view_ids_cap] host staging of one piece's embedding ids */
    size_t view_ids_cap;
    ff_layer_params *layers; /* [L] */

    /* tensor parallelism (model/tp.c): tp ranks (1: none), this one tp_rank */
    int tp, tp_rank;
    ff_model_comm comm;
    int kv_rep;       /* ranks sharing each key/value head: tp / num_key_value_heads when larger, else 1 */
    int32_t q0, kv0;  /* this rank's first query head and key/value head */
    int32_t v0;       /* its first vocabulary row */
    float *tp_host;   /* [tp_host_cap] host staging of collectives, grown on demand */
    size_t tp_host_cap;
    int32_t *tp_ids;  /* [tp_ids_cap] token and target ids in this rank's vocabulary rows */
    size_t tp_ids_cap;
    ff_buffer *tp_dkv; /* [2 D H + 2 D] one layer's k|v weight and bias gradient (kv_rep > 1) */
    /* sequence parallelism (ff_model_opts.sequence_parallel, tp > 1): the residual stream,
     * the norms and the value head of a forward over T tokens hold this rank's rows of them
     * (ffm_sp_rows) */
    bool sp;
    size_t *sp_counts; /* [tp] elements per rank of the last ffm_sp_counts */
    /* [(2 L + 2) H] one backward's partial gradients of the sequence-parallel weights:
     * per layer ln1 | ln2, then the final norm and score (trainable SP models) */
    ff_buffer *sp_dw;

    ff_buffer *rope_cos, *rope_sin; /* [max_pos, D/2] each */
    int32_t max_pos;

    /* pipeline stage (ff_model_stage; a whole model: one chunk of all layers with both ends).
     * L above is the layers held; chunk c is local layers [chunk_l0[c], + chunk_nl[c]). */
    int n_chunks;
    int32_t *chunk_l0, *chunk_nl; /* [n_chunks] */
    int32_t *layer_global;        /* [L] each held layer's index in the whole model */
    bool has_embed, has_final;    /* the embedding (chunk 0), the final norm and heads (last chunk) */
    bool embed_copy;              /* tied embeddings: this last stage's LM head copies the first's */
    ff_model_comm pp;             /* the pipeline group (size 0 or 1: none) */

    ffm_acts **acts; /* [n_acts] the pool; pointers stay put when it grows */
    int n_acts, cap_acts;
    ffm_scratch sc;
    int32_t logits_chunk; /* 0: automatic */
};

/* Where one decoder layer's forward reads and writes (ffm_layer_forward), for T tokens.
 * The caller lays it out: training gives each layer its own activations, kept for the
 * backward, and a residual stream x -> mid -> y of separate buffers; scoring and
 * generation reuse one set for every layer and update the residual in place (mid == x,
 * y == x; xn1 may equal xn2 and rstd1 rstd2). */
typedef struct ffm_layer_acts {
    ff_dptr x;     /* [T, H] the layer's input (residual stream), read */
    ff_dptr xn1;   /* [T, H] input_layernorm(x) */
    ff_dptr rstd1; /* [T] its 1/rms */
    ff_dptr qkv;   /* [T, QKV] q|k|v (+ bias), q and k rotated */
    ff_dptr att;   /* [T, Hq D] attention output, heads side by side */
    ff_dptr lse;   /* [T, Hq] attention log-sum-exp (packed attention only; unused with a cache) */
    ff_dptr mid;   /* [T, H] x + o_proj(att); may be x */
    ff_dptr xn2;   /* [T, H] post_attention_layernorm(mid) */
    ff_dptr rstd2; /* [T] */
    ff_dptr gu;    /* [T, 2I] gate|up */
    ff_dptr hm;    /* [T, I] silu(gate) * up */
    /* bf16 products, a kept forward (null otherwise): where xn1 and xn2 are kept rounded to
     * bf16 for the backward (the forward rounds each once there and its product reads that
     * copy); q|k|v rounded once after its bias and rotation (qkv is then fp32 scratch) for
     * attention's forward and backward; the attention output and the MLP's gu and hm kept in
     * bf16 alone (attention writes att_16, o_proj reads it; gate|up writes gu_16, SwiGLU reads
     * it and writes hm_16; att, gu and hm are then null) */
    ff_dptr xn1_16, xn2_16, qkv_16, att_16, hm_16, gu_16; /* bf16 [T, H], [T, H], [T, QKV], [T, Hq D], [T, I], [T, 2I] */
    ff_dptr y;     /* [T, H] mid + down_proj(hm), the layer's output; may be mid */
    ff_dptr part;  /* sequence parallelism: [T, H] scratch for the row-parallel partial sums */
} ffm_layer_acts;

/* The tokens of one forward and where their attention finds keys and values: either the
 * packed batch itself (causal within each of S sequences; kv_k null) or a KV cache, into
 * which the tokens' own k/v rows are written first (generation: prefill and decode). */
typedef struct ffm_layer_tokens {
    int32_t T;
    ff_dptr pos;       /* i32 [T] position of each token in its sequence (RoPE) */
    int32_t S;         /* packed: sequences */
    ff_dptr seq_start; /* packed: i32 [S + 1] */
    ff_dptr kv_k, kv_v;         /* cache: this layer's K and V, [blocks * block_rows, Hkv D] each (fp32, or bf16) */
    ff_dptr kv_wrow;            /* cache: i32 [T] the row each token's k/v is written to */
    ff_dptr kv_table;           /* cache: i32 [kv_S, kv_table_ld] block tables (ff_attention_cached) */
    int32_t kv_S, kv_table_ld, kv_block_rows;
    bool kv16;                  /* cache: K and V in bf16 (ff_generator_config.kv_bf16) */
    ff_dptr kv_seq, kv_nkeys;   /* cache: i32 [T] token t's table row; it attends positions 0 .. nkeys - 1 */
    /* sequence parallelism (packed only): x, mid, y, rstd1 and rstd2 hold this rank's rows
     * [r0, r0 + nr) of the T tokens only ([nr, H], [nr]); xn1 and xn2 are [T, H], gathered */
    bool sp;
    int32_t r0, nr;
} ffm_layer_tokens;

/* Layer l's forward: a->y = layer(a->x) (model/layer.c). Enqueues kernels on m->st; under
 * tensor parallelism also runs its two all-reduces, or with tk->sp its two all-gathers and
 * two reduce-scatters. 0, or -1 + error (a failed collective). */
int ffm_layer_forward(ff_model *m, int l, const ffm_layer_tokens *tk, const ffm_layer_acts *a);

/* ---- tensor parallelism (model/tp.c) ---- */

/* Set m->tp and the per-rank shares of the dimensions (after set_dims; comm NULL: none) and
 * m->sp (sp: sequence parallelism, when tp > 1),
 * then, after the table is built, each tensor's shard (ffm_tp_shards). 0 or -1 + error. */
int ffm_tp_setup(ff_model *m, const ff_model_comm *comm, bool sp);
/* The per-rank shares for rank r of t (ffm_tp_setup without a communicator). 0 or -1. */
int ffm_tp_dims(ff_model *m, int r, int t);
/* m (zeroed first; not a working model): the config's dimensions, rank r of t's shares
 * and the tensor table with its shards, for readers of checkpoints. 0 or -1 + error; free
 * with ffm_layout_free (also after a failure). */
int ffm_layout(ff_model *m, const ff_model_config *cfg, int r, int t);
void ffm_layout_free(ff_model *m);
void ffm_tp_shards(ff_model *m);
/* Device scratch the TP backward needs (after the table). 0 or -1 + error. */
int ffm_tp_alloc(ff_model *m);
void ffm_tp_free(ff_model *m);
/* Host staging of at least n floats / n ids (grown, never shrunk). NULL + error. */
float *ffm_tp_host(ff_model *m, size_t n);
int32_t *ffm_tp_ids(ff_model *m, size_t n);
/* Grow both to what a training step of T tokens needs (ff_model_reserve). 0 or -1. */
int ffm_tp_reserve(ff_model *m, int32_t T);
/* Sequence parallelism: rank r's rows [*r0, *r0 + *nr) of T tokens, balanced (the first
 * T % tp ranks one more); ffm_sp_max_rows the most any rank has (ceil(T / tp)). */
void ffm_sp_rows(const ff_model *m, int32_t T, int r, int32_t *r0, int32_t *nr);
static inline int32_t ffm_sp_max_rows(const ff_model *m, int32_t T) { return (T + m->tp - 1) / m->tp; }
/* counts [tp] for ff_model_comm's _v collectives: each rank's rows of T times width. */
const size_t *ffm_sp_counts(ff_model *m, int32_t T, size_t width);
/* full [T, width] = every rank's mine [nr, width] at its rows (device; mine may be full's
 * own rows): an all-gather. 0 or -1 + error. */
int ffm_sp_gather(ff_model *m, ff_dptr mine, ff_dptr full, int32_t T, int width);
/* The same into host memory: full [T, width] host from mine [nr, width] device. */
int ffm_sp_gather_host(ff_model *m, ff_dptr mine, float *full, int32_t T, int width);
/* mine [nr, width] = the sum over the group of full [T, width]'s rows of this rank (device;
 * mine may point into full): a reduce-scatter. full's contents are lost (on device buffers
 * the collective runs in place, this rank's rows of full the result). 0 or -1 + error. */
int ffm_sp_scatter(ff_model *m, ff_dptr full, ff_dptr mine, int32_t T, int width);
/* Where one backward's partial gradient of a sequence-parallel weight goes (m->sp_dw):
 * layer l's ln1 (which 0) or ln2 (1), the final norm (l = L, which 0) or score (l = L, 1). */
static inline ff_dptr ffm_sp_dw(ff_model *m, int l, int which) {
    return ff_dptr_f32(m->sp_dw, ((size_t)2 * (size_t)l + (size_t)which) * (size_t)m->H);
}
/* A backward through layers [l0, l0 + nl) (and the head, with head) starts its partial
 * gradients at zero, and at its end sums them over the group and adds them to the
 * gradients (one all-reduce; 0 or -1 + error): the sum of the parts is the whole batch's. */
void ffm_sp_zero_grads(ff_model *m, int l0, int nl, bool head);
int ffm_sp_finish_grads(ff_model *m, int l0, int nl, bool head);
/* x [n] = sum over the TP group of x (device memory, staged through the host). 0 or -1. */
int ffm_tp_sum(ff_model *m, ff_dptr x, size_t n);
/* ids [n] (whole vocabulary, -1 = none) into this rank's rows: id - v0 inside its slice;
 * outside: -1 for tokens (embedding gives zeros), -2 for targets (ff_logprob_* contract),
 * and -1 stays -1. */
void ffm_tp_local_ids(const ff_model *m, const int32_t *ids, int32_t *out, int64_t n, bool targets);
/* Per-token statistics of this rank's vocabulary shard (ff_logprob_fwd over it: lse, entropy,
 * logprob with local targets) into those of the whole vocabulary, in place: lse [T],
 * entropy [T], logprob [T] (null: no targets). targets [T] host, whole-vocabulary ids. Two
 * all-reduces (max, then one sum of the packed sums). 0 or -1 + error. */
int ffm_tp_vocab_combine(ff_model *m, ff_dptr lse, ff_dptr entropy, ff_dptr logprob, const int32_t *targets, int32_t T);
/* Layer p's k|v weight (and bias) gradient of this backward, from dqkv [T, QKV] and xn1
 * [T, H] (fp32, or bf16: xn1_b16, with bf16 products), summed over the kv_rep ranks sharing the head and added to the gradients. */
int ffm_tp_kv_grads(ff_model *m, const ff_layer_params *p, ff_dptr dqkv, ff_dptr xn1, bool xn1_b16, int32_t T);
/* This rank's part of the sum of squares of the gradients in [lo, hi) of the flat buffer:
 * under TP each element replicated over TP ranks counted by one of them, so the sum over
 * the TP group (ffm_tp_sum_f64) is the whole model's. Waits for the stream; NaN when a
 * kernel failed. */
double ffm_grad_sumsq_range(ff_model *m, int64_t lo, int64_t hi);
/* *x = its sum over the TP group (no-op without TP). 0 or -1 + error. */
int ffm_tp_sum_f64(ff_model *m, double *x);
/* Is t (shaped as p->shape, not p->full) already this rank's shard of sharded tensor p? */
bool ffm_tp_is_shard(const ff_param_tensor *p, const ff_host_tensor *t);
/* This rank's shard of tensor p [p->numel] in host memory, from t: the whole tensor
 * (p->full), or the shard itself (ffm_tp_is_shard). Points into t, or (a column split) into
 * the TP host staging, valid until its next use. NULL + error when out of memory. */
const float *ffm_tp_local_view(ff_model *m, const ff_param_tensor *p, const ff_host_tensor *t);
/* Tensor p from src [p->numel] (this rank's shard) into whole (host, p->full), gathered
 * from the group (a collective when p is sharded). 0 or -1 + error. */
int ffm_tp_store_whole(ff_model *m, const ff_param_tensor *p, ff_dptr src, float *whole);
/* The same from host memory: mine [p->numel] (not in the TP host staging). */
int ffm_tp_store_whole_host(ff_model *m, const ff_param_tensor *p, const float *mine, float *whole);
/* Every tensor of b (a buffer in the parameter layout) as whole tensors "<prefix><name>". */
int ffm_tp_export(ff_model *m, ff_buffer *b, const char *prefix, ff_tensor_set *out);

/* ---- view models (model/view.c) ---- */

/* bf16 products (m->p16): the weights' bf16 copy as they are now, made where they changed since
 * it was; the forwards between two optimizer steps, and a colocated view's generation between
 * them, share one. 0 or -1 + error (its buffer could not be made). */
int ffm_bf16_copy_fresh(ff_model *m);
/* Before a view's generation step (model/generate.c): on a backend whose products are bf16,
 * where the viewed model has bf16 products, the step's products read the viewed pieces from
 * that model's bf16 copy, made fresh here (v16; made again where ff_model_release_grads gave it
 * back): 2 bytes a weight where rounding the fp32 pieces for each product reads 4 and writes
 * and reads 2 more, the same numbers; otherwise they do that. A no-op for a model that is not a
 * view. 0 or -1 + error. */
int ffm_view_bf16(ff_model *m);
/* Lay out m's pieces against src (same config and backend; after the table and the shards):
 * each tensor's units that src holds are read there, the rest are m's own; sets n_own. 0 or
 * -1 + error (src of another config or backend, or itself a view). */
int ffm_view_setup(ff_model *m, const ff_model *src);
/* C [M, shape[0]] ldc = A [M, K] lda @ W^T for W = tensor p [shape[0], K] (axis 0 or -1: the
 * output features are its rows); a view: one product per piece into its output columns. */
void ffm_w_out(ff_model *m, const ff_param_tensor *p, int M, ff_dptr A, int lda, ff_dptr C, int ldc);
/* C [M, shape[0]] ldc = beta C + A [M, shape[1]] lda @ W^T for W = tensor p split by its input
 * columns (axis 1); a view: one product per piece over its columns of A, accumulating. A is
 * fp32, or bf16 (a16: where the forwards hold bf16 activations, ffm_act16; then the weights are
 * the bf16 operand of ffm_w16_operand). */
void ffm_w_in(ff_model *m, const ff_param_tensor *p, int M, ff_dptr A, bool a16, int lda, float beta, ff_dptr C, int ldc);
/* x [T, ld] columns [0, shape[0]) += bias tensor p, per piece. */
void ffm_w_bias(ff_model *m, const ff_param_tensor *p, ff_dptr x, int ld, int T);
/* A tensor that is one piece (norm weights; any tensor of an ordinary model). */
ff_dptr ffm_w_vec(ff_model *m, const ff_param_tensor *p);
/* out [T, H] = the embedding rows of ids [T] (host, this model's vocabulary rows, -1: none;
 * dev_ids i32 [T] device, already holding them for an ordinary model); a view: each piece's
 * rows from its own ids into scratch [T, H], added. 0 or -1 + error (out of memory). */
int ffm_w_embed(ff_model *m, const ff_param_tensor *p, const int32_t *ids, ff_dptr dev_ids, ff_dptr out, ff_dptr scratch, int T);
/* Whether ffm_w_embed does device work only (no host copy of remapped ids): not a view, or a view
 * whose embedding is one piece of every row. What a decode step captured as a graph needs. */
bool ffm_embed_on_device(const ff_model *m);
/* Tensor p to and from host [p->numel] (this model's shard of it): a view reads every piece
 * and writes its own pieces only (the viewed ones are another model's memory). 0 or -1. */
int ffm_view_read(ff_model *m, const ff_param_tensor *p, float *host);
int ffm_view_write(ff_model *m, const ff_param_tensor *p, const float *host);

/* Whole model: one chunk with every layer, the embedding and the heads. */
static inline bool ffm_whole(const ff_model *m) { return m->n_chunks == 1 && m->has_embed && m->has_final; }

/* A pointer into the flat parameter or gradient buffer: fp32 elements (with bf16 weights, of
 * the norms and biases only). */
static inline ff_dptr ffm_param(ff_model *m, size_t off) {
    assert(m->params); /* not between ff_model_release_params and ff_model_restore_params */
    if (!m->w16) return ff_dptr_f32(m->params, off);
    assert((int64_t)off >= m->n_decay);
    return ff_dptr_of(m->params, m->vec_base + (off - (size_t)m->n_decay) * 4);
}
/* bf16 weights: element off of the weight matrices, stored bf16. */
static inline ff_dptr ffm_param16(ff_model *m, size_t off) {
    assert(m->params && m->w16 && (int64_t)off < m->n_decay);
    return ff_dptr_of(m->params, off * 2);
}
/* Every path that writes m's weights (or hands out memory to write them) calls this first, so
 * that the next forward makes the bf16 products' copy again. */
static inline void ffm_params_written(ff_model *m) { m->params_gen++; }
static inline void ffm_buffers_moved(ff_model *m) { m->buffers_moved++; }

/* bf16 products: element off of the weight matrices' bf16 copy (while w16c_live). */
static inline ff_dptr ffm_copy16(ff_model *m, size_t off) {
    assert(m->w16c_live && m->w16c && (int64_t)off < m->n_decay);
    return ff_dptr_of(m->w16c, off * 2);
}
/* Do this model's forwards, training and scoring (not generation's), hold the layers'
 * activations in bf16 (in16 sets; docs/model.md "bf16 products")? A trainable model's with bf16
 * products, and an inference model's on a backend whose products are bf16, so that a reference
 * scores as the actor it was copied from does (not a view: the colocated generating copy only
 * generates, and its pieces are multiplied one by one). */
static inline bool ffm_act16(const ff_model *m) {
    return m->p16 || (m->inference && !m->viewed && ff_backend_bf16_products(m->be));
}
/* The weight matrix at element off as the operand of a product whose activations are bf16:
 * the bf16 copy (bf16 products), the bf16 weights, or the fp32 weights, which the product
 * rounds (*b16 false). Not a view's. */
static inline ff_dptr ffm_w16_operand(ff_model *m, size_t off, bool *b16) {
    assert(!m->viewed);
    *b16 = m->w16c_live || m->w16;
    return m->w16c_live ? ffm_copy16(m, off) : m->w16 ? ffm_param16(m, off) : ffm_param(m, off);
}
/* Is tensor p stored bf16? (a weight matrix of a model with bf16 weights) */
static inline bool ffm_is16(const ff_model *m, const ff_param_tensor *p) { return m->w16 && (int64_t)p->off < m->n_decay; }
/* The bytes of the parameter buffer: n_own floats, or bf16 weights and fp32 vectors. */
static inline size_t ffm_param_bytes(const ff_model *m) {
    return m->w16 ? m->vec_base + (size_t)(m->n_params - m->n_decay) * 4 : (size_t)m->n_own * 4;
}
/* Where a view model's piece q starts. */
static inline ff_dptr ffm_piece_ptr(ff_model *m, const ffm_piece *q) {
    return q->buf ? ff_dptr_f32(q->buf, q->off) : ffm_param(m, q->off);
}
/* Tensors per decoder layer in the tensor table (q/k/v biases with attention_bias). */
static inline int ffm_tensors_per_layer(bool bias) { return bias ? 12 : 9; }
static inline ff_dptr ffm_grad(ff_model *m, size_t off) { return ff_dptr_f32(m->grads, off); }

/* The error of asking an inference model for what only training needs: -1 + error. */
int ffm_inference_only(const char *what);
/* 0 when the gradient buffer is there (or the model has none: inference), else -1 + an error
 * naming `what` and ff_model_restore_grads. */
int ffm_grads_released(const ff_model *m, const char *what);

/* Validate token ids (each in [0, V)) naming `what` in the message. 0 or -1 + error. */
int ffm_check_tokens(const ff_model *m, const int32_t *tok, int64_t n, const char *what, bool allow_minus_one);

#endif

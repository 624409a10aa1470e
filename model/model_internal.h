/* Inside the model library (model/ except model/io/): the model struct, shared by the
 * forward/backward code (model.c), the optimizer (optim.c) and generation (generate.c),
 * and the one decoder-layer forward both of them run (layer.c). */
#ifndef FF_MODEL_INTERNAL_H
#define FF_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/backend.h"
#include "fuseflow/kernels.h"
#include "fuseflow/model.h"

/* One Hugging Face tensor inside the flat parameter buffer. */
typedef struct ff_param_tensor {
    char name[96];
    size_t off; /* element offset in the flat buffers */
    int ndim;
    int64_t shape[2];
    int64_t numel;
    bool is_norm; /* initialised to 1 */
    bool is_bias; /* initialised to 0 */
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
} ff_layer_params;

/* Training workspace: byte offsets into ws (activations kept for backward) for up to
 * cap_tokens tokens and n_act layer slots (L when training, with L + 1 residuals; else 1
 * slot and 1 residual that every layer updates in place). */
typedef struct ff_train_ws {
    int32_t cap_tokens;
    bool train_slots;
    ff_buffer *buf;
    /* per layer slot (stride given) */
    size_t resid, resid_stride; /* [T, H], L + 1 slots (1 without train_slots) */
    size_t xn1, rstd1, qkv, att, lse, mid, xn2, rstd2, gu, hm, layer_stride;
    size_t xf, rstdf;                 /* [T, H], [T] */
    size_t logits;                    /* [chunk, V] */
    size_t tok_lse, logprob, entropy, values; /* [T] each */
    size_t dlogprob, dentropy, dvalues;       /* [T] each */
    size_t dres, dxn, dqkv, datt, delta, dgu, dh; /* backward scratch */
    size_t tokens, targets, pos, seq_start;   /* i32 [T], [T], [T], [T + 1] */
    int32_t *pos_host;                        /* [cap] */
    int32_t *seq_start_host;                  /* [cap + 1] */
} ff_train_ws;

struct ff_model {
    ff_backend *be;
    ff_stream *st;
    ff_model_config cfg;
    int H, Hq, Hkv, D, I, V, L, QKV; /* QKV = (Hq + 2 Hkv) D */
    bool tied, bias, vhead, lm_head;
    bool inference; /* ff_model_opts.inference: grads is NULL, no training forward */

    ff_param_tensor *tensors; /* Hugging Face tensors, in expected order */
    int n_tensors;
    int64_t n_params;
    int64_t n_decay; /* parameters [0, n_decay) get weight decay, the rest (norms, biases) not */
    ff_buffer *params, *grads; /* [n_params] each (grads NULL for inference) */
    size_t off_embed, off_lm, off_norm, off_score;
    ff_layer_params *layers; /* [L] */

    ff_buffer *rope_cos, *rope_sin; /* [max_pos, D/2] each */
    int32_t max_pos;

    ff_train_ws ws;
    int32_t logits_chunk; /* 0: automatic */

    /* the last forward, for backward */
    bool fwd_ready;
    int32_t fwd_T, fwd_S;
    bool fwd_lm, fwd_targets, fwd_entropy, fwd_values;
    int32_t fwd_chunk;
    float fwd_inv_temp;
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
    ff_dptr y;     /* [T, H] mid + down_proj(hm), the layer's output; may be mid */
} ffm_layer_acts;

/* The tokens of one forward and where their attention finds keys and values: either the
 * packed batch itself (causal within each of S sequences; kv_k null) or a KV cache, into
 * which the tokens' own k/v rows are written first (generation: prefill and decode). */
typedef struct ffm_layer_tokens {
    int32_t T;
    ff_dptr pos;       /* i32 [T] position of each token in its sequence (RoPE) */
    int32_t S;         /* packed: sequences */
    ff_dptr seq_start; /* packed: i32 [S + 1] */
    ff_dptr kv_k, kv_v;         /* cache: this layer's K and V, [rows, Hkv D] each */
    ff_dptr kv_wrow;            /* cache: i32 [T] the row each token's k/v is written to */
    ff_dptr kv_row0, kv_nkeys;  /* cache: i32 [T] token t attends rows row0 .. row0 + nkeys - 1 */
} ffm_layer_tokens;

/* Layer l's forward: a->y = layer(a->x) (model/layer.c). Enqueues kernels on m->st. */
void ffm_layer_forward(ff_model *m, int l, const ffm_layer_tokens *tk, const ffm_layer_acts *a);

/* A pointer into the flat parameter or gradient buffer. */
static inline ff_dptr ffm_param(ff_model *m, size_t off) { return ff_dptr_f32(m->params, off); }
static inline ff_dptr ffm_grad(ff_model *m, size_t off) { return ff_dptr_f32(m->grads, off); }

/* The error of asking an inference model for what only training needs: -1 + error. */
int ffm_inference_only(const char *what);

/* Validate token ids (each in [0, V)) naming `what` in the message. 0 or -1 + error. */
int ffm_check_tokens(const ff_model *m, const int32_t *tok, int64_t n, const char *what, bool allow_minus_one);

#endif

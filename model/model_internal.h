/* Inside the model library (model/ except model/io/): the model struct, shared by the
 * forward/backward code (model.c), the optimizer (optim.c) and generation (generate.c). */
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
 * cap_tokens tokens and n_act layer slots (L when training, else 1 with 2 residuals). */
typedef struct ff_train_ws {
    int32_t cap_tokens;
    bool train_slots;
    ff_buffer *buf;
    /* per layer slot (stride given) */
    size_t resid, resid_stride; /* [T, H], L + 1 slots */
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

    ff_param_tensor *tensors; /* Hugging Face tensors, in expected order */
    int n_tensors;
    int64_t n_params;
    int64_t n_decay; /* parameters [0, n_decay) get weight decay, the rest (norms, biases) not */
    ff_buffer *params, *grads; /* [n_params] each */
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

/* A pointer into the flat parameter or gradient buffer. */
static inline ff_dptr ffm_param(ff_model *m, size_t off) { return ff_dptr_f32(m->params, off); }
static inline ff_dptr ffm_grad(ff_model *m, size_t off) { return ff_dptr_f32(m->grads, off); }

/* Validate token ids (each in [0, V)) naming `what` in the message. 0 or -1 + error. */
int ffm_check_tokens(const ff_model *m, const int32_t *tok, int64_t n, const char *what, bool allow_minus_one);

#endif

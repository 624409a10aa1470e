/* The Llama-family decoder on a backend: config checks, the parameter layout, weights in and
 * out (Hugging Face names), random initialisation, and the training forward and backward
 * over packed variable-length batches. One decoder layer's forward is layer.c's (shared
 * with generation, generate.c); AdamW is in optim.c.
 *
 * Parameter layout (one flat fp32 buffer, offsets in ff_model.tensors): first every tensor
 * that gets weight decay (embeddings, lm_head, score, then per layer q|k|v, o, gate|up,
 * down), then the rest (per layer q|k|v biases and the two norms, the final norm). q, k
 * and v rows sit together so one matrix product computes all three (same for gate|up).
 * With bf16 weights (an inference model, ff_model_opts.bf16_weights) the decay region is
 * stored bf16 and the rest fp32 (model_internal.h, ffm_param16); every copy in and out below
 * converts (store_range, fetch_range), so the flat fp32 layout callers see is the same.
 *
 * Under tensor parallelism (model/tp.c) the same code runs on this rank's shares of the
 * dimensions, with the collectives tp.c provides where the comments say; with sequence
 * parallelism the residual stream, the norms and the value head on its rows of the tokens.
 *
 * Not here: sliding-window attention, MoE, rope scalings other than llama3 (errors), and
 * dropout (RLHF and SFT of these models run without it). */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "fuseflow/modelio.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"
#include "model/model_internal.h"

/* The automatic LM-head chunk: logits of at most LOGITS_BUDGET_BYTES, or, for a model that
 * trains on a device, 1/LOGITS_DEVICE_SHARE of the device's memory where that is more. A batch
 * of more than one chunk computes its logits again in the backward: on a GPU a third more of
 * the LM head's products (2 T H V flops, 7 % more of a Llama-3.2-1B step), worth the memory
 * there (at 80 GB: 2.5 GB, a 4.9k-token micro-batch at a 128k vocabulary). Host memory keeps
 * the small budget. */
#define LOGITS_BUDGET_BYTES ((size_t)256 << 20)
#define LOGITS_DEVICE_SHARE 32
#define CONVERT_CHUNK 8192                  /* elements converted to or from bf16 at a time, on the stack */

/* ---- one tensor's elements in and out, whatever its storage ----------------------------------- */

/* Elements [from, from + n) of tensor p (not a view's) from host fp32 src. */
static void store_range(ff_model *m, const ff_param_tensor *p, size_t from, const float *src, size_t n) {
    ffm_params_written(m);
    if (!ffm_is16(m, p)) {
        ff_memcpy_h2d(m->st, ffm_param(m, p->off + from), src, n * sizeof(float));
        return;
    }
    uint16_t h[CONVERT_CHUNK]; /* h2d takes its own copy before returning (backend.h): reusable */
    for (size_t done = 0; done < n;) {
        const size_t k = n - done < CONVERT_CHUNK ? n - done : CONVERT_CHUNK;
        ff_dtype_from_f32(FF_DTYPE_BF16, src + done, h, k);
        ff_memcpy_h2d(m->st, ffm_param16(m, p->off + from + done), h, k * 2);
        done += k;
    }
}

/* The same out, into host fp32 dst (widened exactly). Waits for the stream. */
static void fetch_range(ff_model *m, const ff_param_tensor *p, size_t from, float *dst, size_t n) {
    if (!ffm_is16(m, p)) {
        ff_memcpy_d2h(m->st, dst, ffm_param(m, p->off + from), n * sizeof(float));
        return;
    }
    uint16_t h[CONVERT_CHUNK];
    for (size_t done = 0; done < n;) {
        const size_t k = n - done < CONVERT_CHUNK ? n - done : CONVERT_CHUNK;
        ff_memcpy_d2h(m->st, h, ffm_param16(m, p->off + from + done), k * 2);
        ff_dtype_to_f32(FF_DTYPE_BF16, h, dst + done, k);
        done += k;
    }
}

/* ---- configuration ------------------------------------------------------------------------ */

static int head_dim_of(const ff_model_config *c) {
    if (c->head_dim > 0) return c->head_dim;
    return c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
}

int ff_model_config_check(const ff_model_config *c, const char *where) {
    const char *w = where ? where : "model config";
#define REQ(cond, field, hint, ...) \
    if (!(cond)) return ff_error_set(w, hint, field ": " __VA_ARGS__)
    REQ(c->vocab_size >= 1, "vocab_size", NULL, "%d must be >= 1", c->vocab_size);
    REQ(c->hidden_size >= 1, "hidden_size", NULL, "%d must be >= 1", c->hidden_size);
    REQ(c->intermediate_size >= 1, "intermediate_size", NULL, "%d must be >= 1", c->intermediate_size);
    REQ(c->num_hidden_layers >= 1, "num_hidden_layers", NULL, "%d must be >= 1", c->num_hidden_layers);
    REQ(c->num_attention_heads >= 1, "num_attention_heads", NULL, "%d must be >= 1", c->num_attention_heads);
    REQ(c->num_key_value_heads >= 1 && c->num_attention_heads % c->num_key_value_heads == 0, "num_key_value_heads",
        "it must divide num_attention_heads", "%d does not divide num_attention_heads = %d", c->num_key_value_heads,
        c->num_attention_heads);
    REQ(c->num_attention_heads / c->num_key_value_heads <= 64, "num_key_value_heads", NULL,
        "more than 64 query heads per key/value head are not supported");
    int D = head_dim_of(c);
    REQ(c->head_dim > 0 || c->hidden_size % c->num_attention_heads == 0, "head_dim", "set head_dim explicitly",
        "hidden_size %d is not a multiple of num_attention_heads %d", c->hidden_size, c->num_attention_heads);
    REQ(D >= 2 && D % 2 == 0 && D <= 256, "head_dim", NULL, "%d must be even and in [2, 256]", D);
    REQ(c->max_position_embeddings >= 1 && c->max_position_embeddings <= (1 << 22), "max_position_embeddings", NULL,
        "%d must be in [1, 4194304]", c->max_position_embeddings);
    REQ(isfinite(c->rms_norm_eps) && c->rms_norm_eps > 0, "rms_norm_eps", NULL, "%g must be > 0", c->rms_norm_eps);
    REQ(isfinite(c->rope_theta) && c->rope_theta > 0, "rope_theta", NULL, "%g must be > 0", c->rope_theta);
    if (c->rope_scaling.kind == FF_ROPE_SCALING_LLAMA3) {
        REQ(c->rope_scaling.factor >= 1, "rope_scaling.factor", NULL, "%g must be >= 1", c->rope_scaling.factor);
        REQ(c->rope_scaling.low_freq_factor > 0 && c->rope_scaling.high_freq_factor > c->rope_scaling.low_freq_factor,
            "rope_scaling", NULL, "need 0 < low_freq_factor (%g) < high_freq_factor (%g)",
            c->rope_scaling.low_freq_factor, c->rope_scaling.high_freq_factor);
        REQ(c->rope_scaling.original_max_position_embeddings >= 1, "rope_scaling.original_max_position_embeddings",
            NULL, "%d must be >= 1", c->rope_scaling.original_max_position_embeddings);
    } else {
        REQ(c->rope_scaling.kind == FF_ROPE_SCALING_NONE, "rope_scaling", "use none or llama3",
            "unsupported rope scaling kind %d", (int)c->rope_scaling.kind);
    }
#undef REQ
    return 0;
}

/* ---- the tensor table ----------------------------------------------------------------------- */

typedef struct table_builder {
    ff_param_tensor *t;
    int n, cap;
    size_t next; /* element offset of the next region */
} table_builder;

static int tb_add(table_builder *b, const char *name, size_t off, int ndim, int64_t d0, int64_t d1) {
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 64;
        ff_param_tensor *t = ff_realloc(b->t, (size_t)cap * sizeof *t);
        if (!t) return -1;
        b->t = t;
        b->cap = cap;
    }
    ff_param_tensor *p = &b->t[b->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->off = off;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 0;
    p->numel = ndim > 1 ? d0 * d1 : d0;
    size_t len = strlen(name);
    p->is_norm = len >= 11 && !strcmp(name + len - 11, "norm.weight");
    p->is_bias = len >= 5 && !strcmp(name + len - 5, ".bias");
    return 0;
}

/* Offsets of every region (decay first) and the table in Hugging Face order, for the layers,
 * ends and heads this model holds (set_stage). */
static int build_table(ff_model *m) {
    const int H = m->H, D = m->D, I = m->I, V = m->V, L = m->L;
    const size_t QKV = (size_t)m->QKV, qd = (size_t)m->Hq * D, kd = (size_t)m->Hkv * D;
    const bool lm = m->has_final && m->lm_head, embed = m->has_embed || (lm && m->tied);
    m->layers = ff_calloc((size_t)L, sizeof *m->layers);
    if (!m->layers) return -1;
    size_t o = 0;
    m->off_embed = o;
    if (embed) o += (size_t)V * H;
    m->off_lm = m->off_embed;
    if (lm && !m->tied) {
        m->off_lm = o;
        o += (size_t)V * H;
    }
    if (m->has_final && m->vhead) {
        m->off_score = o;
        o += (size_t)H;
    }
    for (int l = 0; l < L; l++) {
        ff_layer_params *p = &m->layers[l];
        p->wqkv = o, o += QKV * H;
        p->wo = o, o += (size_t)H * qd;
        p->wgu = o, o += 2 * (size_t)I * H;
        p->wdown = o, o += (size_t)H * I;
    }
    m->n_decay = (int64_t)o;
    for (int l = 0; l < L; l++) {
        ff_layer_params *p = &m->layers[l];
        if (m->bias) p->bqkv = o, o += QKV;
        p->ln1 = o, o += (size_t)H;
        p->ln2 = o, o += (size_t)H;
    }
    m->off_norm = o;
    if (m->has_final) o += (size_t)H;
    m->n_params = (int64_t)o;
    m->n_own = m->n_params;

    table_builder b = {0};
    char nm[96];
    /* the whole model's order: the embedding, K tensors per layer, the final norm and heads */
    const int K = ffm_tensors_per_layer(m->bias);
    m->t_embed = m->t_lm = m->t_norm = m->t_score = -1;
    int rc = embed ? tb_add(&b, "model.embed_tokens.weight", m->off_embed, 2, V, H) : 0;
    if (embed && !rc) b.t[0].copy = !m->has_embed, m->t_embed = 0; /* copy: the last stage's tied LM head */
    if (lm && m->tied) m->t_lm = m->t_embed;
    for (int l = 0; l < L && !rc; l++) {
        ff_layer_params *p = &m->layers[l];
        p->t_ln1 = b.n, p->t_q = b.n + 1, p->t_bq = m->bias ? b.n + 4 : -1;
        p->t_o = b.n + (m->bias ? 7 : 4), p->t_ln2 = p->t_o + 1, p->t_gate = p->t_o + 2, p->t_down = p->t_o + 4;
        const int g = m->layer_global[l];
        int j = 1 + g * K;
#define ADD(suffix, off, nd, a, c)                                        \
    do {                                                                  \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", g, suffix);         \
        if (!rc) rc = tb_add(&b, nm, off, nd, a, c);                      \
        if (!rc) b.t[b.n - 1].gidx = j++;                                 \
    } while (0)
        ADD("input_layernorm.weight", p->ln1, 1, H, 0);
        ADD("self_attn.q_proj.weight", p->wqkv, 2, (int64_t)qd, H);
        ADD("self_attn.k_proj.weight", p->wqkv + qd * H, 2, (int64_t)kd, H);
        ADD("self_attn.v_proj.weight", p->wqkv + (qd + kd) * H, 2, (int64_t)kd, H);
        if (m->bias) {
            ADD("self_attn.q_proj.bias", p->bqkv, 1, (int64_t)qd, 0);
            ADD("self_attn.k_proj.bias", p->bqkv + qd, 1, (int64_t)kd, 0);
            ADD("self_attn.v_proj.bias", p->bqkv + qd + kd, 1, (int64_t)kd, 0);
        }
        ADD("self_attn.o_proj.weight", p->wo, 2, H, (int64_t)qd);
        ADD("post_attention_layernorm.weight", p->ln2, 1, H, 0);
        ADD("mlp.gate_proj.weight", p->wgu, 2, I, H);
        ADD("mlp.up_proj.weight", p->wgu + (size_t)I * H, 2, I, H);
        ADD("mlp.down_proj.weight", p->wdown, 2, H, I);
#undef ADD
    }
    const int end = 1 + m->cfg.num_hidden_layers * K;
    if (!rc && m->has_final && !(rc = tb_add(&b, "model.norm.weight", m->off_norm, 1, H, 0))) b.t[b.n - 1].gidx = end, m->t_norm = b.n - 1;
    if (!rc && lm && !m->tied && !(rc = tb_add(&b, "lm_head.weight", m->off_lm, 2, V, H))) b.t[b.n - 1].gidx = end + 1, m->t_lm = b.n - 1;
    if (!rc && m->has_final && m->vhead && !(rc = tb_add(&b, "score.weight", m->off_score, 2, 1, H)))
        b.t[b.n - 1].gidx = end + 2, m->t_score = b.n - 1;
    if (rc) {
        free(b.t);
        return -1;
    }
    m->tensors = b.t;
    m->n_tensors = b.n;
    return 0;
}

/* Fill the derived sizes of m from a checked config. */
static void set_dims(ff_model *m, const ff_model_config *c, bool lm_head) {
    m->cfg = *c;
    m->H = c->hidden_size;
    m->Hq = c->num_attention_heads;
    m->Hkv = c->num_key_value_heads;
    m->D = head_dim_of(c);
    m->cfg.head_dim = m->D;
    m->I = c->intermediate_size;
    m->V = c->vocab_size;
    m->L = c->num_hidden_layers;
    m->QKV = (m->Hq + 2 * m->Hkv) * m->D;
    m->tied = c->tie_word_embeddings;
    m->bias = c->attention_bias;
    m->vhead = c->value_head;
    m->lm_head = lm_head || m->tied;
    m->tp = 1;
    m->kv_rep = 1;
}

/* The layers this model holds (after set_dims): the stage's chunks, or all of them as one
 * chunk (st NULL). 0 or -1 + error naming the bad range. */
static int set_stage(ff_model *m, const ff_model_stage *st) {
    const int32_t L = m->cfg.num_hidden_layers, one_first = 0;
    const int32_t *first = st ? st->first_layer : &one_first, *count = st ? st->n_layers : &L;
    const int n = st ? st->n_chunks : 1;
    const char *w = "pipeline stage";
    if (n < 1 || n > FF_MODEL_MAX_CHUNKS || !first || !count)
        return ff_error_set(w, "give 1 .. 64 chunks with their first layer and layer count", "%d chunks", n);
    int32_t held = 0;
    for (int c = 0; c < n; c++) {
        int32_t lo = c ? first[c - 1] + count[c - 1] : 0;
        if (count[c] < 1 || first[c] < lo || first[c] > L - count[c])
            return ff_error_set(w, "chunks hold at least one layer each, in ascending order, within the model's layers",
                                "chunk %d: layers [%d, %d) of %d (the previous chunk ends at %d)", c, first[c],
                                first[c] + count[c], L, lo);
        held += count[c];
    }
    m->chunk_l0 = ff_malloc(sizeof(int32_t) * (size_t)n);
    m->chunk_nl = ff_malloc(sizeof(int32_t) * (size_t)n);
    m->layer_global = ff_malloc(sizeof(int32_t) * (size_t)held);
    if (!m->chunk_l0 || !m->chunk_nl || !m->layer_global) return -1;
    int32_t k = 0;
    for (int c = 0; c < n; c++) {
        m->chunk_l0[c] = k;
        m->chunk_nl[c] = count[c];
        for (int32_t i = 0; i < count[c]; i++) m->layer_global[k++] = first[c] + i;
    }
    m->n_chunks = n;
    m->L = held;
    m->has_embed = first[0] == 0;
    m->has_final = first[n - 1] + count[n - 1] == L;
    m->embed_copy = m->has_final && !m->has_embed && m->tied && m->lm_head;
    if (st && st->comm && st->comm->size > 1) {
        if (!st->comm->all_reduce_sum_f64)
            return ff_error_set(w, "give the pipeline group's all_reduce_sum_f64", "the gradient norm needs a sum over the stages");
        m->pp = *st->comm;
    }
    return 0;
}

static void free_table(ff_model *m) {
    free(m->tensors);
    free(m->layers);
    free(m->chunk_l0);
    free(m->chunk_nl);
    free(m->layer_global);
    m->tensors = NULL;
    m->layers = NULL;
    m->chunk_l0 = m->chunk_nl = m->layer_global = NULL;
}

int ff_model_expected_tensors(const ff_model_config *cfg, ff_tensor_set *out) {
    if (ff_model_config_check(cfg, NULL)) return -1;
    ff_model tmp;
    memset(&tmp, 0, sizeof tmp);
    set_dims(&tmp, cfg, true);
    int rc = set_stage(&tmp, NULL) || build_table(&tmp) ? -1 : 0;
    for (int i = 0; i < tmp.n_tensors && !rc; i++)
        if (!ff_tensor_set_add(out, tmp.tensors[i].name, tmp.tensors[i].ndim, tmp.tensors[i].shape)) rc = -1;
    free_table(&tmp);
    return rc;
}

int ffm_layout(ff_model *m, const ff_model_config *cfg, int r, int t) {
    memset(m, 0, sizeof *m);
    if (ff_model_config_check(cfg, NULL)) return -1;
    set_dims(m, cfg, true);
    if (set_stage(m, NULL) || ffm_tp_dims(m, r, t) || build_table(m)) return -1;
    ffm_tp_shards(m);
    return 0;
}

void ffm_layout_free(ff_model *m) {
    free_table(m);
    memset(m, 0, sizeof *m);
}

int ff_model_init_weights(const ff_model_config *cfg, uint64_t seed, double initializer_range, ff_tensor_set *out) {
    size_t first = out->n;
    if (ff_model_expected_tensors(cfg, out)) return -1;
    double std = initializer_range > 0 ? initializer_range : 0.02;
    ff_rng rng;
    ff_rng_seed(&rng, seed);
    for (size_t i = first; i < out->n; i++) {
        ff_host_tensor *t = &out->items[i];
        int64_t n = ff_host_tensor_numel(t);
        size_t len = strlen(t->name);
        bool norm = len >= 11 && !strcmp(t->name + len - 11, "norm.weight");
        bool bias = len >= 5 && !strcmp(t->name + len - 5, ".bias");
        for (int64_t j = 0; j < n; j++) t->data[j] = norm ? 1.0f : bias ? 0.0f : (float)(std * ff_rng_normal(&rng));
        if (!strcmp(t->name, "model.embed_tokens.weight") && cfg->pad_token_id >= 0 &&
            cfg->pad_token_id < cfg->vocab_size)
            memset(t->data + (size_t)cfg->pad_token_id * (size_t)cfg->hidden_size, 0,
                   (size_t)cfg->hidden_size * sizeof(float));
    }
    return 0;
}

/* ---- rotary tables ----------------------------------------------------------------------- */

/* inv_freq[i] = theta^(-2i/D), then Hugging Face's llama3 rescaling when configured. */
static void rope_inv_freq(const ff_model_config *c, int D, float *inv) {
    for (int i = 0; i < D / 2; i++) {
        double f = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)D);
        if (c->rope_scaling.kind == FF_ROPE_SCALING_LLAMA3) {
            double factor = c->rope_scaling.factor, lo = c->rope_scaling.low_freq_factor;
            double hi = c->rope_scaling.high_freq_factor;
            double old = c->rope_scaling.original_max_position_embeddings;
            double low_wavelen = old / lo, high_wavelen = old / hi;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / factor;
            } else if (wavelen >= high_wavelen) { /* between the two: interpolate */
                double smooth = (old / wavelen - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv[i] = (float)f;
    }
}

static int make_rope(ff_model *m) {
    int half = m->D / 2;
    m->max_pos = m->cfg.max_position_embeddings;
    size_t n = (size_t)m->max_pos * half;
    float *cs = ff_malloc(n * sizeof(float)), *sn = ff_malloc(n * sizeof(float));
    float inv[128];
    int rc = -1;
    if (!cs || !sn) goto done;
    rope_inv_freq(&m->cfg, m->D, inv);
    for (int p = 0; p < m->max_pos; p++)
        for (int i = 0; i < half; i++) {
            float a = (float)p * inv[i]; /* the fp32 product, as Hugging Face forms it */
            cs[(size_t)p * half + i] = (float)cos((double)a);
            sn[(size_t)p * half + i] = (float)sin((double)a);
        }
    m->rope_cos = ff_buffer_new(m->be, n * sizeof(float));
    m->rope_sin = ff_buffer_new(m->be, n * sizeof(float));
    if (!m->rope_cos || !m->rope_sin) goto done;
    ff_memcpy_h2d(m->st, ff_dptr_of(m->rope_cos, 0), cs, n * sizeof(float));
    ff_memcpy_h2d(m->st, ff_dptr_of(m->rope_sin, 0), sn, n * sizeof(float));
    rc = 0;
done:
    free(cs);
    free(sn);
    return rc;
}

/* ---- creation, weights in and out ----------------------------------------------------------- */

/* The host memory of a tensor being copied onto the backend goes back chunk by chunk: the
 * pages already copied become zero pages that cost nothing (madvise MADV_DONTNEED on private
 * anonymous memory), so that loading a model never holds its weights twice. The data is
 * freed right after and never read again. */
#define GIVE_BACK_CHUNK ((size_t)2 << 20) /* floats: 8 MiB */

static void copy_giving_back(ff_model *m, const ff_param_tensor *p, float *src) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t released = ((uintptr_t)src + page - 1) & ~(page - 1); /* whole pages only */
    for (size_t done = 0; done < (size_t)p->numel;) {
        size_t n = (size_t)p->numel - done < GIVE_BACK_CHUNK ? (size_t)p->numel - done : GIVE_BACK_CHUNK;
        store_range(m, p, done, src + done, n);
        done += n;
        uintptr_t end = (uintptr_t)(src + done) & ~(page - 1);
        if (end > released && ff_stream_sync(m->st) == 0) { /* an async copy must have read it */
            madvise((void *)released, end - released, MADV_DONTNEED);
            released = end;
        }
    }
}

/* Check every tensor, then copy them in. own: the same set when it is the model's to consume
 * (ff_model_new_from): each tensor's memory is given back as it is copied. */
static int check_and_load(ff_model *m, const ff_tensor_set *w, ff_tensor_set *own) {
    if (m->tied && ff_tensor_set_find(w, "lm_head.weight")) {
        return ff_error_set("lm_head.weight", "set tie_word_embeddings to false, or drop lm_head.weight",
                            "the weights have an lm_head but the config ties the embeddings");
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const ff_param_tensor *p = &m->tensors[i];
        const ff_host_tensor *t = ff_tensor_set_find(w, p->name);
        if (!t)
            return ff_error_set(p->name, "check that the checkpoint matches config.json",
                                "tensor is missing from the weights");
        if (!ffm_tp_is_shard(p, t) && ff_host_tensor_expect(t, p->ndim, p->full, p->name)) return -1;
        for (int64_t j = 0; j < ff_host_tensor_numel(t); j++)
            if (!isfinite(t->data[j]))
                return ff_error_set(p->name, "the checkpoint is damaged", "element %lld is %g", (long long)j,
                                    (double)t->data[j]);
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const ff_param_tensor *p = &m->tensors[i];
        ff_host_tensor *o = own ? ff_tensor_set_find(own, p->name) : NULL;
        const ff_host_tensor *t = o ? o : ff_tensor_set_find(w, p->name);
        if (p->npc) { /* a view: its own pieces only */
            const float *mine = ffm_tp_local_view(m, p, t);
            if (!mine || ffm_view_write(m, p, mine)) return -1;
        } else if (o && (p->split < 0 || ffm_tp_is_shard(p, t))) /* all of it is this rank's: give it back as it goes */
            copy_giving_back(m, p, o->data);
        else {
            const float *mine = ffm_tp_local_view(m, p, t);
            if (!mine) return -1;
            store_range(m, p, 0, mine, (size_t)p->numel);
        }
        if (o) {
            if (ff_stream_sync(m->st)) return -1; /* an async copy must have read it */
            free(o->data);
            o->data = NULL;
        }
    }
    return 0;
}

/* A model with its buffers and no weights yet (lm: it has an LM head). */
static ff_model *create_shell(ff_backend *be, const ff_model_config *cfg, bool lm, const ff_model_opts *opts) {
    const ff_model_comm *comm = opts ? opts->comm : NULL;
    if (ff_model_config_check(cfg, NULL)) return NULL;
    ff_model *m = ff_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->be = be;
    m->st = ff_backend_stream(be);
    m->inference = opts && opts->inference;
    set_dims(m, cfg, lm);
    const bool sp = opts && opts->sequence_parallel;
    if (set_stage(m, opts ? opts->stage : NULL) || ffm_tp_setup(m, comm, sp) || build_table(m) || make_rope(m)) goto fail;
    ffm_tp_shards(m);
    if (opts && opts->view_of) {
        if (!m->inference) {
            ff_error_set("view model", "set ff_model_opts.inference: a view only infers", "a trainable model cannot view another");
            goto fail;
        }
        if (ffm_view_setup(m, opts->view_of)) goto fail;
    }
    if (opts && opts->bf16_weights) {
        if (!m->inference || opts->view_of) {
            ff_error_set("bf16 weights", "keep fp32 weights for a trainable model or a view (bf16 is for a model that only infers, with weights of its own)",
                         "the model is %s", opts->view_of ? "a view of another model's fp32 weights" : "trainable");
            goto fail;
        }
        m->w16 = true;
        m->vec_base = ((size_t)m->n_decay * 2 + 63) / 64 * 64;
    }
    m->p16 = !m->inference && ff_backend_bf16_products(be);
    /* a view that holds nothing of its own keeps a buffer of one float (held, 0 bytes counted) */
    m->params = ff_buffer_new(be, m->n_own ? ffm_param_bytes(m) : sizeof(float));
    if (!m->params) goto fail;
    if (!m->inference && (!(m->grads = ff_buffer_new(be, (size_t)m->n_params * sizeof(float))) || ffm_tp_alloc(m))) goto fail;
    return m;
fail:
    ff_model_destroy(&m);
    return NULL;
}

static ff_model *create(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *weights, ff_tensor_set *own,
                        const ff_model_opts *opts) {
    const bool lm = !cfg->value_head || cfg->tie_word_embeddings || ff_tensor_set_find(weights, "lm_head.weight");
    ff_model *m = create_shell(be, cfg, lm, opts);
    if (m && check_and_load(m, weights, own)) ff_model_destroy(&m);
    return m;
}

/* ---- straight from a model folder ------------------------------------------------------------ */

#define STREAM_CHUNK (1u << 20) /* floats read from the file at a time (4 MiB of staging) */

/* Tensor p's block of the whole checkpoint tensor e (this rank's shard; all of it without TP),
 * a few rows at a time through buf [STREAM_CHUNK]: converted, checked, stored. */
static int stream_tensor(ff_model *m, const ff_param_tensor *p, const ff_safetensors *f, const ff_st_entry *e, float *buf) {
    const int64_t cols = p->ndim > 1 ? p->full[1] : 1;
    int64_t r0 = 0, nr = p->full[0], c0 = 0, nc = cols;
    if (p->split == 0) r0 = p->start, nr = p->shape[0];
    else if (p->split == 1) c0 = p->start, nc = p->shape[1];
    const int64_t step = nc >= (int64_t)STREAM_CHUNK ? 1 : (int64_t)STREAM_CHUNK / nc;
    for (int64_t r = 0; r < nr; r += step) {
        const int64_t k = nr - r < step ? nr - r : step;
        if (ff_safetensors_read_rows(f, e, r0 + r, k, c0, nc, buf)) return -1;
        for (int64_t i = 0; i < k * nc; i++)
            if (!isfinite(buf[i]))
                return ff_error_set(p->name, "the checkpoint is damaged (a diverged run?)", "element %lld is %g",
                                    (long long)((r0 + r + i / nc) * cols + c0 + i % nc), (double)buf[i]);
        store_range(m, p, (size_t)(r * nc), buf, (size_t)(k * nc));
        if (ff_stream_sync(m->st)) return -1; /* buf is reused: an async copy must have read it */
    }
    return 0;
}

ff_model *ff_model_load_dir(ff_backend *be, const char *dir, const ff_model_opts *opts, ff_model_config *cfg) {
    if (opts && opts->view_of)
        return ff_error_set("view model", "give a view its weights as a host set (ff_model_new_from)",
                            "ff_model_load_dir reads a model's own weights"),
               NULL;
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ff_hf_config_load(path, cfg) != 0) return ff_checkpoint_error(dir), NULL;
    ff_st_dir *d = ff_st_dir_open(dir);
    if (!d) return NULL;
    ff_model *m = NULL;
    float *buf = NULL;
    if (ff_hf_check_dir(cfg, d, dir) != 0) {
        ff_checkpoint_error(dir);
        goto out;
    }
    /* a tied checkpoint's lm_head.weight passed the check only as the embedding's copy: unused */
    const bool lm = !cfg->value_head || cfg->tie_word_embeddings || ff_st_dir_find(d, "lm_head.weight", NULL);
    if (!(m = create_shell(be, cfg, lm, opts)) || !(buf = ff_malloc(STREAM_CHUNK * sizeof *buf))) goto fail;
    for (int i = 0; i < m->n_tensors; i++) {
        const ff_param_tensor *p = &m->tensors[i];
        const ff_safetensors *f;
        const ff_st_entry *e = ff_st_dir_find(d, p->name, &f);
        if (!e) { /* ff_hf_check_dir knows the config's tensors; the model's come from the same list */
            ff_error_set(p->name, "check that the checkpoint matches config.json", "tensor is missing from the weights");
            goto fail;
        }
        if (stream_tensor(m, p, f, e, buf)) {
            ff_error_wrap("%s", dir);
            ff_checkpoint_error(dir);
            goto fail;
        }
    }
    goto out;
fail:
    ff_model_destroy(&m);
out:
    free(buf);
    ff_st_dir_close(&d);
    return m;
}

ff_model *ff_model_new(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *weights) {
    return create(be, cfg, weights, NULL, NULL);
}

ff_model *ff_model_new_opts(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *weights,
                            const ff_model_opts *opts) {
    return create(be, cfg, weights, NULL, opts);
}

ff_model *ff_model_new_tp(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *weights,
                          const ff_model_comm *comm) {
    ff_model_opts o = {.comm = comm};
    return create(be, cfg, weights, NULL, &o);
}

ff_model *ff_model_new_from(ff_backend *be, const ff_model_config *cfg, ff_tensor_set **weights, const ff_model_opts *opts) {
    ff_model *m = create(be, cfg, *weights, *weights, opts);
    ff_tensor_set_destroy(weights);
    return m;
}

static void acts_free(ffm_acts *a) {
    ff_buffer_destroy(&a->buf);
    free(a->seq_start_host);
    a->seq_start_host = NULL;
    a->cap = 0;
}

/* Every activation set and the scratch (forwards in flight are lost). */
static void free_ws(ff_model *m) {
    for (int i = 0; i < m->n_acts; i++) {
        acts_free(m->acts[i]);
        free(m->acts[i]);
    }
    free(m->acts);
    m->acts = NULL;
    m->n_acts = m->cap_acts = 0;
    ff_buffer_destroy(&m->sc.buf);
    free(m->sc.pos_host);
    memset(&m->sc, 0, sizeof m->sc);
}

void ff_model_destroy(ff_model **pm) {
    if (!pm || !*pm) return;
    ff_model *m = *pm;
    free_ws(m);
    ffm_tp_free(m);
    free(m->view_ids);
    ff_buffer_destroy(&m->params);
    ff_buffer_destroy(&m->w16c);
    free(m->host_params);
    ff_buffer_destroy(&m->grads);
    ff_buffer_destroy(&m->rope_cos);
    ff_buffer_destroy(&m->rope_sin);
    free_table(m);
    free(m);
    *pm = NULL;
}

const ff_model_config *ff_model_config_of(const ff_model *m) { return &m->cfg; }
ff_backend *ff_model_backend(const ff_model *m) { return m->be; }
bool ff_model_has_lm_head(const ff_model *m) { return m->lm_head; }
int64_t ff_model_param_count(const ff_model *m) { return m->n_params; }
int ff_model_tp_size(const ff_model *m) { return m->tp; }
int ff_model_tp_rank(const ff_model *m) { return m->tp_rank; }
bool ff_model_is_inference(const ff_model *m) { return m->inference; }
ff_buffer *ff_model_param_buffer(ff_model *m) {
    ffm_params_written(m); /* the caller may write through it */
    return m->params;
}
ff_buffer *ff_model_grad_buffer(ff_model *m) { return m->grads; }
int ff_model_n_chunks(const ff_model *m) { return m->n_chunks; }
bool ff_model_is_whole(const ff_model *m) { return ffm_whole(m); }

void ff_model_chunk_of(const ff_model *m, int c, ff_model_chunk_info *out) {
    assert(c >= 0 && c < m->n_chunks);
    out->first_layer = m->layer_global[m->chunk_l0[c]];
    out->n_layers = m->chunk_nl[c];
    out->embedding = c == 0 && m->has_embed;
    out->head = c == m->n_chunks - 1 && m->has_final;
}

void ff_model_memory_of(const ff_model *m, ff_model_memory *out) {
    out->params = m->params ? (int64_t)ffm_param_bytes(m) : 0;
    out->viewed = (m->n_params - m->n_own) * (int64_t)sizeof(float);
    out->grads = m->grads ? m->n_params * (int64_t)sizeof(float) : 0;
    out->workspace = m->sc.buf ? (int64_t)ff_buffer_size(m->sc.buf) : 0;
    if (m->w16c) out->workspace += (int64_t)ff_buffer_size(m->w16c);
    out->activations = 0;
    for (int i = 0; i < m->n_acts; i++)
        if (m->acts[i]->buf) out->activations += (int64_t)ff_buffer_size(m->acts[i]->buf);
    out->workspace += out->activations;
}

int ffm_grads_released(const ff_model *m, const char *what) {
    if (m->inference || m->grads) return 0;
    return ff_error_set(what, "call ff_model_restore_grads before training (the generation phase is over)",
                        "the model's gradients are released (ff_model_release_grads)");
}

int ff_model_release_grads(ff_model *m) {
    if (m->inference) return ffm_inference_only("release gradients");
    ff_buffer_destroy(&m->grads);
    ff_buffer_destroy(&m->w16c); /* made again by the next forward */
    m->w16c_gen = 0;
    ffm_buffers_moved(m);
    return 0;
}

int ff_model_restore_grads(ff_model *m) {
    if (m->inference) return ffm_inference_only("restore gradients");
    if (m->grads) return 0;
    m->grads = ff_buffer_new(m->be, (size_t)m->n_params * sizeof(float)); /* zeroed */
    return m->grads ? 0 : ff_error_wrap("restoring the gradients (%lld floats)", (long long)m->n_params);
}

bool ff_model_grads_held(const ff_model *m) { return m->grads != NULL; }

int ffm_inference_only(const char *what) {
    return ff_error_set(what, "create the model for training (ff_model_opts.inference = false)",
                        "this model was created for inference only: it has no gradients");
}

static int not_for_views(const ff_model *m, const char *what) {
    if (!m->viewed) return 0;
    return ff_error_set(what, "ask the model it views (its trained shard), or a model of its own",
                        "a view model reads part of its weights in place from another model");
}

/* bf16 weights: each tensor's shard widened on the host, then made whole (under TP, gathered). */
static int export_w16(ff_model *m, ff_tensor_set *out) {
    for (int i = 0; i < m->n_tensors; i++) {
        const ff_param_tensor *p = &m->tensors[i];
        if (p->copy) continue;
        ff_host_tensor *t = ff_tensor_set_add(out, p->name, p->ndim, p->full);
        if (!t) return -1;
        float *mine = p->split < 0 ? t->data : ff_malloc((size_t)p->numel * sizeof(float));
        if (!mine) return -1;
        fetch_range(m, p, 0, mine, (size_t)p->numel);
        int rc = ffm_tp_store_whole_host(m, p, mine, t->data);
        if (mine != t->data) free(mine);
        if (rc) return -1;
    }
    return 0;
}

int ff_model_export_weights(ff_model *m, ff_tensor_set *out) {
    if (not_for_views(m, "export weights")) return -1;
    return m->w16 ? export_w16(m, out) : ffm_tp_export(m, m->params, "", out);
}
int ff_model_export_grads(ff_model *m, ff_tensor_set *out) {
    if (m->inference) return ffm_inference_only("ff_model_export_grads");
    return ffm_grads_released(m, "export gradients") ? -1 : ffm_tp_export(m, m->grads, "", out);
}

int ff_model_load_weights(ff_model *m, const ff_tensor_set *w) {
    if (m->has_final && !m->tied && m->lm_head != (ff_tensor_set_find(w, "lm_head.weight") != NULL) && m->vhead)
        return ff_error_set("lm_head.weight", "load a checkpoint of the same kind (with or without LM head)",
                            "the model %s an LM head but the weights %s", m->lm_head ? "has" : "has no",
                            m->lm_head ? "do not" : "do");
    return check_and_load(m, w, NULL);
}

void ff_model_read_params(ff_model *m, float *host) {
    if (m->viewed) {
        for (int i = 0; i < m->n_tensors; i++) ffm_view_read(m, &m->tensors[i], host + m->tensors[i].off);
        return;
    }
    if (m->w16) {
        for (int i = 0; i < m->n_tensors; i++)
            fetch_range(m, &m->tensors[i], 0, host + m->tensors[i].off, (size_t)m->tensors[i].numel);
        return;
    }
    ff_memcpy_d2h(m->st, host, ff_dptr_of(m->params, 0), (size_t)m->n_params * sizeof(float));
}
void ff_model_write_params(ff_model *m, const float *host) {
    if (m->viewed) {
        for (int i = 0; i < m->n_tensors; i++) (void)ffm_view_write(m, &m->tensors[i], host + m->tensors[i].off);
        return;
    }
    if (m->w16) {
        for (int i = 0; i < m->n_tensors; i++)
            store_range(m, &m->tensors[i], 0, host + m->tensors[i].off, (size_t)m->tensors[i].numel);
        return;
    }
    ffm_params_written(m);
    ff_memcpy_h2d(m->st, ff_dptr_of(m->params, 0), host, (size_t)m->n_params * sizeof(float));
}
int ff_model_read_grads(ff_model *m, float *host) {
    if (m->inference) return ffm_inference_only("read gradients");
    if (ffm_grads_released(m, "read gradients")) return -1;
    ff_memcpy_d2h(m->st, host, ff_dptr_of(m->grads, 0), (size_t)m->n_params * sizeof(float));
    return 0;
}
int ff_model_write_grads(ff_model *m, const float *host) {
    if (m->inference) return ffm_inference_only("write gradients");
    if (ffm_grads_released(m, "write gradients")) return -1;
    ff_memcpy_h2d(m->st, ff_dptr_of(m->grads, 0), host, (size_t)m->n_params * sizeof(float));
    return 0;
}

static const ff_param_tensor *find_tensor(const ff_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

int64_t ff_model_tensor_numel(const ff_model *m, const char *name) {
    const ff_param_tensor *p = find_tensor(m, name);
    return p ? p->numel : 0;
}

static const ff_param_tensor *held(const ff_model *m, const char *name, bool grad) {
    const ff_param_tensor *p = find_tensor(m, name);
    if (!p) ff_error_set(name, "ask the stage that holds it (ff_model_tensor_numel says)", "this model does not hold the tensor");
    else if (grad && m->inference) return ffm_inference_only(name), NULL;
    else if (grad && ffm_grads_released(m, name)) return NULL;
    return p;
}

int ff_model_tensor_storage(ff_model *m, const char *name, ff_dptr *out, ff_dtype *dtype) {
    const ff_param_tensor *p = held(m, name, false);
    if (!p) return -1;
    if (p->npc) return ff_error_set(name, "read and write a view's tensors through the host (ff_model_read_tensor)", "a view's tensor is in pieces");
    if (!m->params) return ff_error_set(name, "restore the parameters first (ff_model_restore_params)", "the model's parameters are released");
    *dtype = ffm_is16(m, p) ? FF_DTYPE_BF16 : FF_DTYPE_F32;
    *out = *dtype == FF_DTYPE_BF16 ? ffm_param16(m, p->off) : ffm_param(m, p->off);
    ffm_params_written(m); /* the caller may write through it */
    return 0;
}

int ff_model_read_tensor(ff_model *m, const char *name, bool grad, float *host) {
    const ff_param_tensor *p = held(m, name, grad);
    if (!p) return -1;
    if (p->npc && !grad) return ffm_view_read(m, p, host);
    if (grad) ff_memcpy_d2h(m->st, host, ffm_grad(m, p->off), (size_t)p->numel * sizeof(float));
    else fetch_range(m, p, 0, host, (size_t)p->numel);
    return 0;
}

int ff_model_write_tensor_grad(ff_model *m, const char *name, const float *host) {
    const ff_param_tensor *p = held(m, name, true);
    if (!p) return -1;
    ff_memcpy_h2d(m->st, ffm_grad(m, p->off), host, (size_t)p->numel * sizeof(float));
    return ff_stream_sync(m->st);
}

int ff_model_write_tensor(ff_model *m, const char *name, const float *host) {
    const ff_param_tensor *p = held(m, name, false);
    if (!p) return -1;
    if (p->npc) return ffm_view_write(m, p, host);
    store_range(m, p, 0, host, (size_t)p->numel);
    return ff_stream_sync(m->st);
}

int ff_model_n_tensors(const ff_model *m) { return m->n_tensors; }

void ff_model_tensor_info_of(const ff_model *m, int i, ff_model_tensor_info *out) {
    assert(i >= 0 && i < m->n_tensors);
    const ff_param_tensor *p = &m->tensors[i];
    const int64_t shape[2] = {p->shape[0], p->ndim > 1 ? p->shape[1] : 1};
    *out = (ff_model_tensor_info){.name = p->name, .index = p->gidx, .full = {p->full[0], p->ndim > 1 ? p->full[1] : 1},
                                  .axis = p->axis, .start = p->axis >= 0 ? p->start : 0,
                                  .len = p->axis >= 0 ? shape[p->axis] : 1, .copy = p->copy};
    if (p->view_lo < p->view_hi) { /* in the whole tensor's coordinates, as start */
        out->view_lo = out->start + p->view_lo;
        out->view_hi = out->start + p->view_hi;
    }
}

const ff_model *ff_model_viewed(const ff_model *m) { return m->viewed; }

int ff_model_tensor_slots(const ff_model_config *cfg) {
    return 1 + cfg->num_hidden_layers * ffm_tensors_per_layer(cfg->attention_bias) + 3;
}

int ff_model_release_params(ff_model *m) {
    if (!m->inference)
        return ff_error_set("release parameters", "only an inference model (a generating copy) gives its parameters back",
                            "the model is trainable");
    free_ws(m);
    ff_buffer_destroy(&m->params);
    ffm_buffers_moved(m);
    return 0;
}

int ff_model_restore_params(ff_model *m) {
    if (m->params) return 0;
    if (!m->inference) return ff_model_release_params(m);
    m->params = ff_buffer_new(m->be, m->n_own ? ffm_param_bytes(m) : sizeof(float));
    ffm_params_written(m);
    ffm_buffers_moved(m);
    return m->params ? 0 : ff_error_wrap("restoring the parameters (%lld floats)", (long long)m->n_own);
}

bool ff_model_params_held(const ff_model *m) { return m->params != NULL; }

/* Only a whole inference model of its own: a trainable one keeps its weights with its
 * gradients, and a view reads part of its weights from another model's buffer. */
static int host_copy_ok(const ff_model *m, const char *what) {
    if (!m->inference)
        return ff_error_set(what, "only a frozen inference model (reference, reward) keeps its weights in host memory", "the model is trainable");
    if (m->viewed) return ff_error_set(what, "a view model reads its weights from another model's", "the model is a view");
    return 0;
}

int ff_model_params_to_host(ff_model *m, ff_offload_stats *stats) {
    const int64_t t0 = ff_now_ns();
    if (stats) *stats = (ff_offload_stats){0};
    if (host_copy_ok(m, "weights to host memory")) return -1;
    if (!m->params) return m->host_params ? 0 : ff_error_set("weights to host memory", NULL, "the model holds no weights");
    const size_t bytes = ffm_param_bytes(m); /* as stored: bf16 weights stay bf16 in host memory */
    if (!m->host_params) {
        float *h = ff_malloc(bytes ? bytes : 1);
        if (!h) return ff_error_wrap("copying the weights to host memory (%zu bytes)", bytes);
        ff_memcpy_d2h(m->st, h, ff_dptr_of(m->params, 0), bytes);
        if (ff_stream_sync(m->st)) {
            free(h);
            return ff_error_wrap("copying the weights to host memory");
        }
        m->host_params = h;
        if (stats) stats->bytes = (int64_t)bytes;
    }
    ff_model_release_params(m);
    if (stats) stats->seconds = (double)(ff_now_ns() - t0) * 1e-9;
    return 0;
}

int ff_model_params_load(ff_model *m, ff_stream *st, ff_offload_stats *stats) {
    const int64_t t0 = ff_now_ns();
    if (stats) *stats = (ff_offload_stats){0};
    if (m->params) return 0;
    if (host_copy_ok(m, "loading the weights")) return -1;
    if (!m->host_params)
        return ff_error_set("loading the weights", "call ff_model_params_to_host first", "the model has no host copy of its weights");
    assert(ff_stream_backend(st) == m->be);
    const size_t bytes = ffm_param_bytes(m);
    ff_buffer *b = ff_buffer_new(m->be, bytes ? bytes : sizeof(float));
    if (!b) return ff_error_wrap("loading the weights (%zu bytes) onto backend %s", bytes, ff_backend_name(m->be));
    ff_memcpy_h2d(st, ff_dptr_of(b, 0), m->host_params, bytes);
    if (ff_stream_sync(st)) {
        ff_buffer_destroy(&b);
        return ff_error_wrap("loading the weights (%zu bytes)", bytes);
    }
    m->params = b;
    ffm_params_written(m);
    ffm_buffers_moved(m);
    if (stats) *stats = (ff_offload_stats){.bytes = (int64_t)bytes, .seconds = (double)(ff_now_ns() - t0) * 1e-9};
    return 0;
}

int64_t ff_model_params_host_bytes(const ff_model *m) { return m->host_params ? (int64_t)ffm_param_bytes(m) : 0; }

int ff_model_copy_params(ff_model *dst, ff_model *src) {
    if (not_for_views(dst, "copy params") || not_for_views(src, "copy params")) return -1;
    if (dst->n_params != src->n_params || dst->n_tensors != src->n_tensors)
        return ff_error_set("copy params", "both models need the same config",
                            "source has %lld parameters, destination %lld", (long long)src->n_params,
                            (long long)dst->n_params);
    size_t bytes = (size_t)src->n_params * sizeof(float);
    ffm_params_written(dst);
    if (dst->be == src->be && (dst->w16 || src->w16)) { /* tensor by tensor, cast on the device where the types differ */
        for (int i = 0; i < dst->n_tensors; i++) {
            const ff_param_tensor *d = &dst->tensors[i], *s = &src->tensors[i];
            const bool d16 = ffm_is16(dst, d), s16 = ffm_is16(src, s);
            const ff_dptr to = d16 ? ffm_param16(dst, d->off) : ffm_param(dst, d->off);
            const ff_dptr from = s16 ? ffm_param16(src, s->off) : ffm_param(src, s->off);
            if (d16 == s16) ff_memcpy_d2d(dst->st, to, from, (size_t)d->numel * (d16 ? 2 : 4));
            else if (d16) ff_cast_f32_bf16(dst->st, from, to, d->numel);
            else ff_cast_bf16_f32(dst->st, from, to, d->numel);
        }
        return 0;
    }
    if (dst->be == src->be) {
        ff_memcpy_d2d(dst->st, ff_dptr_of(dst->params, 0), ff_dptr_of(src->params, 0), bytes);
        return 0;
    }
    float *tmp = ff_malloc(bytes);
    if (!tmp) return -1;
    ff_model_read_params(src, tmp);
    ff_model_write_params(dst, tmp);
    free(tmp);
    return 0;
}

int ff_model_zero_grad(ff_model *m) {
    if (m->inference) return ffm_inference_only("zero gradients");
    if (!m->grads) return 0; /* released: they come back zero (ff_model_restore_grads) */
    ff_memset_zero(m->st, ff_dptr_of(m->grads, 0), (size_t)m->n_params * sizeof(float));
    return 0;
}

int ff_model_set_bf16_products(ff_model *m, bool on) {
    if (on && (m->inference || m->w16 || m->viewed))
        return ff_error_set("bf16 products", "set them on a trainable model (an inference model's products follow its backend, or its bf16 weights)",
                            "the model is for inference only");
    for (int i = 0; on != m->p16 && i < m->n_acts; i++) /* its backward reads the products' inputs as they were kept */
        if (m->acts[i]->kept && m->acts[i]->micro != FFM_FREE)
            return ff_error_set("bf16 products", "run the backward of the training forward first (or ff_model_stage_drop)",
                                "a training forward is held (micro-batch %d)", m->acts[i]->micro);
    m->p16 = on;
    if (!on) ff_buffer_destroy(&m->w16c), m->w16c_gen = 0, ffm_buffers_moved(m);
    return 0;
}

bool ff_model_bf16_products(const ff_model *m) { return m->p16; }
int64_t ff_model_bf16_copies(const ff_model *m) { return m->w16c_made; }

void ff_model_set_logits_chunk(ff_model *m, int32_t max_tokens) {
    m->logits_chunk = max_tokens > 0 ? max_tokens : 0;
    free_ws(m); /* re-laid out on the next forward */
}

int ffm_check_tokens(const ff_model *m, const int32_t *tok, int64_t n, const char *what, bool allow_minus_one) {
    for (int64_t i = 0; i < n; i++) {
        if ((tok[i] >= 0 && tok[i] < m->cfg.vocab_size) || (allow_minus_one && tok[i] == -1)) continue;
        return ff_error_set(what, "token ids must be in [0, vocab_size); check the tokenizer matches the model",
                            "token %lld is %d, out of range for vocab_size %d", (long long)i, tok[i], m->cfg.vocab_size);
    }
    return 0;
}

/* ---- activations and scratch ---------------------------------------------------------------- */

static int32_t chunk_for(const ff_model *m, int32_t T) {
    int32_t c = m->logits_chunk;
    if (c <= 0) {
        ff_backend_memory mem;
        ff_backend_memory_of(m->be, &mem);
        size_t budget = LOGITS_BUDGET_BYTES, device = (size_t)mem.capacity / LOGITS_DEVICE_SHARE;
        if (!m->inference && device > budget) budget = device;
        size_t per = (size_t)m->V * sizeof(float);
        size_t k = budget / per;
        c = k < 1 ? 1 : k > INT32_MAX ? INT32_MAX : (int32_t)k;
    }
    return c < T ? c : T;
}

int32_t ff_model_logits_chunk_of(const ff_model *m, int32_t tokens) {
    assert(tokens > 0);
    return chunk_for(m, tokens);
}

static size_t take(size_t *o, size_t bytes) {
    size_t at = *o;
    *o += (bytes + 63) & ~(size_t)63;
    return at;
}

static bool head_chunk(const ff_model *m, int c) { return c == m->n_chunks - 1 && m->has_final; }
static bool embed_chunk(const ff_model *m, int c) { return c == 0 && m->has_embed; }

/* Lay out and allocate a's buffer for cap tokens, keeping its shape (n_slots, kept, head). */
static int acts_alloc(ff_model *m, ffm_acts *a, int32_t cap) {
    acts_free(a);
    const size_t f = sizeof(float), Tz = (size_t)cap, H = (size_t)m->H, HD = (size_t)m->Hq * m->D;
    const size_t Tl = m->sp ? (size_t)ffm_sp_max_rows(m, cap) : Tz; /* SP: a rank's rows of the residual stream */
    size_t o = 0;
    a->resid_stride = (Tl * H * f + 63) & ~(size_t)63;
    a->resid = take(&o, a->resid_stride * (a->kept ? (size_t)a->n_slots + 1 : 1));
    a->in16 = ffm_act16(m);
    const size_t in_bytes = a->in16 ? 2 : f; /* xn1, qkv, att, xn2, gu, hm: bf16 (in16, and no fp32 copy kept), or fp32 */
    size_t lo = 0; /* one layer's activations */
    size_t xn1 = take(&lo, Tz * H * in_bytes), rstd1 = take(&lo, Tz * f), qkv = take(&lo, Tz * (size_t)m->QKV * in_bytes);
    size_t att = take(&lo, Tz * HD * in_bytes), lse = take(&lo, Tz * (size_t)m->Hq * f), mid = take(&lo, Tl * H * f);
    size_t xn2 = take(&lo, Tz * H * in_bytes), rstd2 = take(&lo, Tz * f), gu = take(&lo, Tz * 2 * (size_t)m->I * in_bytes);
    size_t hm = take(&lo, Tz * (size_t)m->I * in_bytes);
    a->layer_stride = lo;
    size_t base = take(&o, lo * (size_t)a->n_slots);
    a->xn1 = base + xn1, a->rstd1 = base + rstd1, a->qkv = base + qkv, a->att = base + att, a->lse = base + lse;
    a->mid = base + mid, a->xn2 = base + xn2, a->rstd2 = base + rstd2, a->gu = base + gu, a->hm = base + hm;
    a->part = take(&o, m->sp ? Tz * H * f : 0);
    if (a->head) {
        a->xf = take(&o, Tz * H * f);
        a->rstdf = take(&o, Tz * f);
        a->tok_lse = take(&o, Tz * f);
        a->logprob = take(&o, Tz * f);
        a->entropy = take(&o, Tz * f);
        a->values = take(&o, Tz * f);
    }
    a->tokens = take(&o, Tz * 4);
    a->targets = take(&o, Tz * 4);
    a->pos = take(&o, Tz * 4);
    a->seq_start = take(&o, (Tz + 1) * 4);
    a->buf = ff_buffer_new(m->be, o);
    a->seq_start_host = ff_malloc((Tz + 1) * sizeof(int32_t));
    if (!a->buf || !a->seq_start_host) {
        acts_free(a);
        return ff_error_wrap("activations for %d tokens", cap);
    }
    a->cap = cap;
    return 0;
}

/* A new set of the given shape in the pool, for cap tokens. NULL + error. */
static ffm_acts *acts_add(ff_model *m, int32_t n_slots, bool kept, bool head, int32_t cap) {
    if (m->n_acts == m->cap_acts) {
        int c = m->cap_acts ? 2 * m->cap_acts : 4;
        ffm_acts **p = ff_realloc(m->acts, sizeof *p * (size_t)c);
        if (!p) return NULL;
        m->acts = p;
        m->cap_acts = c;
    }
    ffm_acts *a = ff_calloc(1, sizeof *a);
    if (!a) return NULL;
    *a = (ffm_acts){.n_slots = n_slots, .kept = kept, .head = head, .micro = FFM_FREE};
    if (acts_alloc(m, a, cap)) {
        free(a);
        return NULL;
    }
    m->acts[m->n_acts++] = a;
    return a;
}

/* The shape a forward through chunk c needs: a kept set the chunk's layers, else one slot. */
static void shape_for(const ff_model *m, int c, bool kept, int32_t *n_slots, bool *head) {
    *n_slots = kept ? m->chunk_nl[c] : 1;
    *head = kept ? head_chunk(m, c) : m->has_final; /* an unkept set serves every chunk */
}

/* Can set a hold a forward of T tokens as it is laid out? (Where the forwards hold bf16
 * activations every set holds the bf16 forms, and no set does otherwise.) */
static bool acts_fits(const ff_model *m, const ffm_acts *a, int32_t T) {
    return a->cap >= T && a->in16 == ffm_act16(m);
}

/* A free set for a forward of T tokens through chunk c: one of the exact shape first, then
 * any that fits; a fitting one too small (or laid out for other products) is made again, and
 * only when none fits is one added. */
static ffm_acts *acts_take(ff_model *m, int c, bool kept, int32_t T) {
    int32_t ns;
    bool hd;
    shape_for(m, c, kept, &ns, &hd);
    ffm_acts *grow = NULL;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m->n_acts; i++) {
            ffm_acts *a = m->acts[i];
            if (a->micro != FFM_FREE || (kept && !a->kept) || a->n_slots < ns || (head_chunk(m, c) && !a->head)) continue;
            if (pass == 0 && (a->n_slots != ns || a->head != hd || a->kept != kept)) continue;
            if (acts_fits(m, a, T)) return a;
            if (!grow) grow = a;
        }
    if (grow) {
        if (m->sc.logits_of == grow) m->sc.logits_of = NULL;
        return acts_alloc(m, grow, T) ? NULL : grow;
    }
    return acts_add(m, ns, kept, hd, T);
}

static ffm_acts *acts_held(const ff_model *m, int c, int32_t micro) {
    for (int i = 0; i < m->n_acts; i++)
        if (m->acts[i]->micro == micro && m->acts[i]->chunk == c) return m->acts[i];
    return NULL;
}

static void acts_release(ff_model *m, ffm_acts *a) {
    if (m->sc.logits_of == a) m->sc.logits_of = NULL;
    a->micro = FFM_FREE;
}

/* The scratch for T tokens (bwd: with the backward's gradients). */
static int scratch_ensure(ff_model *m, int32_t T, bool bwd) {
    ffm_scratch *w = &m->sc;
    const bool p16 = bwd && m->p16;
    bool f16 = ffm_act16(m); /* a forward's fp32 forms of its bf16 activations go to dxn and dqkv */
    if (w->buf && T <= w->cap && (!bwd || w->bwd) && (!p16 || w->p16) && (!f16 || w->f16)) return 0;
    int32_t cap = T > w->cap ? T : w->cap;
    bwd = bwd || w->bwd;
    f16 = f16 || w->f16;
    ff_buffer_destroy(&w->buf);
    free(w->pos_host);
    memset(w, 0, sizeof *w);
    const size_t f = sizeof(float), Tz = (size_t)cap, H = (size_t)m->H, HD = (size_t)m->Hq * m->D;
    size_t o = 0;
    w->logits = take(&o, m->has_final && m->lm_head ? (size_t)chunk_for(m, cap) * (size_t)m->V * f : 0);
    w->dlogprob = take(&o, Tz * f);
    w->dentropy = take(&o, Tz * f);
    w->dvalues = take(&o, Tz * f);
    if (bwd || f16) {
        w->dxn = take(&o, Tz * H * f);
        w->dqkv = take(&o, Tz * (size_t)m->QKV * f);
    }
    if (bwd) {
        w->dres = take(&o, (m->sp ? (size_t)ffm_sp_max_rows(m, cap) : Tz) * H * f); /* SP: the rank's rows */
        w->datt = take(&o, Tz * HD * f);
        w->delta = take(&o, Tz * (size_t)m->Hq * f);
        w->dgu = take(&o, Tz * 2 * (size_t)m->I * f);
        w->dh = take(&o, Tz * (size_t)m->I * f);
        if (p16) {
            size_t n = H > (size_t)m->QKV ? H : (size_t)m->QKV;
            if (HD > n) n = HD;
            if (2 * (size_t)m->I > n) n = 2 * (size_t)m->I;
            w->dy16 = take(&o, Tz * n * 2);
        }
    }
    w->buf = ff_buffer_new(m->be, o ? o : 64);
    w->pos_host = ff_malloc(Tz * sizeof(int32_t));
    if (!w->buf || !w->pos_host) {
        ff_buffer_destroy(&w->buf);
        free(w->pos_host);
        memset(w, 0, sizeof *w);
        return ff_error_wrap("scratch for %d tokens", cap);
    }
    w->cap = cap;
    w->bwd = bwd;
    w->p16 = p16;
    w->f16 = f16 || bwd;
    return 0;
}

/* bf16 products: the buffer of the weights' bf16 copy (made by a forward after the weights change). 0 or -1 + error. */
static int w16c_ensure(ff_model *m) {
    if (!m->p16 || m->w16c) return 0;
    m->w16c_gen = 0; /* a new buffer holds no copy yet */
    if (!(m->w16c = ff_buffer_new(m->be, (size_t)m->n_decay * 2)))
        return ff_error_wrap("the bf16 copy of the weights (%lld elements) for bf16 products", (long long)m->n_decay);
    ffm_buffers_moved(m);
    return 0;
}

int ffm_bf16_copy_fresh(ff_model *m) {
    assert(m->p16);
    if (w16c_ensure(m)) return -1;
    if (m->w16c_gen != m->params_gen + 1) {
        ff_cast_f32_bf16(m->st, ff_dptr_of(m->params, 0), ff_dptr_of(m->w16c, 0), m->n_decay);
        m->w16c_gen = m->params_gen + 1;
        m->w16c_made++;
    }
    return 0;
}

int ff_model_stage_reserve(ff_model *m, int32_t max_tokens, const int32_t *in_flight) {
    if (max_tokens < 1) return ff_error_set("reserve", NULL, "max_tokens %d must be >= 1", max_tokens);
    if (m->inference) {
        ffm_acts *a = acts_take(m, 0, false, max_tokens);
        if (!a) return -1;
    } else {
        for (int c = 0; c < m->n_chunks; c++) {
            int32_t want = in_flight ? in_flight[c] : 1, have = 0, ns;
            bool hd;
            shape_for(m, c, true, &ns, &hd);
            for (int i = 0; i < m->n_acts; i++) {
                ffm_acts *a = m->acts[i];
                if (!a->kept || a->n_slots != ns || a->head != hd || have >= want) continue;
                if (!acts_fits(m, a, max_tokens) && a->micro == FFM_FREE && acts_alloc(m, a, max_tokens)) return -1;
                have++;
            }
            for (; have < want; have++)
                if (!acts_add(m, ns, true, hd, max_tokens)) return -1;
        }
    }
    if (scratch_ensure(m, max_tokens, !m->inference) || w16c_ensure(m)) return -1;
    return ffm_tp_reserve(m, max_tokens);
}

int ff_model_reserve(ff_model *m, int32_t max_tokens) { return ff_model_stage_reserve(m, max_tokens, NULL); }

int32_t ff_model_stage_in_flight(const ff_model *m, int c) {
    int32_t n = 0;
    for (int i = 0; i < m->n_acts; i++) n += m->acts[i]->micro != FFM_FREE && m->acts[i]->chunk == c;
    return n;
}

void ff_model_stage_drop(ff_model *m) {
    for (int i = 0; i < m->n_acts; i++) acts_release(m, m->acts[i]);
}

/* ---- forward ------------------------------------------------------------------------------ */

#define AW(a, field) ff_dptr_of((a)->buf, (a)->field)
#define AWL(a, field, l) ff_dptr_of((a)->buf, (a)->field + (size_t)(l) * (a)->layer_stride)
#define RESID(a, i) ff_dptr_of((a)->buf, (a)->resid + (size_t)(i) * (a)->resid_stride)
#define SC(field) ff_dptr_of(m->sc.buf, m->sc.field)

/* Where the i-th layer of a forward puts its activations. Kept: slot i, reading residual i
 * and writing residual i + 1. Otherwise slot 0 for every layer, the residual in place. A set
 * of a model whose forwards hold bf16 activations (in16, ffm_act16), kept or not, holds the
 * bf16 forms and no room for the fp32 ones: the forward writes the norms' outputs and q|k|v into
 * the scratch's dxn [T, H] and dqkv [T, QKV] (the backward's, free while a forward runs; an
 * inference model's scratch has them for this alone), and the attention output and the MLP's gu
 * and hm exist in bf16 only. So a scoring forward rounds where a training forward does, and
 * gives its log-probs and values bit for bit; and so does an inference model's on a backend
 * whose products are bf16, holding the same weights. */
static ffm_layer_acts layer_acts(const ff_model *m, const ffm_acts *w, int i, bool kept) {
    int a = kept ? i : 0;
    ffm_layer_acts r = {.x = RESID(w, a), .xn1 = AWL(w, xn1, a), .rstd1 = AWL(w, rstd1, a), .qkv = AWL(w, qkv, a),
                        .att = AWL(w, att, a), .lse = AWL(w, lse, a), .mid = kept ? AWL(w, mid, a) : RESID(w, 0),
                        .xn2 = AWL(w, xn2, a), .rstd2 = AWL(w, rstd2, a), .gu = AWL(w, gu, a), .hm = AWL(w, hm, a),
                        .y = RESID(w, kept ? i + 1 : 0), .part = AW(w, part)};
    if (w->in16) {
        assert(m->sc.f16);
        r.xn1_16 = r.xn1, r.xn2_16 = r.xn2, r.qkv_16 = r.qkv, r.att_16 = r.att, r.hm_16 = r.hm, r.gu_16 = r.gu;
        r.xn1 = r.xn2 = SC(dxn);
        r.qkv = SC(dqkv);
        r.att = r.gu = r.hm = (ff_dptr){0};
    }
    return r;
}

void ff_batch_shift_targets(const int32_t *tokens, const int32_t *seq_start, int32_t n_seqs, int32_t *targets) {
    for (int32_t s = 0; s < n_seqs; s++)
        for (int32_t t = seq_start[s]; t < seq_start[s + 1]; t++)
            targets[t] = t + 1 < seq_start[s + 1] ? tokens[t + 1] : -1;
}

static int check_batch(const ff_model *m, const ff_batch *b) {
    if (!b || b->n_tokens < 1 || b->n_seqs < 1 || !b->tokens || !b->seq_start)
        return ff_error_set("batch", "give at least one token and one sequence", "empty or incomplete batch");
    if (b->n_seqs > b->n_tokens)
        return ff_error_set("batch", "every sequence needs at least one token", "%d sequences for %d tokens",
                            b->n_seqs, b->n_tokens);
    if (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens)
        return ff_error_set("batch", "seq_start[0] must be 0 and seq_start[n_seqs] the token count",
                            "sequence offsets cover [%d, %d), not [0, %d)", b->seq_start[0], b->seq_start[b->n_seqs],
                            b->n_tokens);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t n = b->seq_start[s + 1] - b->seq_start[s];
        if (n < 1)
            return ff_error_set("batch", "offsets must increase; drop empty sequences", "sequence %d has %d tokens", s, n);
        if (n > m->max_pos)
            return ff_error_set("batch", "split or truncate it",
                                "sequence %d has %d tokens, more than max_position_embeddings = %d", s, n, m->max_pos);
    }
    if (ffm_check_tokens(m, b->tokens, b->n_tokens, "batch tokens", false)) return -1;
    if (b->targets && ffm_check_tokens(m, b->targets, b->n_tokens, "batch targets", true)) return -1;
    return 0;
}

/* Logits of tokens [c0, c0 + n) of a's final-norm output into the scratch's logits. */
static void lm_logits(ff_model *m, const ffm_acts *a, int32_t c0, int32_t n) {
    ffm_w_out(m, &m->tensors[m->t_lm], n, ff_dptr_add(AW(a, xf), (size_t)c0 * m->H, 4), m->H, SC(logits), m->V);
}

/* A stage's [T, H] hidden states in or out: in host memory (h) or on the model's backend (d),
 * or neither. */
typedef struct hio {
    float *h;
    ff_dptr d;
} hio;
static bool hio_none(hio x) { return !x.h && ff_dptr_null(x.d); }
static hio hio_host(const float *h) { return (hio){.h = (float *)h}; } /* an input is only read */

/* One forward of b through chunk c: from token ids (the embedding chunk) or hidden_in [T, H],
 * through the chunk's layers, to the heads' outputs (the head chunk) or hidden_out [T, H].
 * Kept (train) under (c, micro) for its backward. */
static int run_forward(ff_model *m, int c, int32_t micro, const ff_batch *b, hio hidden_in,
                       const ff_forward_opts *opts, const ff_forward_out *out_opt, hio hidden_out) {
    const ff_forward_out none = {0};
    const ff_forward_out *out = out_opt ? out_opt : &none;
    const bool train = opts && opts->train, embed = embed_chunk(m, c), head = head_chunk(m, c);
    float temp = opts && opts->temperature > 0 ? opts->temperature : 1.0f;
    if (train && m->inference) return ffm_inference_only("training forward");
    if (train && ffm_grads_released(m, "training forward")) return -1;
    if (check_batch(m, b)) return -1;
    if (!embed && hio_none(hidden_in))
        return ff_error_set("stage forward", "give the previous chunk's output hidden states [T, H]",
                            "chunk %d starts at layer %d and needs its input", c, m->layer_global[m->chunk_l0[c]]);
    if (!head && hio_none(hidden_out))
        return ff_error_set("stage forward", "give room for the output hidden states [T, H]",
                            "chunk %d ends before the last layer", c);
    bool want_lm = head && (out->logprobs || out->entropy || out->logits || (train && m->lm_head && b->targets));
    if (head && out->logprobs && !b->targets)
        return ff_error_set("forward", "set batch.targets (ff_batch_shift_targets)", "log-probs need target tokens");
    if (want_lm && !m->lm_head)
        return ff_error_set("forward", "this model is a critic: ask it for values only",
                            "log-probs, entropy and logits need an LM head, and the weights have none");
    if (head && out->values && !m->vhead)
        return ff_error_set("forward", "set value_head in the config and give score.weight",
                            "values need a value head, and this model has none");
    if (!(temp > 0 && isfinite(temp))) return ff_error_set("forward", NULL, "temperature %g must be > 0", (double)temp);
    if (head && out->logits && m->tp > 1)
        return ff_error_set("forward", "ask for log-probs and entropy, which are computed over the vocabulary shards",
                            "the [T, V] logits are not gathered under tensor parallelism");
    if (m->sp && b->n_tokens < m->tp)
        return ff_error_set("forward", "give at least as many tokens as ranks, or turn sequence parallelism off",
                            "sequence parallelism splits the batch's %d tokens over %d tensor-parallel ranks",
                            b->n_tokens, m->tp);
    if (train && micro != FFM_MAIN && acts_held(m, c, micro))
        return ff_error_set("stage forward", "run its backward first (ff_model_stage_backward)",
                            "micro-batch %d is already in flight through chunk %d", micro, c);
    if (train && micro == FFM_MAIN) { /* a new training forward replaces the one before */
        ffm_acts *old = acts_held(m, c, micro);
        if (old) acts_release(m, old);
    }
    const int32_t T = b->n_tokens, S = b->n_seqs;
    if (scratch_ensure(m, T, !m->inference)) return -1;
    if (w16c_ensure(m)) return -1;
    ffm_acts *a = acts_take(m, c, train, T);
    if (!a) return -1;
    int32_t *ids = m->tp > 1 ? ffm_tp_ids(m, 2 * (size_t)T) : NULL; /* [2, T] this rank's token, target ids */
    if (m->tp > 1 && !ids) return -1;
    ff_stream *st = m->st;
    const int H = m->H, l0 = m->chunk_l0[c], nl = m->chunk_nl[c];
    const float eps = (float)m->cfg.rms_norm_eps;
    a->chunk = c;
    a->micro = micro; /* held while it runs; released below unless kept */

    /* inputs */
    int32_t *pos = m->sc.pos_host;
    for (int32_t s = 0; s < S; s++)
        for (int32_t t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) pos[t] = t - b->seq_start[s];
    memcpy(a->seq_start_host, b->seq_start, ((size_t)S + 1) * sizeof(int32_t));
    const bool targets = head && b->targets;
    if (ids) {
        if (embed) ffm_tp_local_ids(m, b->tokens, ids, T, false);
        if (targets) ffm_tp_local_ids(m, b->targets, ids + T, T, true);
    }
    if (embed) ff_memcpy_h2d(st, AW(a, tokens), ids ? ids : b->tokens, (size_t)T * 4);
    if (targets) ff_memcpy_h2d(st, AW(a, targets), ids ? ids + T : b->targets, (size_t)T * 4);
    ff_memcpy_h2d(st, AW(a, pos), pos, (size_t)T * 4);
    ff_memcpy_h2d(st, AW(a, seq_start), b->seq_start, ((size_t)S + 1) * 4);

    int rc = -1;
    /* SP: the residual stream is this rank's rows [r0, r0 + nr) of the tokens (else all) */
    const bool sp = m->sp;
    int32_t r0 = 0, nr = T;
    if (sp) ffm_sp_rows(m, T, m->tp_rank, &r0, &nr);
    if (m->p16) { /* the weights as they are now, rounded for this forward's embedding rows and products (and
                   * its backward's products) */
        if (ffm_bf16_copy_fresh(m)) goto done;
        m->w16c_live = true;
    }
    if (embed) {
        /* vocabulary-parallel: a token outside this rank's rows embeds to zeros, and the sum
         * over the group has every row (SP: the reduce-scatter of it, the rank's rows) */
        ff_dptr e = sp ? AW(a, part) : RESID(a, 0);
        if (ffm_w_embed(m, &m->tensors[m->t_embed], ids ? ids : b->tokens, AW(a, tokens), e, layer_acts(m, a, 0, train).xn1, T)) goto done;
        if (sp ? ffm_sp_scatter(m, e, RESID(a, 0), T, H) : m->tp > 1 && ffm_tp_sum(m, e, (size_t)T * H)) goto done;
    } else if (hidden_in.h) {
        ff_memcpy_h2d(st, RESID(a, 0), hidden_in.h + (size_t)r0 * H, (size_t)nr * H * 4);
    } else {
        ff_memcpy_d2d(st, RESID(a, 0), ff_dptr_add(hidden_in.d, (size_t)r0 * H, 4), (size_t)nr * H * 4);
    }
    const ffm_layer_tokens tk = {.T = T, .pos = AW(a, pos), .S = S, .seq_start = AW(a, seq_start),
                                 .sp = sp, .r0 = r0, .nr = nr};
    for (int i = 0; i < nl; i++) {
        ffm_layer_acts la = layer_acts(m, a, i, train);
        if (ffm_layer_forward(m, l0 + i, &tk, &la)) goto done;
    }
    ff_dptr xL = RESID(a, train ? nl : 0);
    bool values = false, entropy = false;
    int32_t chunk = 0;
    if (!head) {
        /* SP: the next stage gets the whole [T, H] (gathered), as without SP */
        if (sp) {
            if (hidden_out.h ? ffm_sp_gather_host(m, xL, hidden_out.h, T, H) : ffm_sp_gather(m, xL, hidden_out.d, T, H)) goto done;
        } else if (hidden_out.h) {
            ff_memcpy_d2h(st, hidden_out.h, xL, (size_t)T * H * 4);
        } else {
            ff_memcpy_d2d(st, hidden_out.d, xL, (size_t)T * H * 4);
        }
    } else {
        /* the final norm and the value head on the rank's rows; SP gathers the norm's output
         * for the LM head (the values, [T], for the caller) */
        ff_dptr xf = AW(a, xf), xf_mine = ff_dptr_add(xf, (size_t)r0 * H, 4);
        ff_dptr v_mine = ff_dptr_add(AW(a, values), (size_t)r0, 4);
        ff_rmsnorm_fwd(st, xL, ffm_w_vec(m, &m->tensors[m->t_norm]), xf_mine, AW(a, rstdf), nr, H, eps);
        values = m->vhead && (out->values || train);
        if (values) {
            ffm_w_out(m, &m->tensors[m->t_score], nr, xf_mine, H, v_mine, 1);
            if (out->values && sp && ffm_sp_gather_host(m, v_mine, out->values, T, 1)) goto done;
            if (out->values && !sp) ff_memcpy_d2h(st, out->values, v_mine, (size_t)T * 4);
        }
        if (want_lm && sp && ffm_sp_gather(m, xf_mine, xf, T, H)) goto done;
        chunk = chunk_for(m, T);
        entropy = out->entropy || (train && want_lm) || m->tp > 1; /* TP: the shard's entropy combines */
        if (want_lm) {
            ff_dptr tg = targets ? AW(a, targets) : (ff_dptr){0};
            for (int32_t c0 = 0; c0 < T; c0 += chunk) {
                int32_t n = T - c0 < chunk ? T - c0 : chunk;
                lm_logits(m, a, c0, n);
                ff_logprob_fwd(st, SC(logits), targets ? ff_dptr_add(tg, (size_t)c0, 4) : tg, 1.0f / temp, n, m->V,
                               targets ? ff_dptr_add(AW(a, logprob), (size_t)c0, 4) : (ff_dptr){0},
                               entropy ? ff_dptr_add(AW(a, entropy), (size_t)c0, 4) : (ff_dptr){0},
                               ff_dptr_add(AW(a, tok_lse), (size_t)c0, 4));
                if (out->logits)
                    ff_memcpy_d2h(st, out->logits + (size_t)c0 * m->V, SC(logits), (size_t)n * m->V * 4);
            }
            /* the logits of a one-chunk forward stay for its backward until another writes them */
            m->sc.logits_of = train && chunk == T ? a : NULL;
            /* vocabulary-parallel: this rank's statistics into the whole vocabulary's */
            if (m->tp > 1 && ffm_tp_vocab_combine(m, AW(a, tok_lse), AW(a, entropy),
                                                  targets ? AW(a, logprob) : (ff_dptr){0}, b->targets, T))
                goto done;
            if (out->logprobs) ff_memcpy_d2h(st, out->logprobs, AW(a, logprob), (size_t)T * 4);
            if (out->entropy) ff_memcpy_d2h(st, out->entropy, AW(a, entropy), (size_t)T * 4);
        }
    }
    if (ff_stream_sync(st)) goto done;
    rc = 0;
    if (train) {
        a->T = T;
        a->S = S;
        a->lm = want_lm;
        a->has_targets = targets;
        a->has_entropy = entropy && want_lm;
        a->has_values = values;
        a->lm_chunk = chunk;
        a->inv_temp = 1.0f / temp;
    }
done:
    m->w16c_live = false;
    if (rc || !train) acts_release(m, a);
    return rc;
}

int ff_model_forward(ff_model *m, const ff_batch *b, const ff_forward_opts *opts, ff_forward_out *out) {
    if (!ffm_whole(m))
        return ff_error_set("forward", "run a pipeline stage's chunks with ff_model_stage_forward",
                            "this model is a pipeline stage, not the whole model");
    return run_forward(m, 0, FFM_MAIN, b, (hio){0}, opts, out, (hio){0});
}

int ff_model_stage_forward(ff_model *m, int chunk, int32_t micro, const ff_batch *b, const float *hidden_in,
                           const ff_forward_opts *opts, ff_forward_out *out, float *hidden_out) {
    if (chunk < 0 || chunk >= m->n_chunks)
        return ff_error_set("stage forward", NULL, "chunk %d: the model has %d", chunk, m->n_chunks);
    if (micro < 0) return ff_error_set("stage forward", NULL, "micro-batch %d must be >= 0", micro);
    return run_forward(m, chunk, micro, b, hio_host(hidden_in), opts, out, (hio){.h = hidden_out});
}

/* a [T, H] buffer on the model's backend, or none */
static int dev_io(const ff_model *m, ff_dptr p, const char *what) {
    if (ff_dptr_null(p) || ff_buffer_backend(p.buf) == m->be) return 0;
    return ff_error_set(what, "give a buffer of the model's backend", "the hidden states' buffer is on another backend");
}

int ff_model_stage_forward_dev(ff_model *m, int chunk, int32_t micro, const ff_batch *b, ff_dptr hidden_in,
                               const ff_forward_opts *opts, ff_forward_out *out, ff_dptr hidden_out) {
    if (chunk < 0 || chunk >= m->n_chunks)
        return ff_error_set("stage forward", NULL, "chunk %d: the model has %d", chunk, m->n_chunks);
    if (micro < 0) return ff_error_set("stage forward", NULL, "micro-batch %d must be >= 0", micro);
    if (dev_io(m, hidden_in, "stage forward") || dev_io(m, hidden_out, "stage forward")) return -1;
    return run_forward(m, chunk, micro, b, (hio){.d = hidden_in}, opts, out, (hio){.d = hidden_out});
}

/* ---- backward ----------------------------------------------------------------------------- */

/* An operand of a backward product: fp32, or bf16 (the weights' copy; an output gradient rounded
 * once for its two products) while the model's products are bf16 (w16c_live). */
typedef struct opnd {
    ff_dptr p;
    bool b16;
    int ld;
} opnd;
static opnd f32op(ff_dptr p, int ld) { return (opnd){p, false, ld}; }
/* the weight matrix at element off, rows of ld */
static opnd wop(ff_model *m, size_t off, int ld) {
    return m->w16c_live ? (opnd){ffm_copy16(m, off), true, ld} : f32op(ffm_param(m, off), ld);
}
/* a product input the forward kept [T, ld]: its bf16 copy (in16), or fp32 */
static opnd actop(ff_dptr f32, ff_dptr b16, int ld) { return ff_dptr_null(b16) ? f32op(f32, ld) : (opnd){b16, true, ld}; }
/* dy [T, N] dense, for the input-gradient and weight-gradient products that read it */
static opnd gradop(ff_model *m, ff_dptr dy, int T, int N) {
    if (!m->w16c_live) return f32op(dy, N);
    ff_cast_f32_bf16(m->st, dy, SC(dy16), (int64_t)T * N);
    return (opnd){SC(dy16), true, N};
}
/* C [M, N] = op(A) op(B) + beta C */
static void prod(ff_model *m, ff_trans ta, ff_trans tb, int M, int N, int K, opnd A, opnd B, float beta, ff_dptr C,
                 int ldc) {
    if (m->w16c_live) ff_gemm_bf16(m->st, ta, tb, M, N, K, 1.0f, A.p, A.b16, A.ld, B.p, B.b16, B.ld, beta, C, ldc);
    else {
        assert(!A.b16 && !B.b16);
        ff_gemm(m->st, ta, tb, M, N, K, 1.0f, A.p, A.ld, B.p, B.ld, beta, C, ldc);
    }
}

/* The backward of a's training forward through chunk c: from d_hidden_out [T, H] or the heads'
 * output gradients to d_hidden_in [T, H] or the embedding's gradient. Releases a. */
static int run_backward(ff_model *m, ffm_acts *a, hio d_hidden_out, const float *d_logprobs,
                        const float *d_entropy, const float *d_values, hio d_hidden_in) {
    const int c = a->chunk;
    const bool embed = embed_chunk(m, c), head = head_chunk(m, c);
    if ((d_logprobs && !(a->lm && a->has_targets)) || (d_entropy && !a->has_entropy))
        return ff_error_set("backward", "the forward needs an LM head and batch.targets",
                            "gradient given for log-probs or entropy that the forward did not compute");
    if (d_values && !a->has_values)
        return ff_error_set("backward", "the model needs a value head", "gradient given for values that do not exist");
    if (!head && hio_none(d_hidden_out))
        return ff_error_set("stage backward", "give the gradient of the chunk's output [T, H]", "chunk %d has no heads", c);
    if (!embed && hio_none(d_hidden_in))
        return ff_error_set("stage backward", "give room for the gradient of the chunk's input [T, H]",
                            "chunk %d has no embedding", c);
    ff_stream *st = m->st;
    const int32_t T = a->T, S = a->S;
    const int H = m->H, QKV = m->QKV, HD = m->Hq * m->D, I = m->I, l0 = m->chunk_l0[c], nl = m->chunk_nl[c];
    ff_dptr dres = SC(dres), dxn = SC(dxn), dqkv = SC(dqkv), datt = SC(datt), dgu = SC(dgu), dh = SC(dh);
    int rc = -1;
    /* bf16 products: the copy the forward made (none when they were turned on since) */
    m->w16c_live = m->p16 && m->w16c && m->sc.p16;
    assert(!a->in16 || m->w16c_live); /* ff_model_set_bf16_products refuses while a forward is held */
    /* SP: dres and the norms' inputs and output gradients are the rank's rows [r0, r0 + nr)
     * (dxn's first nr rows after a reduce-scatter), the products' output gradients dy [T, H]
     * the all-gather of dres into dxn; the norms' and the value head's weight gradients are
     * partial (m->sp_dw), summed over the group at the end */
    const bool sp = m->sp;
    int32_t r0 = 0, nr = T;
    if (sp) {
        ffm_sp_rows(m, T, m->tp_rank, &r0, &nr);
        ffm_sp_zero_grads(m, l0, nl, head);
    }
#define NORM_DW(off, l, which) (sp ? ffm_sp_dw(m, (l), (which)) : ffm_grad(m, (off)))

    if (head) {
        /* gradient at the final norm's output: dxn [T, H]. Under TP the LM head's part is a
         * partial sum over the vocabulary shards (all-reduced below, the f operator of a
         * column-parallel product), and the value head's is whole on every rank: rank 0 alone
         * adds it before that sum. SP: the sum is a reduce-scatter to the rank's rows, and each
         * rank adds the value head's part of its rows after it. */
        const bool lm_grad = d_logprobs || d_entropy, reduce_dxn = m->tp > 1 && lm_grad;
        ff_memset_zero(st, dxn, (size_t)T * H * 4);
        if (d_values && !sp) {
            ff_memcpy_h2d(st, SC(dvalues), d_values, (size_t)T * 4);
            if (!reduce_dxn || m->tp_rank == 0)
                prod(m, FF_NO_TRANS, FF_NO_TRANS, T, H, 1, f32op(SC(dvalues), 1), wop(m, m->off_score, H), 1.0f, dxn, H);
            prod(m, FF_TRANS, FF_NO_TRANS, 1, H, T, f32op(SC(dvalues), 1), f32op(AW(a, xf), H), 1.0f,
                 ffm_grad(m, m->off_score), H);
        }
        if (lm_grad) {
            if (d_logprobs) ff_memcpy_h2d(st, SC(dlogprob), d_logprobs, (size_t)T * 4);
            if (d_entropy) ff_memcpy_h2d(st, SC(dentropy), d_entropy, (size_t)T * 4);
            const int32_t chunk = a->lm_chunk;
            const bool recompute = m->sc.logits_of != a; /* another forward wrote the logits since */
            for (int32_t c0 = 0; c0 < T; c0 += chunk) {
                int32_t n = T - c0 < chunk ? T - c0 : chunk;
                if (recompute) lm_logits(m, a, c0, n);
                /* bf16 products: dlogits rounded where they are made, in each row's first half
                 * (a bf16 [n, V] of ld 2V), for both products below */
                (m->w16c_live ? ff_logprob_bwd_bf16 : ff_logprob_bwd)(
                    st, SC(logits), a->has_targets ? ff_dptr_add(AW(a, targets), (size_t)c0, 4) : (ff_dptr){0}, a->inv_temp,
                    n, m->V, ff_dptr_add(AW(a, tok_lse), (size_t)c0, 4),
                    d_logprobs ? ff_dptr_add(SC(dlogprob), (size_t)c0, 4) : (ff_dptr){0},
                    d_entropy ? ff_dptr_add(SC(dentropy), (size_t)c0, 4) : (ff_dptr){0},
                    d_entropy ? ff_dptr_add(AW(a, entropy), (size_t)c0, 4) : (ff_dptr){0});
                const opnd dl = m->w16c_live ? (opnd){SC(logits), true, 2 * m->V} : f32op(SC(logits), m->V);
                /* dxf += dlogits [n, V] @ W [V, H];  dW += dlogits^T @ xf */
                prod(m, FF_NO_TRANS, FF_NO_TRANS, n, H, m->V, dl, wop(m, m->off_lm, H), 1.0f,
                     ff_dptr_add(dxn, (size_t)c0 * H, 4), H);
                prod(m, FF_TRANS, FF_NO_TRANS, m->V, H, n, dl, f32op(ff_dptr_add(AW(a, xf), (size_t)c0 * H, 4), H), 1.0f,
                     ffm_grad(m, m->off_lm), H);
            }
            m->sc.logits_of = NULL; /* the logits buffer now holds dlogits */
        }
        if (sp) { /* the LM head's part reduce-scattered to the rank's rows, then the value head's */
            if (lm_grad && ffm_sp_scatter(m, dxn, dxn, T, H)) goto done;
            if (d_values) {
                ff_dptr xf_mine = ff_dptr_add(AW(a, xf), (size_t)r0 * H, 4);
                ff_memcpy_h2d(st, SC(dvalues), d_values + r0, (size_t)nr * 4);
                prod(m, FF_NO_TRANS, FF_NO_TRANS, nr, H, 1, f32op(SC(dvalues), 1), wop(m, m->off_score, H), 1.0f, dxn, H);
                prod(m, FF_TRANS, FF_NO_TRANS, 1, H, nr, f32op(SC(dvalues), 1), f32op(xf_mine, H), 1.0f,
                     ffm_sp_dw(m, m->L, 1), H);
            }
        } else if (reduce_dxn && ffm_tp_sum(m, dxn, (size_t)T * H)) {
            goto done;
        }
        ff_memset_zero(st, dres, (size_t)nr * H * 4);
        ff_rmsnorm_bwd(st, RESID(a, nl), ffm_param(m, m->off_norm), AW(a, rstdf), dxn, dres,
                       NORM_DW(m->off_norm, m->L, 0), nr, H);
    } else if (d_hidden_out.h) {
        ff_memcpy_h2d(st, dres, d_hidden_out.h + (size_t)r0 * H, (size_t)nr * H * 4);
    } else {
        ff_memcpy_d2d(st, dres, ff_dptr_add(d_hidden_out.d, (size_t)r0 * H, 4), (size_t)nr * H * 4);
    }

    for (int i = nl - 1; i >= 0; i--) {
        const ff_layer_params *p = &m->layers[l0 + i];
        const ffm_layer_acts la = layer_acts(m, a, i, true);
        /* y = mid + hm @ Wdown^T: dres is d y and, after the norm below, d mid */
        ff_dptr dy = dres;
        if (sp) { /* the backward of the forward's reduce-scatter */
            if (ffm_sp_gather(m, dres, dxn, T, H)) goto done;
            dy = dxn;
        }
        opnd g = gradop(m, dy, T, H);
        if (ff_dptr_null(la.gu_16)) {
            prod(m, FF_NO_TRANS, FF_NO_TRANS, T, I, H, g, wop(m, p->wdown, I), 0.0f, dh, I);
            prod(m, FF_TRANS, FF_NO_TRANS, H, I, T, g, actop(la.hm, la.hm_16, I), 1.0f, ffm_grad(m, p->wdown), I);
            ff_swiglu_bwd(st, la.gu, dh, dgu, T, I);
            g = gradop(m, dgu, T, 2 * I);
        } else { /* the MLP's backward in bf16 as its forward: dh [T, I] written in bf16 into dh's
                  * room, SwiGLU's gradient dgu [T, 2I] in bf16 into dy16 (whose dy the down
                  * products have read), read as it is by gate|up's products */
            ff_gemm_bf16_out(st, FF_NO_TRANS, FF_NO_TRANS, T, I, H, g.p, g.b16, g.ld, ffm_copy16(m, p->wdown), true, I, dh, I);
            prod(m, FF_TRANS, FF_NO_TRANS, H, I, T, g, actop(la.hm, la.hm_16, I), 1.0f, ffm_grad(m, p->wdown), I);
            ff_swiglu_bwd_bf16(st, la.gu_16, dh, SC(dy16), T, I);
            g = (opnd){SC(dy16), true, 2 * I};
        }
        prod(m, FF_NO_TRANS, FF_NO_TRANS, T, H, 2 * I, g, wop(m, p->wgu, H), 0.0f, dxn, H);
        prod(m, FF_TRANS, FF_NO_TRANS, 2 * I, H, T, g, actop(la.xn2, la.xn2_16, H), 1.0f, ffm_grad(m, p->wgu), H);
        /* f: gate|up is column-parallel (SP: the backward of the all-gather) */
        if (sp ? ffm_sp_scatter(m, dxn, dxn, T, H) : m->tp > 1 && ffm_tp_sum(m, dxn, (size_t)T * H)) goto done;
        ff_rmsnorm_bwd(st, la.mid, ffm_param(m, p->ln2), la.rstd2, dxn, dres, NORM_DW(p->ln2, l0 + i, 1), nr, H);
        /* mid = x + att @ Wo^T */
        dy = dres;
        if (sp) {
            if (ffm_sp_gather(m, dres, dxn, T, H)) goto done;
            dy = dxn;
        }
        g = gradop(m, dy, T, H);
        if (ff_dptr_null(la.qkv_16)) {
            prod(m, FF_NO_TRANS, FF_NO_TRANS, T, HD, H, g, wop(m, p->wo, HD), 0.0f, datt, HD);
            prod(m, FF_TRANS, FF_NO_TRANS, H, HD, T, g, actop(la.att, la.att_16, HD), 1.0f, ffm_grad(m, p->wo), HD);
            ff_attention_bwd(st, la.qkv, QKV, AW(a, seq_start), a->seq_start_host, S, T, m->Hq, m->Hkv, m->D, la.att,
                             la.lse, datt, SC(delta), dqkv);
        } else { /* attention's backward on bf16 as its forward: the output gradient datt [T, Hq D]
                  * written in bf16 into its room, read with the kept q|k|v and output; dqkv (fp32)
                  * overwrites the forward's fp32 q|k|v scratch, long unused */
            ff_gemm_bf16_out(st, FF_NO_TRANS, FF_NO_TRANS, T, HD, H, g.p, g.b16, g.ld, ffm_copy16(m, p->wo), true, HD, datt, HD);
            prod(m, FF_TRANS, FF_NO_TRANS, H, HD, T, g, actop(la.att, la.att_16, HD), 1.0f, ffm_grad(m, p->wo), HD);
            ff_attention_bwd_bf16(st, la.qkv_16, QKV, AW(a, seq_start), a->seq_start_host, S, T, m->Hq, m->Hkv, m->D,
                                  la.att_16, la.lse, datt, SC(delta), dqkv);
        }
        ff_rope_bwd(st, dqkv, QKV, AW(a, pos), ff_dptr_of(m->rope_cos, 0), ff_dptr_of(m->rope_sin, 0), T,
                    m->Hq + m->Hkv, m->D);
        g = gradop(m, dqkv, T, QKV);
        prod(m, FF_NO_TRANS, FF_NO_TRANS, T, H, QKV, g, wop(m, p->wqkv, H), 0.0f, dxn, H);
        const opnd xn1 = actop(la.xn1, la.xn1_16, H);
        if (m->kv_rep > 1) { /* TP: q rows here; the k|v head is shared, its gradient summed over the sharers */
            if (m->bias) ff_bias_bwd(st, dqkv, QKV, ffm_grad(m, p->bqkv), T, HD);
            prod(m, FF_TRANS, FF_NO_TRANS, HD, H, T, g, xn1, 1.0f, ffm_grad(m, p->wqkv), H);
            if (ffm_tp_kv_grads(m, p, dqkv, xn1.p, xn1.b16, T)) goto done;
        } else {
            if (m->bias) ff_bias_bwd(st, dqkv, QKV, ffm_grad(m, p->bqkv), T, QKV);
            prod(m, FF_TRANS, FF_NO_TRANS, QKV, H, T, g, xn1, 1.0f, ffm_grad(m, p->wqkv), H);
        }
        /* f: q|k|v is column-parallel */
        if (sp ? ffm_sp_scatter(m, dxn, dxn, T, H) : m->tp > 1 && ffm_tp_sum(m, dxn, (size_t)T * H)) goto done;
        ff_rmsnorm_bwd(st, la.x, ffm_param(m, p->ln1), la.rstd1, dxn, dres, NORM_DW(p->ln1, l0 + i, 0), nr, H);
    }
#undef NORM_DW
    if (embed) { /* SP: the vocabulary-parallel embedding sees every token's gradient (gathered) */
        if (sp && ffm_sp_gather(m, dres, dxn, T, H)) goto done;
        ff_embedding_bwd(st, AW(a, tokens), sp ? dxn : dres, ffm_grad(m, m->off_embed), T, H);
    } else if (sp) { /* the previous stage gets the whole [T, H], as without SP */
        if (d_hidden_in.h ? ffm_sp_gather_host(m, dres, d_hidden_in.h, T, H) : ffm_sp_gather(m, dres, d_hidden_in.d, T, H)) goto done;
    } else if (d_hidden_in.h) {
        ff_memcpy_d2h(st, d_hidden_in.h, dres, (size_t)T * H * 4);
    } else {
        ff_memcpy_d2d(st, d_hidden_in.d, dres, (size_t)T * H * 4);
    }
    if (sp && ffm_sp_finish_grads(m, l0, nl, head)) goto done;
    rc = ff_stream_sync(st);
done:
    m->w16c_live = false;
    acts_release(m, a);
    return rc;
}

int ff_model_backward(ff_model *m, const float *d_logprobs, const float *d_entropy, const float *d_values) {
    if (m->inference) return ffm_inference_only("backward");
    if (ffm_grads_released(m, "backward")) return -1;
    ffm_acts *a = ffm_whole(m) ? acts_held(m, 0, FFM_MAIN) : NULL;
    if (!a)
        return ff_error_set("backward", "run ff_model_forward with opts.train = true first (once per backward)",
                            "no training forward to go back through");
    return run_backward(m, a, (hio){0}, d_logprobs, d_entropy, d_values, (hio){0});
}

int ff_model_stage_backward(ff_model *m, int chunk, int32_t micro, const float *d_hidden_out, const float *d_logprobs,
                            const float *d_entropy, const float *d_values, float *d_hidden_in) {
    if (m->inference) return ffm_inference_only("backward");
    if (ffm_grads_released(m, "stage backward")) return -1;
    ffm_acts *a = micro >= 0 && chunk >= 0 && chunk < m->n_chunks ? acts_held(m, chunk, micro) : NULL;
    if (!a)
        return ff_error_set("stage backward", "run its training forward first (ff_model_stage_forward, opts.train)",
                            "micro-batch %d has no training forward in flight through chunk %d", micro, chunk);
    return run_backward(m, a, hio_host(d_hidden_out), d_logprobs, d_entropy, d_values, (hio){.h = d_hidden_in});
}

int ff_model_stage_backward_dev(ff_model *m, int chunk, int32_t micro, ff_dptr d_hidden_out, const float *d_logprobs,
                                const float *d_entropy, const float *d_values, ff_dptr d_hidden_in) {
    if (m->inference) return ffm_inference_only("backward");
    if (ffm_grads_released(m, "stage backward")) return -1;
    if (dev_io(m, d_hidden_out, "stage backward") || dev_io(m, d_hidden_in, "stage backward")) return -1;
    ffm_acts *a = micro >= 0 && chunk >= 0 && chunk < m->n_chunks ? acts_held(m, chunk, micro) : NULL;
    if (!a)
        return ff_error_set("stage backward", "run its training forward first (ff_model_stage_forward, opts.train)",
                            "micro-batch %d has no training forward in flight through chunk %d", micro, chunk);
    return run_backward(m, a, (hio){.d = d_hidden_out}, d_logprobs, d_entropy, d_values, (hio){.d = d_hidden_in});
}

double ff_sft_loss(const float *logprobs, const float *mask, int32_t T, float scale, float *d_logprobs) {
    double n = 0.0, loss = 0.0;
    for (int32_t t = 0; t < T; t++) n += mask ? mask[t] : 1.0;
    double denom = n > 1.0 ? n : 1.0;
    for (int32_t t = 0; t < T; t++) {
        double w = mask ? mask[t] : 1.0;
        loss -= w * logprobs[t];
        if (d_logprobs) d_logprobs[t] = (float)(-w / denom * scale);
    }
    return loss / denom;
}

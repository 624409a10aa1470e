/* Model folders: weights checked against config.json, and whole folders read and written
 * (see include/fuseflow/modelio.h). The list of expected tensors is model_config.h's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/modelio.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"

/* Shard limit when writing: Hugging Face's save_pretrained default. */
#define SHARD_BYTES (5ull * 1000 * 1000 * 1000)

typedef struct expect {
    char name[128];
    int ndim;
    int64_t shape[2];
    bool optional;
} expect;

/* Every tensor of the config in model_config.h's order; returns the count (array of cap). */
static size_t expected(const ff_model_config *c, expect *out, size_t cap) {
    size_t n = 0;
#define ADD(opt, nd, d0, d1, ...)                                              \
    do {                                                                       \
        if (n < cap) {                                                         \
            snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__);            \
            out[n].ndim = (nd);                                                \
            out[n].shape[0] = (d0);                                            \
            out[n].shape[1] = (d1);                                            \
            out[n].optional = (opt);                                           \
        }                                                                      \
        n++;                                                                   \
    } while (0)
    int64_t V = c->vocab_size, H = c->hidden_size, I = c->intermediate_size;
    /* head_dim 0 means hidden_size / num_attention_heads (model_config.h), as configs built in code leave it */
    int64_t D = c->head_dim > 0 ? c->head_dim : (c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0);
    int64_t q = (int64_t)c->num_attention_heads * D, kv = (int64_t)c->num_key_value_heads * D;
    ADD(false, 2, V, H, "model.embed_tokens.weight");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        ADD(false, 1, H, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(false, 2, q, H, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(false, 2, kv, H, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(false, 2, kv, H, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->attention_bias) {
            ADD(false, 1, q, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            ADD(false, 1, kv, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            ADD(false, 1, kv, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        ADD(false, 2, H, q, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(false, 1, H, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(false, 2, I, H, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(false, 2, I, H, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(false, 2, H, I, "model.layers.%d.mlp.down_proj.weight", l);
    }
    ADD(false, 1, H, 0, "model.norm.weight");
    if (!c->tie_word_embeddings) ADD(c->value_head, 2, V, H, "lm_head.weight");
    if (c->value_head) ADD(false, 2, 1, H, "score.weight");
#undef ADD
    return n;
}

static void remove_tensor(ff_tensor_set *w, size_t i) {
    free(w->items[i].name);
    free(w->items[i].data);
    memmove(&w->items[i], &w->items[i + 1], (w->n - i - 1) * sizeof *w->items);
    w->n--;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int ff_hf_expected_tensors(const ff_model_config *cfg, ff_tensor_set *out) {
    size_t n = expected(cfg, NULL, 0);
    expect *ex = ff_malloc(n * sizeof *ex);
    if (!ex) return -1;
    expected(cfg, ex, n);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (!ff_tensor_set_add(out, ex[i].name, ex[i].ndim, ex[i].shape)) rc = -1;
    free(ex);
    return rc;
}

/* ff_hf_check_weights' and ff_hf_check_dir's refusals */
static const char *k_mismatch = "the weights do not match config.json";
static int missing(const char *where, const char *name) { return ff_error_set(where, k_mismatch, "missing tensor '%s'", name); }
static int tied_head(const char *where) {
    return ff_error_set(where, "set tie_word_embeddings to false in config.json if the checkpoint has its own LM head",
                        "config.json ties the embeddings but the weights have a different 'lm_head.weight'");
}
static int unexpected(const char *where, const ff_model_config *cfg, const char *name) {
    return ff_error_set(where, k_mismatch, "unexpected tensor '%.200s' (the config has %d layers%s)", name, cfg->num_hidden_layers,
                        cfg->tie_word_embeddings ? ", tied embeddings" : "");
}

int ff_hf_check_weights(const ff_model_config *cfg, ff_tensor_set *w, const char *where) {
    size_t n = expected(cfg, NULL, 0);
    expect *ex = ff_malloc(n * sizeof *ex);
    if (!ex) return -1;
    expected(cfg, ex, n);
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        ff_host_tensor *t = ff_tensor_set_find(w, ex[i].name);
        if (!t) {
            if (ex[i].optional) continue;
            missing(where, ex[i].name);
            goto out;
        }
        if (ff_host_tensor_expect(t, ex[i].ndim, ex[i].shape, where) != 0) goto out;
    }
    /* anything else is either a harmless extra or a sign that the config is wrong */
    for (size_t i = 0; i < w->n;) {
        const ff_host_tensor *t = &w->items[i];
        bool known = false;
        for (size_t k = 0; k < n && !known; k++) known = !strcmp(ex[k].name, t->name);
        if (known) {
            i++;
            continue;
        }
        if (ends_with(t->name, ".rotary_emb.inv_freq")) { /* a buffer old exporters saved */
            remove_tensor(w, i);
            continue;
        }
        if (cfg->tie_word_embeddings && !strcmp(t->name, "lm_head.weight")) {
            const ff_host_tensor *e = ff_tensor_set_find(w, "model.embed_tokens.weight");
            if (e && ff_host_tensor_expect(t, e->ndim, e->shape, NULL) == 0 &&
                !memcmp(t->data, e->data, (size_t)ff_host_tensor_numel(e) * sizeof(float))) {
                remove_tensor(w, i);
                continue;
            }
            tied_head(where);
            goto out;
        }
        unexpected(where, cfg, t->name);
        goto out;
    }
    rc = 0;
out:
    free(ex);
    return rc;
}

/* an entry as a host tensor without data, for ff_host_tensor_expect's message */
static ff_host_tensor header_of(const ff_st_entry *e) {
    ff_host_tensor t = {.name = (char *)e->name, .ndim = e->ndim};
    for (int d = 0; d < e->ndim && d < FF_MAX_DIMS; d++) t.shape[d] = e->shape[d];
    return t;
}

int ff_hf_check_dir(const ff_model_config *cfg, const ff_st_dir *d, const char *where) {
    size_t n = expected(cfg, NULL, 0);
    expect *ex = ff_malloc(n * sizeof *ex);
    if (!ex) return -1;
    expected(cfg, ex, n);
    int rc = -1;
    for (size_t i = 0; i < n; i++) {
        const ff_st_entry *e = ff_st_dir_find(d, ex[i].name, NULL);
        if (!e) {
            if (ex[i].optional) continue;
            missing(where, ex[i].name);
            goto out;
        }
        const ff_host_tensor t = header_of(e);
        if (ff_host_tensor_expect(&t, ex[i].ndim, ex[i].shape, where) != 0) goto out;
    }
    for (size_t i = 0; i < ff_st_dir_count(d); i++) {
        const ff_safetensors *f;
        const ff_st_entry *e = ff_st_dir_entry(d, i, &f);
        bool known = false;
        for (size_t k = 0; k < n && !known; k++) known = !strcmp(ex[k].name, e->name);
        if (known || ends_with(e->name, ".rotary_emb.inv_freq")) continue;
        if (cfg->tie_word_embeddings && !strcmp(e->name, "lm_head.weight")) { /* accepted when it is the embedding's bytes */
            const ff_safetensors *fe;
            const ff_st_entry *emb = ff_st_dir_find(d, "model.embed_tokens.weight", &fe);
            const ff_host_tensor t = header_of(e);
            if (emb && emb->dtype == e->dtype && ff_host_tensor_expect(&t, emb->ndim, emb->shape, NULL) == 0 &&
                !memcmp(ff_safetensors_bytes(f, e), ff_safetensors_bytes(fe, emb), (size_t)(e->end - e->begin)))
                continue;
            tied_head(where);
            goto out;
        }
        unexpected(where, cfg, e->name);
        goto out;
    }
    rc = 0;
out:
    free(ex);
    return rc;
}

int ff_model_dir_load(const char *dir, ff_model_config *cfg, ff_tensor_set **weights) {
    *weights = NULL;
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ff_hf_config_load(path, cfg) != 0) return ff_checkpoint_error(dir);
    ff_tensor_set *w = ff_tensor_set_new();
    if (!w) return -1;
    if (ff_safetensors_load_dir(dir, w) != 0 || ff_hf_check_weights(cfg, w, dir) != 0) {
        ff_tensor_set_destroy(&w);
        return ff_checkpoint_error(dir);
    }
    for (size_t i = 0; i < w->n; i++) {
        const ff_host_tensor *t = &w->items[i];
        int64_t numel = ff_host_tensor_numel(t);
        for (int64_t k = 0; k < numel; k++)
            if (!isfinite(t->data[k])) {
                ff_error_set(dir, "the checkpoint is damaged (a diverged run?)", "tensor '%s' has a non-finite value at element %lld", t->name, (long long)k);
                ff_tensor_set_destroy(&w);
                return ff_checkpoint_error(dir);
            }
    }
    *weights = w;
    return 0;
}

static const char *torch_dtype_name(ff_dtype d) {
    switch (d) {
    case FF_DTYPE_BF16: return "bfloat16";
    case FF_DTYPE_F16: return "float16";
    default: return "float32";
    }
}

int ff_model_files_write(const char *dir, const ff_model_config *cfg, const ff_tensor_set *weights, const ff_tokenizer *tok, ff_dtype dtype) {
    char path[FF_PATH_MAX];
    char *text = ff_hf_config_dump(cfg, torch_dtype_name(dtype));
    if (!text) return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = ff_write_file_atomic(path, text, strlen(text));
    free(text);
    if (rc != 0) return -1;
    if (ff_safetensors_save_sharded(dir, weights, dtype, SHARD_BYTES) != 0) return -1;
    if (tok && ff_tokenizer_save_dir(tok, dir) != 0) return -1;
    return 0;
}

int ff_model_dir_save(const char *dir, const ff_model_config *cfg, const ff_tensor_set *weights, const ff_tokenizer *tok, ff_dtype dtype) {
    char tmp[FF_PATH_MAX];
    if (ff_atomic_dir_begin(dir, tmp, sizeof tmp) != 0) return -1;
    if (ff_model_files_write(tmp, cfg, weights, tok, dtype) != 0) {
        ff_atomic_dir_abort(tmp);
        return -1;
    }
    return ff_atomic_dir_commit(tmp, dir);
}

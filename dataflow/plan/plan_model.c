/* Planner models: named presets, the same read from a Hugging Face config.json, and parameter
 * counts. Shapes follow the HF layouts (Llama: Q, K, V, O and a SwiGLU MLP; GPT: Q, K, V, O and a
 * GeLU MLP with biases and LayerNorm). Not here: activations or FLOPs (plan_eval.c). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

typedef struct preset {
    const char *name;
    ff_plan_model m;
} preset;

/* Hyper-parameters from the models' published config.json files (GPT-3 from its paper, Table
 * 2.1: 96 layers, d_model 12288, 96 heads of 128, context 2048, GPT-2's tokenizer). */
static const preset presets[] = {
    {"llama3-8b", {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, false, true, false, false, 0, 0, 0, 0, 0, false}},
    {"llama3-70b", {"llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, false, true, false, false, 0, 0, 0, 0, 0, false}},
    {"llama3-405b", {"llama3-405b", 126, 16384, 128, 8, 128, 53248, 128256, false, true, false, false, 0, 0, 0, 0, 0, false}},
    {"gpt3-175b", {"gpt3-175b", 96, 12288, 96, 96, 128, 49152, 50257, true, false, true, true, 2048, 0, 0, 0, 0, false}},
    {"mixtral-8x7b", {"mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, false, true, false, false, 0, 8, 2, 32, 14336, false}},
    /* LLaMA (1), RLHFuse's Table 2 models: 40/60/80 layers, 40/52/64 heads of 128, FFN 13824,
     * 17920, 22016, vocabulary 32000 */
    {"llama-13b", {"llama-13b", 40, 5120, 40, 40, 128, 13824, 32000, false, true, false, false, 0, 0, 0, 0, 0, false}},
    {"llama-33b", {"llama-33b", 60, 6656, 52, 52, 128, 17920, 32000, false, true, false, false, 0, 0, 0, 0, 0, false}},
    {"llama-65b", {"llama-65b", 80, 8192, 64, 64, 128, 22016, 32000, false, true, false, false, 0, 0, 0, 0, 0, false}},
};
#define NPRESETS (sizeof presets / sizeof presets[0])

static const char *const preset_names[] = {"llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "mixtral-8x7b", "llama-13b", "llama-33b", "llama-65b", NULL};

const char *const *ff_plan_model_preset_names(void) { return preset_names; }

int ff_plan_model_preset(const char *name, ff_plan_model *out) {
    for (size_t i = 0; i < NPRESETS; i++)
        if (!strcmp(presets[i].name, name)) {
            *out = presets[i].m;
            return 0;
        }
    char known[256] = "";
    for (size_t i = 0; i < NPRESETS; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, presets[i].name, sizeof known - strlen(known) - 1);
    }
    return ff_error_set(name, "use one of the presets or read a config.json with --config", "unknown model preset (known: %s)",
                        known);
}

/* ---- parameter counts ---------------------------------------------------------------------- */

static double norm_params(const ff_plan_model *m) { return (double)m->hidden * (m->layernorm ? 2.0 : 1.0); }

double ff_plan_params_attention(const ff_plan_model *m) {
    double h = (double)m->hidden, q = (double)m->heads * (double)m->head_dim, kv = (double)m->kv_heads * (double)m->head_dim;
    double p = h * q + 2.0 * h * kv + q * h; /* W_Q, W_K, W_V [h -> .], W_O [q -> h] */
    if (m->linear_bias) p += q + 2.0 * kv + h;
    return p;
}

static double mlp_params(const ff_plan_model *m, int64_t inner) {
    double h = (double)m->hidden, f = (double)inner;
    double p = (m->gated_mlp ? 3.0 : 2.0) * h * f;
    if (m->linear_bias) p += (m->gated_mlp ? 2.0 : 1.0) * f + h;
    return p;
}

double ff_plan_params_mlp(const ff_plan_model *m) { return mlp_params(m, m->ffn); }

double ff_plan_params_expert(const ff_plan_model *m) { return mlp_params(m, m->expert_ffn > 0 ? m->expert_ffn : m->ffn); }

double ff_plan_params_embedding(const ff_plan_model *m) { return (double)m->vocab * (double)m->hidden; }

static double router_params(const ff_plan_model *m) { return (double)m->hidden * (double)m->experts; }

static double params_with_experts(const ff_plan_model *m, double experts_counted) {
    double le = m->experts > 0 ? (double)m->moe_layers : 0.0, l = (double)m->layers;
    double per_layer = ff_plan_params_attention(m) + 2.0 * norm_params(m);
    double p = l * per_layer + (l - le) * ff_plan_params_mlp(m);
    if (le > 0) p += le * (experts_counted * ff_plan_params_expert(m) + router_params(m));
    p += ff_plan_params_embedding(m) + (double)m->pos_embeddings * (double)m->hidden + norm_params(m);
    if (!m->tied_embeddings) p += ff_plan_params_embedding(m);
    return p;
}

double ff_plan_params_total(const ff_plan_model *m) { return params_with_experts(m, (double)m->experts); }

double ff_plan_params_active(const ff_plan_model *m) { return params_with_experts(m, (double)m->experts_per_token); }

/* ---- config.json ------------------------------------------------------------------------- */

/* The first of `keys` present in obj (NULL when none); *which names it. */
static json_t *first_key(json_t *obj, const char *const *keys, const char **which) {
    for (; *keys; keys++) {
        json_t *v = json_object_get(obj, *keys);
        if (v && !json_is_null(v)) {
            *which = *keys;
            return v;
        }
    }
    *which = NULL;
    return NULL;
}

/* 1 = found and valid, 0 = absent, -1 = bad (error set). */
static int get_count(json_t *obj, const char *where, const char *const *keys, int64_t *out) {
    const char *k;
    json_t *v = first_key(obj, keys, &k);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return ff_error_set(where, "fix the value in config.json", "'%s' must be a non-negative integer", k);
    *out = (int64_t)json_integer_value(v);
    return 1;
}

static int need_count(json_t *obj, const char *where, const char *const *keys, int64_t *out) {
    int rc = get_count(obj, where, keys, out);
    if (rc < 0) return -1;
    if (rc == 0 || *out <= 0)
        return ff_error_set(where, "is this a transformer's config.json?", "'%s' is %s", keys[0], rc == 0 ? "missing" : "not positive");
    return 0;
}

int ff_plan_model_from_hf_json(const char *text, size_t len, const char *where, ff_plan_model *out) {
    if (!where) where = "<config.json>";
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) {
        char w[512];
        snprintf(w, sizeof w, "%s:%d:%d", where, jerr.line, jerr.column);
        return ff_error_set(w, "the file is not valid JSON; check it with python3 -m json.tool", "%s", jerr.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return ff_error_set(where, "a config.json holds one JSON object", "not a JSON object");
    }
    ff_plan_model m;
    memset(&m, 0, sizeof m);
    const char *type = json_string_value(json_object_get(root, "model_type"));
    bool gpt2 = type && (!strcmp(type, "gpt2") || !strcmp(type, "gpt_neo") || !strcmp(type, "openai-gpt"));
    snprintf(m.name, sizeof m.name, "%s", type ? type : "config.json");
    m.gated_mlp = !gpt2;
    m.linear_bias = gpt2;
    m.layernorm = gpt2;
    m.tied_embeddings = gpt2; /* GPT-2 ties; Llama, Mistral, Mixtral, Qwen2 say so explicitly */

    static const char *const k_layers[] = {"num_hidden_layers", "n_layer", "num_layers", NULL};
    static const char *const k_hidden[] = {"hidden_size", "n_embd", "d_model", NULL};
    static const char *const k_heads[] = {"num_attention_heads", "n_head", NULL};
    static const char *const k_kv[] = {"num_key_value_heads", NULL};
    static const char *const k_hd[] = {"head_dim", NULL};
    static const char *const k_ffn[] = {"intermediate_size", "n_inner", "ffn_dim", NULL};
    static const char *const k_vocab[] = {"vocab_size", NULL};
    static const char *const k_pos[] = {"n_positions", NULL};
    static const char *const k_experts[] = {"num_local_experts", "num_experts", "n_routed_experts", NULL};
    static const char *const k_topk[] = {"num_experts_per_tok", NULL};
    static const char *const k_moe_ffn[] = {"moe_intermediate_size", NULL};
    static const char *const k_shared[] = {"shared_expert_intermediate_size", "n_shared_experts", NULL};

    int rc = 0;
    if (need_count(root, where, k_layers, &m.layers) || need_count(root, where, k_hidden, &m.hidden) ||
        need_count(root, where, k_heads, &m.heads) || need_count(root, where, k_vocab, &m.vocab))
        rc = -1;
    if (!rc) {
        int r = get_count(root, where, k_kv, &m.kv_heads);
        if (r < 0) rc = -1;
        else if (r == 0 || m.kv_heads == 0) m.kv_heads = m.heads;
    }
    if (!rc) {
        int r = get_count(root, where, k_hd, &m.head_dim);
        if (r < 0) rc = -1;
        else if (r == 0 || m.head_dim == 0) {
            if (m.hidden % m.heads) rc = ff_error_set(where, "add head_dim", "hidden size %lld is not a multiple of %lld heads and no head_dim is given",
                                                     (long long)m.hidden, (long long)m.heads);
            m.head_dim = m.hidden / m.heads;
        }
    }
    if (!rc) {
        int r = get_count(root, where, k_ffn, &m.ffn);
        if (r < 0) rc = -1;
        else if (r == 0 || m.ffn == 0) {
            if (!gpt2) rc = ff_error_set(where, "is this a transformer's config.json?", "'intermediate_size' is missing");
            m.ffn = 4 * m.hidden; /* GPT-2: n_inner null means 4h */
        }
    }
    if (!rc && gpt2 && get_count(root, where, k_pos, &m.pos_embeddings) < 0) rc = -1;
    if (!rc) {
        json_t *tie = json_object_get(root, "tie_word_embeddings");
        if (tie && !json_is_null(tie)) {
            if (!json_is_boolean(tie)) rc = ff_error_set(where, "write true or false", "'tie_word_embeddings' must be a boolean");
            else m.tied_embeddings = json_is_true(tie);
        }
    }
    if (!rc) {
        int r = get_count(root, where, k_experts, &m.experts);
        if (r < 0) rc = -1;
        else if (r > 0 && m.experts > 0) {
            const char *k;
            if (first_key(root, k_shared, &k))
                rc = ff_error_set(where, "shared experts are not modelled; use a preset or the model flags", "'%s': shared experts", k);
            if (!rc && need_count(root, where, k_topk, &m.experts_per_token)) rc = -1;
            if (!rc && get_count(root, where, k_moe_ffn, &m.expert_ffn) < 0) rc = -1;
            if (!rc && m.expert_ffn == 0) m.expert_ffn = m.ffn;
            m.moe_layers = m.layers;
        }
    }
    json_decref(root);
    if (rc) return -1;
    *out = m;
    return 0;
}

int ff_plan_model_from_hf_config(const char *path, ff_plan_model *out) {
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) return -1;
    int rc = ff_plan_model_from_hf_json(text, len, path, out);
    free(text);
    return rc;
}

/* config.json <-> ff_model_config for the Llama family (see include/fuseflow/modelio.h).
 * Defaults follow transformers' LlamaConfig, Qwen2Config and MistralConfig. Keys we do not
 * use are ignored (real configs carry dozens); keys that change the computation in a way
 * the engine does not implement are refused by name. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/modelio.h"
#include "fuseflow/util.h"

typedef struct family {
    const char *model_type;
    const char *prefix; /* architectures: PREFIX "ForCausalLM" / "ForSequenceClassification" */
} family;

static const family k_families[] = {{"llama", "Llama"}, {"qwen2", "Qwen2"}, {"mistral", "Mistral"}};
enum { N_FAMILIES = 3 };
static const char *k_supported = "supported: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM (and their ForSequenceClassification)";

static const family *family_by_type(const char *t) {
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(k_families[i].model_type, t)) return &k_families[i];
    return NULL;
}

int ff_hf_config_defaults(const char *model_type, ff_model_config *c) {
    memset(c, 0, sizeof *c);
    const family *f = family_by_type(model_type);
    if (!f) return ff_error_set(NULL, k_supported, "unsupported model_type '%.64s'", model_type);
    snprintf(c->model_type, sizeof c->model_type, "%s", f->model_type);
    c->rope_theta = 10000.0;
    c->rms_norm_eps = 1e-6;
    c->bos_token_id = -1;
    c->pad_token_id = -1;
    c->num_hidden_layers = 32;
    c->num_attention_heads = 32;
    c->hidden_size = 4096;
    if (!strcmp(model_type, "llama")) {
        c->vocab_size = 32000;
        c->intermediate_size = 11008;
        c->num_key_value_heads = 32;
        c->max_position_embeddings = 2048;
        c->bos_token_id = 1;
        c->eos_token_ids[0] = 2;
        c->n_eos = 1;
    } else if (!strcmp(model_type, "qwen2")) {
        c->vocab_size = 151936;
        c->intermediate_size = 22016;
        c->num_key_value_heads = 32;
        c->max_position_embeddings = 32768;
        c->attention_bias = true; /* Qwen2 always has q/k/v biases */
    } else {                      /* mistral */
        c->vocab_size = 32000;
        c->intermediate_size = 14336;
        c->num_key_value_heads = 8;
        c->max_position_embeddings = 4096 * 32;
        c->bos_token_id = 1;
        c->eos_token_ids[0] = 2;
        c->n_eos = 1;
    }
    c->head_dim = c->hidden_size / c->num_attention_heads;
    return 0;
}

/* ---- parsing ------------------------------------------------------------------------------ */

/* key present and not null */
static json_t *get(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return (v && !json_is_null(v)) ? v : NULL;
}

static int get_int(json_t *o, const char *k, int32_t *out, const char *name) {
    json_t *v = get(o, k);
    if (!v) return 0;
    json_int_t x;
    if (json_is_integer(v))
        x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 2e9)
        x = (json_int_t)json_real_value(v); /* 4096.0 is still 4096 */
    else
        return ff_error_set(name, NULL, "'%s' must be an integer", k);
    if (x < INT32_MIN || x > INT32_MAX) return ff_error_set(name, NULL, "'%s' = %lld is out of range", k, (long long)x);
    *out = (int32_t)x;
    return 0;
}

static int get_num(json_t *o, const char *k, double *out, const char *name) {
    json_t *v = get(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return ff_error_set(name, NULL, "'%s' must be a number", k);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *k, bool *out, const char *name) {
    json_t *v = get(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return ff_error_set(name, NULL, "'%s' must be true or false", k);
    *out = json_is_true(v);
    return 0;
}

/* bos/pad: an integer or null (-1). eos: an integer, a list of integers, or null. */
static int get_token_ids(json_t *o, ff_model_config *c, const char *name) {
    json_t *v;
    if (json_object_get(o, "bos_token_id")) {
        c->bos_token_id = -1;
        if (get_int(o, "bos_token_id", &c->bos_token_id, name) != 0) return -1;
    }
    if (get_int(o, "pad_token_id", &c->pad_token_id, name) != 0) return -1;
    if ((v = json_object_get(o, "eos_token_id"))) {
        c->n_eos = 0;
        if (json_is_integer(v)) {
            if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) return ff_error_set(name, NULL, "'eos_token_id' is out of range");
            c->eos_token_ids[c->n_eos++] = (int32_t)json_integer_value(v);
        } else if (json_is_array(v)) {
            if (json_array_size(v) > FF_MAX_EOS)
                return ff_error_set(name, NULL, "'eos_token_id' lists %zu ids, at most %d are supported", json_array_size(v), FF_MAX_EOS);
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                if (!json_is_integer(x)) return ff_error_set(name, NULL, "'eos_token_id' must be an integer or a list of integers");
                if (json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) return ff_error_set(name, NULL, "'eos_token_id' is out of range");
                c->eos_token_ids[c->n_eos++] = (int32_t)json_integer_value(x);
            }
        } else if (!json_is_null(v)) {
            return ff_error_set(name, NULL, "'eos_token_id' must be an integer or a list of integers");
        }
    }
    return 0;
}

static int parse_rope_scaling(json_t *rs, ff_model_config *c, const char *name) {
    if (!rs) return 0;
    if (!json_is_object(rs)) return ff_error_set(name, NULL, "'rope_scaling' must be an object or null");
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (!type) return ff_error_set(name, NULL, "'rope_scaling' has no \"rope_type\"");
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3") != 0)
        return ff_error_set(name, "supported: none (\"default\") and \"llama3\"", "unsupported rope scaling '%.64s'", type);
    c->rope_scaling.kind = FF_ROPE_SCALING_LLAMA3;
    const char *keys[3] = {"factor", "low_freq_factor", "high_freq_factor"};
    double *dst[3] = {&c->rope_scaling.factor, &c->rope_scaling.low_freq_factor, &c->rope_scaling.high_freq_factor};
    for (int i = 0; i < 3; i++) {
        if (!get(rs, keys[i])) return ff_error_set(name, NULL, "llama3 'rope_scaling' needs \"%s\"", keys[i]);
        if (get_num(rs, keys[i], dst[i], name) != 0) return -1;
    }
    if (!get(rs, "original_max_position_embeddings"))
        return ff_error_set(name, NULL, "llama3 'rope_scaling' needs \"original_max_position_embeddings\"");
    if (get_int(rs, "original_max_position_embeddings", &c->rope_scaling.original_max_position_embeddings, name) != 0) return -1;
    if (!(c->rope_scaling.factor > 0) || !(c->rope_scaling.low_freq_factor > 0) ||
        !(c->rope_scaling.high_freq_factor > c->rope_scaling.low_freq_factor) || c->rope_scaling.original_max_position_embeddings <= 0)
        return ff_error_set(name, NULL, "llama3 'rope_scaling' needs factor > 0, high_freq_factor > low_freq_factor > 0, original_max_position_embeddings > 0");
    return 0;
}

/* Which family and head kind the file declares: model_type and/or architectures[0]. */
static int parse_architecture(json_t *o, ff_model_config *c, const char *name, bool *value_head) {
    const char *mt = json_string_value(json_object_get(o, "model_type"));
    json_t *archs = json_object_get(o, "architectures");
    const char *arch = NULL;
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs) || json_array_size(archs) < 1 || !json_is_string(json_array_get(archs, 0)))
            return ff_error_set(name, NULL, "'architectures' must be a list of class names");
        if (json_array_size(archs) > 1) return ff_error_set(name, k_supported, "'architectures' lists several classes; one is supported");
        arch = json_string_value(json_array_get(archs, 0));
    }
    if (!mt && !arch) return ff_error_set(name, k_supported, "neither 'model_type' nor 'architectures' is given");
    const family *f = NULL;
    *value_head = false;
    if (arch) {
        for (int i = 0; i < N_FAMILIES && !f; i++) {
            size_t n = strlen(k_families[i].prefix);
            if (strncmp(arch, k_families[i].prefix, n) != 0) continue;
            if (!strcmp(arch + n, "ForCausalLM")) {
                f = &k_families[i];
            } else if (!strcmp(arch + n, "ForSequenceClassification")) {
                f = &k_families[i];
                *value_head = true;
            }
        }
        if (!f) return ff_error_set(name, k_supported, "unsupported architecture '%.64s'", arch);
        if (mt && strcmp(mt, f->model_type) != 0)
            return ff_error_set(name, NULL, "'model_type' is '%.64s' but 'architectures' says %.64s", mt, arch);
    } else {
        f = family_by_type(mt);
        if (!f) return ff_error_set(name, k_supported, "unsupported model_type '%.64s'", mt);
    }
    return ff_hf_config_defaults(f->model_type, c);
}

static int parse_object(json_t *o, const char *name, ff_model_config *c) {
    if (!json_is_object(o)) return ff_error_set(name, NULL, "config.json must be a JSON object");
    bool value_head = false;
    if (parse_architecture(o, c, name, &value_head) != 0) return -1;
    c->value_head = value_head;
    const char *mt = c->model_type;
    if (get(o, "quantization_config")) return ff_error_set(name, "use an unquantised checkpoint (F32, BF16 or F16)", "quantised checkpoints are not supported");
    const char *act = json_string_value(get(o, "hidden_act"));
    if (get(o, "hidden_act") && (!act || strcmp(act, "silu") != 0))
        return ff_error_set(name, "the Llama family uses SwiGLU (silu)", "unsupported 'hidden_act' (only \"silu\")");
    if (get_int(o, "vocab_size", &c->vocab_size, name) || get_int(o, "hidden_size", &c->hidden_size, name) ||
        get_int(o, "intermediate_size", &c->intermediate_size, name) || get_int(o, "num_hidden_layers", &c->num_hidden_layers, name) ||
        get_int(o, "num_attention_heads", &c->num_attention_heads, name) ||
        get_int(o, "max_position_embeddings", &c->max_position_embeddings, name) || get_num(o, "rms_norm_eps", &c->rms_norm_eps, name) ||
        get_num(o, "rope_theta", &c->rope_theta, name) || get_bool(o, "tie_word_embeddings", &c->tie_word_embeddings, name))
        return -1;
    /* transformers v5 moves rope_theta and rope scaling into "rope_parameters" */
    json_t *rp = get(o, "rope_parameters");
    if (rp) {
        if (!json_is_object(rp)) return ff_error_set(name, NULL, "'rope_parameters' must be an object");
        if (get_num(rp, "rope_theta", &c->rope_theta, name) != 0 || parse_rope_scaling(rp, c, name) != 0) return -1;
    }
    if (parse_rope_scaling(get(o, "rope_scaling"), c, name) != 0) return -1;
    c->num_key_value_heads = c->num_attention_heads; /* "None" means multi-head attention */
    if (!strcmp(mt, "mistral") && !json_object_get(o, "num_key_value_heads")) c->num_key_value_heads = 8;
    if (get_int(o, "num_key_value_heads", &c->num_key_value_heads, name) != 0) return -1;
    int32_t ints[5] = {c->vocab_size, c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads};
    const char *int_keys[5] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"};
    for (int i = 0; i < 5; i++)
        if (ints[i] <= 0) return ff_error_set(name, NULL, "'%s' must be positive, got %d", int_keys[i], ints[i]);
    if (c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads != 0)
        return ff_error_set(name, NULL, "'num_key_value_heads' (%d) must divide 'num_attention_heads' (%d)", c->num_key_value_heads,
                            c->num_attention_heads);
    c->head_dim = 0;
    if (get_int(o, "head_dim", &c->head_dim, name) != 0) return -1;
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_attention_heads != 0)
            return ff_error_set(name, "give 'head_dim' explicitly", "'hidden_size' (%d) is not divisible by 'num_attention_heads' (%d)",
                                c->hidden_size, c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim <= 0 || c->head_dim % 2 != 0) return ff_error_set(name, NULL, "'head_dim' must be positive and even, got %d", c->head_dim);
    if (c->max_position_embeddings <= 0) return ff_error_set(name, NULL, "'max_position_embeddings' must be positive");
    if (!(c->rms_norm_eps > 0)) return ff_error_set(name, NULL, "'rms_norm_eps' must be positive");
    if (!(c->rope_theta > 0)) return ff_error_set(name, NULL, "'rope_theta' must be positive");

    /* biases */
    bool flag = false;
    if (get_bool(o, "mlp_bias", &flag, name) != 0) return -1;
    if (flag) return ff_error_set(name, NULL, "'mlp_bias': true is not supported (the engine has no MLP biases)");
    if (!strcmp(mt, "llama")) {
        flag = false;
        if (get_bool(o, "attention_bias", &flag, name) != 0) return -1;
        if (flag) return ff_error_set(name, NULL, "Llama 'attention_bias': true (which adds an o_proj bias) is not supported");
    }

    /* sliding windows: supported only when they cover the whole context */
    int32_t window = 0;
    if (!strcmp(mt, "mistral") && get(o, "sliding_window")) {
        if (get_int(o, "sliding_window", &window, name) != 0) return -1;
        if (window < c->max_position_embeddings)
            return ff_error_set(name, "use a Mistral version without sliding window (v0.2 and later), or set sliding_window to null",
                                "'sliding_window' %d is smaller than the context (max_position_embeddings %d): sliding-window attention is not supported",
                                window, c->max_position_embeddings);
    }
    if (!strcmp(mt, "qwen2")) {
        bool use = false;
        int32_t max_window_layers = 28;
        window = 4096;
        if (get_bool(o, "use_sliding_window", &use, name) || get_int(o, "sliding_window", &window, name) ||
            get_int(o, "max_window_layers", &max_window_layers, name))
            return -1;
        if (use && max_window_layers < c->num_hidden_layers && window < c->max_position_embeddings)
            return ff_error_set(name, "set use_sliding_window to false", "'use_sliding_window' with a window of %d < context %d: sliding-window attention is not supported",
                                window, c->max_position_embeddings);
    }

    if (get_token_ids(o, c, name) != 0) return -1;
    int32_t ids[FF_MAX_EOS + 2] = {c->bos_token_id, c->pad_token_id};
    for (int i = 0; i < c->n_eos; i++) ids[2 + i] = c->eos_token_ids[i];
    for (int i = 0; i < 2 + c->n_eos; i++)
        if (ids[i] < -1 || ids[i] >= c->vocab_size)
            return ff_error_set(name, NULL, "special token id %d is outside the vocabulary [0, %d)", ids[i], c->vocab_size);

    if (value_head) {
        int32_t labels = 1;
        json_t *id2label = get(o, "id2label");
        if (id2label && json_is_object(id2label)) labels = (int32_t)json_object_size(id2label);
        if (get_int(o, "num_labels", &labels, name) != 0) return -1;
        if (labels != 1)
            return ff_error_set(name, "value and reward models have one output", "sequence classification with %d labels is not supported", labels);
    }
    return 0;
}

int ff_hf_config_parse(const char *text, size_t len, const char *name, ff_model_config *cfg) {
    json_error_t err;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!name) name = "config.json";
    if (!o) return ff_error_set(name, NULL, "malformed JSON at line %d: %s", err.line, err.text);
    int rc = parse_object(o, name, cfg);
    json_decref(o);
    return rc;
}

int ff_hf_config_load(const char *path, ff_model_config *cfg) {
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) return -1;
    int rc = ff_hf_config_parse(text, len, path, cfg);
    free(text);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------------ */

char *ff_hf_config_dump(const ff_model_config *c, const char *torch_dtype) {
    const family *f = family_by_type(c->model_type);
    if (!f) {
        ff_error_set(NULL, k_supported, "unsupported model_type '%.32s'", c->model_type);
        return NULL;
    }
    /* config.json says q/k/v biases only through Qwen2's model_type: written as another, such a
     * model would load without them (or, here, be refused) */
    if (c->attention_bias && strcmp(f->model_type, "qwen2")) {
        ff_error_set(NULL, "use model_type qwen2 for a model with q/k/v biases",
                     "model_type '%s' cannot carry q/k/v biases in config.json", f->model_type);
        return NULL;
    }
    char arch[96];
    snprintf(arch, sizeof arch, "%s%s", f->prefix, c->value_head ? "ForSequenceClassification" : "ForCausalLM");
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", arch));
    json_object_set_new(o, "model_type", json_string(f->model_type));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->num_hidden_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->num_attention_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->num_key_value_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    if (!strcmp(f->model_type, "llama")) {
        json_object_set_new(o, "attention_bias", json_false());
        json_object_set_new(o, "mlp_bias", json_false());
    }
    if (!strcmp(f->model_type, "qwen2")) json_object_set_new(o, "use_sliding_window", json_false());
    if (!strcmp(f->model_type, "mistral")) json_object_set_new(o, "sliding_window", json_null());
    if (c->rope_scaling.kind == FF_ROPE_SCALING_LLAMA3)
        json_object_set_new(o, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", c->rope_scaling.factor, "low_freq_factor",
                                      c->rope_scaling.low_freq_factor, "high_freq_factor", c->rope_scaling.high_freq_factor,
                                      "original_max_position_embeddings", (int)c->rope_scaling.original_max_position_embeddings));
    else
        json_object_set_new(o, "rope_scaling", json_null());
    json_object_set_new(o, "bos_token_id", c->bos_token_id >= 0 ? json_integer(c->bos_token_id) : json_null());
    if (c->n_eos == 1) {
        json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_ids[0]));
    } else if (c->n_eos == 0) {
        json_object_set_new(o, "eos_token_id", json_null());
    } else {
        json_t *a = json_array();
        for (int i = 0; i < c->n_eos; i++) json_array_append_new(a, json_integer(c->eos_token_ids[i]));
        json_object_set_new(o, "eos_token_id", a);
    }
    json_object_set_new(o, "pad_token_id", c->pad_token_id >= 0 ? json_integer(c->pad_token_id) : json_null());
    if (c->value_head) {
        json_object_set_new(o, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
        json_object_set_new(o, "label2id", json_pack("{s:i}", "LABEL_0", 0));
    }
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype ? torch_dtype : "float32"));
    json_object_set_new(o, "use_cache", json_true());
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!s) {
        ff_error_set(NULL, NULL, "cannot serialise config.json");
        return NULL;
    }
    size_t n = strlen(s);
    char *t = ff_realloc(s, n + 2); /* end with a newline, as editors do */
    if (!t) {
        free(s);
        return NULL;
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    return t;
}

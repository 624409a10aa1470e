/* Helpers shared by the model tests: the reference fixtures (tests/fixtures/model/, written
 * by tests/reference/ref_model.py), configs from their metadata, tiny configs, and
 * tolerance comparisons that print the worst element. */
#ifndef FF_TEST_MODEL_UTIL_H
#define FF_TEST_MODEL_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/model.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static inline double meta_num(const ff_safetensors *f, const char *key) {
    const char *v = ff_safetensors_metadata(f, key);
    if (!v) {
        fprintf(stderr, "fixture %s: metadata key '%s' missing\n", ff_safetensors_name(f), key);
        exit(1);
    }
    return atof(v);
}

/* The config stored in a fixture's weights file. */
static inline ff_model_config fixture_config(const char *weights_path) {
    ff_safetensors *f = ff_safetensors_open(weights_path);
    if (!f) {
        fprintf(stderr, "%s\n", ff_error_message());
        exit(1);
    }
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = (int32_t)meta_num(f, "vocab_size");
    c.hidden_size = (int32_t)meta_num(f, "hidden_size");
    c.intermediate_size = (int32_t)meta_num(f, "intermediate_size");
    c.num_hidden_layers = (int32_t)meta_num(f, "num_hidden_layers");
    c.num_attention_heads = (int32_t)meta_num(f, "num_attention_heads");
    c.num_key_value_heads = (int32_t)meta_num(f, "num_key_value_heads");
    c.max_position_embeddings = (int32_t)meta_num(f, "max_position_embeddings");
    c.rope_theta = meta_num(f, "rope_theta");
    c.rms_norm_eps = meta_num(f, "rms_norm_eps");
    c.tie_word_embeddings = meta_num(f, "tie_word_embeddings") != 0;
    c.attention_bias = meta_num(f, "attention_bias") != 0;
    c.value_head = meta_num(f, "value_head") != 0;
    const char *rs = ff_safetensors_metadata(f, "rope_scaling");
    if (rs && !strcmp(rs, "llama3")) {
        c.rope_scaling.kind = FF_ROPE_SCALING_LLAMA3;
        c.rope_scaling.factor = meta_num(f, "rope_scaling.factor");
        c.rope_scaling.low_freq_factor = meta_num(f, "rope_scaling.low_freq_factor");
        c.rope_scaling.high_freq_factor = meta_num(f, "rope_scaling.high_freq_factor");
        c.rope_scaling.original_max_position_embeddings = (int32_t)meta_num(f, "rope_scaling.original_max_position_embeddings");
    }
    c.bos_token_id = -1;
    c.pad_token_id = -1;
    ff_safetensors_close(&f);
    return c;
}

static inline ff_tensor_set *load_set(const char *path) {
    ff_tensor_set *s = ff_tensor_set_new();
    REQUIRE(s);
    if (ff_safetensors_load(path, s)) {
        fprintf(stderr, "%s\n", ff_error_message());
        exit(1);
    }
    return s;
}

static inline const ff_host_tensor *need_tensor(const ff_tensor_set *s, const char *name) {
    const ff_host_tensor *t = ff_tensor_set_find(s, name);
    if (!t) {
        fprintf(stderr, "fixture tensor '%s' missing\n", name);
        exit(1);
    }
    return t;
}

/* Every |got - want| <= atol + rtol * max|want| (a tolerance scaled by the tensor's size,
 * which is what fp32 against fp64 rounding gives). Prints the worst element. */
static inline int check_tensor_close(const char *what, const float *got, const float *want, int64_t n, double atol,
                              double rtol) {
    double mx = 0, worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) mx = fabs(want[i]) > mx ? fabs(want[i]) : mx;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e <= worst) || isnan(e)) {
            worst = isnan(e) ? INFINITY : e;
            wi = i;
        }
    }
    double tol = atol + rtol * mx;
    if (!(worst <= tol)) {
        fprintf(stderr, "%s: max error %.3g at [%lld] (got %.9g, want %.9g), tolerance %.3g (max |want| %.3g)\n", what,
                worst, (long long)wi, (double)got[wi], (double)want[wi], tol, mx);
        ff_test_failures++;
        return -1;
    }
    if (getenv("FF_TEST_VERBOSE")) printf("%-60s max err %.3g (tol %.3g, max %.3g)\n", what, worst, tol, mx);
    return 0;
}

/* A tiny model config for tests that need no fixture. */
static inline ff_model_config tiny_config(int vocab, int hidden, int inter, int layers, int heads, int kv_heads, bool tied,
                                   bool bias, bool value_head) {
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = vocab;
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv_heads;
    c.max_position_embeddings = 512;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = tied;
    c.attention_bias = bias;
    c.value_head = value_head;
    c.bos_token_id = -1;
    c.pad_token_id = -1;
    return c;
}

static inline ff_model *tiny_model(ff_backend *be, const ff_model_config *c, uint64_t seed, double std) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, seed, std, w) == 0);
    ff_model *m = ff_model_new(be, c, w);
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    ff_tensor_set_destroy(&w);
    return m;
}

/* Every tensor of want in got (the same count, each by name and shape, else a failure naming
 * it), each pair handed to cmp with its name ("WHAT NAME") and its element count. */
typedef void (*tensor_pair_fn)(void *ctx, const char *name, const float *got, const float *want, int64_t n);
static inline void compare_tensor_sets(const char *what, const ff_tensor_set *got, const ff_tensor_set *want, tensor_pair_fn cmp,
                                       void *ctx) {
    CHECK_EQ_INT(got->n, want->n);
    char name[256];
    for (size_t i = 0; i < want->n; i++) {
        const ff_host_tensor *w = &want->items[i], *g = ff_tensor_set_find(got, w->name);
        snprintf(name, sizeof name, "%s %s", what, w->name);
        if (!g || ff_host_tensor_expect(g, w->ndim, w->shape, name)) {
            fprintf(stderr, "%s: missing or misshapen\n", name);
            ff_test_failures++;
            continue;
        }
        cmp(ctx, name, g->data, w->data, ff_host_tensor_numel(w));
    }
}

/* A pair bit for bit (a failure naming it otherwise). */
static inline void check_tensor_bits(const char *name, const float *got, const float *want, int64_t n) {
    if (memcmp(got, want, (size_t)n * 4)) {
        fprintf(stderr, "%s: not bit-identical\n", name);
        ff_test_failures++;
    }
}

/* A generation request of n prompt tokens (the array stays the caller's), default sampling at
 * temperature temp and max_new new tokens. */
static inline ff_gen_request gen_request(uint64_t id, const int32_t *prompt, int32_t n, int32_t samples, float temp,
                                         int32_t max_new, uint64_t seed) {
    ff_gen_request r;
    memset(&r, 0, sizeof r);
    r.id = id;
    r.prompt = prompt;
    r.prompt_len = n;
    r.n_samples = samples;
    ff_sampling_default(&r.sampling);
    r.sampling.temperature = temp;
    r.sampling.max_new_tokens = max_new;
    r.seed = seed;
    return r;
}

/* n outputs of ff_model_generate (or gathered alike) and their array. */
static inline void gen_outputs_free(ff_gen_output *o, int32_t n) {
    for (int32_t i = 0; i < n; i++) ff_gen_output_free(&o[i]);
    free(o);
}

#endif

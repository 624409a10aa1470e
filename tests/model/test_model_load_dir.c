/* ff_model_load_dir: a model straight from a model folder, a few rows at a time, against the
 * way it was loaded before (ff_model_dir_load's fp32 host set, or ff_model_read_shards', given
 * to ff_model_new_from). Folders written here: a small untied model with biases saved as bf16,
 * the same sharded into several files (the index), a tied one in fp32 that also carries its
 * embedding as lm_head.weight (as some exporters save), and a critic (value head, no LM head).
 *
 * Checked: every parameter equal bit for bit (ff_model_read_params) for a trainable model, an
 * inference model, one with bf16 weights, each rank of TP 2 (its rows and columns of the whole
 * tensors), TP 4 (key/value heads replicated), and pipeline stages (the tied embedding's copy
 * on the last); the critic's values equal; the config comes back. And the errors, each naming
 * the folder and what is wrong, with nothing made: no folder, no weights file, a missing
 * tensor, a wrong shape, an unexpected tensor, a NaN (its element), a tied checkpoint whose
 * lm_head differs from the embedding, a view asked for. */
#include <sys/stat.h>
#include <unistd.h>

#include "fuseflow/modelio.h"
#include "tests/model/model_test_util.h"

static char root[256];

static int never(void *ctx, float *b, size_t n) { (void)ctx, (void)b, (void)n; REQUIRE(!"called"); return -1; }
static int never64(void *ctx, double *b, size_t n) { (void)ctx, (void)b, (void)n; REQUIRE(!"called"); return -1; }
static int never_g(void *ctx, const float *i, float *o, size_t n) { (void)ctx, (void)i, (void)o, (void)n; REQUIRE(!"called"); return -1; }

static ff_tensor_set *weights_of(const ff_model_config *c, uint64_t seed) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, seed, 0.3, w) == 0);
    for (size_t i = 0; i < w->n; i++) /* norms off 1, so that a misplaced one shows */
        if (strstr(w->items[i].name, "norm"))
            for (int64_t e = 0; e < ff_host_tensor_numel(&w->items[i]); e++) w->items[i].data[e] = 1.0f + 0.01f * (float)(e % 7);
    return w;
}

static void save(const char *dir, const ff_model_config *c, const ff_tensor_set *w, ff_dtype dt) {
    REQUIRE(ff_model_dir_save(dir, c, w, NULL, dt) == 0);
}

/* the flat parameters of a model, a new array */
static float *params_of(ff_model *m) {
    float *p = malloc((size_t)ff_model_param_count(m) * sizeof *p);
    REQUIRE(p);
    ff_model_read_params(m, p);
    return p;
}

/* the model loaded both ways with opts (the old way from `set`, a new set read as the caller
 * says); the same parameters bit for bit */
static void same_both_ways(const char *what, const char *dir, ff_tensor_set *set, const ff_model_opts *opts) {
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_model_config cfg, c2;
    ff_model *streamed = ff_model_load_dir(be, dir, opts, &cfg);
    if (!streamed) fprintf(stderr, "%s: %s\n", what, ff_error_message());
    REQUIRE(streamed);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    REQUIRE(ff_hf_config_load(path, &c2) == 0);
    CHECK(cfg.num_hidden_layers == c2.num_hidden_layers && cfg.vocab_size == c2.vocab_size);
    ff_model *old = ff_model_new_from(be, &c2, &set, opts);
    if (!old) fprintf(stderr, "%s: %s\n", what, ff_error_message());
    REQUIRE(old && !set);
    CHECK_EQ_INT(ff_model_param_count(streamed), ff_model_param_count(old));
    CHECK(ff_model_has_lm_head(streamed) == ff_model_has_lm_head(old));
    ff_model_memory a, b;
    ff_model_memory_of(streamed, &a);
    ff_model_memory_of(old, &b);
    CHECK_EQ_INT(a.params, b.params);
    CHECK_EQ_INT(a.grads, b.grads);
    float *x = params_of(streamed), *y = params_of(old);
    if (memcmp(x, y, (size_t)ff_model_param_count(old) * sizeof *x)) {
        fprintf(stderr, "%s: the parameters differ from ff_model_new_from's\n", what);
        ff_test_failures++;
    }
    free(x), free(y);
    ff_model_destroy(&streamed);
    ff_model_destroy(&old);
    ff_backend_destroy(&be);
}

static ff_tensor_set *dir_set(const char *dir) {
    ff_model_config c;
    ff_tensor_set *w = NULL;
    if (ff_model_dir_load(dir, &c, &w) != 0) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(w);
    return w;
}

static void whole_and_tp(const char *name, const char *dir, const ff_model_config *c) {
    char what[128];
    snprintf(what, sizeof what, "%s trainable", name);
    same_both_ways(what, dir, dir_set(dir), NULL);
    snprintf(what, sizeof what, "%s inference", name);
    same_both_ways(what, dir, dir_set(dir), &(ff_model_opts){.inference = true});
    if (!c->value_head) {
        snprintf(what, sizeof what, "%s bf16 weights", name);
        same_both_ways(what, dir, dir_set(dir), &(ff_model_opts){.inference = true, .bf16_weights = true});
    }
    const int tps[2] = {2, 4}; /* 4 > the 2 key/value heads: each replicated on two ranks */
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < tps[k]; r++) {
            ff_model_comm comm = {.rank = r, .size = tps[k], .all_reduce_sum = never, .all_reduce_max = never,
                                  .all_reduce_sum_f64 = never64, .all_gather = never_g};
            ff_tensor_set *w = ff_tensor_set_new();
            REQUIRE(w && ff_model_read_shards(dir, c, r, tps[k], NULL, w) == 0);
            snprintf(what, sizeof what, "%s TP %d rank %d", name, tps[k], r);
            same_both_ways(what, dir, w, &(ff_model_opts){.comm = &comm});
        }
    /* pipeline stages: layers [0, 1) and [1, 3) (the last one with the tied embedding's copy) */
    const int32_t f0[1] = {0}, n0[1] = {1}, f1[1] = {1}, n1[1] = {c->num_hidden_layers - 1};
    const ff_model_stage st[2] = {{.n_chunks = 1, .first_layer = f0, .n_layers = n0}, {.n_chunks = 1, .first_layer = f1, .n_layers = n1}};
    for (int s = 0; s < 2; s++) {
        ff_tensor_set *w = ff_tensor_set_new();
        REQUIRE(w && ff_model_read_shards(dir, c, 0, 1, &st[s], w) == 0);
        snprintf(what, sizeof what, "%s stage %d", name, s);
        same_both_ways(what, dir, w, &(ff_model_opts){.inference = true, .stage = &st[s]});
    }
}

/* dir with `w` changed by fix (NULL: as is), saved as fp32; ff_model_load_dir must fail saying `want` */
static void refused(const char *name, const ff_model_config *c, const ff_tensor_set *w0, void (*fix)(ff_tensor_set *),
                    const char *want) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/bad-%s", root, name);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w);
    for (size_t i = 0; i < w0->n; i++) {
        ff_host_tensor *t = ff_tensor_set_add(w, w0->items[i].name, w0->items[i].ndim, w0->items[i].shape);
        REQUIRE(t);
        memcpy(t->data, w0->items[i].data, (size_t)ff_host_tensor_numel(t) * 4);
    }
    if (fix) fix(w);
    save(dir, c, w, FF_DTYPE_F32);
    ff_tensor_set_destroy(&w);
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model_config cfg;
    ff_model *m = ff_model_load_dir(be, dir, &(ff_model_opts){.inference = true}, &cfg);
    CHECK(m == NULL);
    if (!m) {
        printf("%-16s %s\n", name, ff_error_message());
        CHECK_STR_CONTAINS(ff_error_message(), want);
        CHECK_STR_CONTAINS(ff_error_message(), dir);
    }
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
}

static void drop_down(ff_tensor_set *w) {
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->items[i].name, "model.layers.1.mlp.down_proj.weight")) {
            free(w->items[i].name);
            free(w->items[i].data);
            w->items[i] = w->items[--w->n];
            return;
        }
}
static void nan_in_up(ff_tensor_set *w) {
    ff_host_tensor *t = ff_tensor_set_find(w, "model.layers.2.mlp.up_proj.weight");
    REQUIRE(t);
    t->data[77] = NAN;
}
static void extra(ff_tensor_set *w) { REQUIRE(ff_tensor_set_add(w, "model.layers.9.mlp.up_proj.weight", 1, (int64_t[]){4})); }
static void wrong_shape(ff_tensor_set *w) {
    ff_host_tensor *t = ff_tensor_set_find(w, "model.norm.weight");
    REQUIRE(t);
    t->shape[0] -= 1; /* the bytes written follow the shape */
}
static void other_head(ff_tensor_set *w) {
    const ff_host_tensor *e = ff_tensor_set_find(w, "model.embed_tokens.weight");
    REQUIRE(e);
    ff_host_tensor *h = ff_tensor_set_add(w, "lm_head.weight", e->ndim, e->shape);
    REQUIRE(h);
    e = ff_tensor_set_find(w, "model.embed_tokens.weight");
    memcpy(h->data, e->data, (size_t)ff_host_tensor_numel(h) * 4);
    h->data[5] += 1.0f;
}

int main(void) {
    snprintf(root, sizeof root, "%s/ff_load_dir_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    REQUIRE(mkdir(root, 0700) == 0);
    char dir[512];

    /* untied with biases, bf16 on disk; 4 query heads, 2 key/value heads */
    ff_model_config c = tiny_config(64, 32, 48, 3, 4, 2, false, true, false);
    snprintf(c.model_type, sizeof c.model_type, "qwen2"); /* q/k/v biases: Qwen2's (a Llama config.json has none) */
    ff_tensor_set *w = weights_of(&c, 3);
    snprintf(dir, sizeof dir, "%s/untied", root);
    save(dir, &c, w, FF_DTYPE_BF16);
    whole_and_tp("untied bf16", dir, &c);
    /* the same sharded: several files and the index */
    char sh[512];
    snprintf(sh, sizeof sh, "%s/sharded", root);
    save(sh, &c, w, FF_DTYPE_BF16);
    snprintf(dir, sizeof dir, "%s/model.safetensors", sh);
    REQUIRE(unlink(dir) == 0 && ff_safetensors_save_sharded(sh, w, FF_DTYPE_BF16, 8000) == 0);
    snprintf(dir, sizeof dir, "%s/model.safetensors.index.json", sh);
    struct stat sb;
    CHECK(stat(dir, &sb) == 0); /* it is sharded */
    whole_and_tp("sharded", sh, &c);
    refused("missing", &c, w, drop_down, "missing tensor 'model.layers.1.mlp.down_proj.weight'");
    refused("nan", &c, w, nan_in_up, "element 77 is nan");
    refused("unexpected", &c, w, extra, "unexpected tensor 'model.layers.9.mlp.up_proj.weight'");
    refused("shape", &c, w, wrong_shape, "tensor 'model.norm.weight' has shape [31], expected [32]");
    ff_tensor_set_destroy(&w);

    /* tied, fp32, its embedding saved again as lm_head.weight: accepted and not read */
    ff_model_config t = tiny_config(64, 32, 48, 3, 4, 2, true, false, false);
    w = weights_of(&t, 5);
    snprintf(dir, sizeof dir, "%s/tied", root);
    ff_tensor_set *w2 = ff_tensor_set_new();
    REQUIRE(w2);
    for (size_t i = 0; i < w->n; i++) {
        ff_host_tensor *x = ff_tensor_set_add(w2, w->items[i].name, w->items[i].ndim, w->items[i].shape);
        REQUIRE(x);
        memcpy(x->data, w->items[i].data, (size_t)ff_host_tensor_numel(x) * 4);
    }
    const ff_host_tensor *e = ff_tensor_set_find(w2, "model.embed_tokens.weight");
    ff_host_tensor *h = ff_tensor_set_add(w2, "lm_head.weight", e->ndim, e->shape);
    REQUIRE(h);
    memcpy(h->data, ff_tensor_set_find(w2, "model.embed_tokens.weight")->data, (size_t)ff_host_tensor_numel(h) * 4);
    save(dir, &t, w2, FF_DTYPE_F32);
    ff_tensor_set_destroy(&w2);
    whole_and_tp("tied", dir, &t);
    refused("tied-head", &t, w, other_head, "a different 'lm_head.weight'");
    ff_tensor_set_destroy(&w);

    /* a critic: a value head and no LM head; its values the same */
    ff_model_config v = tiny_config(64, 32, 48, 3, 4, 2, false, false, true);
    w = weights_of(&v, 9);
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->items[i].name, "lm_head.weight")) {
            free(w->items[i].name), free(w->items[i].data);
            w->items[i] = w->items[--w->n];
            break;
        }
    snprintf(dir, sizeof dir, "%s/critic", root);
    save(dir, &v, w, FF_DTYPE_F32);
    ff_tensor_set_destroy(&w);
    whole_and_tp("critic", dir, &v);
    {
        ff_backend *be = ff_backend_new("cpu:1");
        ff_model_config cfg;
        ff_model *a = ff_model_load_dir(be, dir, &(ff_model_opts){.inference = true}, &cfg);
        ff_tensor_set *s = dir_set(dir);
        ff_model *b = ff_model_new_from(be, &cfg, &s, &(ff_model_opts){.inference = true});
        REQUIRE(a && b && !ff_model_has_lm_head(a));
        int32_t tok[6] = {1, 5, 9, 2, 40, 7}, ss[2] = {0, 6};
        ff_batch bt = {.n_tokens = 6, .n_seqs = 1, .tokens = tok, .seq_start = ss};
        float va[6], vb[6];
        REQUIRE(ff_model_forward(a, &bt, NULL, &(ff_forward_out){.values = va}) == 0);
        REQUIRE(ff_model_forward(b, &bt, NULL, &(ff_forward_out){.values = vb}) == 0);
        CHECK(!memcmp(va, vb, sizeof va));
        /* a view reads another model's weights: refused, saying how to make one */
        ff_model *view = ff_model_load_dir(be, dir, &(ff_model_opts){.inference = true, .view_of = a}, &cfg);
        CHECK(view == NULL);
        CHECK_STR_CONTAINS(ff_error_message(), "ff_model_new_from");
        ff_model_destroy(&a), ff_model_destroy(&b);
        ff_backend_destroy(&be);
    }

    /* no folder, no weights */
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model_config cfg;
    snprintf(dir, sizeof dir, "%s/none", root);
    CHECK(ff_model_load_dir(be, dir, NULL, &cfg) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "config.json");
    REQUIRE(mkdir(dir, 0700) == 0);
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/critic/config.json", root);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    REQUIRE(link(src, dst) == 0);
    CHECK(ff_model_load_dir(be, dir, NULL, &cfg) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "no model.safetensors or model.safetensors.index.json");
    ff_backend_destroy(&be);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
    TEST_MAIN_END();
}

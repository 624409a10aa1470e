/* Bad input to the model gets a clear error naming the problem, and nothing crashes:
 * configs the engine does not run, weights with a wrong shape, a missing or non-finite
 * tensor, an lm_head beside tied embeddings, token ids out of range, bad sequence offsets,
 * outputs the model does not have, backward without forward, bad optimizer settings and
 * optimizer state of another model. Also: the engine's tensor list and the model-folder
 * checker's (model/io, which validates files without the engine) agree. */
#include "fuseflow/modelio.h"
#include "tests/model/model_test_util.h"

static ff_backend *be;

static void expect_new_fails(const ff_model_config *c, ff_tensor_set *w, const char *needle) {
    ff_model *m = ff_model_new(be, c, w);
    CHECK(m == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), needle);
    ff_model_destroy(&m);
}

static void test_config_errors(void) {
    ff_model_config good = tiny_config(16, 16, 32, 1, 4, 2, false, false, false);
    CHECK(ff_model_config_check(&good, "cfg.json") == 0);
    ff_model_config c = good;
    c.num_key_value_heads = 3;
    CHECK(ff_model_config_check(&c, "cfg.json") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cfg.json: num_key_value_heads: 3 does not divide num_attention_heads = 4");
    c = good;
    c.head_dim = 5;
    CHECK(ff_model_config_check(&c, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "head_dim");
    c = good;
    c.hidden_size = 18; /* not a multiple of 4 heads, no head_dim given */
    CHECK(ff_model_config_check(&c, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "set head_dim explicitly");
    c = good;
    c.rope_scaling.kind = (ff_rope_scaling_kind)7;
    CHECK(ff_model_config_check(&c, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unsupported rope scaling");
    c = good;
    c.rope_scaling.kind = FF_ROPE_SCALING_LLAMA3;
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 4;
    c.rope_scaling.high_freq_factor = 1;
    c.rope_scaling.original_max_position_embeddings = 64;
    CHECK(ff_model_config_check(&c, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "low_freq_factor");
    c = good;
    c.rms_norm_eps = 0;
    CHECK(ff_model_config_check(&c, NULL) == -1);
    c = good;
    c.vocab_size = 0;
    ff_tensor_set *w = ff_tensor_set_new();
    CHECK(ff_model_init_weights(&c, 1, 0.02, w) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "vocab_size");
    ff_tensor_set_destroy(&w);
    /* an explicit head_dim different from hidden/heads works (Qwen3-like projections) */
    c = good;
    c.head_dim = 8;
    w = ff_tensor_set_new();
    REQUIRE(ff_model_init_weights(&c, 1, 0.02, w) == 0);
    CHECK(ff_tensor_set_find(w, "model.layers.0.self_attn.q_proj.weight")->shape[0] == 32);
    ff_model *m = ff_model_new(be, &c, w);
    CHECK(m != NULL);
    ff_model_destroy(&m);
    ff_tensor_set_destroy(&w);
}

static void test_weight_errors(void) {
    ff_model_config c = tiny_config(16, 16, 32, 2, 4, 2, false, true, false);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(ff_model_init_weights(&c, 3, 0.02, w) == 0);
    /* init: norms 1, biases 0, others ~N(0, 0.02) */
    CHECK(ff_tensor_set_find(w, "model.layers.1.post_attention_layernorm.weight")->data[5] == 1.0f);
    CHECK(ff_tensor_set_find(w, "model.layers.0.self_attn.k_proj.bias")->data[3] == 0.0f);
    const ff_host_tensor *e = ff_tensor_set_find(w, "model.embed_tokens.weight");
    double sq = 0;
    for (int64_t i = 0; i < ff_host_tensor_numel(e); i++) sq += (double)e->data[i] * e->data[i];
    CHECK_CLOSE(sqrt(sq / (double)ff_host_tensor_numel(e)), 0.02, 0.003, 0);

    /* missing tensor */
    ff_tensor_set *w2 = ff_tensor_set_new();
    for (size_t i = 0; i < w->n; i++) {
        if (!strcmp(w->items[i].name, "model.layers.1.mlp.up_proj.weight")) continue;
        ff_host_tensor *t = ff_tensor_set_add(w2, w->items[i].name, w->items[i].ndim, w->items[i].shape);
        memcpy(t->data, w->items[i].data, (size_t)ff_host_tensor_numel(t) * 4);
    }
    expect_new_fails(&c, w2, "model.layers.1.mlp.up_proj.weight: tensor is missing");
    ff_tensor_set_destroy(&w2);
    /* wrong shape */
    ff_host_tensor *k = ff_tensor_set_find(w, "model.layers.0.self_attn.k_proj.weight");
    k->shape[0] = 4;
    expect_new_fails(&c, w, "has shape [4, 16], expected [8, 16]");
    k->shape[0] = 8;
    /* NaN */
    ff_host_tensor *n = ff_tensor_set_find(w, "model.norm.weight");
    n->data[2] = NAN;
    expect_new_fails(&c, w, "model.norm.weight: element 2 is nan");
    n->data[2] = 1;
    /* lm_head beside tied embeddings */
    ff_model_config ct = c;
    ct.tie_word_embeddings = true;
    expect_new_fails(&ct, w, "lm_head");
    ff_model *m = ff_model_new(be, &c, w);
    REQUIRE(m);
    /* load_weights checks the same way and leaves the model usable */
    k->shape[1] = 3;
    CHECK(ff_model_load_weights(m, w) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "expected [8, 16]");
    k->shape[1] = 16;
    CHECK(ff_model_load_weights(m, w) == 0);

    /* batches */
    int32_t tok[6] = {1, 2, 3, 4, 5, 6}, ss[3] = {0, 2, 6}, tg[6];
    ff_batch b = {.n_tokens = 6, .n_seqs = 2, .tokens = tok, .seq_start = ss};
    ff_batch_shift_targets(tok, ss, 2, tg);
    float lp[6], val[6];
    ff_forward_out o = {.logprobs = lp};
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "log-probs need target tokens");
    b.targets = tg;
    CHECK(ff_model_forward(m, &b, NULL, &o) == 0);
    tok[4] = 16;
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "batch tokens: token 4 is 16, out of range for vocab_size 16");
    tok[4] = -3;
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    tok[4] = 5;
    tg[1] = 99;
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "batch targets");
    tg[1] = -1;
    ss[1] = 7;
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "offsets");
    ss[1] = 2;
    ss[2] = 5;
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cover [0, 5), not [0, 6)");
    ss[2] = 6;
    ff_model_config cs = c;
    ff_model_destroy(&m);
    cs.max_position_embeddings = 3; /* sequence of 4 tokens is too long */
    m = ff_model_new(be, &cs, w);
    REQUIRE(m);
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "max_position_embeddings");
    ff_model_destroy(&m);
    m = ff_model_new(be, &c, w);
    REQUIRE(m);
    o.values = val;
    CHECK(ff_model_forward(m, &b, NULL, &o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "value head");
    o.values = NULL;
    CHECK(ff_model_backward(m, lp, NULL, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no training forward");
    ff_forward_opts tr = {.train = true};
    REQUIRE(ff_model_forward(m, &b, &tr, &o) == 0);
    CHECK(ff_model_backward(m, NULL, NULL, val) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "values");
    ff_forward_opts hot = {.temperature = -2};
    CHECK(ff_model_forward(m, &b, &hot, &o) == 0); /* <= 0 means 1 */

    /* optimizer settings and foreign state */
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.beta2 = 1.0;
    CHECK(ff_optimizer_new(m, &ac) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "beta2");
    ff_adamw_config_default(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    ff_tensor_set *state = ff_tensor_set_new();
    CHECK(ff_optimizer_import_state(opt, state) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "'step' is missing");
    REQUIRE(ff_optimizer_export_state(opt, state) == 0);
    ff_host_tensor *sv = ff_tensor_set_find(state, "exp_avg_sq.model.norm.weight");
    REQUIRE(sv);
    sv->shape[0] = 3;
    CHECK(ff_optimizer_import_state(opt, state) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "exp_avg_sq.model.norm.weight");
    ff_tensor_set_destroy(&state);
    /* a NaN gradient is refused, the parameters stay */
    float *g = calloc((size_t)ff_model_param_count(m), 4), *p0 = malloc((size_t)ff_model_param_count(m) * 4);
    float *p1 = malloc((size_t)ff_model_param_count(m) * 4);
    g[17] = NAN;
    ff_model_write_grads(m, g);
    ff_model_read_params(m, p0);
    ff_optim_stats st;
    CHECK(ff_optimizer_step(opt, &st) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "gradient norm is nan");
    ff_model_read_params(m, p1);
    CHECK(memcmp(p0, p1, (size_t)ff_model_param_count(m) * 4) == 0);
    CHECK_EQ_INT(ff_optimizer_steps_done(opt), 0);
    free(g), free(p0), free(p1);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_tensor_set_destroy(&w);
}

/* A critic: value head and no LM head. */
static void test_critic(void) {
    ff_model_config c = tiny_config(16, 16, 32, 1, 2, 2, false, false, true);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(ff_model_init_weights(&c, 3, 0.02, w) == 0);
    ff_tensor_set *w2 = ff_tensor_set_new();
    for (size_t i = 0; i < w->n; i++) {
        if (!strcmp(w->items[i].name, "lm_head.weight")) continue;
        ff_host_tensor *t = ff_tensor_set_add(w2, w->items[i].name, w->items[i].ndim, w->items[i].shape);
        memcpy(t->data, w->items[i].data, (size_t)ff_host_tensor_numel(t) * 4);
    }
    ff_model *m = ff_model_new(be, &c, w2);
    REQUIRE(m);
    CHECK(!ff_model_has_lm_head(m));
    ff_model *actor = ff_model_new(be, &c, w);
    REQUIRE(actor);
    CHECK(ff_model_has_lm_head(actor));
    CHECK_EQ_INT(ff_model_param_count(actor) - ff_model_param_count(m), 16 * 16);
    int32_t tok[3] = {1, 2, 3}, ss[2] = {0, 3};
    ff_batch b = {.n_tokens = 3, .n_seqs = 1, .tokens = tok, .seq_start = ss};
    float v1[3], v2[3], e[3];
    ff_forward_out o = {.values = v1};
    CHECK(ff_model_forward(m, &b, NULL, &o) == 0);
    o.values = v2;
    CHECK(ff_model_forward(actor, &b, NULL, &o) == 0);
    for (int i = 0; i < 3; i++) CHECK(v1[i] == v2[i]);
    ff_forward_out oe = {.entropy = e};
    CHECK(ff_model_forward(m, &b, NULL, &oe) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "critic");
    ff_generator_config gc = {.max_slots = 1, .max_seq_len = 8};
    CHECK(ff_generator_new(m, &gc) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "no LM head");
    CHECK(ff_model_load_weights(m, w) == -1); /* an actor's weights into a critic */
    CHECK(ff_model_copy_params(m, actor) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "same config");
    ff_model_destroy(&m);
    ff_model_destroy(&actor);
    ff_tensor_set_destroy(&w);
    ff_tensor_set_destroy(&w2);
}

/* Two lists of the tensors a config implies exist (the engine's table and model/io's check of
 * a folder); every variant must give the same names and shapes in both. */
static void test_tensor_lists_agree(void) {
    for (int v = 0; v < 8; v++) {
        bool tied = v & 1, bias = v & 2, vhead = v & 4;
        ff_model_config c = tiny_config(16, 16, 32, 2, 4, 2, tied, bias, vhead);
        ff_tensor_set *engine = ff_tensor_set_new(), *io = ff_tensor_set_new();
        REQUIRE(engine && io);
        REQUIRE(ff_model_expected_tensors(&c, engine) == 0);
        REQUIRE(ff_hf_expected_tensors(&c, io) == 0);
        CHECK_EQ_INT(engine->n, io->n);
        for (size_t i = 0; i < io->n; i++) {
            const ff_host_tensor *a = &io->items[i], *b = ff_tensor_set_find(engine, a->name);
            CHECK(b != NULL);
            if (!b) continue;
            CHECK_EQ_INT(a->ndim, b->ndim);
            for (int d = 0; d < a->ndim && d < b->ndim; d++) CHECK_EQ_INT(a->shape[d], b->shape[d]);
        }
        CHECK(ff_hf_check_weights(&c, engine, "engine list") == 0);
        ff_tensor_set_destroy(&engine);
        ff_tensor_set_destroy(&io);
    }
}

int main(void) {
    be = ff_backend_cpu_new(2);
    REQUIRE(be);
    test_config_errors();
    test_weight_errors();
    test_critic();
    test_tensor_lists_agree();
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}

/* The model against the PyTorch reference (tests/reference/ref_model.py, float64): logits,
 * log-probs, entropy (temperature 1 and 0.7), values, the cross-entropy loss, the gradient
 * of every parameter, and the parameters after three AdamW steps with clipping and a
 * warmup + cosine schedule. Two configs: Qwen2-style (GQA 4/2, q/k/v biases, untied, value
 * head) and Llama-style (GQA 4/1, tied embeddings, llama3 rope scaling), both with packed
 * variable-length batches including sequences longer than one attention tile (64) and of
 * length 1. Also checks that eval mode, a chunked LM head and one thread give the same
 * numbers.
 *
 * Tolerances (fp32 here against fp64 there), relative to each tensor's largest magnitude:
 * forward outputs 1e-5 (+1e-5 absolute), gradients 2e-5, parameters after AdamW 5e-5 of
 * the largest parameter. Observed errors are 10-30x below these (FF_TEST_VERBOSE=1 prints
 * them); a wrong formula anywhere is off by orders of magnitude more. */
#include "tests/model/model_test_util.h"

#define FIX "tests/fixtures/model/"

static void run_case(const char *name, int threads) {
    char wpath[256], epath[256], what[256];
    snprintf(wpath, sizeof wpath, FIX "%s.weights.safetensors", name);
    snprintf(epath, sizeof epath, FIX "%s.expect.safetensors", name);
    ff_model_config cfg = fixture_config(wpath);
    ff_tensor_set *w = load_set(wpath), *ex = load_set(epath);
    ff_backend *be = ff_backend_cpu_new(threads);
    REQUIRE(be);
    ff_model *m = ff_model_new(be, &cfg, w);
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);

    const ff_host_tensor *tok_t = need_tensor(ex, "tokens"), *ss_t = need_tensor(ex, "seq_start");
    const ff_host_tensor *tg_t = need_tensor(ex, "targets");
    int32_t T = (int32_t)tok_t->shape[0], S = (int32_t)ss_t->shape[0] - 1, V = cfg.vocab_size;
    int32_t *tokens = malloc((size_t)T * 4), *targets = malloc((size_t)T * 4), *ss = malloc((size_t)(S + 1) * 4);
    for (int32_t i = 0; i < T; i++) tokens[i] = (int32_t)tok_t->data[i], targets[i] = (int32_t)tg_t->data[i];
    for (int32_t i = 0; i <= S; i++) ss[i] = (int32_t)ss_t->data[i];
    /* our own target shifting agrees with the fixture's */
    int32_t *shifted = malloc((size_t)T * 4);
    ff_batch_shift_targets(tokens, ss, S, shifted);
    CHECK(memcmp(shifted, targets, (size_t)T * 4) == 0);
    free(shifted);

    ff_batch b = {.n_tokens = T, .n_seqs = S, .tokens = tokens, .seq_start = ss, .targets = targets};
    float *lp = calloc((size_t)T, 4), *ent = calloc((size_t)T, 4), *val = calloc((size_t)T, 4);
    float *logits = calloc((size_t)T * V, 4);
    ff_forward_out out = {.logprobs = lp, .entropy = ent, .values = cfg.value_head ? val : NULL, .logits = logits};
    ff_forward_opts train = {.train = true, .temperature = 1.0f};
    REQUIRE(ff_model_forward(m, &b, &train, &out) == 0);
    snprintf(what, sizeof what, "%s logits", name);
    check_tensor_close(what, logits, need_tensor(ex, "logits")->data, (int64_t)T * V, 1e-5, 1e-5);
    snprintf(what, sizeof what, "%s logprobs", name);
    check_tensor_close(what, lp, need_tensor(ex, "logprobs")->data, T, 1e-5, 1e-5);
    snprintf(what, sizeof what, "%s entropy", name);
    check_tensor_close(what, ent, need_tensor(ex, "entropy")->data, T, 1e-5, 1e-5);
    if (cfg.value_head) {
        snprintf(what, sizeof what, "%s values", name);
        check_tensor_close(what, val, need_tensor(ex, "values")->data, T, 1e-5, 1e-5);
    }
    float *mask = malloc((size_t)T * 4), *dce = malloc((size_t)T * 4);
    for (int32_t t = 0; t < T; t++) mask[t] = targets[t] >= 0;
    double ce = ff_sft_loss(lp, mask, T, 1.0f, dce);
    CHECK_CLOSE(ce, need_tensor(ex, "loss_ce")->data[0], 1e-5, 1e-5);

    /* gradients of L = sum c_lp*logprob + c_ent*entropy + c_val*value */
    const float *c_lp = need_tensor(ex, "c_lp")->data, *c_ent = need_tensor(ex, "c_ent")->data;
    const float *c_val = cfg.value_head ? need_tensor(ex, "c_val")->data : NULL;
    ff_model_zero_grad(m);
    REQUIRE(ff_model_backward(m, c_lp, c_ent, c_val) == 0);
    CHECK(ff_model_backward(m, c_lp, c_ent, c_val) == -1); /* one backward per forward */
    int64_t P = ff_model_param_count(m);
    float *g1 = malloc((size_t)P * 4);
    ff_model_read_grads(m, g1);
    ff_tensor_set *exported = ff_tensor_set_new();
    /* gradients by name: write them as weights into a scratch model and export */
    ff_model *gm = ff_model_new(be, &cfg, w);
    REQUIRE(gm);
    ff_model_write_params(gm, g1);
    REQUIRE(ff_model_export_weights(gm, exported) == 0);
    for (size_t i = 0; i < exported->n; i++) {
        const ff_host_tensor *g = &exported->items[i];
        char key[160];
        snprintf(key, sizeof key, "grad.%s", g->name);
        snprintf(what, sizeof what, "%s %s", name, key);
        check_tensor_close(what, g->data, need_tensor(ex, key)->data, ff_host_tensor_numel(g), 1e-6, 2e-5);
    }
    ff_tensor_set_destroy(&exported);

    /* gradient accumulation: a second forward/backward doubles the gradient */
    REQUIRE(ff_model_forward(m, &b, &train, NULL) == 0);
    REQUIRE(ff_model_backward(m, c_lp, c_ent, c_val) == 0);
    float *g2 = malloc((size_t)P * 4);
    ff_model_read_grads(m, g2);
    for (int64_t i = 0; i < P; i++) g1[i] *= 2.0f;
    snprintf(what, sizeof what, "%s accumulated gradient", name);
    check_tensor_close(what, g2, g1, P, 1e-6, 1e-6);
    for (int64_t i = 0; i < P; i++) g1[i] *= 0.5f;

    /* a chunked LM head (recomputed logits in backward) gives the same gradient */
    ff_model_set_logits_chunk(m, 16);
    ff_model_zero_grad(m);
    REQUIRE(ff_model_forward(m, &b, &train, &out) == 0);
    REQUIRE(ff_model_backward(m, c_lp, c_ent, c_val) == 0);
    ff_model_read_grads(m, g2);
    snprintf(what, sizeof what, "%s chunked LM head gradient", name);
    check_tensor_close(what, g2, g1, P, 1e-6, 1e-5);
    snprintf(what, sizeof what, "%s chunked LM head logits", name);
    check_tensor_close(what, logits, need_tensor(ex, "logits")->data, (int64_t)T * V, 1e-5, 1e-5);
    ff_model_set_logits_chunk(m, 0);

    /* eval mode (no saved activations) and temperature 0.7 */
    float tmeta = 0.7f;
    ff_forward_opts evalt = {.train = false, .temperature = tmeta};
    ff_forward_out out2 = {.logprobs = lp, .entropy = ent};
    REQUIRE(ff_model_forward(m, &b, &evalt, &out2) == 0);
    snprintf(what, sizeof what, "%s logprobs at temperature 0.7", name);
    check_tensor_close(what, lp, need_tensor(ex, "logprobs_t")->data, T, 1e-5, 1e-5);
    snprintf(what, sizeof what, "%s entropy at temperature 0.7", name);
    check_tensor_close(what, ent, need_tensor(ex, "entropy_t")->data, T, 1e-5, 1e-5);
    CHECK(ff_model_backward(m, c_lp, NULL, NULL) == -1); /* eval forward keeps nothing */

    /* three AdamW steps from the fixture's weights */
    ff_safetensors *ef = ff_safetensors_open(epath);
    REQUIRE(ef);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = meta_num(ef, "adamw.lr");
    ac.beta1 = meta_num(ef, "adamw.beta1");
    ac.beta2 = meta_num(ef, "adamw.beta2");
    ac.eps = meta_num(ef, "adamw.eps");
    ac.weight_decay = meta_num(ef, "adamw.weight_decay");
    ac.warmup_steps = (int64_t)meta_num(ef, "adamw.warmup_steps");
    ac.total_steps = (int64_t)meta_num(ef, "adamw.total_steps");
    ac.min_lr_ratio = meta_num(ef, "adamw.min_lr_ratio");
    ac.max_grad_norm = meta_num(ef, "max_grad_norm");
    ff_safetensors_close(&ef);
    REQUIRE(ff_model_load_weights(m, w) == 0);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    const float *norms = need_tensor(ex, "grad_norm")->data, *lrs = need_tensor(ex, "lr")->data;
    for (int k = 0; k < 3; k++) {
        ff_model_zero_grad(m);
        REQUIRE(ff_model_forward(m, &b, &train, NULL) == 0);
        REQUIRE(ff_model_backward(m, c_lp, c_ent, c_val) == 0);
        ff_optim_stats st;
        REQUIRE(ff_optimizer_step(opt, &st) == 0);
        CHECK_EQ_INT(st.step, k + 1);
        CHECK_CLOSE(st.grad_norm, norms[k], 0, 1e-4);
        CHECK_CLOSE(st.lr, lrs[k], 0, 1e-7); /* the fixture stores fp32 */
        CHECK(st.clipped == (norms[k] > ac.max_grad_norm));
    }
    CHECK_EQ_INT(ff_optimizer_steps_done(opt), 3);
    exported = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m, exported) == 0);
    double pmax = 0;
    for (size_t i = 0; i < exported->n; i++) {
        char key[160];
        snprintf(key, sizeof key, "after3.%s", exported->items[i].name);
        const ff_host_tensor *want = need_tensor(ex, key);
        for (int64_t j = 0; j < ff_host_tensor_numel(want); j++) pmax = fabs(want->data[j]) > pmax ? fabs(want->data[j]) : pmax;
    }
    for (size_t i = 0; i < exported->n; i++) {
        const ff_host_tensor *p = &exported->items[i];
        char key[160];
        snprintf(key, sizeof key, "after3.%s", p->name);
        snprintf(what, sizeof what, "%s %s", name, key);
        check_tensor_close(what, p->data, need_tensor(ex, key)->data, ff_host_tensor_numel(p), 5e-5 * pmax, 0);
    }
    ff_tensor_set_destroy(&exported);
    ff_optimizer_destroy(&opt);

    free(g1);
    free(g2);
    free(mask);
    free(dce);
    free(lp);
    free(ent);
    free(val);
    free(logits);
    free(tokens);
    free(targets);
    free(ss);
    ff_model_destroy(&gm);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_tensor_set_destroy(&w);
    ff_tensor_set_destroy(&ex);
}

int main(void) {
    run_case("qwen_gqa_bias_value", 2);
    run_case("llama_tied_rope3", 2);
    run_case("qwen_gqa_bias_value", 1);
    TEST_MAIN_END();
}

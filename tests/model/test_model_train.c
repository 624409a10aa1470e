/* Training through the model API, independent of the PyTorch fixtures: whole-model
 * finite-difference gradients (every tensor, log-prob + entropy + value losses), packing
 * (a packed batch gives each sequence exactly what it gets alone, so nothing attends across
 * sequences), training and scoring forwards agreeing bit for bit (bf16 products too), the learning-rate
 * schedule, the weight-decay rule, optimizer state export/import resuming bit-exactly,
 * weight export/import and copy, bf16 products' weight copy following every write of the
 * weights. */
#include "tests/model/model_test_util.h"

static ff_backend *be;

static double loss_of(ff_model *m, const ff_batch *b, const float *a, const float *c, const float *d, float *lp,
                      float *ent, float *val) {
    ff_forward_out o = {.logprobs = lp, .entropy = ent, .values = val};
    REQUIRE(ff_model_forward(m, b, NULL, &o) == 0);
    double L = 0;
    for (int t = 0; t < b->n_tokens; t++) L += (double)a[t] * lp[t] + (double)c[t] * ent[t] + (double)d[t] * val[t];
    return L;
}

static void test_finite_differences(void) {
    ff_model_config c = tiny_config(20, 16, 24, 2, 4, 2, false, true, true);
    c.rope_scaling.kind = FF_ROPE_SCALING_LLAMA3;
    c.rope_scaling.factor = 4;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_position_embeddings = 16;
    ff_model *m = tiny_model(be, &c, 11, 0.4);
    int32_t tok[12] = {1, 5, 9, 3, 3, 19, 0, 7, 2, 11, 4, 8}, ss[4] = {0, 5, 6, 12}, tg[12];
    ff_batch_shift_targets(tok, ss, 3, tg);
    ff_batch b = {.n_tokens = 12, .n_seqs = 3, .tokens = tok, .seq_start = ss, .targets = tg};
    float a[12], cc[12], d[12], lp[12], ent[12], val[12];
    ff_rng r;
    ff_rng_seed(&r, 5);
    for (int t = 0; t < 12; t++) {
        a[t] = (float)ff_rng_normal(&r);
        cc[t] = (float)ff_rng_normal(&r);
        d[t] = (float)ff_rng_normal(&r);
    }
    /* distinct random values everywhere (norm weights too), so that export finds each
     * tensor's place in the flat buffer by value */
    int64_t P = ff_model_param_count(m);
    float *p = malloc((size_t)P * 4), *g = malloc((size_t)P * 4);
    for (int64_t i = 0; i < P; i++) p[i] = (float)(0.4 * ff_rng_normal(&r));
    ff_model_write_params(m, p);
    ff_forward_out o = {.logprobs = lp, .entropy = ent, .values = val};
    ff_forward_opts tr = {.train = true};
    REQUIRE(ff_model_forward(m, &b, &tr, &o) == 0);
    ff_model_zero_grad(m);
    REQUIRE(ff_model_backward(m, a, cc, d) == 0);
    ff_model_read_grads(m, g);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m, w) == 0);
    const float h = 1e-2f;
    int checked = 0;
    for (size_t ti = 0; ti < w->n; ti++) {
        const ff_host_tensor *t = &w->items[ti];
        for (int k = 0; k < 3; k++) {
            int64_t j = (int64_t)ff_rng_below(&r, (uint64_t)ff_host_tensor_numel(t));
            int64_t at = -1, hits = 0;
            for (int64_t q = 0; q < P; q++)
                if (p[q] == t->data[j]) at = q, hits++;
            REQUIRE(hits == 1);
            float keep = p[at];
            p[at] = keep + h;
            ff_model_write_params(m, p);
            double lpv = loss_of(m, &b, a, cc, d, lp, ent, val);
            p[at] = keep - h;
            ff_model_write_params(m, p);
            double lmv = loss_of(m, &b, a, cc, d, lp, ent, val);
            p[at] = keep;
            ff_model_write_params(m, p);
            double fd = (lpv - lmv) / (2 * h);
            if (!(fabs(fd - g[at]) <= 3e-3 + 3e-2 * fabs(g[at]))) {
                fprintf(stderr, "%s[%lld]: finite difference %.6g, backward %.6g\n", t->name, (long long)j, fd, g[at]);
                ff_test_failures++;
            }
            checked++;
        }
    }
    CHECK(checked >= 3 * 25);
    ff_tensor_set_destroy(&w);
    free(p), free(g);
    ff_model_destroy(&m);
}

static void test_packing(void) {
    ff_model_config c = tiny_config(32, 32, 48, 2, 4, 1, true, false, false);
    ff_model *m = tiny_model(be, &c, 12, 0.3);
    int32_t len[4] = {70, 1, 9, 66}, ss[5] = {0};
    for (int s = 0; s < 4; s++) ss[s + 1] = ss[s] + len[s];
    int32_t T = ss[4], *tok = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
    ff_rng r;
    ff_rng_seed(&r, 3);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)ff_rng_below(&r, 32);
    ff_batch_shift_targets(tok, ss, 4, tg);
    float *lp = malloc((size_t)T * 4), *ent = malloc((size_t)T * 4), *one = malloc((size_t)T * 4);
    ff_batch b = {.n_tokens = T, .n_seqs = 4, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_forward_out o = {.logprobs = lp, .entropy = ent};
    REQUIRE(ff_model_forward(m, &b, NULL, &o) == 0);
    for (int s = 0; s < 4; s++) {
        int32_t s2[2] = {0, len[s]};
        ff_batch bs = {.n_tokens = len[s], .n_seqs = 1, .tokens = tok + ss[s], .seq_start = s2, .targets = tg + ss[s]};
        ff_forward_out os = {.logprobs = one};
        REQUIRE(ff_model_forward(m, &bs, NULL, &os) == 0);
        char what[64];
        snprintf(what, sizeof what, "sequence %d alone vs packed", s);
        check_tensor_close(what, one, lp + ss[s], len[s], 1e-5, 0);
    }
    /* targets -1 give log-prob 0 */
    for (int s = 0; s < 4; s++) CHECK(lp[ss[s + 1] - 1] == 0.0f);
    free(tok), free(tg), free(lp), free(ent), free(one);
    ff_model_destroy(&m);
}

/* Training and scoring run the same layer code with the activations in different places
 * (a slot per layer and separate residuals, or one set updated in place): their outputs
 * agree bit for bit, before and after the workspace is laid out for training. A scoring
 * forward between a training forward and its backward takes a set of activations of its
 * own, so the kept ones stay: the gradients equal those of a model that never scored. One
 * backward per training forward. */
/* p16: with bf16 products set (ff_model_set_bf16_products), where a scoring forward rounds as
 * the training forward does (q|k|v, the attention output, gate|up and SwiGLU in bf16) */
static void test_train_and_score_agree(bool p16) {
    ff_model_config c = tiny_config(32, 32, 48, 3, 4, 2, false, true, true);
    ff_model *m = tiny_model(be, &c, 21, 0.3), *m2 = tiny_model(be, &c, 21, 0.3);
    REQUIRE(ff_model_set_bf16_products(m, p16) == 0 && ff_model_set_bf16_products(m2, p16) == 0);
    int32_t len[3] = {67, 1, 12}, ss[4] = {0};
    for (int s = 0; s < 3; s++) ss[s + 1] = ss[s] + len[s];
    const int32_t T = ss[3];
    int32_t tok[80], tg[80];
    ff_rng r;
    ff_rng_seed(&r, 8);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)ff_rng_below(&r, 32);
    ff_batch_shift_targets(tok, ss, 3, tg);
    ff_batch b = {.n_tokens = T, .n_seqs = 3, .tokens = tok, .seq_start = ss, .targets = tg};
    float out[3][3][80], d[80]; /* [run][logprob, entropy, value][T] */
    ff_forward_opts tr = {.train = true};
    for (int run = 0; run < 3; run++) {
        ff_forward_out o = {.logprobs = out[run][0], .entropy = out[run][1], .values = out[run][2]};
        REQUIRE(ff_model_forward(m, &b, run == 1 ? &tr : NULL, &o) == 0); /* score, train, score */
    }
    for (int run = 1; run < 3; run++)
        if (memcmp(out[0], out[run], sizeof out[0]) != 0) {
            fprintf(stderr, "bf16 products %s: the %s forward's outputs are not the first scoring forward's\n", p16 ? "on" : "off",
                    run == 1 ? "training" : "second scoring");
            ff_test_failures++;
        }
    /* the scoring forward on a set of its own (the first) and on the training forward's
     * (unkept, after its backward below) agree too: no scoring result depends on which set it got */
    for (int t = 0; t < T; t++) d[t] = (float)ff_rng_normal(&r);
    /* m scored before and after its training forward, m2 never scored: same gradients */
    int64_t P = ff_model_param_count(m);
    float *g = malloc((size_t)P * 4), *g2 = malloc((size_t)P * 4);
    ff_model_zero_grad(m);
    REQUIRE(ff_model_backward(m, d, d, d) == 0);
    ff_model_read_grads(m, g);
    ff_forward_out o2 = {.logprobs = out[2][0]};
    REQUIRE(ff_model_forward(m2, &b, &tr, &o2) == 0);
    ff_model_zero_grad(m2);
    REQUIRE(ff_model_backward(m2, d, d, d) == 0);
    ff_model_read_grads(m2, g2);
    CHECK(memcmp(g, g2, (size_t)P * 4) == 0);
    CHECK(ff_model_backward(m, d, NULL, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no training forward");
    {
        float again[3][80];
        ff_forward_out o = {.logprobs = again[0], .entropy = again[1], .values = again[2]};
        REQUIRE(ff_model_forward(m2, &b, NULL, &o) == 0); /* m2's only set is the training one */
        CHECK(memcmp(again, out[0], sizeof again) == 0);
    }
    double norm = 0;
    for (int64_t i = 0; i < P; i++) norm += (double)g[i] * g[i];
    CHECK(norm > 0);
    free(g), free(g2);
    ff_model_destroy(&m);
    ff_model_destroy(&m2);
}

static void test_schedule(void) {
    ff_adamw_config c;
    ff_adamw_config_default(&c);
    c.lr = 1.0;
    c.warmup_steps = 4;
    c.total_steps = 14;
    c.min_lr_ratio = 0.1;
    CHECK_CLOSE(ff_adamw_lr_at(&c, 1), 0.25, 1e-12, 0);
    CHECK_CLOSE(ff_adamw_lr_at(&c, 4), 1.0, 1e-12, 0);
    CHECK_CLOSE(ff_adamw_lr_at(&c, 9), 0.1 + 0.9 * 0.5, 1e-12, 0); /* halfway: cos = 0 */
    CHECK_CLOSE(ff_adamw_lr_at(&c, 14), 0.1, 1e-12, 0);
    CHECK_CLOSE(ff_adamw_lr_at(&c, 100), 0.1, 1e-12, 0);
    c.total_steps = 0;
    CHECK_CLOSE(ff_adamw_lr_at(&c, 50), 1.0, 1e-12, 0);
    c.warmup_steps = 0;
    CHECK_CLOSE(ff_adamw_lr_at(&c, 1), 1.0, 1e-12, 0);
}

static void sft_step(ff_model *m, ff_optimizer *o, const ff_batch *b, ff_optim_stats *st) {
    float lp[64], d[64];
    ff_forward_out fo = {.logprobs = lp};
    ff_forward_opts tr = {.train = true};
    ff_model_zero_grad(m);
    REQUIRE(ff_model_forward(m, b, &tr, &fo) == 0);
    ff_sft_loss(lp, NULL, b->n_tokens, 1.0f, d);
    REQUIRE(ff_model_backward(m, d, NULL, NULL) == 0);
    REQUIRE(ff_optimizer_step(o, st) == 0);
}

static void test_optimizer_resume_and_decay(void) {
    ff_model_config c = tiny_config(24, 16, 32, 1, 2, 1, false, true, false);
    ff_model *m = tiny_model(be, &c, 21, 0.1);
    int32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, ss[3] = {0, 4, 10}, tg[10];
    ff_batch_shift_targets(tok, ss, 2, tg);
    ff_batch b = {.n_tokens = 10, .n_seqs = 2, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-2;
    ac.weight_decay = 0.5;
    ac.warmup_steps = 2;
    ac.total_steps = 6;
    ac.max_grad_norm = 0.5;
    ff_optimizer *o = ff_optimizer_new(m, &ac);
    REQUIRE(o);
    ff_optim_stats st;
    sft_step(m, o, &b, &st);
    CHECK(st.step == 1 && st.lr == 5e-3);
    sft_step(m, o, &b, &st);
    /* checkpoint: weights and optimizer state */
    ff_tensor_set *w = ff_tensor_set_new(), *os = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m, w) == 0 && ff_optimizer_export_state(o, os) == 0);
    CHECK(ff_tensor_set_find(os, "step")->data[0] == 2.0f);
    CHECK(ff_tensor_set_find(os, "exp_avg.model.layers.0.self_attn.q_proj.bias") != NULL);
    ff_model *m2 = ff_model_new(be, &c, w);
    REQUIRE(m2);
    ff_optimizer *o2 = ff_optimizer_new(m2, &ac);
    REQUIRE(o2 && ff_optimizer_import_state(o2, os) == 0);
    CHECK_EQ_INT(ff_optimizer_steps_done(o2), 2);
    for (int k = 0; k < 2; k++) {
        ff_optim_stats s1, s2;
        sft_step(m, o, &b, &s1);
        sft_step(m2, o2, &b, &s2);
        CHECK(s1.step == s2.step && s1.lr == s2.lr && s1.grad_norm == s2.grad_norm);
    }
    int64_t P = ff_model_param_count(m);
    float *p1 = malloc((size_t)P * 4), *p2 = malloc((size_t)P * 4);
    ff_model_read_params(m, p1);
    ff_model_read_params(m2, p2);
    CHECK(memcmp(p1, p2, (size_t)P * 4) == 0); /* resumed run is bit-identical */

    /* decay rule: zero gradients, one step: 2-D weights shrink by (1 - lr wd), norms and
     * biases stay (Adam's update is 0 with zero moments... so reset the state first) */
    ff_optimizer_destroy(&o2);
    ff_adamw_config dc = ac;
    dc.warmup_steps = 0;
    dc.total_steps = 0;
    o2 = ff_optimizer_new(m2, &dc);
    REQUIRE(o2);
    ff_model_zero_grad(m2);
    ff_tensor_set *before = ff_tensor_set_new(), *after = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(m2, before) == 0);
    REQUIRE(ff_optimizer_step(o2, &st) == 0);
    CHECK(st.grad_norm == 0 && !st.clipped);
    REQUIRE(ff_model_export_weights(m2, after) == 0);
    for (size_t i = 0; i < before->n; i++) {
        const ff_host_tensor *x = &before->items[i], *y = &after->items[i];
        float f = x->ndim == 2 ? (float)(1.0 - dc.lr * dc.weight_decay) : 1.0f;
        for (int64_t j = 0; j < ff_host_tensor_numel(x); j++)
            if (y->data[j] != x->data[j] * f) {
                fprintf(stderr, "%s[%lld]: %g after decay, want %g\n", x->name, (long long)j, (double)y->data[j],
                        (double)(x->data[j] * f));
                ff_test_failures++;
                break;
            }
    }
    /* copy_params makes two models identical */
    REQUIRE(ff_model_copy_params(m2, m) == 0);
    ff_model_read_params(m2, p2);
    CHECK(memcmp(p1, p2, (size_t)P * 4) == 0);
    ff_tensor_set_destroy(&before);
    ff_tensor_set_destroy(&after);
    ff_tensor_set_destroy(&w);
    ff_tensor_set_destroy(&os);
    free(p1), free(p2);
    ff_optimizer_destroy(&o);
    ff_optimizer_destroy(&o2);
    ff_model_destroy(&m);
    ff_model_destroy(&m2);
}

/* Training an SFT loss on one batch brings it down (the whole loop works end to end). */
static void test_learns(void) {
    ff_model_config c = tiny_config(16, 32, 64, 2, 4, 2, false, false, false);
    ff_model *m = tiny_model(be, &c, 1, 0.02);
    CHECK(ff_model_reserve(m, 64) == 0);
    int32_t tok[16], ss[3] = {0, 8, 16}, tg[16];
    for (int t = 0; t < 16; t++) tok[t] = (t * 5 + 3) % 16;
    ff_batch_shift_targets(tok, ss, 2, tg);
    ff_batch b = {.n_tokens = 16, .n_seqs = 2, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-2;
    ff_optimizer *o = ff_optimizer_new(m, &ac);
    float lp[16], mask[16];
    for (int t = 0; t < 16; t++) mask[t] = tg[t] >= 0;
    ff_forward_out fo = {.logprobs = lp};
    REQUIRE(ff_model_forward(m, &b, NULL, &fo) == 0);
    double first = ff_sft_loss(lp, mask, 16, 1, NULL);
    ff_optim_stats st;
    for (int k = 0; k < 40; k++) sft_step(m, o, &b, &st);
    REQUIRE(ff_model_forward(m, &b, NULL, &fo) == 0);
    double last = ff_sft_loss(lp, mask, 16, 1, NULL);
    CHECK(first > 2.5 && last < 0.1);
    ff_optimizer_destroy(&o);
    ff_model_destroy(&m);
}

/* bf16 products (the CPU's definition of ff_gemm_bf16): the weights' bf16 copy is made once a
 * change of the weights and is never stale. Forwards that change nothing (scoring, a training
 * forward and its backward) share one copy; after each way of writing the weights the next
 * forward gives the log-probs of a new model made with the new weights, bit for bit, and makes
 * one copy more. */
static const int32_t c16_ss[3] = {0, 9, 23};
static int32_t c16_tok[23], c16_tg[23];
static void score16(ff_model *m, float *lp) {
    ff_batch b = {.n_tokens = 23, .n_seqs = 2, .tokens = c16_tok, .seq_start = c16_ss, .targets = c16_tg};
    ff_forward_out o = {.logprobs = lp};
    REQUIRE(ff_model_forward(m, &b, NULL, &o) == 0);
}
/* m's log-probs against those of a new model with m's weights as they are (read back) */
static void same_as_new16(const char *what, ff_model *m, const ff_model_config *c, int64_t copies) {
    const int64_t P = ff_model_param_count(m);
    float *w = malloc((size_t)P * 4), lp[23], want[23];
    REQUIRE(w);
    ff_model_read_params(m, w);
    score16(m, lp);
    ff_model *n = tiny_model(be, c, 99, 0.3);
    ff_model_write_params(n, w);
    REQUIRE(ff_model_set_bf16_products(n, true) == 0);
    score16(n, want);
    if (memcmp(lp, want, sizeof lp)) {
        fprintf(stderr, "bf16 copy after %s: log-probs are not a new model's with the same weights (a stale copy)\n", what);
        ff_test_failures++;
    }
    if (ff_model_bf16_copies(m) != copies) {
        fprintf(stderr, "bf16 copy after %s: %lld copies made, %lld expected\n", what, (long long)ff_model_bf16_copies(m),
                (long long)copies);
        ff_test_failures++;
    }
    ff_model_destroy(&n);
    free(w);
}

static void test_bf16_copy_follows_weights(void) {
    ff_model_config c = tiny_config(32, 32, 48, 2, 4, 2, false, true, false);
    ff_rng r;
    ff_rng_seed(&r, 4);
    for (int t = 0; t < 23; t++) c16_tok[t] = (int32_t)ff_rng_below(&r, 32);
    ff_batch_shift_targets(c16_tok, c16_ss, 2, c16_tg);
    ff_model *m = tiny_model(be, &c, 5, 0.3), *other = tiny_model(be, &c, 6, 0.3);
    REQUIRE(ff_model_set_bf16_products(m, true) == 0);
    CHECK(ff_model_bf16_copies(m) == 0);
    float lp0[23], lp[23], d[23];
    score16(m, lp0);
    score16(m, lp);
    CHECK(!memcmp(lp, lp0, sizeof lp) && ff_model_bf16_copies(m) == 1);
    ff_batch b = {.n_tokens = 23, .n_seqs = 2, .tokens = c16_tok, .seq_start = c16_ss, .targets = c16_tg};
    ff_forward_opts tr = {.train = true};
    ff_forward_out o = {.logprobs = lp};
    for (int t = 0; t < 23; t++) d[t] = 0.1f;
    REQUIRE(ff_model_forward(m, &b, &tr, &o) == 0 && ff_model_backward(m, d, NULL, NULL) == 0);
    CHECK(ff_model_bf16_copies(m) == 1 && !memcmp(lp, lp0, sizeof lp)); /* the same copy, and the scoring log-probs */
    same_as_new16("nothing", m, &c, 1);

    const int64_t P = ff_model_param_count(m);
    float *w = malloc((size_t)P * 4);
    REQUIRE(w);
    ff_model_read_params(other, w);
    ff_model_write_params(m, w);
    same_as_new16("ff_model_write_params", m, &c, 2);
    const char *name = "model.layers.1.mlp.down_proj.weight";
    const int64_t n = ff_model_tensor_numel(m, name);
    REQUIRE(n > 0);
    for (int64_t i = 0; i < n; i++) w[i] = (float)ff_rng_normal(&r) * 0.3f;
    REQUIRE(ff_model_write_tensor(m, name, w) == 0);
    same_as_new16("ff_model_write_tensor", m, &c, 3);
    ff_dptr at;
    ff_dtype ty;
    REQUIRE(ff_model_tensor_storage(m, "model.layers.0.self_attn.q_proj.weight", &at, &ty) == 0 && ty == FF_DTYPE_F32);
    for (int64_t i = 0; i < 64; i++) w[i] = (float)ff_rng_normal(&r);
    ff_memcpy_h2d(ff_backend_stream(be), at, w, 64 * 4);
    same_as_new16("a write through ff_model_tensor_storage", m, &c, 4);
    ff_memcpy_h2d(ff_backend_stream(be), ff_dptr_of(ff_model_param_buffer(m), 0), w, 64 * 4);
    same_as_new16("a write through ff_model_param_buffer", m, &c, 5);
    ff_tensor_set *ws = ff_tensor_set_new();
    REQUIRE(ws && ff_model_export_weights(other, ws) == 0 && ff_model_load_weights(m, ws) == 0);
    ff_tensor_set_destroy(&ws);
    same_as_new16("ff_model_load_weights", m, &c, 6);
    REQUIRE(ff_model_write_tensor(other, name, w) == 0 && ff_model_copy_params(m, other) == 0);
    same_as_new16("ff_model_copy_params", m, &c, 7);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-2;
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    ff_optim_stats st;
    REQUIRE(ff_model_zero_grad(m) == 0 && ff_model_forward(m, &b, &tr, &o) == 0 && ff_model_backward(m, d, NULL, NULL) == 0);
    REQUIRE(ff_optimizer_step(opt, &st) == 0);
    same_as_new16("an optimizer step", m, &c, 8);
    REQUIRE(ff_model_release_grads(m) == 0 && ff_model_restore_grads(m) == 0); /* the copy given back */
    same_as_new16("the gradients released and restored", m, &c, 9);
    REQUIRE(ff_model_set_bf16_products(m, false) == 0 && ff_model_set_bf16_products(m, true) == 0);
    same_as_new16("bf16 products off and on", m, &c, 10);
    ff_optimizer_destroy(&opt);
    free(w);
    ff_model_destroy(&m);
    ff_model_destroy(&other);
}

int main(void) {
    be = ff_backend_cpu_new(2);
    REQUIRE(be);
    test_finite_differences();
    test_packing();
    test_train_and_score_agree(false);
    test_train_and_score_agree(true);
    test_schedule();
    test_optimizer_resume_and_decay();
    test_learns();
    test_bf16_copy_follows_weights();
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}

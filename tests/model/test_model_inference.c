/* A model created for inference (ff_model_opts.inference): it scores and generates the same
 * numbers as a trainable one, bit for bit; it holds no gradients and keeps no activations
 * for a backward (ff_model_memory_of, a smaller workspace); every call that needs gradients
 * is an error naming the mode, not a crash. ff_model_new_from takes its weights (the set is
 * gone afterwards, also when creation fails) and gives their host memory back while it
 * copies them: loading adds a few MiB to what the weights already hold, where copying them
 * (ff_model_new) adds the weights once more. */
#include "fuseflow/util.h"
#include "tests/model/model_test_util.h"

static ff_backend *be;

static ff_model *make(const ff_model_config *c, bool inference) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, 11, 0.5, w) == 0);
    ff_model *m = ff_model_new_from(be, c, &w, &(ff_model_opts){.inference = inference});
    DIE_IF(!m);
    CHECK(w == NULL);
    return m;
}

/* log-probs, entropy and (with a value head) values of a packed batch of 3 sequences */
static void score(ff_model *m, float *lp, float *ent, float *val) {
    int32_t tok[11] = {1, 5, 9, 2, 7, 7, 3, 0, 12, 4, 6}, ss[4] = {0, 4, 5, 11}, tg[11];
    ff_batch_shift_targets(tok, ss, 3, tg);
    ff_batch b = {.n_tokens = 11, .n_seqs = 3, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_forward_opts o = {.temperature = 0.7f};
    ff_forward_out out = {.logprobs = lp, .entropy = ent, .values = val};
    DIE_IF(ff_model_forward(m, &b, &o, &out) != 0);
}

static void same_numbers(bool value_head) {
    ff_model_config c = tiny_config(16, 16, 32, 2, 4, 2, false, true, value_head);
    ff_model *tm = make(&c, false), *im = make(&c, true);
    float lp[2][11], ent[2][11], val[2][11];
    score(tm, lp[0], ent[0], value_head ? val[0] : NULL);
    score(im, lp[1], ent[1], value_head ? val[1] : NULL);
    CHECK(memcmp(lp[0], lp[1], sizeof lp[0]) == 0);
    CHECK(memcmp(ent[0], ent[1], sizeof ent[0]) == 0);
    if (value_head) CHECK(memcmp(val[0], val[1], sizeof val[0]) == 0);
    if (!value_head) { /* generation: the same tokens and log-probs */
        int32_t prompt[3] = {3, 1, 4};
        ff_gen_request r = {.id = 1, .prompt = prompt, .prompt_len = 3, .n_samples = 2, .seed = 5};
        ff_sampling_default(&r.sampling);
        r.sampling.max_new_tokens = 6; /* the config has no eos: each sample runs to 6 tokens */
        ff_gen_output *o[2];
        int32_t n[2];
        DIE_IF(ff_model_generate(tm, NULL, &r, 1, &o[0], &n[0]) != 0);
        DIE_IF(ff_model_generate(im, NULL, &r, 1, &o[1], &n[1]) != 0);
        REQUIRE(n[0] == 2 && n[1] == 2);
        for (int s = 0; s < 2; s++) {
            CHECK(o[0][s].n_tokens == 6 && o[1][s].n_tokens == 6);
            CHECK(memcmp(o[0][s].tokens, o[1][s].tokens, 6 * sizeof(int32_t)) == 0);
            CHECK(memcmp(o[0][s].logprobs, o[1][s].logprobs, 6 * sizeof(float)) == 0);
        }
        for (int k = 0; k < 2; k++) {
            for (int s = 0; s < n[k]; s++) ff_gen_output_free(&o[k][s]);
            free(o[k]);
        }
    }
    ff_model_destroy(&tm);
    ff_model_destroy(&im);
}

static void no_gradients(void) {
    ff_model_config c = tiny_config(16, 16, 32, 3, 4, 2, false, false, false);
    ff_model *tm = make(&c, false), *im = make(&c, true);
    CHECK(!ff_model_is_inference(tm) && ff_model_is_inference(im));
    int64_t n = ff_model_param_count(im);
    ff_model_memory a, b;
    ff_model_memory_of(tm, &a);
    ff_model_memory_of(im, &b);
    CHECK_EQ_INT(a.params, n * 4);
    CHECK_EQ_INT(a.grads, n * 4);
    CHECK_EQ_INT(b.params, n * 4);
    CHECK_EQ_INT(b.grads, 0);
    CHECK(ff_model_grad_buffer(im) == NULL && ff_model_grad_buffer(tm) != NULL);
    /* the reserved workspace of an inference model keeps one layer's activations, not L */
    DIE_IF(ff_model_reserve(tm, 64) != 0);
    DIE_IF(ff_model_reserve(im, 64) != 0);
    ff_model_memory_of(tm, &a);
    ff_model_memory_of(im, &b);
    CHECK(b.workspace > 0 && 2 * b.workspace < a.workspace);

    /* every call that needs gradients: an error naming the mode */
    int32_t tok[4] = {1, 2, 3, 4}, ss[2] = {0, 4}, tg[4];
    ff_batch_shift_targets(tok, ss, 1, tg);
    ff_batch bt = {.n_tokens = 4, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
    float lp[4], d[4] = {1, 1, 1, 1};
    ff_forward_opts train = {.train = true};
    CHECK_EQ_INT(ff_model_forward(im, &bt, &train, &(ff_forward_out){.logprobs = lp}), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "training forward: this model was created for inference only");
    CHECK_STR_CONTAINS(ff_error_message(), "ff_model_opts.inference = false");
    CHECK_EQ_INT(ff_model_backward(im, d, NULL, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "backward: this model was created for inference only");
    CHECK_EQ_INT(ff_model_zero_grad(im), -1);
    float *g = malloc((size_t)n * sizeof *g);
    REQUIRE(g);
    CHECK_EQ_INT(ff_model_read_grads(im, g), -1);
    CHECK_EQ_INT(ff_model_write_grads(im, g), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "write gradients: this model was created for inference only");
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    CHECK(ff_optimizer_new(im, &ac) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "optimizer: this model was created for inference only");
    /* ... and the trainable model does all of it; its optimizer reports its state */
    DIE_IF(ff_model_zero_grad(tm) != 0);
    DIE_IF(ff_model_forward(tm, &bt, &train, &(ff_forward_out){.logprobs = lp}) != 0);
    DIE_IF(ff_model_backward(tm, d, NULL, NULL) != 0);
    DIE_IF(ff_model_read_grads(tm, g) != 0);
    ff_optimizer *o = ff_optimizer_new(tm, &ac);
    DIE_IF(!o);
    CHECK_EQ_INT(ff_optimizer_state_bytes(o), 2 * n * 4);
    /* weights move between the two kinds (a weight sync to a generating copy) */
    DIE_IF(ff_model_copy_params(im, tm) != 0);
    ff_optimizer_destroy(&o);
    free(g);
    ff_model_destroy(&tm);
    ff_model_destroy(&im);
}

/* Creation that fails still consumes the set (ASan: nothing leaks). */
static void taken_on_failure(void) {
    ff_model_config c = tiny_config(16, 16, 32, 1, 4, 2, false, false, false);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&c, 1, 0.5, w) == 0);
    ff_model_config wrong = c;
    wrong.hidden_size = 32;
    wrong.num_attention_heads = 8;
    CHECK(ff_model_new_from(be, &wrong, &w, NULL) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "model.embed_tokens.weight");
    CHECK(w == NULL);
}

/* The peak of creating a model of W bytes of weights, above what the weights already hold. */
static uint64_t creation_peak(const ff_model_config *c, bool take, uint64_t *weights) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, 3, 0.02, w) == 0);
    uint64_t before = ff_resident_memory().now;
    ff_model *m = take ? ff_model_new_from(be, c, &w, &(ff_model_opts){.inference = true}) : ff_model_new(be, c, w);
    DIE_IF(!m);
    uint64_t peak = ff_resident_memory().peak;
    *weights = (uint64_t)ff_model_param_count(m) * 4;
    ff_model_destroy(&m);
    ff_tensor_set_destroy(&w);
    return peak > before ? peak - before : 0;
}

static void loading_memory(void) {
    if (!ff_resident_memory().peak) SKIP("no /proc/self/status here: resident memory cannot be measured");
    /* 4096 x 512 embeddings (8 MiB) and 4 layers of 512 x 1408: 64 MiB of fp32 weights */
    ff_model_config c = tiny_config(4096, 512, 1408, 4, 8, 8, false, false, false);
    uint64_t w_bytes, took = creation_peak(&c, true, &w_bytes);
    /* the peak only grows: measure the copy second, it rises above the first */
    uint64_t copied = creation_peak(&c, false, &w_bytes);
    char b[3][32];
    printf("creating a model of %s: %s above its weights when it takes them, %s when it copies them\n",
           ff_fmt_bytes(w_bytes, b[0], sizeof b[0]), ff_fmt_bytes(took, b[1], sizeof b[1]), ff_fmt_bytes(copied, b[2], sizeof b[2]));
    /* taken: a chunk in flight (8 MiB), the rotary tables (and under ASan the parameters'
     * shadow, W / 8); copied: the weights again */
    CHECK(took < w_bytes / 3);
    CHECK(copied > w_bytes * 9 / 10);
}

int main(void) {
    be = ff_backend_cpu_new(2);
    REQUIRE(be);
    same_numbers(false);
    same_numbers(true);
    no_gradients();
    taken_on_failure();
    loading_memory();
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}

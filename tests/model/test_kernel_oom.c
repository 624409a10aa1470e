/* A CPU kernel that cannot get its scratch memory fails its stream instead of aborting the
 * process: ff_cpu_scratch returns NULL with a message, the next ff_stream_sync returns -1
 * with it (once), and so do the callers that sync: the model's forward and the optimizer,
 * which then leaves the weights alone. The backend works again afterwards. The allocation
 * is forced to fail with an absurd size. */
#include "kernels/cpu/cpu_internal.h"
#include "tests/model/model_test_util.h"

/* Under ASan an absurd malloc must return NULL (as glibc's does), not stop the test. The
 * runtime finds this hook in the dynamic symbol table, so it must not be hidden. */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

#define OOM "out of memory for 4611686018427387904 bytes of kernel scratch"

static ff_backend *be;

static void fail_scratch(void) {
    CHECK(ff_cpu_scratch(ff_backend_stream(be), (size_t)1 << 62) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), OOM);
    ff_error_clear(); /* the stream keeps the failure, not the thread's message */
}

int main(void) {
    be = ff_backend_cpu_new(2);
    REQUIRE(be);
    ff_stream *st = ff_backend_stream(be);

    fail_scratch();
    CHECK_EQ_INT(ff_stream_sync(st), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cpu backend: " OOM " (hint: use smaller batches");
    CHECK_EQ_INT(ff_stream_sync(st), 0); /* reported once */

    ff_model_config c = tiny_config(16, 16, 32, 2, 4, 2, false, false, false);
    ff_model *m = tiny_model(be, &c, 7, 0.5);
    int32_t tok[6] = {1, 2, 3, 4, 5, 6}, ss[3] = {0, 2, 6}, tg[6];
    ff_batch_shift_targets(tok, ss, 2, tg);
    ff_batch b = {.n_tokens = 6, .n_seqs = 2, .tokens = tok, .seq_start = ss, .targets = tg};
    float lp_ok[6], lp[6];
    ff_forward_out o = {.logprobs = lp_ok};
    REQUIRE(ff_model_forward(m, &b, NULL, &o) == 0);

    /* the forward that finds its stream failed returns the error */
    fail_scratch();
    o.logprobs = lp;
    CHECK_EQ_INT(ff_model_forward(m, &b, NULL, &o), -1);
    CHECK_STR_CONTAINS(ff_error_message(), OOM);
    /* and the next one computes again, the same numbers */
    CHECK_EQ_INT(ff_model_forward(m, &b, NULL, &o), 0);
    CHECK(memcmp(lp, lp_ok, sizeof lp) == 0);

    /* the optimizer checks the stream after the gradient norm, before it moves anything */
    ff_forward_opts fo = {.train = true};
    REQUIRE(ff_model_forward(m, &b, &fo, &o) == 0);
    float d[6] = {1, 1, 1, 1, 1, 1};
    REQUIRE(ff_model_backward(m, d, NULL, NULL) == 0);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-2;
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    int64_t n = ff_model_param_count(m);
    float *before = malloc((size_t)n * sizeof *before), *after = malloc((size_t)n * sizeof *after);
    REQUIRE(before && after);
    ff_model_read_params(m, before);
    fail_scratch();
    CHECK_EQ_INT(ff_optimizer_step(opt, NULL), -1);
    CHECK_STR_CONTAINS(ff_error_message(), OOM);
    ff_model_read_params(m, after);
    CHECK(memcmp(before, after, (size_t)n * sizeof *after) == 0);
    CHECK(ff_optimizer_steps_done(opt) == 0);
    CHECK_EQ_INT(ff_optimizer_step(opt, NULL), 0);
    ff_model_read_params(m, after);
    CHECK(memcmp(before, after, (size_t)n * sizeof *after) != 0);

    free(before);
    free(after);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}

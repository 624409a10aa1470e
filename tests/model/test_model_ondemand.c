/* A frozen model's weights on demand (ff_model_params_to_host, ff_model_params_load;
 * docs/run.md "Weights on demand"), what a worker does with roles.<ref|reward>.weights:
 * on_demand:
 *   - to host: the backend's counters drop by exactly the weights' bytes (4 a parameter), which
 *     the host copy then holds; a load brings exactly those bytes back, on another stream and
 *     from another thread (the worker's prefetch), and a release gives them back again at no copy;
 *   - bit for bit: the loaded weights read back as the original, and a scoring forward gives the
 *     same log-probs, values and entropy as an identical model that never left the backend, after
 *     each of several round trips;
 *   - refused, naming the reason: a trainable model, a load without a host copy;
 *   - out of memory (an address-space limit below the load's allocation): the load fails naming
 *     the bytes, the host copy stays, the counters are unchanged, and once memory is back the
 *     load succeeds with the same bits. Not under AddressSanitizer, whose shadow memory an
 *     address-space limit does not allow (the other checks run there). */
#include <pthread.h>
#include <sys/resource.h>

#include "fuseflow/util.h"
#include "tests/model/model_test_util.h"

static ff_backend *be;

static ff_model *make(const ff_model_config *c, bool inference) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, 5, 0.5, w) == 0);
    ff_model *m = ff_model_new_from(be, c, &w, &(ff_model_opts){.inference = inference});
    DIE_IF(!m);
    return m;
}

static int64_t in_use(void) {
    ff_backend_memory bm;
    ff_backend_memory_of(be, &bm);
    return bm.in_use;
}

/* log-probs, entropy and values of a packed batch of 2 sequences: [10] each */
static void score(ff_model *m, float *out) {
    int32_t tok[10] = {1, 5, 9, 2, 7, 7, 3, 0, 12, 4}, ss[3] = {0, 4, 10}, tg[10];
    ff_batch_shift_targets(tok, ss, 2, tg);
    ff_batch b = {.n_tokens = 10, .n_seqs = 2, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_forward_out o = {.logprobs = out, .entropy = out + 10, .values = out + 20};
    DIE_IF(ff_model_forward(m, &b, NULL, &o) != 0);
}

typedef struct loader {
    ff_model *m;
    ff_stream *st;
    int rc;
    ff_offload_stats stats;
} loader;
static void *load_thread(void *p) {
    loader *l = p;
    l->rc = ff_model_params_load(l->m, l->st, &l->stats);
    return NULL;
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FF_TEST_ASAN 1
#endif
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(FF_TEST_ASAN)
#define FF_TEST_RLIMIT 1
#include <malloc.h>
/* The process's address space now, in bytes (/proc/self/statm's first field, in pages). */
static int64_t vm_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0;
    REQUIRE(f && fscanf(f, "%ld", &pages) == 1);
    fclose(f);
    return (int64_t)pages * 4096;
}
#endif

#ifdef FF_TEST_RLIMIT
/* Before any other thread exists: a thread's malloc arena reserves address space that a failed
 * mapping would fall back on, under the limit. */
static void out_of_memory(ff_stream *st) {
    /* a model whose weights (24 MB) do not fit under the limit */
    ff_model_config big = tiny_config(4096, 512, 512, 1, 8, 8, false, false, false);
    /* large blocks from fresh mappings, given back when freed: the load cannot reuse a freed block */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    ff_model *bm = make(&big, true);
    const int64_t bb = 4 * ff_model_param_count(bm);
    float *b0 = ff_malloc((size_t)bb), *b1 = ff_malloc((size_t)bb);
    REQUIRE(b0 && b1);
    ff_model_read_params(bm, b0);
    REQUIRE(ff_model_params_to_host(bm, NULL) == 0);
    struct rlimit old;
    REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
    struct rlimit lim = old;
    lim.rlim_cur = (rlim_t)(vm_bytes() + bb / 4);
    const int64_t at = in_use();
    REQUIRE(setrlimit(RLIMIT_AS, &lim) == 0);
    const int rc = ff_model_params_load(bm, st, NULL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ff_error_message());
    REQUIRE(setrlimit(RLIMIT_AS, &old) == 0);
    CHECK_EQ_INT(rc, -1);
    char want_msg[128];
    snprintf(want_msg, sizeof want_msg, "loading the weights (%lld bytes)", (long long)bb);
    CHECK_STR_CONTAINS(msg, want_msg);
    CHECK_STR_CONTAINS(msg, "out of memory");
    if (getenv("FF_TEST_VERBOSE")) printf("%s\n", msg);
    CHECK(!ff_model_params_held(bm) && ff_model_params_host_bytes(bm) == bb);
    CHECK_EQ_INT(in_use(), at);
    ff_error_clear();
    REQUIRE(ff_model_params_load(bm, st, NULL) == 0); /* memory back: the same weights */
    ff_model_read_params(bm, b1);
    CHECK(memcmp(b0, b1, (size_t)bb) == 0);
    free(b0), free(b1);
    ff_model_destroy(&bm);
}
#endif

int main(void) {
    be = ff_backend_cpu_new(1);
    REQUIRE(be);
    ff_model_config c = tiny_config(16, 16, 32, 2, 4, 2, false, true, true);
    ff_model *resident = make(&c, true), *m = make(&c, true);
    const int64_t n = ff_model_param_count(m), bytes = 4 * n;
    float want[30], got[30];
    score(resident, want);
    float *w0 = ff_malloc((size_t)bytes), *w1 = ff_malloc((size_t)bytes);
    REQUIRE(w0 && w1);
    ff_model_read_params(m, w0);

    /* refused: a trainable model, a load with no host copy */
    ff_model *trainable = make(&c, false);
    ff_stream *st = ff_stream_new(be);
    REQUIRE(st);
#ifdef FF_TEST_RLIMIT
    out_of_memory(st);
#endif
    CHECK(ff_model_params_to_host(trainable, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "the model is trainable");
    ff_model_destroy(&trainable);
    CHECK(ff_model_params_load(m, st, NULL) == 0); /* held: nothing to do */
    REQUIRE(ff_model_release_params(m) == 0);
    CHECK(ff_model_params_load(m, st, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no host copy of its weights");
    ff_error_clear();
    ff_model_destroy(&m);
    m = make(&c, true);

    /* to host: exactly the weights leave the backend */
    int64_t before = in_use();
    ff_offload_stats os;
    REQUIRE(ff_model_params_to_host(m, &os) == 0);
    CHECK_EQ_INT(os.bytes, bytes);
    CHECK_EQ_INT(before - in_use(), bytes);
    CHECK_EQ_INT(ff_model_params_host_bytes(m), bytes);
    CHECK(!ff_model_params_held(m));
    const int64_t away = in_use();

    for (int round = 0; round < 3; round++) {
        /* round 0 loads on the model's stream here, the others on a stream of their own on another thread */
        if (round == 0) {
            REQUIRE(ff_model_params_load(m, ff_backend_stream(be), &os) == 0);
        } else {
            loader l = {.m = m, .st = st};
            pthread_t th;
            REQUIRE(pthread_create(&th, NULL, load_thread, &l) == 0);
            pthread_join(th, NULL);
            REQUIRE(l.rc == 0);
            os = l.stats;
        }
        CHECK_EQ_INT(os.bytes, bytes);
        CHECK(os.seconds >= 0);
        CHECK_EQ_INT(in_use() - away, bytes);
        ff_model_read_params(m, w1);
        CHECK(memcmp(w0, w1, (size_t)bytes) == 0);
        score(m, got);
        CHECK(memcmp(want, got, sizeof want) == 0);
        /* released: the scoring workspace goes too, the host copy stays */
        REQUIRE(ff_model_release_params(m) == 0);
        CHECK_EQ_INT(in_use(), away);
        CHECK_EQ_INT(ff_model_params_host_bytes(m), bytes);
    }


    free(w0), free(w1);
    ff_stream_destroy(&st);
    ff_model_destroy(&m);
    ff_model_destroy(&resident);
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}

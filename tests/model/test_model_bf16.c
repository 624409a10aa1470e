/* An inference model with bf16 weights (ff_model_opts.bf16_weights). With the fixed-order
 * products (FF_BATCH_INVARIANT=fixed, set here before the backend is made) it must give, bit
 * for bit, the log-probs, entropy and generated tokens of an fp32 model holding the same
 * weights rounded to bf16, and near those of the unrounded fp32 model; hold half the bytes;
 * give the rounded weights back through every reader (read_params, read_tensor, export, the
 * host copy of ff_model_params_to_host); take weights through every writer (ff_model_new_from,
 * write_params, write_tensor, copy_params from an fp32 model on the same backend, which casts
 * on the device); and under tensor parallelism (2 ranks as threads) load its shards and
 * export whole tensors. A trainable model or a view with bf16 weights is refused naming why. */
#include <math.h>

#include "fuseflow/dtype.h"
#include "fuseflow/util.h"
#include "tests/model/model_test_util.h"
#include "tests/model/thread_comm.h"

static ff_backend *be;

enum { T = 13 };

static ff_tensor_set *weights(const ff_model_config *c, uint64_t seed) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, seed, 0.5, w) == 0);
    return w;
}

/* w with its matrices rounded to bf16 (norms and biases stay fp32, as the model keeps them) */
static ff_tensor_set *rounded(const ff_tensor_set *w) {
    ff_tensor_set *r = ff_tensor_set_new();
    REQUIRE(r);
    for (size_t i = 0; i < w->n; i++) {
        const ff_host_tensor *t = &w->items[i];
        ff_host_tensor *o = ff_tensor_set_add(r, t->name, t->ndim, t->shape);
        REQUIRE(o);
        int64_t n = ff_host_tensor_numel(t);
        for (int64_t j = 0; j < n; j++) o->data[j] = t->ndim == 2 ? ff_bf16_to_f32(ff_f32_to_bf16(t->data[j])) : t->data[j];
    }
    return r;
}

static void bits_pair(void *ctx, const char *name, const float *got, const float *want, int64_t n) {
    (void)ctx;
    check_tensor_bits(name, got, want, n);
}

static ff_model *make(const ff_model_config *c, const ff_tensor_set *w, bool bf16) {
    ff_model_opts o = {.inference = true, .bf16_weights = bf16};
    ff_model *m = ff_model_new_opts(be, c, w, &o);
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    return m;
}

/* log-probs and entropy (or values) of a packed batch of 3 sequences */
static void score(ff_model *m, float *lp, float *ent, float *val) {
    int32_t tok[T] = {1, 5, 9, 2, 7, 7, 3, 0, 12, 4, 6, 40, 63}, ss[4] = {0, 4, 5, T}, tg[T];
    ff_batch_shift_targets(tok, ss, 3, tg);
    ff_batch b = {.n_tokens = T, .n_seqs = 3, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_forward_opts o = {.temperature = 0.8f};
    ff_forward_out out = {.logprobs = lp, .entropy = ent, .values = val};
    DIE_IF(ff_model_forward(m, &b, &o, &out) != 0);
}

static bool same_scores(ff_model *a, ff_model *b) {
    float lp[2][T], ent[2][T];
    score(a, lp[0], ent[0], NULL);
    score(b, lp[1], ent[1], NULL);
    return !memcmp(lp[0], lp[1], sizeof lp[0]) && !memcmp(ent[0], ent[1], sizeof ent[0]);
}

static double max_diff(const float *a, const float *b, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

static void check_params(ff_model *m, ff_model *want, const char *what) {
    int64_t n = ff_model_param_count(want);
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    REQUIRE(a && b);
    ff_model_read_params(m, a);
    ff_model_read_params(want, b);
    check_tensor_bits(what, a, b, n);
    free(a), free(b);
}

static void generate_same(ff_model *a, ff_model *b) {
    int32_t prompt[4] = {3, 1, 4, 1};
    ff_gen_request r[2] = {gen_request(1, prompt, 4, 2, 1.0f, 10, 5), gen_request(2, prompt, 3, 1, 0.0f, 10, 6)};
    ff_gen_output *o[2];
    int32_t n[2];
    DIE_IF(ff_model_generate(a, NULL, r, 2, &o[0], &n[0]) != 0);
    DIE_IF(ff_model_generate(b, NULL, r, 2, &o[1], &n[1]) != 0);
    REQUIRE(n[0] == 3 && n[1] == 3);
    for (int s = 0; s < 3; s++) {
        CHECK_EQ_INT(o[0][s].n_tokens, o[1][s].n_tokens);
        CHECK(memcmp(o[0][s].tokens, o[1][s].tokens, (size_t)o[0][s].n_tokens * 4) == 0);
        CHECK(memcmp(o[0][s].logprobs, o[1][s].logprobs, (size_t)o[0][s].n_tokens * 4) == 0);
    }
    gen_outputs_free(o[0], n[0]);
    gen_outputs_free(o[1], n[1]);
}

static void same_as_rounded(bool tied, bool bias) {
    ff_model_config c = tiny_config(64, 32, 64, 2, 4, 2, tied, bias, false);
    ff_tensor_set *w = weights(&c, 3), *r = rounded(w), *own = weights(&c, 3);
    ff_model *m16 = ff_model_new_from(be, &c, &own, &(ff_model_opts){.inference = true, .bf16_weights = true});
    REQUIRE(m16 && own == NULL);
    ff_model *m32 = make(&c, r, false), *full = make(&c, w, false);

    /* the rounded fp32 model's numbers, bit for bit; near the unrounded model's */
    CHECK(same_scores(m16, m32));
    float lp[2][T], ent[2][T];
    score(m16, lp[0], ent[0], NULL);
    score(full, lp[1], ent[1], NULL);
    double dl = max_diff(lp[0], lp[1], T), de = max_diff(ent[0], ent[1], T), big = 0;
    for (int i = 0; i < T; i++) big = fmax(big, fabs((double)lp[1][i]));
    printf("tied %d bias %d: bf16 weights against fp32: max |d logprob| %.3g (of log-probs up to %.3g), max |d entropy| "
           "%.3g\n", tied, bias, dl, big, de);
    /* weights of std 0.5 make log-probs of several nats; bf16 keeps 8 significant bits (2^-8
     * relative), which moves them by a few hundredths of their size */
    CHECK(dl > 0 && dl < 0.03 * big && de < 0.1);
    generate_same(m16, m32);

    /* the bytes: 2 a matrix element, 4 a norm or bias element (from a 64-byte boundary) */
    int64_t mat = 0, vec = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (tied && !strcmp(w->items[i].name, "lm_head.weight")) continue;
        *(w->items[i].ndim == 2 ? &mat : &vec) += ff_host_tensor_numel(&w->items[i]);
    }
    ff_model_memory a, b;
    ff_model_memory_of(m16, &a);
    ff_model_memory_of(m32, &b);
    CHECK_EQ_INT(b.params, (mat + vec) * 4);
    CHECK_EQ_INT(a.params, (mat * 2 + 63) / 64 * 64 + vec * 4);
    CHECK_EQ_INT(a.grads, 0);

    /* readers give the rounded weights */
    check_params(m16, m32, "read_params");
    ff_tensor_set *ex = ff_tensor_set_new();
    REQUIRE(ex && ff_model_export_weights(m16, ex) == 0);
    compare_tensor_sets("export", ex, r, bits_pair, NULL);
    ff_tensor_set_destroy(&ex);

    /* the host copy keeps bf16 bytes, and loads back the same model */
    ff_offload_stats st;
    DIE_IF(ff_model_params_to_host(m16, &st) != 0);
    CHECK_EQ_INT(st.bytes, a.params);
    CHECK_EQ_INT(ff_model_params_host_bytes(m16), a.params);
    CHECK(!ff_model_params_held(m16));
    DIE_IF(ff_model_params_load(m16, ff_backend_stream(be), NULL) != 0);
    CHECK(same_scores(m16, m32));

    /* writers round: another model's weights in, by write_params, then back by write_tensor */
    ff_tensor_set *w2 = weights(&c, 9), *r2 = rounded(w2);
    ff_model *o32 = make(&c, w2, false), *o32r = make(&c, r2, false);
    int64_t n = ff_model_param_count(o32);
    float *flat = malloc((size_t)n * 4);
    REQUIRE(flat);
    ff_model_read_params(o32, flat);
    ff_model_write_params(m16, flat);
    CHECK(same_scores(m16, o32r));
    check_params(m16, o32r, "write_params");
    const ff_host_tensor *q = ff_tensor_set_find(w, "model.layers.1.self_attn.q_proj.weight");
    REQUIRE(q);
    DIE_IF(ff_model_write_tensor(m16, q->name, q->data) != 0);
    float *got = malloc((size_t)ff_host_tensor_numel(q) * 4);
    REQUIRE(got);
    DIE_IF(ff_model_read_tensor(m16, q->name, false, got) != 0);
    check_tensor_bits("write_tensor", got, ff_tensor_set_find(r, q->name)->data, ff_host_tensor_numel(q));
    free(got);

    /* weight sync from a trainable fp32 model on the same backend: cast on the device */
    ff_model *train = ff_model_new(be, &c, w);
    REQUIRE(train);
    DIE_IF(ff_model_copy_params(m16, train) != 0);
    check_params(m16, m32, "copy_params fp32 -> bf16");
    CHECK(same_scores(m16, m32));
    DIE_IF(ff_model_copy_params(o32, m16) != 0); /* and back: the rounded weights, widened */
    check_params(o32, m32, "copy_params bf16 -> fp32");

    free(flat);
    ff_model_destroy(&train);
    ff_model_destroy(&o32), ff_model_destroy(&o32r);
    ff_tensor_set_destroy(&w2), ff_tensor_set_destroy(&r2);
    ff_model_destroy(&m16), ff_model_destroy(&m32), ff_model_destroy(&full);
    ff_tensor_set_destroy(&w), ff_tensor_set_destroy(&r);
}

/* a critic: values near the rounded model's (its value head of one output is a narrow dot
 * product in fp32, the fixed-order product in bf16: another order of the same sum) */
static void critic(void) {
    ff_model_config c = tiny_config(64, 32, 64, 2, 4, 2, false, false, true);
    ff_tensor_set *w = weights(&c, 4);
    ff_tensor_set *r = rounded(w);
    ff_model *m16 = make(&c, w, true), *m32 = make(&c, r, false);
    float v[2][T];
    score(m16, NULL, NULL, v[0]);
    score(m32, NULL, NULL, v[1]);
    CHECK(max_diff(v[0], v[1], T) < 1e-5);
    ff_model_destroy(&m16), ff_model_destroy(&m32);
    ff_tensor_set_destroy(&w), ff_tensor_set_destroy(&r);
}

static void refused(void) {
    ff_model_config c = tiny_config(64, 32, 64, 1, 4, 2, false, false, false);
    ff_tensor_set *w = weights(&c, 5);
    CHECK(ff_model_new_opts(be, &c, w, &(ff_model_opts){.bf16_weights = true}) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "bf16");
    CHECK_STR_CONTAINS(ff_error_message(), "trainable");
    ff_model *src = ff_model_new(be, &c, w);
    REQUIRE(src);
    CHECK(ff_model_new_opts(be, &c, w, &(ff_model_opts){.inference = true, .view_of = src, .bf16_weights = true}) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "view");
    ff_model_destroy(&src);
    ff_tensor_set_destroy(&w);
}

/* ---- tensor parallelism: 2 ranks as threads ---- */

typedef struct tp_job {
    const ff_model_config *c;
    const ff_tensor_set *w;
    tc_rank comm;
    float lp[T], ent[T];
    ff_tensor_set *exported;
} tp_job;

static void *tp_rank(void *arg) {
    tp_job *j = arg;
    ff_backend *b = ff_backend_new("cpu:1");
    REQUIRE(b);
    ff_model_comm comm = tc_comm(&j->comm);
    ff_model_opts o = {.inference = true, .bf16_weights = true, .comm = &comm};
    ff_model *m = ff_model_new_opts(b, j->c, j->w, &o);
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    score(m, j->lp, j->ent, NULL);
    j->exported = ff_tensor_set_new();
    REQUIRE(j->exported && ff_model_export_weights(m, j->exported) == 0);
    ff_model_destroy(&m);
    ff_backend_destroy(&b);
    return NULL;
}

static void tensor_parallel(void) {
    ff_model_config c = tiny_config(64, 32, 64, 2, 4, 2, false, true, false);
    ff_tensor_set *w = weights(&c, 6), *r = rounded(w);
    ff_model *whole = make(&c, w, true);
    float lp[T], ent[T];
    score(whole, lp, ent, NULL);
    tc_group g;
    tc_group_init(&g, 2);
    tp_job jobs[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++) {
        jobs[k] = (tp_job){.c = &c, .w = w, .comm = {.g = &g, .rank = k}};
        REQUIRE(pthread_create(&th[k], NULL, tp_rank, &jobs[k]) == 0);
    }
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        /* the row-parallel sums add in another order than one product: near, not equal */
        CHECK(max_diff(jobs[k].lp, lp, T) < 1e-4);
        CHECK(max_diff(jobs[k].ent, ent, T) < 1e-4);
        compare_tensor_sets("tp export", jobs[k].exported, r, bits_pair, NULL);
        ff_tensor_set_destroy(&jobs[k].exported);
        tc_rank_free(&jobs[k].comm);
    }
    tc_group_destroy(&g);
    ff_model_destroy(&whole);
    ff_tensor_set_destroy(&w), ff_tensor_set_destroy(&r);
}

int main(void) {
    setenv("FF_BATCH_INVARIANT", "fixed", 1); /* both models' products of one fixed order */
    be = ff_backend_new("cpu:2");
    REQUIRE(be);
    same_as_rounded(false, true);
    same_as_rounded(true, false);
    critic();
    refused();
    tensor_parallel();
    ff_backend_destroy(&be);
    TEST_MAIN_END();
}

/* Pipeline stages of the model (ff_model_stage), in one thread, without an executor: a model
 * split into stage models whose chunks are run by hand, the hidden states handed from chunk to
 * chunk on the host, against the whole model.
 *
 * Checked: three stages (one of them with two chunks, as interleaving places them) with three
 * micro-batches in flight through every chunk give the whole model's log-probs, entropy,
 * values, input-to-output hidden states and gradients bit for bit (the same kernels on the
 * same activations, the micro-batches' gradients accumulated in the same order); the in-flight
 * count per chunk; room reserved for them is not grown by the step; an inference stage gives
 * the trainable stage's outputs; the stages' exports are the whole model's tensors, each from
 * one stage (the tied LM head's copy left out), and loading whole tensors takes each stage's;
 * tensors by name; and bad stages and calls get errors naming the problem. The same split with
 * bf16 products: the stages' forwards in flight, each keeping its bf16 activations, still give
 * the whole model's outputs and gradients bit for bit. */
#include "tests/model/model_test_util.h"

static ff_backend *be;

enum { NM = 3, MAXT = 40 };

typedef struct mb {
    ff_batch b;
    int32_t tok[MAXT], tg[MAXT], ss[4];
    float a[MAXT], c[MAXT], d[MAXT];
} mb;

static void make_mb(mb *m, int vocab, uint64_t seed) {
    ff_rng r;
    ff_rng_seed(&r, seed);
    int32_t S = 1 + (int32_t)(seed % 3);
    m->ss[0] = 0;
    for (int s = 0; s < S; s++) m->ss[s + 1] = m->ss[s] + 3 + (int32_t)ff_rng_below(&r, 9);
    const int32_t T = m->ss[S];
    for (int32_t t = 0; t < T; t++) {
        m->tok[t] = (int32_t)ff_rng_below(&r, (uint64_t)vocab);
        m->a[t] = (float)ff_rng_normal(&r), m->c[t] = (float)ff_rng_normal(&r), m->d[t] = (float)ff_rng_normal(&r);
    }
    ff_batch_shift_targets(m->tok, m->ss, S, m->tg);
    m->b = (ff_batch){.n_tokens = T, .n_seqs = S, .tokens = m->tok, .seq_start = m->ss, .targets = m->tg};
}

static ff_model *stage(const ff_model_config *c, const ff_tensor_set *w, int n, const int32_t *first, const int32_t *count,
                       bool inference) {
    ff_model_stage st = {.n_chunks = n, .first_layer = first, .n_layers = count};
    ff_model_opts o = {.inference = inference, .stage = &st};
    ff_model *m = ff_model_new_opts(be, c, w, &o);
    if (!m) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(m);
    return m;
}

/* Layers 0..7: stage A holds [0, 2) and [5, 6) (chunks 0 and 1), B [2, 5), C [6, 8). p16: every
 * model with bf16 products (the CPU's definition), whose forwards in flight keep their MLP and
 * normed rows in bf16. */
static void split(bool tied, bool p16) {
    ff_model_config c = tiny_config(48, 32, 40, 8, 4, 2, tied, !tied, !tied);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&c, 3, 0.3, w) == 0);
    ff_model *whole = ff_model_new(be, &c, w);
    REQUIRE(whole);
    const int32_t fa[] = {0, 5}, na[] = {2, 1}, fb[] = {2}, nb[] = {3}, fc[] = {6}, nc[] = {2};
    ff_model *A = stage(&c, w, 2, fa, na, false), *B = stage(&c, w, 1, fb, nb, false), *C = stage(&c, w, 1, fc, nc, false);
    ff_model *all[] = {whole, A, B, C};
    for (int k = 0; p16 && k < 4; k++) REQUIRE(ff_model_set_bf16_products(all[k], true) == 0);
    CHECK(!ff_model_is_whole(A) && ff_model_is_whole(whole) && ff_model_n_chunks(A) == 2);
    ff_model_chunk_info ci;
    ff_model_chunk_of(A, 1, &ci);
    CHECK(ci.first_layer == 5 && ci.n_layers == 1 && !ci.embedding && !ci.head);
    ff_model_chunk_of(A, 0, &ci);
    CHECK(ci.embedding && !ci.head);
    ff_model_chunk_of(C, 0, &ci);
    CHECK(!ci.embedding && ci.head);
    mb m[NM];
    for (int i = 0; i < NM; i++) make_mb(&m[i], c.vocab_size, 40 + (uint64_t)i);
    const int H = c.hidden_size;
    const bool vh = c.value_head;
    /* room for NM in flight through each chunk: the step below must not grow it */
    const int32_t fl2[] = {NM, NM}, fl1[] = {NM};
    REQUIRE(ff_model_stage_reserve(A, MAXT, fl2) == 0 && ff_model_stage_reserve(B, MAXT, fl1) == 0 &&
            ff_model_stage_reserve(C, MAXT, fl1) == 0);
    ff_model_memory mem0[3], mem1[3];
    ff_model_memory_of(A, &mem0[0]), ff_model_memory_of(B, &mem0[1]), ff_model_memory_of(C, &mem0[2]);
    /* whole model, micro-batch after micro-batch */
    float lp[NM][MAXT], ent[NM][MAXT], val[NM][MAXT];
    ff_forward_opts tr = {.train = true, .temperature = 0.9f};
    for (int i = 0; i < NM; i++) {
        ff_forward_out o = {.logprobs = lp[i], .entropy = ent[i], .values = vh ? val[i] : NULL};
        REQUIRE(ff_model_forward(whole, &m[i].b, &tr, &o) == 0);
        REQUIRE(ff_model_backward(whole, m[i].a, m[i].c, vh ? m[i].d : NULL) == 0);
    }
    /* stages: every forward first (GPipe's order), then the backwards, in micro-batch order */
    static float h[NM][5][MAXT * 32], dh[NM][5][MAXT * 32]; /* after stage A0, B, A1, C's input */
    float slp[NM][MAXT], sent[NM][MAXT], sval[NM][MAXT];
    for (int i = 0; i < NM; i++) {
        const ff_batch *b = &m[i].b;
        REQUIRE(ff_model_stage_forward(A, 0, i, b, NULL, &tr, NULL, h[i][0]) == 0);
        REQUIRE(ff_model_stage_forward(B, 0, i, b, h[i][0], &tr, NULL, h[i][1]) == 0);
        REQUIRE(ff_model_stage_forward(A, 1, i, b, h[i][1], &tr, NULL, h[i][2]) == 0);
        ff_forward_out o = {.logprobs = slp[i], .entropy = sent[i], .values = vh ? sval[i] : NULL};
        REQUIRE(ff_model_stage_forward(C, 0, i, b, h[i][2], &tr, &o, NULL) == 0);
    }
    CHECK_EQ_INT(ff_model_stage_in_flight(A, 0), NM);
    CHECK_EQ_INT(ff_model_stage_in_flight(A, 1), NM);
    CHECK_EQ_INT(ff_model_stage_in_flight(C, 0), NM);
    for (int i = 0; i < NM; i++) {
        REQUIRE(ff_model_stage_backward(C, 0, i, NULL, m[i].a, m[i].c, vh ? m[i].d : NULL, dh[i][2]) == 0);
        REQUIRE(ff_model_stage_backward(A, 1, i, dh[i][2], NULL, NULL, NULL, dh[i][1]) == 0);
        REQUIRE(ff_model_stage_backward(B, 0, i, dh[i][1], NULL, NULL, NULL, dh[i][0]) == 0);
        REQUIRE(ff_model_stage_backward(A, 0, i, dh[i][0], NULL, NULL, NULL, NULL) == 0);
    }
    CHECK_EQ_INT(ff_model_stage_in_flight(A, 0), 0);
    CHECK_EQ_INT(ff_model_stage_in_flight(B, 0), 0);
    ff_model_memory_of(A, &mem1[0]), ff_model_memory_of(B, &mem1[1]), ff_model_memory_of(C, &mem1[2]);
    for (int k = 0; k < 3; k++) CHECK(mem1[k].workspace == mem0[k].workspace && mem0[k].workspace > 0);
    for (int i = 0; i < NM; i++) {
        const size_t T = (size_t)m[i].b.n_tokens;
        CHECK(!memcmp(lp[i], slp[i], T * 4) && !memcmp(ent[i], sent[i], T * 4));
        if (vh) CHECK(!memcmp(val[i], sval[i], T * 4));
    }
    /* the gradients: each stage's tensors are the whole model's, bit for bit, but the tied
     * embedding, whose two copies' gradients add up to the whole model's */
    ff_tensor_set *gw = ff_tensor_set_new(), *gs = ff_tensor_set_new();
    REQUIRE(ff_model_export_grads(whole, gw) == 0);
    REQUIRE(ff_model_export_grads(A, gs) == 0 && ff_model_export_grads(B, gs) == 0 && ff_model_export_grads(C, gs) == 0);
    CHECK_EQ_INT(gs->n, gw->n); /* each tensor once: C's tied copy is not exported */
    for (size_t i = 0; i < gw->n; i++) {
        const ff_host_tensor *want = &gw->items[i], *got = ff_tensor_set_find(gs, want->name);
        REQUIRE(got && ff_host_tensor_numel(got) == ff_host_tensor_numel(want));
        const int64_t n = ff_host_tensor_numel(want);
        if (tied && !strcmp(want->name, "model.embed_tokens.weight")) {
            float *copy = malloc(sizeof(float) * (size_t)n), *sum = malloc(sizeof(float) * (size_t)n);
            REQUIRE(copy && sum && ff_model_tensor_numel(C, want->name) == n);
            REQUIRE(ff_model_read_tensor(C, want->name, true, copy) == 0);
            for (int64_t q = 0; q < n; q++) sum[q] = got->data[q] + copy[q];
            check_tensor_close("tied embedding gradient (first + last stage)", sum, want->data, n, 0, 1e-6);
            CHECK(memcmp(got->data, want->data, (size_t)n * 4) != 0); /* A alone holds only part of it */
            free(copy), free(sum);
        } else if (memcmp(got->data, want->data, (size_t)n * 4)) {
            fprintf(stderr, "%s: stage gradient differs from the whole model's\n", want->name);
            ff_test_failures++;
        }
    }
    /* weights: the union of the stages' exports is the whole set; B holds no embedding */
    ff_tensor_set *ws = ff_tensor_set_new();
    REQUIRE(ff_model_export_weights(A, ws) == 0 && ff_model_export_weights(B, ws) == 0 && ff_model_export_weights(C, ws) == 0);
    CHECK_EQ_INT(ws->n, w->n);
    for (size_t i = 0; i < w->n; i++) {
        const ff_host_tensor *got = ff_tensor_set_find(ws, w->items[i].name);
        CHECK(got && !memcmp(got->data, w->items[i].data, sizeof(float) * (size_t)ff_host_tensor_numel(got)));
    }
    CHECK(ff_model_tensor_numel(B, "model.embed_tokens.weight") == 0);
    CHECK(ff_model_tensor_numel(C, "model.embed_tokens.weight") == (tied ? (int64_t)c.vocab_size * H : 0));
    CHECK(ff_model_tensor_numel(B, "model.layers.3.mlp.up_proj.weight") == (int64_t)c.intermediate_size * H);
    float one[1];
    CHECK(ff_model_read_tensor(B, "model.norm.weight", false, one) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "this model does not hold the tensor");
    REQUIRE(ff_model_load_weights(B, w) == 0); /* whole tensors in: B takes its own */
    if (p16) { /* an inference stage's products follow its backend: fp32 here */
        ff_model_destroy(&A), ff_model_destroy(&B), ff_model_destroy(&C), ff_model_destroy(&whole);
        ff_tensor_set_destroy(&ws), ff_tensor_set_destroy(&gw), ff_tensor_set_destroy(&gs), ff_tensor_set_destroy(&w);
        return;
    }
    /* an inference stage: the trainable stage's outputs, bit for bit */
    ff_model *Ci = stage(&c, w, 1, fc, nc, true);
    float ilp[MAXT], tlp[MAXT];
    ff_forward_opts sc = {.temperature = 0.9f};
    REQUIRE(ff_model_stage_forward(Ci, 0, 0, &m[0].b, h[0][2], &sc, &(ff_forward_out){.logprobs = ilp}, NULL) == 0);
    REQUIRE(ff_model_stage_forward(C, 0, 0, &m[0].b, h[0][2], &sc, &(ff_forward_out){.logprobs = tlp}, NULL) == 0);
    CHECK(!memcmp(ilp, tlp, sizeof(float) * (size_t)m[0].b.n_tokens) && !memcmp(ilp, lp[0], sizeof(float) * (size_t)m[0].b.n_tokens));
    CHECK(ff_model_stage_backward(Ci, 0, 0, NULL, m[0].a, NULL, NULL, dh[0][0]) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "inference only");
    ff_model_destroy(&Ci);
    ff_tensor_set_destroy(&ws);
    ff_tensor_set_destroy(&gw);
    ff_tensor_set_destroy(&gs);
    ff_model_destroy(&A), ff_model_destroy(&B), ff_model_destroy(&C), ff_model_destroy(&whole);
    ff_tensor_set_destroy(&w);
}

static void errors(void) {
    ff_model_config c = tiny_config(32, 16, 32, 4, 4, 2, false, false, false);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&c, 1, 0.2, w) == 0);
    const int32_t f_overlap[] = {0, 1}, n_overlap[] = {2, 2}, f_out[] = {3}, n_out[] = {2}, f_zero[] = {1}, n_zero[] = {0};
    ff_model_stage bad[] = {{.n_chunks = 2, .first_layer = f_overlap, .n_layers = n_overlap},
                            {.n_chunks = 1, .first_layer = f_out, .n_layers = n_out},
                            {.n_chunks = 1, .first_layer = f_zero, .n_layers = n_zero},
                            {.n_chunks = 0, .first_layer = f_out, .n_layers = n_out}};
    const char *msg[] = {"chunk 1: layers [1, 3) of 4 (the previous chunk ends at 2)", "chunk 0: layers [3, 5) of 4",
                         "chunk 0: layers [1, 1)", "0 chunks"};
    for (int i = 0; i < 4; i++) {
        CHECK(ff_model_new_opts(be, &c, w, &(ff_model_opts){.stage = &bad[i]}) == NULL);
        CHECK_STR_CONTAINS(ff_error_message(), msg[i]);
    }
    const int32_t f1[] = {1}, n1[] = {2}, f0[] = {0}, n0[] = {1};
    ff_model *mid = stage(&c, w, 1, f1, n1, false), *first = stage(&c, w, 1, f0, n0, false);
    mb m;
    make_mb(&m, c.vocab_size, 7);
    float h[MAXT * 16], o[MAXT * 16];
    memset(h, 0, sizeof h);
    ff_forward_opts tr = {.train = true};
    CHECK(ff_model_forward(mid, &m.b, &tr, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "pipeline stage");
    CHECK(ff_model_stage_forward(mid, 0, 0, &m.b, NULL, &tr, NULL, o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "needs its input");
    CHECK(ff_model_stage_forward(mid, 0, 0, &m.b, h, &tr, NULL, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "room for the output hidden states");
    CHECK(ff_model_stage_forward(mid, 1, 0, &m.b, h, &tr, NULL, o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "chunk 1: the model has 1");
    CHECK(ff_model_stage_backward(mid, 0, 5, h, NULL, NULL, NULL, o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "micro-batch 5 has no training forward in flight through chunk 0");
    REQUIRE(ff_model_stage_forward(mid, 0, 5, &m.b, h, &tr, NULL, o) == 0);
    CHECK(ff_model_stage_forward(mid, 0, 5, &m.b, h, &tr, NULL, o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "micro-batch 5 is already in flight through chunk 0");
    CHECK(ff_model_stage_backward(mid, 0, 5, NULL, NULL, NULL, NULL, o) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "gradient of the chunk's output");
    CHECK(ff_model_stage_backward(mid, 0, 5, h, NULL, NULL, NULL, o) == 0);
    CHECK_EQ_INT(ff_model_stage_in_flight(mid, 0), 0);
    /* the embedding chunk: token ids in, no input gradient out */
    REQUIRE(ff_model_stage_forward(first, 0, 0, &m.b, NULL, &tr, NULL, o) == 0);
    CHECK(ff_model_stage_backward(first, 0, 0, h, m.a, NULL, NULL, NULL) == -1); /* no head: no log-prob gradient */
    CHECK_STR_CONTAINS(ff_error_message(), "did not compute");
    ff_generator_config gc = {.max_slots = 1, .max_seq_len = 16};
    CHECK(ff_generator_new(first, &gc) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "pipeline stage");
    ff_model_destroy(&mid);
    ff_model_destroy(&first);
    ff_tensor_set_destroy(&w);
}

int main(void) {
    be = ff_backend_new("cpu:1");
    REQUIRE(be);
    split(false, false);
    split(true, false);
    split(false, true);
    errors();
    ff_backend_destroy(&be);
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

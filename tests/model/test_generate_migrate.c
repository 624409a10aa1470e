/* Moving a running sequence between generators (ff_generator_export / ff_generator_import)
 * at tensor parallelism 1 and 2 (ranks as threads, tests/model/thread_comm.h) and over a
 * pipeline of two stages (threads, tests/model/two_stages.h): each rank's state holds its own
 * key/value heads and each stage's its own layers (the header says which), rows go only into
 * the same rank or stage, and the moved sequence ends with the tokens and log-probs it gets
 * without moving: bit for bit with its rows and with a recompute (whose forward runs the
 * group's collectives, or crosses the stages: a prefill's rows round as the decode steps'
 * did, the CPU backend's batch invariance); the sequences that stay are untouched. Every rank and stage gets the same outputs, the whole model's. */
#include <pthread.h>

#include "tests/model/model_test_util.h"
#include "tests/model/thread_comm.h"
#include "tests/model/two_stages.h"

enum { MAXO = 16, MAXTP = 2, NCASE = 4 };

static const int32_t P0[3] = {2, 5, 7}, P1[5] = {3, 4, 5, 6, 7}, P2[2] = {30, 31};

typedef struct outs {
    ff_gen_output o[MAXO];
    int32_t n;
} outs;

typedef struct rank_job {
    int tp, rank;
    const ff_model_config *cfg;
    const ff_tensor_set *w;
    tc_rank comm;
    two_stages *pp; /* a pipeline of two stages (tp 1), rank = the stage; NULL: none */
    outs moved[NCASE]; /* the moved sequence's output, per case */
    outs ref;          /* everything without a move */
} rank_job;

static ff_gen_request req(uint64_t id, const int32_t *p, int32_t n, int32_t samples, uint64_t seed) {
    ff_gen_request r = {.id = id, .prompt = p, .prompt_len = n, .n_samples = samples, .seed = seed};
    ff_sampling_default(&r.sampling);
    r.sampling.max_new_tokens = 20;
    r.sampling.logprob_mode = FF_LOGPROB_TEMPERATURE;
    r.sampling.temperature = 0.9f;
    return r;
}

static ff_generator *gen(ff_model *m, const ff_gen_pipe *pipe) {
    ff_generator_config gc = {.max_slots = 6, .max_seq_len = 40, .max_prefill_tokens = 6, .pipe = pipe};
    ff_generator *g = ff_generator_new(m, &gc);
    REQUIRE(g);
    return g;
}

static void pop_all(ff_generator *g, outs *o) {
    while (o->n < MAXO && ff_generator_pop(g, &o->o[o->n])) o->n++;
}

static void step_pop(ff_generator *g, outs *o) {
    REQUIRE(ff_generator_step(g) == 0);
    pop_all(g, o);
}

static const ff_gen_output *find(const outs *o, uint64_t id, int32_t s) {
    for (int32_t i = 0; i < o->n; i++)
        if (o->o[i].id == id && o->o[i].sample == s) return &o->o[i];
    return NULL;
}

static bool bitwise(const ff_gen_output *a, const ff_gen_output *b) {
    return a && b && a->n_tokens == b->n_tokens && a->finish == b->finish &&
           !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * 4) && !memcmp(a->logprobs, b->logprobs, (size_t)a->n_tokens * 4);
}

static void free_outs(outs *o) {
    for (int32_t i = 0; i < o->n; i++) ff_gen_output_free(&o->o[i]);
    o->n = 0;
}

static void submit_a(ff_generator *g) {
    ff_gen_request a = req(1, P0, 3, 2, 13), b = req(2, P1, 5, 1, 12);
    REQUIRE(ff_generator_submit(g, &a) == 0 && ff_generator_submit(g, &b) == 0);
}

static void *rank_main(void *p) {
    rank_job *j = p;
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_model_comm comm = tc_comm(&j->comm);
    ff_model *ma, *mb;
    ff_gen_pipe pipe, *pp = NULL;
    int32_t first = 0, count = j->cfg->num_hidden_layers;
    if (j->pp) { /* stage j->rank: one layer of the two */
        first = j->rank, count = 1;
        const ff_model_stage stage = {.n_chunks = 1, .first_layer = &first, .n_layers = &count};
        const ff_model_opts o = {.inference = true, .stage = &stage};
        ma = ff_model_new_opts(be, j->cfg, j->w, &o), mb = ff_model_new_opts(be, j->cfg, j->w, &o);
        pipe = ts_pipe(j->pp, j->rank);
        pp = &pipe;
    } else {
        ma = ff_model_new_tp(be, j->cfg, j->w, &comm), mb = ff_model_new_tp(be, j->cfg, j->w, &comm);
    }
    REQUIRE(ma && mb);
    ff_generator *g = gen(ma, pp);
    submit_a(g);
    while (ff_generator_pending(g) > 0) step_pop(g, &j->ref);
    ff_generator_destroy(&g);
    REQUIRE(j->ref.n == 3);
    const int cuts[2] = {2, 6};
    for (int c = 0; c < NCASE; c++) {
        const int k = cuts[c / 2];
        const bool with_kv = c % 2 == 0;
        ff_generator *a = gen(ma, pp), *b = gen(mb, pp);
        submit_a(a);
        ff_gen_request other = req(3, P2, 2, 2, 13);
        REQUIRE(ff_generator_submit(b, &other) == 0);
        outs got_a = {0}, got_b = {0};
        for (int s = 0; s < k; s++) step_pop(a, &got_a), step_pop(b, &got_b);
        REQUIRE(!find(&got_a, 1, 1)); /* request 1 sample 1 moves (20 tokens: no eos in it, checked below) */
        ff_gen_seq_state st, back;
        REQUIRE(ff_generator_export(a, 1, 1, with_kv, &st) == 0);
        /* this rank's shard (4 kv heads / tp) of this stage's layers, and the header names them */
        CHECK_EQ_INT(st.kv.layers, count);
        CHECK_EQ_INT(st.kv.first_layer, first);
        CHECK_EQ_INT(st.kv.kv_heads, 4 / j->tp);
        CHECK_EQ_INT(st.kv.tp_rank, j->pp ? 0 : j->rank);
        CHECK_EQ_INT(st.kv.tp_size, j->tp);
        CHECK_EQ_INT(st.kv.positions, 3 + k);
        size_t n = ff_gen_seq_state_size(&st);
        unsigned char *buf = malloc(n);
        REQUIRE(buf && ff_gen_seq_state_write(&st, buf, n) == n && ff_gen_seq_state_read(buf, n, &back) == 0);
        free(buf);
        if (with_kv && j->tp > 1) { /* another rank's rows: refused before any collective, on every rank */
            back.kv.tp_rank = (j->rank + 1) % j->tp;
            CHECK(ff_generator_import(b, &back) == -1);
            CHECK_STR_CONTAINS(ff_error_message(), "TP rank");
            back.kv.tp_rank = j->rank;
        }
        if (with_kv && j->pp) { /* the other stage's layers: refused on both stages */
            back.kv.first_layer = 1 - j->rank;
            CHECK(ff_generator_import(b, &back) == -1);
            CHECK_STR_CONTAINS(ff_error_message(), "this stage holds layers");
            back.kv.first_layer = j->rank;
        }
        REQUIRE(ff_generator_import(b, &back) == 0);
        ff_gen_seq_state_free(&st);
        ff_gen_seq_state_free(&back);
        while (ff_generator_pending(a) > 0 || ff_generator_pending(b) > 0) {
            if (ff_generator_pending(a) > 0) step_pop(a, &got_a);
            if (ff_generator_pending(b) > 0) step_pop(b, &got_b);
        }
        const ff_gen_output *moved = find(&got_b, 1, 1);
        REQUIRE(moved && got_b.n == 3 && got_a.n == 2);
        /* the sequences that stayed on A are the reference's */
        CHECK(bitwise(find(&got_a, 1, 0), find(&j->ref, 1, 0)));
        CHECK(bitwise(find(&got_a, 2, 0), find(&j->ref, 2, 0)));
        for (int32_t i = 0; i < got_b.n; i++) { /* keep the moved output, free the rest */
            if (&got_b.o[i] == moved) j->moved[c].o[j->moved[c].n++] = got_b.o[i];
            else ff_gen_output_free(&got_b.o[i]);
        }
        free_outs(&got_a);
        ff_generator_destroy(&a);
        ff_generator_destroy(&b);
    }
    ff_model_destroy(&ma);
    ff_model_destroy(&mb);
    ff_backend_destroy(&be);
    return NULL;
}

int main(void) {
    ff_model_config cfg = tiny_config(48, 32, 64, 2, 4, 4, false, false, false);
    cfg.eos_token_ids[0] = 1;
    cfg.n_eos = 1;
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&cfg, 9, 0.3, w) == 0);
    outs first_ref = {0};
    for (int layout = 0; layout < 3; layout++) { /* TP 1, TP 2, PP 2 */
        const int tp = layout == 1 ? 2 : 1, ranks = layout == 0 ? 1 : 2;
        tc_group grp;
        tc_group_init(&grp, tp);
        two_stages stages;
        ts_init(&stages);
        rank_job jobs[MAXTP];
        pthread_t th[MAXTP];
        memset(jobs, 0, sizeof jobs);
        for (int r = 0; r < ranks; r++) {
            jobs[r] = (rank_job){.tp = tp, .rank = r, .cfg = &cfg, .w = w, .comm = {.g = &grp, .rank = tp > 1 ? r : 0},
                                 .pp = layout == 2 ? &stages : NULL};
            REQUIRE(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0);
        }
        for (int r = 0; r < ranks; r++) pthread_join(th[r], NULL);
        const ff_gen_output *ref = find(&jobs[0].ref, 1, 1);
        REQUIRE(ref);
        CHECK(ref->finish == FF_FINISH_LENGTH); /* it runs its whole budget: every cut leaves it decoding */
        double worst = 0;
        for (int r = 0; r < ranks; r++)
            for (int c = 0; c < NCASE; c++) {
                const ff_gen_output *m = &jobs[r].moved[c].o[0];
                REQUIRE(jobs[r].moved[c].n == 1);
                CHECK(bitwise(m, &jobs[0].moved[c].o[0])); /* every rank the same */
                if (c % 2 == 0) {
                    CHECK(bitwise(m, ref));
                } else {
                    CHECK(bitwise(m, ref));
                    CHECK(m->n_tokens == ref->n_tokens && !memcmp(m->tokens, ref->tokens, (size_t)ref->n_tokens * 4));
                    for (int32_t i = 0; i < ref->n_tokens; i++) {
                        double d = fabs((double)m->logprobs[i] - ref->logprobs[i]);
                        if (d > worst) worst = d;
                    }
                }
            }
        CHECK(worst == 0);
        printf("%s: moved with rows bitwise; recomputed: bitwise too, max |log-prob difference| %.3g\n",
               layout == 0 ? "tp 1" : layout == 1 ? "tp 2" : "pp 2", worst);
        /* TP 2 and PP 2 generate TP 1's tokens (PP 2 its log-probs too, bit for bit) */
        if (layout == 0) {
            first_ref.o[0] = *ref;
            first_ref.o[0].tokens = malloc((size_t)ref->n_tokens * 4);
            REQUIRE(first_ref.o[0].tokens);
            memcpy(first_ref.o[0].tokens, ref->tokens, (size_t)ref->n_tokens * 4);
            first_ref.o[0].logprobs = malloc((size_t)ref->n_tokens * 4);
            REQUIRE(first_ref.o[0].logprobs);
            memcpy(first_ref.o[0].logprobs, ref->logprobs, (size_t)ref->n_tokens * 4);
        } else {
            CHECK(ref->n_tokens == first_ref.o[0].n_tokens &&
                  !memcmp(ref->tokens, first_ref.o[0].tokens, (size_t)ref->n_tokens * 4));
            if (layout == 2) CHECK(bitwise(ref, &first_ref.o[0]));
        }
        for (int r = 0; r < ranks; r++) {
            free_outs(&jobs[r].ref);
            for (int c = 0; c < NCASE; c++) free_outs(&jobs[r].moved[c]);
            tc_rank_free(&jobs[r].comm);
        }
        tc_group_destroy(&grp);
        ts_destroy(&stages);
    }
    ff_gen_output_free(&first_ref.o[0]);
    ff_tensor_set_destroy(&w);
    TEST_MAIN_END();
}

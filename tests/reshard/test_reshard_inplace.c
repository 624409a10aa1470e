/* The 3D-HybridEngine's in-place transition (issue 11; docs/run.md "Memory of the colocated
 * copy"): each rank (a forked process over ff_coll's cpu backend) trains a shard (TP t x PP
 * p, with gradients and AdamW state) and generates with a view of it (ff_model_opts.view_of)
 * in HybridFlow's layout (TP tg, micro-DP replicas), whose own buffer holds only the part of
 * the generation shard that the training shard lacks.
 *
 * Per rank and case, from the allocations (ff_model_memory_of, ff_optimizer_state_bytes,
 * ff_generator_kv_bytes):
 * - training: the view gives its own part back (0 bytes); it still reads the training shard,
 *   whose new weights (loaded after the view was made, as an optimizer step writes them)
 *   show in it at once;
 * - the transition: the view's own part is exactly the generation shard minus the training
 *   shard (4 (P_gen - P_train) bytes), which is what the rank received, counted; nothing was
 *   copied locally (stats.local 0) and the whole training shard was used in place
 *   (stats.in_place = 4 P_train);
 * - generating: the weights held are the generation shard exactly (training shard + gathered
 *   part = 4 P_gen: no byte twice; the separate copy held 4 (P_train + P_gen)), a whole model
 *   only at tg = 1; over the phases the weights peak at the larger shard, never both. The KV
 *   cache comes on top while generating, beside the gradients and AdamW state, which stay
 *   allocated (printed per phase with FF_TEST_VERBOSE).
 * - the weights read back are byte-equal to the separate copy's (a model of the generation
 *   layout built from the same weights), greedy generation gives the same tokens, and a
 *   scoring forward the same log-probs within 1e-5 (o_proj and down_proj sum their column
 *   pieces in two products).
 * Also refused, naming the problem: bf16 on the wire into a view (at planning), a view of a
 * view, a trainable view, a view of another config, exporting a view's weights. */
#include <inttypes.h>
#include <math.h>

#include "fuseflow/backend.h"
#include "fuseflow/model.h"
#include "fuseflow/reshard.h"
#include "tests/coll/coll_test.h"
#include "tests/model/model_test_util.h"

typedef struct tcase {
    const char *name;
    int t, p, tg; /* training TP x PP, generation TP (one stage) */
    int kv;
    bool tied, bias;
} tcase;

static int c_sum(void *c, float *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F32, FF_COLL_SUM, c, NULL); }
static int c_max(void *c, float *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F32, FF_COLL_MAX, c, NULL); }
static int c_sum64(void *c, double *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F64, FF_COLL_SUM, c, NULL); }
static int c_gather(void *c, const float *in, float *out, size_t n) { return ff_coll_all_gather(in, out, n, FF_DTYPE_F32, c, NULL); }

static ff_model_comm mcomm(ff_coll_comm *c) {
    return (ff_model_comm){.rank = ff_coll_comm_rank(c), .size = ff_coll_comm_size(c), .ctx = c, .all_reduce_sum = c_sum,
                           .all_reduce_max = c_max, .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather};
}

/* A model of layout (TP group tp, stage s of pp), trainable, an inference copy, or a view of `of`. */
static ff_model *shard_model(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *w, ff_coll_comm *tp, int s, int pp,
                             bool inference, const ff_model *of) {
    int32_t first = s * (cfg->num_hidden_layers / pp), count = cfg->num_hidden_layers / pp;
    ff_model_stage st = {.n_chunks = 1, .first_layer = &first, .n_layers = &count};
    ff_model_comm mc = mcomm(tp);
    ff_model_opts o = {.inference = inference, .comm = ff_coll_comm_size(tp) > 1 ? &mc : NULL, .stage = pp > 1 ? &st : NULL,
                       .view_of = of};
    return ff_model_new_opts(be, cfg, w, &o);
}

/* Greedy responses to two prompts on m: tokens [2][NEW] into tok; the KV cache's bytes. */
enum { NEW = 12 };
static int generate(ff_model *m, int32_t tok[2][NEW], int64_t *kv_bytes) {
    const ff_generator_config gc = {.max_slots = 2, .max_seq_len = 32};
    ff_generator *g = ff_generator_new(m, &gc);
    if (!g) return -1;
    *kv_bytes = ff_generator_kv_bytes(g);
    static const int32_t prompts[2][5] = {{1, 7, 3, 9, 2}, {5, 60, 11}};
    const int32_t lens[2] = {5, 3};
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        ff_gen_request r = {.id = (uint64_t)i, .prompt = prompts[i], .prompt_len = lens[i], .n_samples = 1, .seed = 3};
        ff_sampling_default(&r.sampling);
        r.sampling.temperature = 0, r.sampling.max_new_tokens = NEW;
        rc = ff_generator_submit(g, &r);
    }
    while (rc == 0 && ff_generator_pending(g) > 0) rc = ff_generator_step(g);
    ff_gen_output o;
    memset(tok, 0xff, sizeof(int32_t) * 2 * NEW);
    while (rc == 0 && ff_generator_pop(g, &o) == 1) {
        for (int32_t k = 0; k < o.n_tokens && k < NEW; k++) tok[o.id][k] = o.tokens[k];
        ff_gen_output_free(&o);
    }
    ff_generator_destroy(&g);
    return rc;
}

static int rank_main(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg) {
    (void)id, (void)nranks;
    const tcase *c = arg;
    int fails = 0;
    ff_model_config cfg = tiny_config(64, 32, 64, 4, 4, c->kv, c->tied, c->bias, false);
    cfg.n_eos = 0; /* full-length responses: every token compared */
    ff_backend *be = ff_backend_new("cpu:1");
    ff_tensor_set *w1 = ff_tensor_set_new(), *w0 = ff_tensor_set_new();
    REQUIRE(be && w1 && w0 && ff_model_init_weights(&cfg, 11, 0.2, w1) == 0 && ff_model_init_weights(&cfg, 12, 0.2, w0) == 0);
    /* HybridFlow's mapping: training rank i + t s, generation TP index i / (t/tg), replica
     * (i mod t/tg) + (t/tg) s: the micro-DP group of t/tg neighbouring TP ranks x p stages */
    const int i = rank % c->t, s = rank / c->t, a = c->t / c->tg;
    const int ig = i / a, rep = i % a + a * s;
    ff_coll_comm *tp = NULL, *gtp = NULL, *group = NULL;
    REQUIRE(ff_coll_comm_split(comm, s, i, &tp) == 0);
    REQUIRE(ff_coll_comm_split(comm, rep, ig, &gtp) == 0);
    REQUIRE(ff_coll_comm_split(comm, ig, rep, &group) == 0);
    /* the actor trains from W0; its view and the separate copy of today are made */
    ff_model *src = shard_model(be, &cfg, w0, tp, s, c->p, false, NULL);
    ff_model *dst = src ? shard_model(be, &cfg, w0, gtp, 0, 1, true, src) : NULL;
    ff_model *ref = shard_model(be, &cfg, w1, gtp, 0, 1, true, NULL);
    REQUIRE(src && dst && ref && ff_model_viewed(dst) == src && !ff_model_viewed(ref));
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ff_optimizer *opt = ff_optimizer_new(src, &ac);
    REQUIRE(opt);
    const int64_t P_train = ff_model_param_count(src), P_gen = ff_model_param_count(dst);
    RCHECK(P_gen == ff_model_param_count(ref), "the view's shard has %" PRId64 " parameters, the copy's %" PRId64, P_gen,
           ff_model_param_count(ref));

    /* training: the view's own part given back; the actor "steps" to W1 */
    ff_model_memory ms, md;
    RCHECK(ff_model_release_params(dst) == 0, "release: %s", ff_error_message());
    ff_model_memory_of(src, &ms), ff_model_memory_of(dst, &md);
    const int64_t train_phase = ms.params + ms.grads + ff_optimizer_state_bytes(opt) + md.params;
    int64_t peak_weights = ms.params + md.params; /* the most weight bytes held at any phase */
    RCHECK(md.params == 0 && md.viewed == 4 * P_train, "released view: %" PRId64 " own bytes, %" PRId64 " viewed (training shard %" PRId64 ")",
           md.params, md.viewed, 4 * P_train);
    RCHECK(ms.params == 4 * P_train && ms.grads == 4 * P_train, "training shard %" PRId64 " B, grads %" PRId64 " B", ms.params, ms.grads);
    REQUIRE(ff_model_load_weights(src, w1) == 0);

    /* the transition: gather the missing part */
    RCHECK(ff_model_restore_params(dst) == 0, "restore: %s", ff_error_message());
    ff_model_memory_of(dst, &md);
    if (ms.params + md.params > peak_weights) peak_weights = ms.params + md.params;
    RCHECK(md.params == 4 * (P_gen - P_train), "the gathered part is %" PRId64 " B, the formula %" PRId64, md.params, 4 * (P_gen - P_train));
    ff_reshard_plan *plan = ff_reshard_plan_new(group, src, dst, NULL);
    RCHECK(plan, "plan: %s", ff_error_message());
    if (!plan) goto done;
    ff_reshard_stats st;
    RCHECK(ff_reshard_run(plan, src, dst, &st) == 0, "run: %s", ff_error_message());
    RCHECK(st.received == md.params && ff_reshard_plan_received(plan) == md.params, "received %" PRId64 " B (plan %" PRId64 "), gathered part %" PRId64,
           st.received, ff_reshard_plan_received(plan), md.params);
    RCHECK(st.local == 0 && st.in_place == 4 * P_train, "copied locally %" PRId64 " B, in place %" PRId64 " B of %" PRId64, st.local, st.in_place,
           4 * P_train);

    /* the weights: byte-equal to the separate copy of the trained weights */
    float *got = malloc((size_t)P_gen * sizeof *got), *exp = malloc((size_t)P_gen * sizeof *exp);
    REQUIRE(got && exp);
    ff_model_read_params(dst, got);
    ff_model_read_params(ref, exp);
    int64_t diff = 0;
    for (int64_t k = 0; k < P_gen; k++) diff += memcmp(&got[k], &exp[k], 4) != 0;
    RCHECK(diff == 0, "%" PRId64 " of %" PRId64 " parameters differ from the separate copy's", diff, P_gen);
    free(got), free(exp);

    /* generating: the same tokens as the separate copy's; memory by phase */
    int32_t tv[2][NEW], tr[2][NEW];
    int64_t kv = 0, kv_ref = 0;
    RCHECK(generate(dst, tv, &kv) == 0 && generate(ref, tr, &kv_ref) == 0, "generate: %s", ff_error_message());
    RCHECK(memcmp(tv, tr, sizeof tv) == 0, "the view generated other tokens than the separate copy (first %d, %d)", tv[0][0], tr[0][0]);
    RCHECK(tv[0][NEW - 1] >= 0 && tv[1][NEW - 1] >= 0, "responses shorter than %d tokens", NEW);
    /* scoring on the view (rl.logprob of the generating copy): the copy's log-probs, within the
     * rounding of o_proj and down_proj summed over their column pieces */
    {
        const int32_t toks[8] = {1, 7, 3, 9, 2, 5, 60, 11}, starts[3] = {0, 5, 8};
        int32_t tg[8];
        ff_batch_shift_targets(toks, starts, 2, tg);
        const ff_batch b = {.n_tokens = 8, .n_seqs = 2, .tokens = toks, .seq_start = starts, .targets = tg};
        float lv[8], lr[8];
        ff_forward_out ov = {.logprobs = lv}, orf = {.logprobs = lr};
        RCHECK(ff_model_forward(dst, &b, NULL, &ov) == 0 && ff_model_forward(ref, &b, NULL, &orf) == 0, "forward: %s", ff_error_message());
        double worst = 0;
        for (int k = 0; k < 8; k++) worst = fabs(lv[k] - lr[k]) > worst ? fabs(lv[k] - lr[k]) : worst;
        RCHECK(worst <= 1e-5 && lv[0] < 0, "the view's log-probs differ from the copy's by %g", worst);
    }
    ff_model_memory_of(src, &ms), ff_model_memory_of(dst, &md);
    const int64_t weights = ms.params + md.params;
    RCHECK(weights == 4 * P_gen, "weights held while generating %" PRId64 " B, the generation shard %" PRId64 " B", weights, 4 * P_gen);
    if (weights > peak_weights) peak_weights = weights;
    /* over the phases: the larger shard, never both (the separate copy's 4 (P_train + P_gen)) */
    RCHECK(peak_weights == 4 * (P_gen > P_train ? P_gen : P_train) && peak_weights < 4 * (P_gen + P_train),
           "peak weights %" PRId64 " B: training shard %" PRId64 ", generation shard %" PRId64, peak_weights, 4 * P_train, 4 * P_gen);
    RCHECK(kv > 0 && kv == kv_ref, "KV cache %" PRId64 " B (the copy's %" PRId64 ")", kv, kv_ref);
    const int64_t gen_phase = ms.grads + ff_optimizer_state_bytes(opt) + weights + kv;
    const int64_t peak = train_phase > gen_phase ? train_phase : gen_phase;
    const int64_t whole = 4 * (ff_model_param_count(ref) * c->tg); /* about (norms replicated): the whole model */
    if (c->tg > 1) RCHECK(weights < whole, "the generation shard is %" PRId64 " B, a whole model %" PRId64, weights, whole);
    if (getenv("FF_TEST_VERBOSE"))
        printf("%s rank %d: peak %" PRId64 " B; training %" PRId64 " B (shard %" PRId64 " + grads %" PRId64 " + AdamW %" PRId64 "), generating %" PRId64
               " B (shard in place %" PRId64 " + gathered %" PRId64 " + KV %" PRId64 " + grads, AdamW); separate copy +%" PRId64 " B\n",
               c->name, rank, peak, train_phase, ms.params, ms.grads, ff_optimizer_state_bytes(opt), gen_phase, ms.params, md.params, kv,
               4 * P_train);

    /* bf16 on the wire into a view: refused */
    const ff_reshard_opts bf = {.bf16 = true};
    ff_reshard_plan *bad = ff_reshard_plan_new(group, src, dst, &bf);
    RCHECK(!bad && strstr(ff_error_message(), "bf16 on the wire into a destination that reads the fp32 source in place"),
           "a bf16 plan into a view: %s", bad ? "planned" : ff_error_message());
    ff_reshard_plan_destroy(&bad);
    ff_error_clear();
done:
    ff_reshard_plan_destroy(&plan);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&dst), ff_model_destroy(&ref), ff_model_destroy(&src);
    ff_coll_comm_destroy(&group), ff_coll_comm_destroy(&tp), ff_coll_comm_destroy(&gtp);
    ff_tensor_set_destroy(&w1), ff_tensor_set_destroy(&w0);
    ff_backend_destroy(&be);
    return fails;
}

/* Views that cannot be: refused, naming the problem. */
static void refusals(void) {
    ff_model_config cfg = tiny_config(64, 32, 64, 2, 4, 4, false, false, false), other = cfg;
    other.intermediate_size = 128;
    ff_backend *be = ff_backend_new("cpu:1");
    ff_tensor_set *w = ff_tensor_set_new(), *wo = ff_tensor_set_new();
    REQUIRE(be && w && wo && ff_model_init_weights(&cfg, 1, 0.2, w) == 0 && ff_model_init_weights(&other, 1, 0.2, wo) == 0);
    ff_model *src = ff_model_new(be, &cfg, w);
    REQUIRE(src);
    const ff_model_opts ov = {.inference = true, .view_of = src}, ot = {.view_of = src};
    ff_model *v = ff_model_new_opts(be, &cfg, w, &ov);
    REQUIRE(v);
    ff_model_memory mv;
    ff_model_memory_of(v, &mv);
    CHECK(mv.params == 0 && mv.viewed == 4 * ff_model_param_count(src)); /* the same layout: all of it in place */
    const ff_model_opts ovv = {.inference = true, .view_of = v};
    ff_model *bad = ff_model_new_opts(be, &cfg, w, &ovv);
    CHECK(!bad && strstr(ff_error_message(), "the model to view is itself a view"));
    ff_model_destroy(&bad);
    bad = ff_model_new_opts(be, &cfg, w, &ot);
    CHECK(!bad && strstr(ff_error_message(), "a trainable model cannot view another"));
    ff_model_destroy(&bad);
    bad = ff_model_new_opts(be, &other, wo, &ov);
    CHECK(!bad && strstr(ff_error_message(), "the model to view has another config"));
    ff_model_destroy(&bad);
    ff_tensor_set *out = ff_tensor_set_new();
    CHECK(out && ff_model_export_weights(v, out) != 0 && strstr(ff_error_message(), "reads part of its weights in place"));
    ff_tensor_set_destroy(&out);
    ff_error_clear();
    ff_model_destroy(&v), ff_model_destroy(&src);
    ff_tensor_set_destroy(&w), ff_tensor_set_destroy(&wo);
    ff_backend_destroy(&be);
}

int main(void) {
    const tcase cases[] = {
        {"TP2 PP2 -> TP1", 2, 2, 1, 4, false, false},
        {"TP4 -> TP2, replicated KV heads, q/k/v biases", 4, 1, 2, 2, false, true},
        {"TP2 PP2 -> TP2, tied embeddings", 2, 2, 2, 4, true, false},
        {"TP2 -> TP1, tied embeddings, biases", 2, 1, 1, 4, true, true},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const tcase *c = &cases[k];
        run_opts ro = default_run();
        const int n = c->t * c->p;
        int failed = run_ranks(n, &ro, rank_main, (void *)c);
        CHECK(failed == 0);
        if (failed) fprintf(stderr, "case '%s': %d of %d ranks failed\n", c->name, failed, n);
    }
    refusals(); /* after the forks: this process then uses a backend of its own */
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

/* The 3D-HybridEngine's in-place transition (issue 11; docs/run.md "Memory of the colocated
 * copy"): each rank (a forked process over ff_coll's cpu backend) trains a shard (TP t x PP
 * p, with gradients and AdamW state) and generates with a view of it (ff_model_opts.view_of)
 * in HybridFlow's layout (TP tg, micro-DP replicas), whose own buffer holds only the part of
 * the generation shard that the training shard lacks.
 *
 * Per rank and case, from the allocations (ff_model_memory_of, ff_optimizer_state_bytes,
 * ff_generator_kv_bytes, and the backend's counters):
 * - training: the view gives its own part back (0 bytes); it still reads the training shard,
 *   whose new weights (loaded after the view was made, as an optimizer step writes them)
 *   show in it at once;
 * - the transition: the view's own part is exactly the generation shard minus the training
 *   shard (4 (P_gen - P_train) bytes), which is what the rank received, counted; nothing was
 *   copied locally (stats.local 0) and the whole training shard was used in place
 *   (stats.in_place = 4 P_train);
 * - generating: the weights held are the generation shard exactly (training shard + gathered
 *   part = 4 P_gen: no byte twice; the separate copy held 4 (P_train + P_gen)), a whole model
 *   only at tg = 1; over the phases the weights peak at the larger shard, never both.
 * - the phases from the backend's allocation counters (ff_backend_memory_of; the separate
 *   copy on a backend of its own), beside a constant for the models' tables: training = the
 *   shard + gradients + AdamW (16 x 4 P_train bytes at zero 0); train -> generate gives the
 *   gradients back (ff_model_release_grads: -4 P_train) and moves AdamW (made non-zero first)
 *   to host memory (ff_optimizer_offload: -8 P_train, counted apart as host bytes), so
 *   generating = the generation shard (in place + gathered) + the KV cache and its decode
 *   workspace, nothing else; the counters' peak over the transition is the larger of the two
 *   phases; generate -> train gives zeroed gradients and AdamW bit for bit again, and the
 *   training bytes are those of before. A step while offloaded and reading released gradients
 *   are refused, naming the call that restores them (printed per phase with FF_TEST_VERBOSE).
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

/* Greedy responses to two prompts on m: tokens [2][NEW] into tok; the KV cache's bytes, the
 * generator's decode workspace and the backend's bytes in use once both are allocated. */
enum { NEW = 12 };
static int generate(ff_model *m, int32_t tok[2][NEW], int64_t *kv_bytes, int64_t *ws_bytes, int64_t *in_use) {
    const ff_generator_config gc = {.max_slots = 2, .max_seq_len = 32};
    ff_generator *g = ff_generator_new(m, &gc);
    if (!g) return -1;
    *kv_bytes = ff_generator_kv_bytes(g);
    *ws_bytes = ff_generator_workspace_bytes(g);
    ff_backend_memory bm;
    ff_backend_memory_of(ff_model_backend(m), &bm);
    *in_use = bm.in_use;
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

/* A trained actor's state: AdamW's exp_avg and exp_avg_sq not zero (a pattern of the element
 * and the tensor, imported whole), and a step's gradients, zeroed after it as the trainer does. */
static int train_state(ff_model *m, ff_optimizer *o) {
    ff_tensor_set *st = ff_tensor_set_new();
    int rc = st && ff_optimizer_export_state(o, st) == 0 ? 0 : -1;
    /* the last stage's copy of the tied embedding: exported by the first stage, imported here too */
    for (int i = 0; rc == 0 && i < ff_model_n_tensors(m); i++) {
        ff_model_tensor_info ti;
        ff_model_tensor_info_of(m, i, &ti);
        char name[160];
        for (int pass = 0; ti.copy && pass < 2 && rc == 0; pass++) {
            snprintf(name, sizeof name, "%s.%s", pass ? "exp_avg_sq" : "exp_avg", ti.name);
            if (!ff_tensor_set_find(st, name) && !ff_tensor_set_add(st, name, 2, ti.full)) rc = -1;
        }
    }
    for (size_t t = 0; rc == 0 && t < st->n; t++) {
        ff_host_tensor *h = &st->items[t];
        if (!strcmp(h->name, "step")) continue;
        const int64_t n = ff_host_tensor_numel(h);
        for (int64_t k = 0; k < n; k++) h->data[k] = (float)((k * 7 + (int64_t)t * 13) % 101) * 1e-3f + (strstr(h->name, "_sq") ? 1e-2f : 0);
    }
    if (rc == 0) rc = ff_optimizer_import_state(o, st);
    ff_tensor_set_destroy(&st);
    const int64_t P = ff_model_param_count(m);
    float *g = malloc((size_t)P * sizeof *g);
    if (!g) return -1;
    for (int64_t k = 0; k < P; k++) g[k] = (float)(k % 17) - 8.0f;
    if (rc == 0) rc = ff_model_write_grads(m, g);
    free(g);
    return rc == 0 ? ff_model_zero_grad(m) : -1;
}

/* The backend's bytes in use now, and those ff_model_memory_of, the optimizer and a
 * generator (kv + ws, or 0) account for; their difference is the models' fixed tables (rope,
 * TP scratch), the same in every phase. */
static int64_t in_use(ff_backend *be) {
    ff_backend_memory bm;
    ff_backend_memory_of(be, &bm);
    return bm.in_use;
}
static int64_t accounted(const ff_model *src, const ff_model *dst, const ff_optimizer *o, int64_t gen, int64_t *ws) {
    ff_model_memory ms, md;
    ff_model_memory_of(src, &ms), ff_model_memory_of(dst, &md);
    *ws = ms.workspace + md.workspace;
    return ms.params + ms.grads + ff_optimizer_state_bytes(o) + md.params + *ws + gen;
}

static int rank_main(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg) {
    (void)id, (void)nranks;
    const tcase *c = arg;
    int fails = 0;
    ff_model_config cfg = tiny_config(64, 32, 64, 4, 4, c->kv, c->tied, c->bias, false);
    cfg.n_eos = 0; /* full-length responses: every token compared */
    /* the separate copy on a backend of its own: `be`'s counters are the actor's and its view's */
    ff_backend *be = ff_backend_new("cpu:1"), *be_ref = ff_backend_new("cpu:1");
    ff_tensor_set *w1 = ff_tensor_set_new(), *w0 = ff_tensor_set_new();
    REQUIRE(be && be_ref && w1 && w0 && ff_model_init_weights(&cfg, 11, 0.2, w1) == 0 && ff_model_init_weights(&cfg, 12, 0.2, w0) == 0);
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
    ff_model *ref = shard_model(be_ref, &cfg, w1, gtp, 0, 1, true, NULL);
    REQUIRE(src && dst && ref && ff_model_viewed(dst) == src && !ff_model_viewed(ref));
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ff_optimizer *opt = ff_optimizer_new(src, &ac);
    REQUIRE(opt);
    const int64_t P_train = ff_model_param_count(src), P_gen = ff_model_param_count(dst);
    RCHECK(P_gen == ff_model_param_count(ref), "the view's shard has %" PRId64 " parameters, the copy's %" PRId64, P_gen,
           ff_model_param_count(ref));
    REQUIRE(train_state(src, opt) == 0);

    /* training: the view's own part given back; the actor "steps" to W1 */
    ff_model_memory ms, md;
    RCHECK(ff_model_release_params(dst) == 0, "release: %s", ff_error_message());
    ff_model_memory_of(src, &ms), ff_model_memory_of(dst, &md);
    const int64_t train_phase = ms.params + ms.grads + ff_optimizer_state_bytes(opt) + md.params;
    int64_t peak_weights = ms.params + md.params; /* the most weight bytes held at any phase */
    RCHECK(md.params == 0 && md.viewed == 4 * P_train, "released view: %" PRId64 " own bytes, %" PRId64 " viewed (training shard %" PRId64 ")",
           md.params, md.viewed, 4 * P_train);
    RCHECK(ms.params == 4 * P_train && ms.grads == 4 * P_train, "training shard %" PRId64 " B, grads %" PRId64 " B", ms.params, ms.grads);
    /* the same from the backend's counters: training = shard + grads + AdamW, nothing else
     * but the fixed tables and the (here empty) workspaces */
    int64_t ws = 0;
    const int64_t tables = in_use(be) - accounted(src, dst, opt, 0, &ws);
    const int64_t train_counted = in_use(be) - tables - ws;
    RCHECK(tables >= 0 && train_counted == 16 * P_train && train_counted == train_phase,
           "training phase from the counters %" PRId64 " B (tables %" PRId64 "), shard + grads + AdamW = 16 x %" PRId64, train_counted, tables, P_train);
    REQUIRE(ff_model_load_weights(src, w1) == 0);
    ff_tensor_set *state0 = ff_tensor_set_new();
    REQUIRE(state0 && ff_optimizer_export_state(opt, state0) == 0);

    /* train -> generate: the gradients given back, AdamW to host memory */
    ff_backend_memory_reset_peak(be);
    int64_t before = in_use(be);
    RCHECK(ff_model_release_grads(src) == 0 && !ff_model_grads_held(src) && before - in_use(be) == 4 * P_train,
           "releasing the gradients gave back %" PRId64 " B of %" PRId64, before - in_use(be), 4 * P_train);
    float one;
    RCHECK(ff_model_read_grads(src, &one) != 0 && strstr(ff_error_message(), "ff_model_restore_grads"), "reading released gradients: %s",
           ff_error_message());
    ff_offload_stats os;
    before = in_use(be);
    RCHECK(ff_optimizer_offload(opt, &os) == 0 && ff_optimizer_offloaded(opt) && os.bytes == 8 * P_train && before - in_use(be) == 8 * P_train &&
               ff_optimizer_state_bytes(opt) == 0 && ff_optimizer_host_bytes(opt) == 8 * P_train && os.seconds >= 0,
           "offload: %" PRId64 " B moved, %" PRId64 " B off the backend, %" PRId64 " B on the host (AdamW %" PRId64 ")", os.bytes, before - in_use(be),
           ff_optimizer_host_bytes(opt), 8 * P_train);
    RCHECK(ff_optimizer_step(opt, NULL) != 0 && strstr(ff_error_message(), "ff_optimizer_reload"), "a step while offloaded: %s", ff_error_message());
    ff_error_clear();
    const int64_t host_bytes = ff_optimizer_host_bytes(opt);

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
    int64_t kv = 0, kv_ref = 0, gws = 0, gws_ref = 0, gen_in_use = 0, ref_in_use = 0;
    RCHECK(generate(dst, tv, &kv, &gws, &gen_in_use) == 0 && generate(ref, tr, &kv_ref, &gws_ref, &ref_in_use) == 0, "generate: %s", ff_error_message());
    ff_backend_memory bm;
    ff_backend_memory_of(be, &bm);
    /* generating, from the counters: the generation shard (in place + gathered) + the KV cache
     * and its decode workspace, no gradients, no AdamW; the peak over the transition is the
     * larger phase */
    int64_t acc_g = accounted(src, dst, opt, kv + gws, &ws);
    const int64_t gen_counted = gen_in_use - tables - ws;
    RCHECK(gen_in_use - acc_g == tables && gen_counted == 4 * P_gen + kv + gws,
           "generation phase from the counters %" PRId64 " B (tables %" PRId64 " vs %" PRId64 "), generation shard %" PRId64 " + KV %" PRId64 " + decode %" PRId64,
           gen_counted, gen_in_use - acc_g, tables, 4 * P_gen, kv, gws);
    const int64_t peak_counted = bm.peak - tables - ws;
    RCHECK(peak_counted == (train_counted > gen_counted ? train_counted : gen_counted),
           "peak over the transition %" PRId64 " B: training %" PRId64 ", generating %" PRId64, peak_counted, train_counted, gen_counted);
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
    const int64_t gen_phase = ms.grads + ff_optimizer_state_bytes(opt) + weights + kv + gws;
    RCHECK(gen_phase == gen_counted, "generation phase %" PRId64 " B by the models, %" PRId64 " B by the counters", gen_phase, gen_counted);
    const int64_t peak = train_phase > gen_phase ? train_phase : gen_phase;
    const int64_t whole = 4 * (ff_model_param_count(ref) * c->tg); /* about (norms replicated): the whole model */
    if (c->tg > 1) RCHECK(weights < whole, "the generation shard is %" PRId64 " B, a whole model %" PRId64, weights, whole);
    if (getenv("FF_TEST_VERBOSE"))
        printf("%s rank %d: peak %" PRId64 " B (counted %" PRId64 "); training %" PRId64 " B (shard %" PRId64 " + grads %" PRId64 " + AdamW %" PRId64
               "), generating %" PRId64 " B (shard in place %" PRId64 " + gathered %" PRId64 " + KV %" PRId64 " + decode %" PRId64
               "); AdamW on the host %" PRId64 " B; separate copy +%" PRId64 " B\n",
               c->name, rank, peak, peak_counted, train_phase, ms.params, 4 * P_train, 8 * P_train, gen_phase, ms.params, md.params, kv, gws, host_bytes,
               4 * P_train);

    /* generate -> train: the view's part back, zeroed gradients and AdamW bit for bit again */
    RCHECK(ff_model_release_params(dst) == 0, "release: %s", ff_error_message());
    RCHECK(ff_model_restore_grads(src) == 0 && ff_optimizer_reload(opt, &os) == 0 && os.bytes == 8 * P_train && !ff_optimizer_offloaded(opt) &&
               ff_optimizer_host_bytes(opt) == 0,
           "restore: %s", ff_error_message());
    const int64_t back = in_use(be) - accounted(src, dst, opt, 0, &ws);
    RCHECK(back == tables && in_use(be) - tables - ws == train_counted, "training again from the counters %" PRId64 " B, before %" PRId64,
           in_use(be) - tables - ws, train_counted);
    {
        float *gr = malloc((size_t)P_train * sizeof *gr);
        REQUIRE(gr && ff_model_read_grads(src, gr) == 0);
        int64_t nz = 0;
        for (int64_t k = 0; k < P_train; k++) nz += gr[k] != 0.0f;
        RCHECK(nz == 0, "%" PRId64 " restored gradients are not zero", nz);
        free(gr);
        ff_tensor_set *state1 = ff_tensor_set_new();
        REQUIRE(state1 && ff_optimizer_export_state(opt, state1) == 0);
        int64_t bad = state1->n != state0->n;
        for (size_t t = 0; !bad && t < state0->n; t++) {
            const ff_host_tensor *x = &state0->items[t], *y = ff_tensor_set_find(state1, x->name);
            bad += !y || ff_host_tensor_numel(x) != ff_host_tensor_numel(y) ||
                   memcmp(x->data, y->data, (size_t)ff_host_tensor_numel(x) * sizeof(float)) != 0;
        }
        RCHECK(bad == 0, "the reloaded AdamW state differs from the offloaded one (%" PRId64 " tensors)", bad);
        ff_tensor_set_destroy(&state1);
    }
    ff_tensor_set_destroy(&state0);

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
    ff_backend_destroy(&be), ff_backend_destroy(&be_ref);
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

/* RLHFuse's fused training step, executed: an actor (PP 4, log-prob loss) and a critic (value
 * head, value loss) train together on 4 ranks (threads, the mailbox transport in its rendezvous
 * mode: a posted send is done once received, a call's sends once received; the steps' sums are
 * barriers, so a placement that could deadlock would hang here) by following
 * the streams ff_fuse_to_pipe makes of a fused schedule, in two layouts: the critic as PP 2 x 2
 * replicas in the reverse direction (critic0 on nodes [1, 0], critic1 on [3, 2], each its own
 * half of the critic's micro-batches, their gradients summed over the replicas in the
 * before_step hook), and the critic as PP 4 reversed ([3, 2, 1, 0]). Schedules: the serial
 * baseline (ff_fuse_serial: the actor's 1F1B, then the critic's), greedy fused ones, the
 * solver's (ff_fuse_solve) and random valid ones.
 *
 * Proved, after two training steps: every fused schedule's weights equal the serial schedule's
 * bit for bit (each stage runs the same arithmetic on the same micro-batches in the same order
 * whatever the interleaving: a model's k-th backward on a node is micro-batch k, and its step
 * comes after all of them), the critic replicas' weights are equal bit for bit, every rank
 * reports the same losses, and the serial step equals the single-rank models (the whole actor
 * on its batch, the whole critic on the whole critic batch) within the pipeline tests' fp32
 * tolerances (the gradient norm summed per stage, clipping on). The instance built from the
 * serial run (ff_pipe_fuse_instance) has the layout, measured times and the stated activation
 * bytes. */
#include "tests/pipe/fuse_exec_util.h"

enum { STEPS = 2, NMICRO = 8, MAXSCHED = 16 };

/* The whole model on micro-batches [0, g->n) of g: only log-probs (the actor) or values (the
 * critic) asked, `steps` AdamW steps; the weights after, and the first step's loss. */
static ff_tensor_set *reference(const ff_model_config *cfg, const ff_tensor_set *w, const pt_batch *g, bool values,
                                double *loss) {
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model *m = be ? ff_model_new(be, cfg, w) : NULL;
    REQUIRE(m);
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt);
    const int64_t N = g->off[g->n];
    float *out = malloc(sizeof(float) * (size_t)N), *d = malloc(sizeof(float) * (size_t)N);
    REQUIRE(out && d);
    for (int s = 0; s < STEPS; s++) {
        ff_model_zero_grad(m);
        double l = 0;
        for (int32_t j = 0; j < g->n; j++) {
            ff_forward_out o = {.logprobs = values ? NULL : out + g->off[j], .values = values ? out + g->off[j] : NULL};
            ff_forward_opts fo = {.train = true, .temperature = PT_TEMP};
            REQUIRE(ff_model_forward(m, &g->b[j], &fo, &o) == 0);
            l += pt_loss_of(g, j, &o, values ? NULL : d + g->off[j], NULL, values ? d + g->off[j] : NULL);
            REQUIRE(ff_model_backward(m, values ? NULL : d + g->off[j], NULL, values ? d + g->off[j] : NULL) == 0);
        }
        ff_optim_stats st;
        REQUIRE(ff_optimizer_step(opt, &st) == 0);
        if (s == 0) *loss = l;
    }
    ff_tensor_set *after = ff_tensor_set_new();
    REQUIRE(after && ff_model_export_weights(m, after) == 0);
    free(out), free(d);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    return after;
}

/* The instance ff_pipe_fuse_instance built from the serial run: the layout, measured times,
 * and the activation bytes of its rule (layers of a stage x 34 x tokens x hidden). */
static void check_measured(const ff_fuse_instance *in, const ff_fuse_instance *got, const ff_model_config *cfg, const pt_batch *g,
                           const int64_t *layers) {
    CHECK_EQ_INT(got->nodes, in->nodes);
    CHECK_EQ_INT(got->n_models, in->n_models);
    for (int i = 0; i < in->n_models && i < got->n_models; i++) {
        const ff_fuse_model *a = &in->models[i], *b = &got->models[i];
        CHECK(!strcmp(a->name, b->name) && !strcmp(a->family, b->family) && b->family[0]);
        CHECK_EQ_INT(b->n_stages, a->n_stages);
        CHECK_EQ_INT(b->micro, a->micro);
        for (int32_t k = 0; k < a->n_stages; k++) CHECK_EQ_INT(b->stages[k], a->stages[k]);
        CHECK(b->fwd > 0 && b->bwd > 0 && b->fwd < 1 && b->bwd < 1); /* seconds of a tiny stage */
        const pt_batch *gb = &g[i > 0];
        const double tokens = (double)gb->off[gb->n] / gb->n;
        CHECK_CLOSE(b->act, (double)layers[i] / a->n_stages * 34.0 * tokens * cfg[i > 0].hidden_size, 0, 1e-12);
    }
    /* it is an instance the fused simulator and solver take */
    ff_fuse_schedule s;
    REQUIRE(ff_fuse_serial(got, &s) == 0);
    CHECK(fz_makespan(got, &s) > 0);
    ff_fuse_schedule_free(&s);
    printf("measured: actor forward %.3f ms, backward %.3f ms per stage; critic0 %.3f, %.3f ms\n", 1e3 * got->models[0].fwd,
           1e3 * got->models[0].bwd, 1e3 * got->models[1].fwd, 1e3 * got->models[1].bwd);
}

static void layout(const char *name, bool replicas) {
    const ff_model_config cfg[2] = {tiny_config(64, 32, 48, 4, 4, 2, false, false, false),
                                    tiny_config(64, 32, 48, 4, 4, 2, false, true, true)};
    ff_tensor_set *w[2];
    pt_batch g[2];
    ff_tensor_set *ref[2];
    double ref_loss[2];
    for (int f = 0; f < 2; f++) {
        REQUIRE((w[f] = ff_tensor_set_new()) && ff_model_init_weights(&cfg[f], 31 + (uint64_t)f, 0.2, w[f]) == 0);
        pt_batch_make(&g[f], NMICRO, cfg[f].vocab_size, 10, 0, 41 + (uint64_t)f);
        ref[f] = reference(&cfg[f], w[f], &g[f], f == 1, &ref_loss[f]);
    }
    const ff_fuse_instance in = fz_layout(replicas, NMICRO, replicas ? NMICRO / 2 : NMICRO, 3, 2);
    const int64_t layers[FF_FUSE_MAX_MODELS] = {4, 4, 4};
    /* the schedules: serial first, then greedy fused ones, then random valid ones */
    ff_fuse_schedule fs[MAXSCHED];
    char label[MAXSCHED][48];
    int n = 0;
    fz_serial(&in, &fs[n]);
    snprintf(label[n], sizeof label[0], "serial (makespan %.0f)", fz_makespan(&in, &fs[n]));
    n++;
    for (int q = 0; q < 2 * in.n_models; q++) {
        const double mk = fz_greedy(&in, q % 2, q / 2, &fs[n]);
        snprintf(label[n++], sizeof label[0], "greedy %d (makespan %.0f)", q, mk);
    }
    ff_fuse_solve_opts so = {.seconds = 0.3, .seed = 1, .threads = 1};
    ff_fuse_solve_stats ss;
    REQUIRE(ff_fuse_solve(&in, &so, &fs[n], &ss) == 0);
    snprintf(label[n], sizeof label[0], "solver (makespan %.0f)", fz_makespan(&in, &fs[n]));
    n++;
    for (int q = 0; q < 3; q++) {
        fz_random(&in, 77 + (uint64_t)q, &fs[n]);
        snprintf(label[n], sizeof label[0], "random %d (makespan %.0f)", q, fz_makespan(&in, &fs[n]));
        n++;
    }
    ff_tensor_set *base[FF_FUSE_MAX_MODELS] = {0};
    double base_loss[FF_FUSE_MAX_MODELS] = {0};
    for (int q = 0; q < n; q++) {
        ff_pipe_schedule ps;
        if (ff_fuse_to_pipe(&in, &fs[q], layers, &ps)) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(ps.streams);
        fx_job *j = calloc(1, sizeof *j);
        REQUIRE(j);
        *j = (fx_job){.in = &in, .sched = {&ps}, .n_sched = 1, .reps = STEPS, .cfg = {&cfg[0], &cfg[1]}, .w = {w[0], w[1]},
                      .g = {&g[0], &g[1]}, .keep = true, .rendezvous = true, .measure_from = q == 0 ? 0 : -1};
        const int rc = fx_run(j);
        CHECK(rc == 0);
        if (rc == 0 && q == 0) check_measured(&in, &j->measured, cfg, g, layers);
        char what[160];
        if (rc == 0) {
            for (int i = 0; i < in.n_models; i++) {
                ff_tensor_set *after = fx_model_after(j, i);
                const double loss = j->stats[0][0][0].loss[i];
                for (int r = 1; r < FX_RANKS; r++) CHECK(j->stats[0][0][r].loss[i] == loss);
                if (q == 0) {
                    base[i] = after, base_loss[i] = loss;
                    continue;
                }
                pt_err e = {0};
                snprintf(what, sizeof what, "%s %s: %s after %d steps", name, label[q], in.models[i].name, STEPS);
                pt_compare_sets(&e, what, after, base[i], 0, 0);
                CHECK(!e.differs);
                CHECK(loss == base_loss[i]);
                ff_tensor_set_destroy(&after);
            }
            if (q) printf("%-26s %-26s: the weights after %d steps equal the serial schedule's bit for bit\n", name, label[q], STEPS);
        }
        fx_job_clear(j);
        free(j);
        ff_pipe_schedule_clear(&ps);
    }
    /* the serial step against the single-rank models; the replicas alike */
    pt_err e = {0};
    char what[160];
    snprintf(what, sizeof what, "%s serial actor against the whole model", name);
    pt_compare_sets(&e, what, base[0], ref[0], PT_ATOL_AFTER, PT_TOL_AFTER);
    CHECK_CLOSE(base_loss[0], ref_loss[0], 0, 1e-12);
    snprintf(what, sizeof what, "%s serial critic against the whole model", name);
    pt_compare_sets(&e, what, base[1], ref[1], PT_ATOL_AFTER, PT_TOL_AFTER);
    double critic_loss = 0;
    for (int i = 1; i < in.n_models; i++) critic_loss += base_loss[i];
    CHECK_CLOSE(critic_loss, ref_loss[1], 1e-12, 1e-9);
    if (replicas) {
        pt_err same = {0};
        snprintf(what, sizeof what, "%s critic1 against critic0", name);
        pt_compare_sets(&same, what, base[2], base[1], 0, 0);
        CHECK(!same.differs);
    }
    printf("%-26s serial step against the single-rank actor and critic: worst relative error %.3g\n", name, e.rel);
    for (int i = 0; i < in.n_models; i++) ff_tensor_set_destroy(&base[i]);
    for (int q = 0; q < n; q++) fz_free(&fs[q]);
    for (int f = 0; f < 2; f++) {
        ff_tensor_set_destroy(&ref[f]);
        ff_tensor_set_destroy(&w[f]);
        pt_batch_free(&g[f]);
    }
}

int main(void) {
    layout("actor pp4, critic pp2 x 2", true);
    layout("actor pp4, critic pp4 rev", false);
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

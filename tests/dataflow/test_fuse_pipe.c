/* ff_fuse_to_pipe (fuseflow/fuse.h): a fused schedule as the executor's instruction streams.
 * For five instances (the actor PP 4 with the critic as PP 2 x 2 replicas, actor PP 4
 * with the critic PP 4 reversed, two nodes with a hop latency, eight nodes with 4-stage critic
 * replicas, a one-stage model beside a three-stage one) and, for each, the serial baseline
 * (ff_fuse_serial), greedy fused schedules, the solver's (ff_fuse_solve) and hundreds of random
 * valid schedules: the streams pass the
 * pipeline simulator (no deadlock with sends that do not block, every channel's k-th send
 * meets its k-th receive with the same tensor, inputs before use, steps after the backwards),
 * each node runs the schedule's forwards and backwards in its order with the k-th of a model
 * being micro-batch k, one step per model per node after its last backward there, and the
 * simulated makespan of the streams equals the fused simulator's (ff_fuse_simulate) for the
 * serial and the solver's schedules, with no latency and with a hop latency (what runs follows
 * the fused schedule; so the solver's fused streams are never slower than the serial
 * baseline's), and for the others is never below it, at most 5% above (a receive held before a
 * step it crosses), equal on at least 90% of them. The streams say they need eager sends
 * (eager_sends): the same streams run with blocking calls are printed (how many deadlock), and
 * without the flag but with eager options give the same makespan. Bad schedules and instances
 * are refused with errors naming the node and task (the fused simulator's, ff_fuse_simulate). */
#include <math.h>

#include "tests/dataflow/fuse_test_util.h"

#include "fuseflow/error.h"
#include "fuseflow/pipeline.h"

static double worst_ratio, sum_ratio;
static int n_ratio, n_blocking_deadlocks, n_blocking, n_exact;

/* The streams' makespan equals the fused schedule's. */
static void check_exact(const char *what, double streams, double fused) {
    if (fabs(streams - fused) <= 1e-9 * fused) return;
    fprintf(stderr, "%s: the streams run %.9g, the fused schedule %.9g\n", what, streams, fused);
    ff_test_failures++;
}

/* The streams of schedule s of instance in, checked; the simulated makespan of the streams. */
static double check_streams(const char *what, const ff_fuse_instance *in, const ff_fuse_schedule *s, const int64_t *layers) {
    ff_pipe_schedule p;
    if (ff_fuse_to_pipe(in, s, layers, &p)) {
        fprintf(stderr, "%s: %s\n", what, ff_error_message());
        ff_test_failures++;
        return -1;
    }
    CHECK_EQ_INT(p.n_ranks, in->nodes);
    CHECK_EQ_INT(p.n_models, in->n_models);
    double f[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES], b[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES];
    ff_pipe_sim_opts o = {.hop_s = in->hop_latency};
    for (int i = 0; i < in->n_models; i++) {
        const ff_fuse_model *m = &in->models[i];
        CHECK_EQ_INT(p.models[i].n_stages, m->n_stages);
        CHECK_EQ_INT(p.models[i].micro, m->micro);
        int64_t sum = 0;
        for (int32_t k = 0; k < m->n_stages; k++) {
            CHECK_EQ_INT(p.models[i].stage_rank[k], m->stages[k]);
            f[i][k] = m->fwd, b[i][k] = m->bwd;
            if (layers) {
                sum += p.models[i].stage_layers[k];
                CHECK(p.models[i].stage_layers[k] >= layers[i] / m->n_stages && p.models[i].stage_layers[k] <= layers[i] / m->n_stages + 1);
            }
        }
        if (layers) CHECK(sum == layers[i]);
        else CHECK(p.models[i].stage_layers == NULL);
        o.fwd_stage_s[i] = f[i], o.bwd_stage_s[i] = b[i];
    }
    ff_pipe_sim sim;
    const int rc = ff_pipe_simulate(&p, &o, &sim);
    if (rc) fprintf(stderr, "%s: %s\n", what, ff_error_message());
    CHECK(rc == 0);
    const double makespan = rc ? -1 : sim.makespan_s;
    ff_pipe_sim_clear(&sim);
    /* each node: the schedule's computes in order, one step per model after its backwards */
    for (int32_t n = 0; n < in->nodes; n++) {
        const ff_pipe_stream *st = &p.streams[n];
        int64_t j = 0;
        int32_t kf[FF_FUSE_MAX_MODELS] = {0}, kb[FF_FUSE_MAX_MODELS] = {0}, steps[FF_FUSE_MAX_MODELS] = {0};
        int32_t last_call = -1;
        for (int64_t q = 0; q < st->n; q++) {
            const ff_pipe_instr *x = &st->instr[q];
            if (x->call >= 0) {
                CHECK(x->call >= last_call);
                last_call = x->call;
            }
            if (x->op == FF_PIPE_OPTIMIZER_STEP) {
                CHECK(kb[x->model] == in->models[x->model].micro);
                steps[x->model]++;
            }
            if (x->op != FF_PIPE_FORWARD && x->op != FF_PIPE_BACKWARD) continue;
            REQUIRE(j < s->n_tasks[n]);
            const ff_fuse_task t = s->tasks[n][j++];
            CHECK(x->model == t.model && (x->op == FF_PIPE_BACKWARD) == (t.backward != 0));
            CHECK_EQ_INT(x->micro, t.backward ? kb[t.model]++ : kf[t.model]++);
            CHECK(x->chunk == 0);
        }
        CHECK(j == s->n_tasks[n]);
        for (int i = 0; i < in->n_models; i++) CHECK_EQ_INT(steps[i], fz_stage_on(&in->models[i], n) >= 0 ? 1 : 0);
    }
    /* sends that do not block, receives before their consumers: the fused simulator's makespan,
     * but where a receive is held before a step it crosses (a few random schedules) */
    CHECK(p.eager_sends);
    const double fused = fz_makespan(in, s);
    CHECK(fused > 0 && makespan >= fused * (1 - 1e-12) && makespan <= fused * 1.05);
    n_exact += fabs(makespan - fused) <= 1e-9 * fused;
    if (fused > 0 && makespan > 0) {
        const double r = makespan / fused;
        worst_ratio = r > worst_ratio ? r : worst_ratio;
        sum_ratio += r, n_ratio++;
    }
    /* the same streams without the flag: with blocking calls (what the executor did before),
     * and with eager options (the same run as with the flag) */
    ff_pipe_schedule sp = p;
    sp.eager_sends = false;
    ff_pipe_sim ss;
    n_blocking++;
    if (ff_pipe_simulate(&sp, &o, &ss) != 0 && ss.n_stuck > 0) n_blocking_deadlocks++;
    ff_pipe_sim_clear(&ss);
    ff_pipe_sim_opts oe = o;
    oe.eager_sends = true;
    CHECK(ff_pipe_simulate(&sp, &oe, &ss) == 0 && ss.makespan_s == makespan);
    ff_pipe_sim_clear(&ss);
    ff_pipe_schedule_clear(&p);
    return makespan;
}

static void instance(const char *name, const ff_fuse_instance *in, int n_random, const int64_t *layers) {
    ff_fuse_schedule s;
    char what[128];
    fz_serial(in, &s);
    snprintf(what, sizeof what, "%s serial", name);
    const double serial = check_streams(what, in, &s, layers);
    const double serial_fused = fz_makespan(in, &s);
    check_exact(what, serial, serial_fused);
    fz_free(&s);
    double best = -1, best_fused = -1;
    for (int g = 0; g < 2 * in->n_models; g++) {
        const double fused = fz_greedy(in, g % 2, g / 2, &s);
        snprintf(what, sizeof what, "%s greedy %d", name, g);
        const double got = check_streams(what, in, &s, layers);
        if (best_fused < 0 || fused < best_fused) best_fused = fused, best = got;
        fz_free(&s);
    }
    ff_fuse_solve_opts so = {.seconds = 0.3, .seed = 1, .threads = 1};
    ff_fuse_solve_stats ss;
    REQUIRE(ff_fuse_solve(in, &so, &s, &ss) == 0);
    snprintf(what, sizeof what, "%s solver", name);
    const double solved = fz_makespan(in, &s), solved_streams = check_streams(what, in, &s, layers);
    check_exact(what, solved_streams, solved);
    CHECK(solved_streams > 0 && solved_streams <= serial); /* what runs: fused never slower than serial */
    fz_free(&s);
    for (int q = 0; q < n_random; q++) {
        fz_random(in, 1000 + (uint64_t)q, &s);
        snprintf(what, sizeof what, "%s random %d", name, q);
        check_streams(what, in, &s, q % 2 ? layers : NULL);
        fz_free(&s);
    }
    printf("%-32s makespan (of the streams): serial %6.1f (%6.1f), best greedy %6.1f (%6.1f), solver %6.1f (%6.1f); %d random schedules\n",
           name, serial_fused, serial, best_fused, best, solved, solved_streams, n_random);
}

/* Refusals: each names the problem. */
static void errors(void) {
    ff_fuse_instance in = fz_layout(true, 4, 2, 3, 2);
    ff_fuse_schedule s;
    ff_pipe_schedule p;
    fz_serial(&in, &s);
    /* node 3 (the actor's last stage) runs its first backward before that micro-batch's forward */
    ff_fuse_task *t3 = s.tasks[3];
    REQUIRE(t3[0].model == 0 && !t3[0].backward && t3[1].backward);
    t3[0].backward = 1, t3[1].backward = 0;
    CHECK(ff_fuse_to_pipe(&in, &s, NULL, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "deadlock: node 3, task 0 (actor B of micro-batch 0) comes before that micro-batch's forward on the node");
    CHECK(p.streams == NULL);
    t3[0].backward = 0, t3[1].backward = 1;
    /* a task of a model on a node without its stage */
    t3[0].model = 1;
    CHECK(ff_fuse_to_pipe(&in, &s, NULL, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "node 3, task 0: critic0 has no stage on node 3");
    t3[0].model = 0;
    /* one task short (node 3's last: critic1's last backward) */
    s.n_tasks[3]--;
    CHECK(ff_fuse_to_pipe(&in, &s, NULL, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "incomplete: node 3 has 1 backwards of critic1; it needs 2");
    s.n_tasks[3]++;
    /* too few layers for the stages; two stages on one node; the wrong node count */
    const int64_t few[3] = {3, 2, 2};
    CHECK(ff_fuse_to_pipe(&in, &s, few, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "the layers of actor");
    in.models[1].stages[1] = 1;
    CHECK(ff_fuse_to_pipe(&in, &s, NULL, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "critic0: stages 0 and 1 both on node 1");
    in.models[1].stages[1] = 0;
    in.nodes = 5;
    CHECK(ff_fuse_to_pipe(&in, &s, NULL, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "it has 4 nodes; the instance has 5");
    in.nodes = 4;
    in.models[0].fwd = 0;
    CHECK(ff_fuse_to_pipe(&in, &s, NULL, &p) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "model actor: forward 0 and backward 6 must be > 0");
    in.models[0].fwd = 3;
    /* the good one still goes through */
    CHECK(ff_fuse_to_pipe(&in, &s, NULL, &p) == 0);
    ff_pipe_schedule_clear(&p);
    fz_free(&s);
}

int main(void) {
    /* the instance: actor 8 micro-batches, critic 2 replicas of 4, forward 3 : 2 */
    ff_fuse_instance a = fz_layout(true, 8, 4, 3, 2);
    const int64_t la[3] = {8, 4, 4};
    instance("actor pp4, critic pp2 x 2", &a, 300, la);
    ff_fuse_instance b = fz_layout(false, 8, 8, 5, 4);
    const int64_t lb[2] = {6, 5};
    instance("actor pp4, critic pp4 reversed", &b, 300, lb);
    ff_fuse_instance c = {.nodes = 2, .hop_latency = 0.5};
    c.models[c.n_models++] = fz_model("actor", 2, (const int32_t[]){0, 1}, 3, 2, 4, 1);
    c.models[c.n_models++] = fz_model("critic", 2, (const int32_t[]){1, 0}, 5, 1, 2, 1);
    instance("2 nodes, hop latency 0.5", &c, 300, NULL);
    ff_fuse_instance d = {.nodes = 8};
    d.models[d.n_models++] = fz_model("actor", 8, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 16, 5, 10, 1.6);
    d.models[d.n_models++] = fz_model("critic0", 4, (const int32_t[]){3, 2, 1, 0}, 8, 2, 4, 1);
    d.models[d.n_models++] = fz_model("critic1", 4, (const int32_t[]){7, 6, 5, 4}, 8, 2, 4, 1);
    instance("8 nodes, critic pp4 x 2", &d, 60, NULL);
    ff_fuse_instance e = {.nodes = 3};
    e.models[e.n_models++] = fz_model("actor", 3, (const int32_t[]){2, 0, 1}, 4, 1, 2, 1);
    e.models[e.n_models++] = fz_model("critic", 1, (const int32_t[]){1}, 3, 1, 1, 1);
    instance("3 nodes, a one-stage critic", &e, 200, NULL);
    printf("streams' makespan over the fused timeline's (eager sends): mean %.6f, worst %.6f over %d schedules, %d exactly\n",
           sum_ratio / (n_ratio ? n_ratio : 1), worst_ratio, n_ratio, n_exact);
    CHECK(n_exact * 10 >= n_ratio * 9);
    printf("the same streams with blocking calls: %d of %d deadlock\n", n_blocking_deadlocks, n_blocking);
    CHECK(n_ratio > 1000);
    errors();
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

/* The fused actor+critic schedule (fuseflow/fuse.h): instance parsing and its errors, the
 * simulator on hand-computed cases (times, memory, hop latency, deadlocks, incomplete
 * schedules), the bounds (tight on 1F1B alone; never above any valid schedule's makespan or
 * peak, over hundreds of random valid schedules), the serial baseline, the solver reaching the
 * bound where a schedule shows it is reachable, its determinism, schedule JSON and the SVG. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/fuse.h"
#include "fuseflow/pipeline.h"
#include "dataflow/fuse_internal.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static ff_fuse_instance parse_ok(const char *json) {
    ff_fuse_instance in;
    DIE_IF(ff_fuse_instance_parse(json, "test.json", &in));
    return in;
}

static void expect_parse_error(const char *json, const char *needle) {
    ff_fuse_instance in;
    int rc = ff_fuse_instance_parse(json, "test.json", &in);
    CHECK(rc == -1);
    if (rc == -1) CHECK_STR_CONTAINS(ff_error_message(), needle);
}

/* schedule from a compact text: per node "aF cB ..." where the letter is the model (a = 0) */
static ff_fuse_schedule sched_of(int32_t nodes, const char *const *lists) {
    ff_fuse_schedule s;
    DIE_IF(ff_fuse_schedule_init(&s, nodes));
    for (int32_t n = 0; n < nodes; n++)
        for (const char *p = lists[n]; *p; p++) {
            if (*p == ' ') continue;
            ff_fuse_task t = {.model = (uint8_t)(p[0] - 'a'), .backward = p[1] == 'B'};
            DIE_IF(ff_fuse_schedule_push(&s, n, t));
            p++;
        }
    return s;
}

static const char *ISSUE = "{\"nodes\": 4, \"models\": ["
                           "{\"name\": \"actor\", \"stages\": [0, 1, 2, 3], \"micro_batches\": 8, \"forward\": 3, \"backward\": 6, \"activation\": 1.0},"
                           "{\"name\": \"critic0\", \"stages\": [1, 0], \"micro_batches\": 4, \"forward\": 2, \"backward\": 4, \"activation\": 1.0},"
                           "{\"name\": \"critic1\", \"stages\": [3, 2], \"micro_batches\": 4, \"forward\": 2, \"backward\": 4, \"activation\": 1.0}]}";

static void test_parse(void) {
    ff_fuse_instance in = parse_ok(ISSUE);
    CHECK_EQ_INT(in.nodes, 4);
    CHECK_EQ_INT(in.n_models, 3);
    CHECK_EQ_INT(in.models[1].n_stages, 2);
    CHECK_EQ_INT(in.models[1].stages[0], 1);
    CHECK_CLOSE(in.models[0].bwd, 6, 0, 0);
    CHECK(!strcmp(in.models[1].family, "critic") && !strcmp(in.models[2].family, "critic") && !strcmp(in.models[0].family, "actor"));
    ff_fuse_instance f = parse_ok("{\"nodes\": 2, \"hop_latency\": 0.5, \"models\": [{\"name\": \"x7\", \"family\": \"critic\", \"stages\": [1], "
                                  "\"micro_batches\": 1, \"forward\": 1, \"backward\": 2}]}");
    CHECK(!strcmp(f.models[0].family, "critic"));
    CHECK_CLOSE(f.models[0].act, 1.0, 0, 0); /* the default */
    CHECK_CLOSE(f.hop_latency, 0.5, 0, 0);

    const char *m1 = "{\"name\": \"a\", \"stages\": [0, 1], \"micro_batches\": 2, \"forward\": 1, \"backward\": 2";
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"nodes\": 2, \"modles\": []}");
    expect_parse_error(buf, "unknown key 'modles'");
    snprintf(buf, sizeof buf, "{\"nodes\": 2, \"models\": [%s, \"fwd\": 1}]}", m1);
    expect_parse_error(buf, "unknown key 'fwd'");
    expect_parse_error("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0], \"forward\": 1, \"backward\": 2}]}", "missing \"micro_batches\"");
    expect_parse_error("{\"models\": []}", "missing \"nodes\"");
    snprintf(buf, sizeof buf, "{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0, 2], \"micro_batches\": 2, \"forward\": 1, \"backward\": 2}]}");
    expect_parse_error(buf, "stage 1 is on node out of range");
    expect_parse_error("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [1, 1], \"micro_batches\": 2, \"forward\": 1, \"backward\": 2}]}",
                       "node 1 holds two of its stages");
    expect_parse_error("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0], \"micro_batches\": 2, \"forward\": 0, \"backward\": 2}]}",
                       "\"forward\" is 0; it must be above 0");
    expect_parse_error("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0], \"micro_batches\": 2, \"forward\": 1, \"backward\": -2}]}",
                       "\"backward\" is -2");
    expect_parse_error("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0], \"micro_batches\": 0, \"forward\": 1, \"backward\": 2}]}",
                       "\"micro_batches\" is 0");
    expect_parse_error("{\"nodes\": 65, \"models\": []}", "\"nodes\" is 65");
    expect_parse_error("{\"nodes\": 0, \"models\": []}", "\"nodes\" is 0");
    snprintf(buf, sizeof buf, "{\"nodes\": 2, \"models\": [%s}, %s}, %s}, %s}, %s}]}", m1, m1, m1, m1, m1);
    expect_parse_error(buf, "list of 1 to 4 models");
    snprintf(buf, sizeof buf, "{\"nodes\": 2, \"models\": [%s}, %s}]}", m1, m1);
    expect_parse_error(buf, "both named 'a'");
    expect_parse_error("{\"nodes\": 2, ", "line 1");
    expect_parse_error("[1, 2]", "must be a JSON object");
    expect_parse_error("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0], \"micro_batches\": 5000, \"forward\": 1, \"backward\": 2}]}",
                       "must be in 1 .. 4096");
}

/* 1F1B on two stages, m = 2, f = 1, b = 2 (times worked by hand):
 * node 0: F0 0-1, F1 1-2, B0 4-6 (after node 1's B0 2-4), B1 7-9 (after node 1's B1 5-7);
 * node 1: F0 1-2, B0 2-4, F1 4-5, B1 5-7. Makespan 9 = (m + S - 1)(f + b). */
static void test_simulate_by_hand(void) {
    ff_fuse_instance in =
        parse_ok("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0, 1], \"micro_batches\": 2, \"forward\": 1, \"backward\": 2, \"activation\": 1.5}]}");
    const char *lists[] = {"aF aF aB aB", "aF aB aF aB"};
    ff_fuse_schedule s = sched_of(2, lists);
    ff_fuse_sim sim;
    DIE_IF(ff_fuse_simulate(&in, &s, &sim));
    CHECK_CLOSE(sim.makespan, 9, 1e-12, 0);
    CHECK_CLOSE(sim.node_peak[0], 3.0, 1e-12, 0); /* two forwards before the first backward */
    CHECK_CLOSE(sim.node_peak[1], 1.5, 1e-12, 0);
    CHECK_CLOSE(sim.peak_activation, 3.0, 1e-12, 0);
    CHECK_CLOSE(sim.node_busy[0], 6, 1e-12, 0);
    CHECK_CLOSE(sim.node_busy[1], 6, 1e-12, 0);
    /* with a hop of 0.5: node 1 F0 1.5-2.5, B0 2.5-4.5, F1 4.5-5.5, B1 5.5-7.5; node 0 B0 5-7, B1 8-10 */
    in.hop_latency = 0.5;
    DIE_IF(ff_fuse_simulate(&in, &s, &sim));
    CHECK_CLOSE(sim.makespan, 10, 1e-12, 0);
    /* the serial baseline of one model is this 1F1B */
    ff_fuse_schedule ser;
    DIE_IF(ff_fuse_serial(&in, &ser));
    for (int32_t n = 0; n < 2; n++) {
        CHECK_EQ_INT(ser.n_tasks[n], s.n_tasks[n]);
        CHECK(ser.n_tasks[n] == s.n_tasks[n] && !memcmp(ser.tasks[n], s.tasks[n], (size_t)s.n_tasks[n] * sizeof *s.tasks[n]));
    }
    ff_fuse_schedule_free(&ser);
    ff_fuse_schedule_free(&s);
    CHECK(s.tasks == NULL && s.n_tasks == NULL); /* freed and zeroed */
    ff_fuse_schedule_free(&s);                   /* safe again */
}

/* Two models in opposite directions, one micro-batch each: each fills the other's bubble.
 * node 0: aF 0-1, cF 1-2, cB 2-3, aB 3-4; node 1: cF 0-1, aF 1-2, aB 2-3, cB 3-4. Each model
 * alone needs 4 (two forwards and two backwards in a chain), so 4 is the bound and optimal. */
static const char *TWO = "{\"nodes\": 2, \"models\": ["
                         "{\"name\": \"actor\", \"stages\": [0, 1], \"micro_batches\": 1, \"forward\": 1, \"backward\": 1},"
                         "{\"name\": \"critic\", \"stages\": [1, 0], \"micro_batches\": 1, \"forward\": 1, \"backward\": 1}]}";

static void test_fused_by_hand(void) {
    ff_fuse_instance in = parse_ok(TWO);
    const char *lists[] = {"aF bF bB aB", "bF aF aB bB"};
    ff_fuse_schedule s = sched_of(2, lists);
    ff_fuse_sim sim;
    DIE_IF(ff_fuse_simulate(&in, &s, &sim));
    CHECK_CLOSE(sim.makespan, 4, 1e-12, 0);
    CHECK_CLOSE(sim.peak_activation, 2, 1e-12, 0);
    double lb, plb;
    ff_fuse_lower_bounds(&in, &lb, &plb);
    CHECK_CLOSE(lb, 4, 1e-12, 0);
    CHECK(plb <= sim.peak_activation + 1e-12);
    /* serial: the actor, then the critic: 4 + 4, less the overlap of node 1 starting the
     * critic while node 0 does the actor's last backward (no barrier): 7 */
    ff_fuse_schedule ser;
    ff_fuse_sim ss;
    DIE_IF(ff_fuse_serial(&in, &ser));
    DIE_IF(ff_fuse_simulate(&in, &ser, &ss));
    CHECK_CLOSE(ss.makespan, 7, 1e-12, 0);
    ff_fuse_schedule_free(&ser);
    ff_fuse_schedule_free(&s);
}

static void test_errors(void) {
    ff_fuse_instance in = parse_ok(TWO);
    ff_fuse_sim sim;
    /* node 0 waits for the critic's forward on node 1, node 1 for the actor's on node 0 */
    const char *cyc[] = {"bF aF bB aB", "aF bF aB bB"};
    ff_fuse_schedule s = sched_of(2, cyc);
    CHECK(ff_fuse_simulate(&in, &s, &sim) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "deadlock: node 0 waits at its task 0 (critic F of micro-batch 0, stage 1) for critic F of micro-batch 0 on node 1");
    ff_fuse_schedule_free(&s);
    const char *early[] = {"aF bF bB aB", "bF aB aF bB"}; /* node 1: the actor's backward before its forward */
    s = sched_of(2, early);
    CHECK(ff_fuse_simulate(&in, &s, &sim) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "node 1, task 1 (actor B of micro-batch 0) comes before that micro-batch's forward");
    ff_fuse_schedule_free(&s);
    const char *missing[] = {"aF bF bB aB", "bF aF aB"};
    s = sched_of(2, missing);
    CHECK(ff_fuse_simulate(&in, &s, &sim) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "incomplete: node 1 has 0 backwards of critic; it needs 1");
    ff_fuse_schedule_free(&s);
    ff_fuse_instance one = parse_ok("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0], \"micro_batches\": 1, \"forward\": 1, \"backward\": 1}]}");
    const char *wrong[] = {"aF aB", "aF"};
    s = sched_of(2, wrong);
    CHECK(ff_fuse_simulate(&one, &s, &sim) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "node 1, task 0: a has no stage on node 1");
    ff_fuse_schedule_free(&s);
    CHECK(ff_fuse_schedule_init(&s, 0) == -1);
    CHECK(ff_fuse_schedule_init(&s, 65) == -1);
}

static void test_schedule_json(void) {
    ff_fuse_instance in = parse_ok(TWO);
    ff_fuse_schedule s;
    DIE_IF(ff_fuse_schedule_parse(&in, "{\"makespan\": 4, \"schedule\": [[[0, \"F\"], [1, \"F\"], [1, \"B\"], [0, \"B\"]], [[1, \"F\"], [0, \"F\"], [0, \"B\"], [1, \"B\"]]]}",
                                  "s.json", &s));
    ff_fuse_sim sim;
    DIE_IF(ff_fuse_simulate(&in, &s, &sim));
    CHECK_CLOSE(sim.makespan, 4, 1e-12, 0);
    ff_fuse_schedule c;
    DIE_IF(ff_fuse_schedule_copy(&s, &c));
    CHECK(c.n_tasks[1] == 4 && c.tasks[1][1].model == 0 && c.tasks[1][1].backward == 0 && c.tasks[1][3].backward == 1);
    ff_fuse_schedule_free(&c);
    ff_fuse_schedule_free(&s);
    ff_fuse_schedule bad;
    CHECK(ff_fuse_schedule_parse(&in, "{\"schedule\": [[]]}", "s.json", &bad) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "has 1 node lists; the instance has 2 nodes");
    CHECK(ff_fuse_schedule_parse(&in, "{\"schedule\": [[[2, \"F\"]], []]}", "s.json", &bad) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "model 2 is out of range");
    CHECK(ff_fuse_schedule_parse(&in, "{\"schedule\": [[[0, \"X\"]], []]}", "s.json", &bad) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "schedule[0][0] must be [model index, \"F\" or \"B\"]");
    CHECK(ff_fuse_schedule_parse(&in, "{\"plan\": 1}", "s.json", &bad) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no \"schedule\" list");
}

/* One model alone: the makespan bound is 1F1B's (m + S - 1)(f + b), and at that makespan
 * the peak bound is 1F1B's S micro-batches in flight on stage 0: both tight. */
static void test_bounds_tight_on_1f1b(void) {
    for (int S = 1; S <= 5; S++)
        for (int m = S; m <= 9; m += 4) {
            char buf[512], stages[64] = "";
            for (int s = 0; s < S; s++) snprintf(stages + strlen(stages), sizeof stages - strlen(stages), "%s%d", s ? ", " : "", s);
            snprintf(buf, sizeof buf, "{\"nodes\": %d, \"models\": [{\"name\": \"a\", \"stages\": [%s], \"micro_batches\": %d, \"forward\": 2, \"backward\": 3, \"activation\": 0.5}]}",
                     S, stages, m);
            ff_fuse_instance in = parse_ok(buf);
            ff_fuse_schedule ser;
            ff_fuse_sim sim;
            DIE_IF(ff_fuse_serial(&in, &ser));
            DIE_IF(ff_fuse_simulate(&in, &ser, &sim));
            double lb, plb;
            ff_fuse_lower_bounds(&in, &lb, &plb);
            CHECK_CLOSE(sim.makespan, (m + S - 1) * 5.0, 1e-9, 0);
            CHECK_CLOSE(lb, sim.makespan, 1e-9, 0);
            CHECK_CLOSE(sim.peak_activation, 0.5 * S, 1e-12, 0);
            CHECK_CLOSE(plb, 0.5 * S, 1e-12, 0);
            /* more time allows fewer in flight: never more than at the bound */
            CHECK(ff_fuse_peak_bound(&in, 3 * sim.makespan) <= plb);
            ff_fuse_schedule_free(&ser);
        }
}

/* Random valid schedules (the serial one, shuffled by moves the simulator accepts): the
 * makespan bound is at most each one's makespan, the peak bound at its makespan at most its
 * peak. */
static void test_bounds_below_random_schedules(void) {
    const char *insts[] = {
        ISSUE,
        TWO,
        "{\"nodes\": 3, \"hop_latency\": 0.3, \"models\": ["
        "{\"name\": \"actor\", \"stages\": [0, 1, 2], \"micro_batches\": 5, \"forward\": 2, \"backward\": 3.5, \"activation\": 1.7},"
        "{\"name\": \"critic\", \"stages\": [2, 1, 0], \"micro_batches\": 4, \"forward\": 1, \"backward\": 2, \"activation\": 1}]}",
    };
    ff_rng r;
    ff_rng_seed(&r, 7);
    int checked = 0;
    for (size_t q = 0; q < sizeof insts / sizeof *insts; q++) {
        ff_fuse_instance in = parse_ok(insts[q]);
        double lb, plb;
        ff_fuse_lower_bounds(&in, &lb, &plb);
        ff_fuse_schedule s;
        DIE_IF(ff_fuse_serial(&in, &s));
        for (int it = 0; it < 3000; it++) {
            int32_t n = (int32_t)ff_rng_below(&r, (uint64_t)in.nodes);
            if (s.n_tasks[n] < 2) continue;
            int64_t j = (int64_t)ff_rng_below(&r, (uint64_t)s.n_tasks[n] - 1);
            ff_fuse_task t = s.tasks[n][j];
            s.tasks[n][j] = s.tasks[n][j + 1];
            s.tasks[n][j + 1] = t;
            ff_fuse_sim sim;
            if (ff_fuse_simulate(&in, &s, &sim) != 0) { /* deadlock: undo */
                s.tasks[n][j + 1] = s.tasks[n][j];
                s.tasks[n][j] = t;
                continue;
            }
            checked++;
            CHECK(sim.makespan >= lb - 1e-9);
            double pk = ff_fuse_peak_bound(&in, sim.makespan);
            if (sim.peak_activation < pk - 1e-9) {
                fprintf(stderr, "instance %zu: peak %g below its bound %g at makespan %g\n", q, sim.peak_activation, pk, sim.makespan);
                ff_test_failures++;
                break;
            }
        }
        ff_fuse_schedule_free(&s);
    }
    CHECK(checked > 1000);
}

/* The makespan of the executor's streams for s (ff_fuse_to_pipe, then the pipeline simulator
 * with the instance's times). */
static double streams_makespan(const ff_fuse_instance *in, const ff_fuse_schedule *s) {
    ff_pipe_schedule p;
    DIE_IF(ff_fuse_to_pipe(in, s, NULL, &p));
    double f[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES], b[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES];
    ff_pipe_sim_opts o = {.hop_s = in->hop_latency};
    for (int i = 0; i < in->n_models; i++) {
        for (int32_t k = 0; k < in->models[i].n_stages; k++) f[i][k] = in->models[i].fwd, b[i][k] = in->models[i].bwd;
        o.fwd_stage_s[i] = f[i], o.bwd_stage_s[i] = b[i];
    }
    ff_pipe_sim sim;
    DIE_IF(ff_pipe_simulate(&p, &o, &sim));
    double mk = sim.makespan_s;
    ff_pipe_sim_clear(&sim);
    ff_pipe_schedule_clear(&p);
    return mk;
}

static void test_solver(void) {
    /* the two-model case: 4 is reachable (test_fused_by_hand), so the solver must reach it */
    ff_fuse_instance two = parse_ok(TWO);
    ff_fuse_solve_opts o = {.seconds = 300, .seed = 3, .threads = 2}; /* it stops long before: at the bounds or stale */
    ff_fuse_schedule s;
    ff_fuse_solve_stats st;
    DIE_IF(ff_fuse_solve(&two, &o, &s, &st));
    ff_fuse_sim sim;
    DIE_IF(ff_fuse_simulate(&two, &s, &sim));
    CHECK_CLOSE(sim.makespan, 4, 1e-12, 0);
    CHECK(st.optimal);
    ff_fuse_schedule_free(&s);

    /* the issue's instance: node 2's work (96) plus its unavoidable idle (2 before, 4 after)
     * is 102, the bound; the solver reaches it, well below the serial baseline's */
    ff_fuse_instance in = parse_ok(ISSUE);
    double lb, plb;
    ff_fuse_lower_bounds(&in, &lb, &plb);
    CHECK_CLOSE(lb, 102, 1e-9, 0);
    DIE_IF(ff_fuse_solve(&in, &o, &s, &st));
    DIE_IF(ff_fuse_simulate(&in, &s, &sim));
    CHECK_CLOSE(sim.makespan, 102, 1e-9, 0);
    CHECK(st.optimal);
    CHECK(st.evaluations > 0);
    CHECK(sim.peak_activation >= ff_fuse_peak_bound(&in, sim.makespan) - 1e-12);
    /* what runs: the executor's streams block in their transfers, so they may take longer than
     * the fused makespan; after the search the solver keeps, among the schedules that tie on the
     * fused objective, one whose streams run fastest; here they run the bound (without that
     * step the solver's schedule ran 107) */
    CHECK_CLOSE(streams_makespan(&in, &s), 102, 1e-9, 0);
    ff_fuse_schedule ser;
    ff_fuse_sim ss;
    DIE_IF(ff_fuse_serial(&in, &ser));
    DIE_IF(ff_fuse_simulate(&in, &ser, &ss));
    CHECK(ss.makespan > sim.makespan + 20); /* 127 */
    ff_fuse_schedule_free(&ser);
    /* same seed, same threads, stopped before the time: the same schedule */
    ff_fuse_schedule again;
    DIE_IF(ff_fuse_solve(&in, &o, &again, &st));
    bool same = true;
    for (int32_t n = 0; n < in.nodes; n++)
        same &= again.n_tasks[n] == s.n_tasks[n] && !memcmp(again.tasks[n], s.tasks[n], (size_t)s.n_tasks[n] * sizeof *s.tasks[n]);
    CHECK(same);
    ff_fuse_schedule_free(&again);
    /* a round budget: the same schedule and the same count of evaluations however loaded the
     * machine is (the time budget is far away) */
    ff_fuse_instance heavy = in;
    heavy.models[0].micro = 32; /* large enough not to stop at the bounds within 3 rounds */
    ff_fuse_solve_opts ob = {.seconds = 300, .seed = 5, .threads = 2, .max_rounds = 3};
    ff_fuse_schedule b1, b2;
    ff_fuse_solve_stats s1, s2;
    DIE_IF(ff_fuse_solve(&heavy, &ob, &b1, &s1));
    DIE_IF(ff_fuse_solve(&heavy, &ob, &b2, &s2));
    CHECK(s1.evaluations == s2.evaluations);
    CHECK(s1.seconds < 60);
    printf("3 rounds: %lld evaluations\n", (long long)s1.evaluations);
    CHECK(s1.evaluations < 7000); /* 3 rounds of 48 per thread, the fixed points, at most 1000 moves a thread on the streams and the memory descent's 4000 tries, not the ~250k of a free run */
    same = true;
    for (int32_t n = 0; n < heavy.nodes; n++)
        same &= b1.n_tasks[n] == b2.n_tasks[n] && !memcmp(b1.tasks[n], b2.tasks[n], (size_t)b1.n_tasks[n] * sizeof *b1.tasks[n]);
    CHECK(same);
    ff_fuse_schedule_free(&b1);
    ff_fuse_schedule_free(&b2);

    /* the picture: one row per node, the families named */
    char path[] = "/tmp/ff_test_fuse_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    DIE_IF(ff_fuse_write_svg(&in, &s, path));
    size_t len;
    char *svg = ff_read_file(path, &len);
    REQUIRE(svg);
    CHECK_STR_CONTAINS(svg, "<svg");
    CHECK_STR_CONTAINS(svg, "makespan 102");
    CHECK_STR_CONTAINS(svg, ">node 3<");
    CHECK_STR_CONTAINS(svg, ">critic<");
    CHECK_STR_CONTAINS(svg, "node 2: critic1 B3");
    free(svg);
    unlink(path);
    ff_fuse_schedule_free(&s);
}

/* Every valid schedule of a two-node instance with two micro-batches per model (per node, the
 * 280 orders of its 8 tasks that put each backward after its forward; 78400 in all), simulated:
 * the exact least makespan and, at each makespan, the exact least peak. The makespan bound is
 * at most the least makespan, the peak bound at every makespan T at most the least peak of the
 * schedules that end by T (both bounds valid); the solver reaches the least makespan and, at it,
 * the least peak (a solver whose memory objective is broken keeps a higher one). */
enum { EX_ORDERS = 280 };

static int node_orders(int a, int b, ff_fuse_task out[EX_ORDERS][8]) {
    int n = 0;
    for (int mask = 0; mask < 256; mask++) { /* bits: which model (4 each); then F/B patterns */
        if (__builtin_popcount((unsigned)mask) != 4) continue;
        for (int pa = 0; pa < 2; pa++)
            for (int pb = 0; pb < 2; pb++) { /* FFBB or FBFB per model */
                static const uint8_t pat[2][4] = {{0, 0, 1, 1}, {0, 1, 0, 1}};
                int ka = 0, kb = 0;
                for (int j = 0; j < 8; j++) {
                    bool isb = mask >> j & 1;
                    out[n][j] = (ff_fuse_task){.model = (uint8_t)(isb ? b : a), .backward = isb ? pat[pb][kb++] : pat[pa][ka++]};
                }
                n++;
            }
    }
    return n;
}

enum { MAXV = 4096 };

/* Every valid schedule of a two-node, two-models, two-micro-batch instance: the distinct
 * makespans mks[nv] and the least peak at each, pks. The count of valid schedules. */
static int enumerate(const ff_fuse_instance *in, double *mks, double *pks, int *nv_out) {
    ff_fuse_task o[EX_ORDERS][8];
    REQUIRE(node_orders(0, 1, o) == EX_ORDERS);
    ff_fuse_schedule s;
    DIE_IF(ff_fuse_schedule_init(&s, 2));
    for (int32_t n = 0; n < 2; n++)
        for (int j = 0; j < 8; j++) DIE_IF(ff_fuse_schedule_push(&s, n, o[0][j]));
    int nv = 0, valid = 0;
    for (int x = 0; x < EX_ORDERS; x++)
        for (int y = 0; y < EX_ORDERS; y++) {
            memcpy(s.tasks[0], o[x], sizeof o[x]);
            memcpy(s.tasks[1], o[y], sizeof o[y]);
            ff_fuse_sim sim;
            if (ff_fuse_simulate(in, &s, &sim)) continue;
            valid++;
            int v = 0;
            while (v < nv && mks[v] != sim.makespan) v++;
            if (v == nv) {
                REQUIRE(nv < MAXV);
                mks[nv] = sim.makespan, pks[nv++] = sim.peak_activation;
            } else if (sim.peak_activation < pks[v]) {
                pks[v] = sim.peak_activation;
            }
        }
    ff_fuse_schedule_free(&s);
    *nv_out = nv;
    return valid;
}

/* The least peak of the schedules that end by T. */
static double least_peak_by(const double *mks, const double *pks, int nv, double T) {
    double least = INFINITY;
    for (int u = 0; u < nv; u++)
        if (mks[u] <= T + 1e-12) least = fmin(least, pks[u]);
    return least;
}

static void exhaustive(const char *json, bool solver_reaches_peak) {
    ff_fuse_instance in = parse_ok(json);
    static double mks[MAXV], pks[MAXV]; /* the distinct makespans, the least peak at each */
    int nv = 0, valid = enumerate(&in, mks, pks, &nv);
    CHECK(valid > 1000);
    double lb, plb, best_mk = INFINITY;
    ff_fuse_lower_bounds(&in, &lb, &plb);
    for (int v = 0; v < nv; v++) best_mk = fmin(best_mk, mks[v]);
    CHECK(lb <= best_mk + 1e-9);
    double best_pk = INFINITY; /* the least peak at the least makespan */
    for (int v = 0; v < nv; v++) {
        double least = least_peak_by(mks, pks, nv, mks[v]);
        double bound = ff_fuse_peak_bound(&in, mks[v]);
        if (bound > least + 1e-9) {
            fprintf(stderr, "peak bound %g at makespan %g is above the least peak %g of the schedules that end by then\n", bound, mks[v], least);
            ff_test_failures++;
        }
        if (mks[v] == best_mk) best_pk = least;
    }
    printf("exhaustive: %d valid schedules; least makespan %g (bound %g), least peak there %g (bound %g)\n", valid, best_mk, lb, best_pk,
           ff_fuse_peak_bound(&in, best_mk));
    ff_fuse_solve_opts opt = {.seconds = 60, .seed = 2, .threads = 2, .max_rounds = 200};
    ff_fuse_schedule sol;
    ff_fuse_solve_stats st;
    DIE_IF(ff_fuse_solve(&in, &opt, &sol, &st));
    ff_fuse_sim sim;
    DIE_IF(ff_fuse_simulate(&in, &sol, &sim));
    CHECK_CLOSE(sim.makespan, best_mk, 1e-9, 0);
    if (solver_reaches_peak) CHECK_CLOSE(sim.peak_activation, best_pk, 1e-9, 0);
    ff_fuse_schedule_free(&sol);
    /* the trade: with a slack F, the exact least peak of the schedules that end by (1 + F) x the
     * least makespan (a memory phase that ignored the cap, or the memory, misses it) */
    static const double slacks[] = {0.1, 0.25, 0.5};
    int traded = 0; /* slacks where the least peak under the cap is below the one at the least makespan */
    for (size_t f = 0; f < sizeof slacks / sizeof *slacks; f++) {
        double cap = best_mk * (1 + slacks[f]), least = INFINITY;
        for (int u = 0; u < nv; u++)
            if (mks[u] <= cap + 1e-12) least = fmin(least, pks[u]);
        traded += least < best_pk - 1e-9;
        ff_fuse_solve_opts os = opt;
        os.makespan_slack = slacks[f];
        DIE_IF(ff_fuse_solve(&in, &os, &sol, &st));
        DIE_IF(ff_fuse_simulate(&in, &sol, &sim));
        printf("  slack %g: least peak %g by makespan %g; the solver: peak %g at makespan %g\n", slacks[f], least, cap, sim.peak_activation, sim.makespan);
        CHECK(sim.makespan <= cap + 1e-9);
        CHECK_CLOSE(sim.peak_activation, least, 1e-9, 0);
        ff_fuse_schedule_free(&sol);
    }
    CHECK(traded > 0);
}

/* makespan_slack outside 0..1 (or NaN) is refused with the range named */
static void test_slack_errors(void) {
    ff_fuse_instance in = parse_ok(TWO);
    static const double bad[] = {-0.01, 1.5, NAN};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        ff_fuse_solve_opts o = {.seconds = 1, .seed = 1, .threads = 1, .makespan_slack = bad[k]};
        ff_fuse_schedule s;
        CHECK(ff_fuse_solve(&in, &o, &s, NULL) == -1);
        CHECK_STR_CONTAINS(ff_error_message(), "makespan slack");
        CHECK_STR_CONTAINS(ff_error_message(), "from 0");
        ff_fuse_schedule_free(&s);
    }
}

static void test_exhaustive(void) {
    exhaustive("{\"nodes\": 2, \"models\": ["
               "{\"name\": \"actor\", \"stages\": [0, 1], \"micro_batches\": 2, \"forward\": 2, \"backward\": 4, \"activation\": 2},"
               "{\"name\": \"critic\", \"stages\": [1, 0], \"micro_batches\": 2, \"forward\": 1, \"backward\": 2, \"activation\": 1}]}",
               true);
    exhaustive("{\"nodes\": 2, \"hop_latency\": 0.5, \"models\": ["
               "{\"name\": \"actor\", \"stages\": [0, 1], \"micro_batches\": 2, \"forward\": 1, \"backward\": 2, \"activation\": 1.6},"
               "{\"name\": \"critic\", \"stages\": [1, 0], \"micro_batches\": 2, \"forward\": 1, \"backward\": 2, \"activation\": 1}]}",
               true);
}

/* Random two-node instances (integer times, sometimes a hop latency), every schedule
 * enumerated: the makespan bound never exceeds the least makespan, the propagation never
 * refutes the least makespan itself (the sharpest place for a wrong deduction to show), and the
 * peak bound at every makespan never exceeds the least peak of the schedules that end by it.
 * (Jackson's bound is already tight on these; test_bounds_propagated shows where the
 * propagation raises it.) */
static void test_bounds_exact_random(void) {
    ff_rng r;
    ff_rng_seed(&r, 11);
    static double mks[MAXV], pks[MAXV];
    int tight = 0, peak_tight = 0, n_inst = 24;
    for (int q = 0; q < n_inst; q++) {
        char json[512];
        int fa = 1 + (int)ff_rng_below(&r, 5), fc = 1 + (int)ff_rng_below(&r, 5);
        int ba = fa + (int)ff_rng_below(&r, 2 * (uint64_t)fa), bc = fc + (int)ff_rng_below(&r, 2 * (uint64_t)fc);
        int hop = (int)ff_rng_below(&r, 3) == 0;
        snprintf(json, sizeof json,
                 "{\"nodes\": 2, \"hop_latency\": %d, \"models\": ["
                 "{\"name\": \"actor\", \"stages\": [0, 1], \"micro_batches\": 2, \"forward\": %d, \"backward\": %d, \"activation\": %g},"
                 "{\"name\": \"critic\", \"stages\": [1, 0], \"micro_batches\": 2, \"forward\": %d, \"backward\": %d, \"activation\": 1}]}",
                 hop, fa, ba, 1 + 0.1 * (double)ff_rng_below(&r, 11), fc, bc);
        ff_fuse_instance in = parse_ok(json);
        int nv = 0;
        CHECK(enumerate(&in, mks, pks, &nv) > 100);
        double best = INFINITY, lb, plb;
        for (int v = 0; v < nv; v++) best = fmin(best, mks[v]);
        ff_fuse_lower_bounds(&in, &lb, &plb);
        if (lb > best + 1e-9) fprintf(stderr, "%s: makespan bound %g above the least makespan %g\n", json, lb, best);
        CHECK(lb <= best + 1e-9);
        CHECK(fuse_refutes(&in, best) == 0);
        tight += lb >= best - 1e-9;
        peak_tight += ff_fuse_peak_bound(&in, best) >= least_peak_by(mks, pks, nv, best) - 1e-9;
        for (int v = 0; v < nv; v++) {
            double least = least_peak_by(mks, pks, nv, mks[v]), bound = ff_fuse_peak_bound(&in, mks[v]);
            if (bound > least + 1e-9) {
                fprintf(stderr, "%s: peak bound %g at makespan %g above the least peak %g by then\n", json, bound, mks[v], least);
                ff_test_failures++;
            }
        }
    }
    printf("bounds on %d random instances: makespan bound tight on %d, peak bound at it tight on %d\n", n_inst, tight, peak_tight);
}

/* Where the propagation proves more than Jackson's bound over the models' own windows: 16
 * nodes, the critic PP 16 reversed, 8 micro-batches, 5:4 (bench_fuse's instance 32). Jackson's
 * bound there is 345; the propagation refutes 345 (edge finding on the nodes narrows the
 * windows until one node's tasks cannot fit), and 346 is optimal (the solver reaches it, and
 * CP-SAT, bench/bench_fuse_exact.py, proves 345 infeasible). */
static void test_bounds_propagated(void) {
    ff_fuse_instance in;
    memset(&in, 0, sizeof in);
    in.nodes = 16;
    in.n_models = 2;
    in.models[0] = (ff_fuse_model){.name = "actor", .family = "actor", .n_stages = 16, .micro = 8, .fwd = 5, .bwd = 10, .act = 2.0};
    in.models[1] = (ff_fuse_model){.name = "critic", .family = "critic", .n_stages = 16, .micro = 8, .fwd = 4, .bwd = 8, .act = 1.0};
    for (int s = 0; s < 16; s++) in.models[0].stages[s] = s, in.models[1].stages[s] = 15 - s;
    double lb, plb;
    ff_fuse_lower_bounds(&in, &lb, &plb);
    CHECK_CLOSE(lb, 346, 0, 0);
    CHECK(fuse_refutes(&in, 345) == 1);
    CHECK(fuse_refutes(&in, 346) == 0);
    CHECK(ff_fuse_peak_bound(&in, 346) >= ff_fuse_peak_bound(&in, 400));
}

/* The memory at the makespan bound (issue 13): the lead's 8-node instance (critic PP 8 reversed,
 * 8 micro-batches, 5:4, actor activation 1.6), whose bound 261 is optimal and where CP-SAT finds
 * peak 13.2 at 261 (12.8 infeasible; the peak bound says 11.52). Before the capped and repair
 * cycles of the memory phase this seed ended at peak 16 there (other seeds 16.6); now it must
 * reach 15.6 or less at 261 within a round budget (deterministic: rounds, not time). Still far
 * from 13.2: the search, not the instance, is what is weak. */
static void test_memory_at_bound(void) {
    ff_fuse_instance in;
    DIE_IF(ff_fuse_instance_parse("{\"nodes\": 8, \"models\": ["
                                  "{\"name\": \"actor\", \"stages\": [0, 1, 2, 3, 4, 5, 6, 7], \"micro_batches\": 8, \"forward\": 5, \"backward\": 10, \"activation\": 1.6},"
                                  "{\"name\": \"critic0\", \"stages\": [7, 6, 5, 4, 3, 2, 1, 0], \"micro_batches\": 8, \"forward\": 4, \"backward\": 8, \"activation\": 1.0}]}",
                                  "issue 13's b.json", &in));
    ff_fuse_solve_opts o = {.seconds = 300, .seed = 1, .threads = 2, .max_rounds = 3000};
    ff_fuse_schedule s;
    ff_fuse_solve_stats st;
    DIE_IF(ff_fuse_solve(&in, &o, &s, &st));
    ff_fuse_sim sim;
    DIE_IF(ff_fuse_simulate(&in, &s, &sim));
    printf("memory at the bound: makespan %g, peak %g (its bound 11.52, CP-SAT's 13.2) in %.2f s\n", sim.makespan, sim.peak_activation, st.seconds);
    CHECK_CLOSE(sim.makespan, 261, 1e-9, 0);
    CHECK(sim.peak_activation <= 15.6 + 1e-9);
    ff_fuse_schedule_free(&s);
}

int main(void) {
    test_parse();
    test_simulate_by_hand();
    test_fused_by_hand();
    test_errors();
    test_schedule_json();
    test_bounds_tight_on_1f1b();
    test_bounds_below_random_schedules();
    test_solver();
    test_memory_at_bound();
    test_slack_errors();
    test_exhaustive();
    test_bounds_exact_random();
    test_bounds_propagated();
    TEST_MAIN_END();
}

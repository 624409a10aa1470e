/* ff_fuse_solve_capped: the fastest schedule under a peak activation cap. On the unit instance
 * (4 nodes, actor and reversed critic, 4 micro-batches each, forward 1, backward 2, activation
 * 1): uncapped the fastest is the makespan bound 27 at a peak of 5; capped at the serial 1F1B's
 * peak (4) it takes a makespan slack and fits; a cap no schedule can meet (under one forward's
 * activation) says so with -1 and leaves the least peak it found, valid; a loose cap is
 * ff_fuse_solve at slack 0, schedule for schedule. */
#include "tests/dataflow/fuse_test_util.h"

static ff_fuse_sim simulate(const ff_fuse_instance *in, const ff_fuse_schedule *s) {
    ff_fuse_sim sim;
    if (ff_fuse_simulate(in, s, &sim)) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(sim.makespan > 0);
    return sim;
}

static bool same_lists(const ff_fuse_schedule *a, const ff_fuse_schedule *b) {
    if (a->nodes != b->nodes) return false;
    for (int32_t n = 0; n < a->nodes; n++) {
        if (a->n_tasks[n] != b->n_tasks[n]) return false;
        for (int64_t i = 0; i < a->n_tasks[n]; i++)
            if (a->tasks[n][i].model != b->tasks[n][i].model || a->tasks[n][i].backward != b->tasks[n][i].backward) return false;
    }
    return true;
}

int main(void) {
    ff_fuse_instance in = fz_layout(false, 4, 4, 1, 1);
    ff_fuse_schedule serial, s, plain;
    fz_serial(&in, &serial);
    const ff_fuse_sim ss = simulate(&in, &serial);
    CHECK_CLOSE(ss.peak_activation, 4, 0, 0);
    const ff_fuse_solve_opts o = {.seconds = 60, .seed = 3, .threads = 1, .max_rounds = 400};
    ff_fuse_solve_stats st;
    double slack = -2;

    /* loose: the uncapped solve itself */
    REQUIRE(ff_fuse_solve(&in, &o, &plain, &st) == 0);
    const ff_fuse_sim sp = simulate(&in, &plain);
    CHECK_CLOSE(sp.makespan, 27, 0, 0);
    CHECK(sp.peak_activation > ss.peak_activation); /* what the cap below is for */
    REQUIRE(ff_fuse_solve_capped(&in, &o, 100, &s, &st, &slack) == 0);
    CHECK(slack == 0);
    CHECK(same_lists(&s, &plain));
    fz_free(&s);

    /* at the serial peak: a slack, a peak that fits, faster than serial still */
    REQUIRE(ff_fuse_solve_capped(&in, &o, ss.peak_activation, &s, &st, &slack) == 0);
    const ff_fuse_sim sc = simulate(&in, &s);
    printf("capped at the serial peak %g: slack %g, makespan %g (uncapped %g at peak %g, serial %g)\n", ss.peak_activation, slack,
           sc.makespan, sp.makespan, sp.peak_activation, ss.makespan);
    CHECK(slack > 0 && slack <= 1);
    CHECK(sc.peak_activation <= ss.peak_activation);
    CHECK(sc.makespan >= sp.makespan && sc.makespan <= (1 + slack) * sp.makespan && sc.makespan < ss.makespan);
    fz_free(&s);

    /* under one forward's activation: nothing fits; the least found comes back, valid */
    slack = -2;
    REQUIRE(ff_fuse_solve_capped(&in, &o, 0.5, &s, &st, &slack) == 0);
    CHECK(slack == -1);
    const ff_fuse_sim sn = simulate(&in, &s);
    CHECK(sn.peak_activation >= 1 && sn.peak_activation < sp.peak_activation);
    fz_free(&s);

    fz_free(&plain);
    fz_free(&serial);
    TEST_MAIN_END();
}

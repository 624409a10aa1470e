/* The fused solver's memory descent and memory walk (dataflow/fuse_mem.c fuse_mem_descend,
 * fuse_mem_walk): GPipe's order (all forwards, then all backwards) has 1F1B's makespan and m
 * micro-batches in flight; the descent, keeping the makespan, must bring it down to 1F1B's S - s.
 * The walk, from two models' GPipe-like order, must lower the peak under the same makespan, the
 * same way for the same seed, and move nothing when it cannot gain. And in the solver: on an
 * instance of the bench's family the peak at the makespan bound must be lower than the search
 * without them reached with the same rounds. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dataflow/fuse_internal.h"
#include "fuseflow/fuse.h"
#include "tests/test_util.h"

static void gpipe_to_1f1b(int32_t S, int32_t m) {
    char buf[512], stages[64] = "";
    for (int32_t s = 0; s < S; s++) snprintf(stages + strlen(stages), sizeof stages - strlen(stages), "%s%d", s ? ", " : "", s);
    snprintf(buf, sizeof buf, "{\"nodes\": %d, \"models\": [{\"name\": \"a\", \"stages\": [%s], \"micro_batches\": %d, \"forward\": 2, \"backward\": 3, \"activation\": 0.5}]}",
             S, stages, m);
    ff_fuse_instance in;
    DIE_IF(ff_fuse_instance_parse(buf, "gpipe", &in));
    ff_fuse_schedule s;
    DIE_IF(ff_fuse_schedule_init(&s, S));
    for (int32_t n = 0; n < S; n++)
        for (int b = 0; b < 2; b++)
            for (int32_t k = 0; k < m; k++) DIE_IF(ff_fuse_schedule_push(&s, n, (ff_fuse_task){.model = 0, .backward = (uint8_t)b}));
    ff_fuse_sim before, after;
    DIE_IF(ff_fuse_simulate(&in, &s, &before));
    double T = (m + S - 1) * 5.0; /* 1F1B's makespan, and GPipe's */
    CHECK_CLOSE(before.makespan, T, 1e-9, 0);
    CHECK_CLOSE(before.peak_activation, 0.5 * m, 1e-12, 0);
    fuse_ctx c;
    DIE_IF(fuse_ctx_init(&c, &in));
    int64_t tries = 0;
    int gains = fuse_mem_descend(&c, &s, T, 100000, &tries);
    DIE_IF(ff_fuse_simulate(&in, &s, &after));
    printf("GPipe S %d m %d: peak %g -> %g at makespan %g (%d moves, %lld simulations)\n", S, m, before.peak_activation, after.peak_activation, after.makespan,
           gains, (long long)tries);
    CHECK(gains > 0);
    CHECK(after.makespan <= T + 1e-9);
    CHECK_CLOSE(after.peak_activation, 0.5 * S, 1e-12, 0); /* 1F1B's, the peak bound there */
    for (int32_t n = 0; n < S; n++) CHECK(after.node_peak[n] <= 0.5 * (S - n) + 1e-12);
    /* a cap below the schedule's makespan: nothing to do, the schedule is left as it is */
    ff_fuse_schedule copy;
    DIE_IF(ff_fuse_schedule_copy(&s, &copy));
    CHECK(fuse_mem_descend(&c, &copy, T - 1, 100000, &tries) == 0 && tries == 0);
    for (int32_t n = 0; n < S; n++) CHECK(memcmp(copy.tasks[n], s.tasks[n], (size_t)s.n_tasks[n] * sizeof **s.tasks) == 0);
    ff_fuse_schedule_free(&copy);
    fuse_ctx_free(&c);
    ff_fuse_schedule_free(&s);
}

/* bench_fuse's 8 nodes, critic PP 8 reversed, 32 micro-batches, forward 2:1, activation 1.8 (its
 * bounds: makespan 300, peak 10.8). With seed 1, 2 threads and 40 rounds the search (with the
 * makespan repair, fuse_lns.c) ends at peak 46.4 at 300 without the descent (DESCEND_TRIES 0);
 * with it the same search ends at 45.4. */
static void solver_descends(void) {
    char buf[1024] = "{\"nodes\": 8, \"models\": [{\"name\": \"actor\", \"stages\": [0, 1, 2, 3, 4, 5, 6, 7], \"micro_batches\": 32, "
                     "\"forward\": 2, \"backward\": 4, \"activation\": 1.8}, {\"name\": \"critic0\", \"stages\": [7, 6, 5, 4, 3, 2, 1, 0], "
                     "\"micro_batches\": 32, \"forward\": 1, \"backward\": 2, \"activation\": 1.0}]}";
    ff_fuse_instance in;
    DIE_IF(ff_fuse_instance_parse(buf, "bench instance", &in));
    ff_fuse_solve_opts o = {.seconds = 300, .seed = 1, .threads = 2, .max_rounds = 40};
    ff_fuse_schedule s;
    ff_fuse_solve_stats st;
    DIE_IF(ff_fuse_solve(&in, &o, &s, &st));
    ff_fuse_sim sim;
    DIE_IF(ff_fuse_simulate(&in, &s, &sim));
    printf("8 nodes, 32 micro-batches, 2:1: makespan %g, peak %g (without the descent: 46.4) in %.2f s\n", sim.makespan, sim.peak_activation, st.seconds);
    CHECK_CLOSE(sim.makespan, 300, 1e-9, 0);
    CHECK(sim.peak_activation <= 45.4 + 1e-9);
    ff_fuse_schedule_free(&s);
}

/* Without activation memory no move is a gain: none is made, and the schedule stays as it is. */
static void no_memory_no_moves(void) {
    ff_fuse_instance in;
    DIE_IF(ff_fuse_instance_parse("{\"nodes\": 2, \"models\": [{\"name\": \"a\", \"stages\": [0, 1], \"micro_batches\": 4, \"forward\": 1, \"backward\": 2, \"activation\": 0}]}",
                                  "no memory", &in));
    ff_fuse_schedule s, before;
    DIE_IF(ff_fuse_schedule_init(&s, 2));
    for (int32_t n = 0; n < 2; n++)
        for (int b = 0; b < 2; b++)
            for (int32_t k = 0; k < 4; k++) DIE_IF(ff_fuse_schedule_push(&s, n, (ff_fuse_task){.model = 0, .backward = (uint8_t)b}));
    DIE_IF(ff_fuse_schedule_copy(&s, &before));
    fuse_ctx c;
    DIE_IF(fuse_ctx_init(&c, &in));
    int64_t tries = -1;
    CHECK(fuse_mem_descend(&c, &s, 1000, 100000, &tries) == 0);
    CHECK(tries == 0);
    for (int32_t n = 0; n < 2; n++) CHECK(memcmp(before.tasks[n], s.tasks[n], (size_t)s.n_tasks[n] * sizeof **s.tasks) == 0);
    fuse_ctx_free(&c);
    ff_fuse_schedule_free(&before);
    ff_fuse_schedule_free(&s);
}

static bool same_lists(const ff_fuse_schedule *a, const ff_fuse_schedule *b) {
    bool same = a->nodes == b->nodes;
    for (int32_t n = 0; same && n < a->nodes; n++)
        same = a->n_tasks[n] == b->n_tasks[n] && !memcmp(a->tasks[n], b->tasks[n], (size_t)a->n_tasks[n] * sizeof **a->tasks);
    return same;
}

/* The walk on two models in opposite directions (the bench's 8 nodes, critic PP 8, 16
 * micro-batches, 2:1, activation 1.8), from the order that holds everything: on every node all the
 * actor's forwards, all the critic's, then the critic's backwards and the actor's (it runs: a
 * forward waits only for forwards, a backward for the other model's backwards on the same node
 * and its own chain). */
static void walk_lowers(void) {
    const char *buf = "{\"nodes\": 8, \"models\": [{\"name\": \"actor\", \"stages\": [0, 1, 2, 3, 4, 5, 6, 7], \"micro_batches\": 16, "
                      "\"forward\": 2, \"backward\": 4, \"activation\": 1.8}, {\"name\": \"critic0\", \"stages\": [7, 6, 5, 4, 3, 2, 1, 0], "
                      "\"micro_batches\": 16, \"forward\": 1, \"backward\": 2, \"activation\": 1.0}]}";
    ff_fuse_instance in;
    DIE_IF(ff_fuse_instance_parse(buf, "walk instance", &in));
    ff_fuse_schedule s, a, b;
    DIE_IF(ff_fuse_schedule_init(&s, 8));
    for (int32_t n = 0; n < 8; n++) {
        static const uint8_t order[4][2] = {{0, 0}, {1, 0}, {1, 1}, {0, 1}}; /* (model, backward) */
        for (int g = 0; g < 4; g++)
            for (int32_t k = 0; k < 16; k++) DIE_IF(ff_fuse_schedule_push(&s, n, (ff_fuse_task){.model = order[g][0], .backward = order[g][1]}));
    }
    ff_fuse_sim before, after;
    DIE_IF(ff_fuse_simulate(&in, &s, &before));
    CHECK_CLOSE(before.peak_activation, 16 * 2.8, 1e-9, 0); /* every micro-batch of both in flight */
    double cap = before.makespan;
    fuse_ctx c;
    DIE_IF(fuse_ctx_init(&c, &in));
    DIE_IF(ff_fuse_schedule_copy(&s, &a));
    DIE_IF(ff_fuse_schedule_copy(&s, &b));
    int64_t tries = 0, tries_b = 0;
    int lowered = fuse_mem_walk(&c, &a, cap, 0, 7, 30000, 0, &tries);
    DIE_IF(ff_fuse_simulate(&in, &a, &after));
    printf("walk, 2 models: peak %g -> %g at makespan %g <= %g (%d times lower, %lld simulations)\n", before.peak_activation, after.peak_activation,
           after.makespan, cap, lowered, (long long)tries);
    CHECK(lowered > 0);
    CHECK(after.makespan <= cap + 1e-9);
    CHECK(after.peak_activation < 0.7 * before.peak_activation); /* 44.8 -> 29.8 */
    /* the same seed and tries: the same lists */
    CHECK(fuse_mem_walk(&c, &b, cap, 0, 7, 30000, 0, &tries_b) == lowered && tries_b == tries);
    CHECK(same_lists(&a, &b));
    /* at its floor already, or over the cap: nothing tried, the lists as they were */
    ff_fuse_schedule_free(&b);
    DIE_IF(ff_fuse_schedule_copy(&s, &b));
    CHECK(fuse_mem_walk(&c, &b, cap, before.peak_activation, 7, 30000, 0, &tries_b) == 0 && tries_b == 0);
    CHECK(fuse_mem_walk(&c, &b, cap - 1, 0, 7, 30000, 0, &tries_b) == 0 && tries_b == 0);
    CHECK(same_lists(&s, &b));
    fuse_ctx_free(&c);
    ff_fuse_schedule_free(&a);
    ff_fuse_schedule_free(&b);
    ff_fuse_schedule_free(&s);
}

int main(void) {
    no_memory_no_moves();
    walk_lowers();
    gpipe_to_1f1b(4, 8);
    gpipe_to_1f1b(3, 7);
    gpipe_to_1f1b(1, 5);
    solver_descends();
    TEST_MAIN_END();
}

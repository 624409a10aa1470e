/* `migrate: auto`'s measurements and decision (controller/rl/exec_rollout.c) on synthetic
 * timings: workers decoding their jobs in lockstep at a known step cost (a + b x batch
 * seconds), their results as the controller would receive them. Checks that
 *   - nothing is simulated before an iteration was measured, nor from an iteration that
 *     migrated before any job ended (its jobs end early: no lockstep to read);
 *   - an iteration that migrated is read up to the decision, the sources' jobs left out (a
 *     run that migrates every iteration still follows its costs);
 *   - the fit finds the step's fixed and per-sequence costs (within the reconstruction's error)
 *     and the inference forwards' seconds per token;
 *   - with a fixed cost per step (decoding memory bound, as on a GPU) and a long tail, auto
 *     picks a threshold and survivors that the simulation says save time; with the step in
 *     proportion to the batch and no inference to take, it picks none (nothing to gain);
 *   - a fixed threshold gets the prediction at that threshold;
 *   - a migration's cost is fitted as a latency plus a cost per moved sample. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

#define JOBS 16 /* per worker */
#define N 8     /* samples per job */
#define PLEN 6

/* One iteration on `workers` workers: every job starts at once; job lengths log-normal with a
 * long tail (median 8, a few near 90); each worker runs its jobs in lockstep, a step costing
 * a + b x running samples; each finished sample's forwards cost `inf` s per token after the
 * worker's last job (one inference subtask per job). `moved_rank` (-1: none) is a migration's
 * source: its job that ends last is reported moved (its samples left it). Returns the time the
 * first worker's last job ended. */
static int64_t iteration(ex_run *x, int workers, double a, double b, double inf, uint64_t seed, int moved_rank) {
    int64_t first_done = INT64_MAX;
    ff_rng rng;
    ff_rng_seed(&rng, seed);
    for (int w = 0; w < workers; w++) {
        int32_t len[JOBS][N];
        for (int j = 0; j < JOBS; j++)
            for (int i = 0; i < N; i++) {
                double l = floor(8 * exp(0.99 * ff_rng_normal(&rng)) + 0.5);
                len[j][i] = l < 1 ? 1 : l > 96 ? 96 : (int32_t)l;
            }
        int64_t t0 = 1000000000, t = t0, end[JOBS];
        int32_t lmax[JOBS] = {0};
        for (int j = 0; j < JOBS; j++)
            for (int i = 0; i < N; i++)
                if (len[j][i] > lmax[j]) lmax[j] = len[j][i];
        for (int step = 1; step <= 96; step++) {
            int running = 0;
            for (int j = 0; j < JOBS; j++)
                for (int i = 0; i < N; i++) running += len[j][i] >= step;
            if (!running) break;
            t += (int64_t)((a + b * running) * 1e9);
            for (int j = 0; j < JOBS; j++)
                if (lmax[j] == step) end[j] = t;
        }
        int last = 0;
        for (int j = 1; j < JOBS; j++)
            if (end[j] > end[last]) last = j;
        if (end[last] < first_done) first_done = end[last];
        for (int j = 0; j < JOBS; j++) {
            ex_rollout_gen(x, w, t0, end[j], PLEN, len[j], N, w == moved_rank && j == last);
            ex_rollout_final(x, PLEN, len[j], N);
        }
        int64_t s = t;
        for (int j = 0; j < JOBS; j++) { /* inference after the worker's generation: no overlap to take off */
            int64_t tok = 0;
            for (int i = 0; i < N; i++) tok += PLEN + len[j][i];
            int64_t e = s + (int64_t)(inf * (double)tok * 1e9) + 1;
            ex_rollout_infer(x, 3, w, s, e, tok);
            s = e;
        }
    }
    return first_done;
}

static ex_run *run_new(void) {
    ex_run *x = calloc(1, sizeof *x);
    REQUIRE(x);
    return x;
}

static void run_free(ex_run **x) {
    ex_rollout_free(&(*x)->ro);
    CHECK(!(*x)->ro);
    free(*x);
    *x = NULL;
}

int main(void) {
    ex_rollout_plan p;
    ex_iter I;
    memset(&I, 0, sizeof I);

    /* 1. nothing measured: no plan; an iteration that migrated before any job ended teaches no
     * step costs */
    ex_run *x = run_new();
    CHECK(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &p) == 0 && !p.valid);
    iteration(x, 2, 2e-3, 1e-5, 2e-5, 1, -1);
    I.mig_sources = 1, I.mig_moved = 8, I.mig_t0_ns = 1, I.mig_t1_ns = 1 + 1000000;
    ex_rollout_finish(x, &I);
    CHECK(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &p) == 0 && !p.valid);
    run_free(&x);

    /* 2. a fixed cost per step (2 ms) beside a small one per sequence (10 us): the fit finds
     * both, and auto migrates the tail for a simulated gain */
    memset(&I, 0, sizeof I);
    x = run_new();
    iteration(x, 2, 2e-3, 1e-5, 2e-5, 2, -1);
    ex_rollout_finish(x, &I);
    REQUIRE(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &p) == 0 && p.valid);
    CHECK(fabs(p.step_a - 2e-3) < 0.3 * 2e-3);
    CHECK(p.step_b < 1e-4);
    CHECK(fabs(p.infer_per_tok - 2e-5) < 1e-3 * 2e-5);
    CHECK(p.rt > 0 && p.rt <= 0.5);
    CHECK(p.survivors == 1);
    CHECK(p.migrate_s < 0.99 * p.fused_s && p.fused_s <= p.serial_s);
    ff_log(FF_LOG_INFO, "fixed step cost: a %.3g ms, b %.3g ms, R_t %.3g, %.4f s against %.4f s fused, %.4f s serial", p.step_a * 1e3,
           p.step_b * 1e3, p.rt, p.migrate_s, p.fused_s, p.serial_s);
    /* a fixed threshold: the prediction at it, onto one survivor */
    ex_rollout_plan q;
    REQUIRE(ex_rollout_plan_stage(x, 2, 256, 100, 0.25, 1, &q) == 0 && q.valid);
    CHECK(q.rt == 0.25 && q.survivors == 1 && q.fused_s == p.fused_s && q.migrate_s >= p.migrate_s);
    /* 4 workers: the tail ends the stage after the inference is done on the freed workers:
     * migration does not shorten it, and auto keeps to no migration unless it gains */
    REQUIRE(ex_rollout_plan_stage(x, 4, 256, 100, -1, -1, &q) == 0 && q.valid);
    CHECK(q.migrate_s <= q.fused_s && q.fused_s < p.fused_s && (q.rt == 0) == (q.survivors == 0));

    /* migrations of 2 samples in 24 ms and of 7 in 28 ms: 22.4 ms + 0.8 ms a sample; the fit
     * of the decode step is left as it was (those iterations migrated before any job ended) */
    const double a0 = p.step_a;
    memset(&I, 0, sizeof I);
    I.mig_sources = 1, I.mig_moved = 2, I.mig_t0_ns = 1000, I.mig_t1_ns = 1000 + 24000000;
    iteration(x, 2, 1e-3, 1e-5, 2e-5, 4, -1);
    ex_rollout_finish(x, &I);
    I.mig_moved = 7, I.mig_t1_ns = 1000 + 28000000;
    ex_rollout_finish(x, &I);
    REQUIRE(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &q) == 0 && q.valid);
    CHECK_CLOSE(q.move_latency_s, 0.0224, 1e-9, 1e-6);
    CHECK_CLOSE(q.move_per_sample_s, 0.0008, 1e-9, 1e-6);
    CHECK(q.step_a == a0);
    memset(&I, 0, sizeof I);
    run_free(&x);

    /* 4. a run that migrates every iteration: the step costs halve (2 ms to 1 ms) after its
     * first; each migrated iteration is read up to the decision, without the source's jobs */
    x = run_new();
    iteration(x, 2, 2e-3, 1e-5, 2e-5, 5, -1);
    ex_rollout_finish(x, &I);
    REQUIRE(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &p) == 0 && p.valid);
    CHECK(p.step_jobs == 2 * JOBS);
    I.mig_sources = 1, I.mig_moved = 3;
    int64_t done = iteration(x, 2, 1e-3, 1e-5, 2e-5, 6, 1);
    I.mig_t0_ns = done - 1, I.mig_t1_ns = done + 1000000; /* just before a worker's last job ended */
    ex_rollout_finish(x, &I);
    REQUIRE(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &q) == 0 && q.valid);
    CHECK(q.step_jobs > 2 * JOBS && q.step_jobs < 3 * JOBS); /* worker 0's, all but its last */
    for (uint64_t seed = 7; seed < 10; seed++) {
        I.mig_t0_ns = INT64_MAX / 2; /* after every job: worker 0's all */
        iteration(x, 2, 1e-3, 1e-5, 2e-5, seed, 1);
        ex_rollout_finish(x, &I);
    }
    ex_rollout_plan q2;
    REQUIRE(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &q2) == 0 && q2.valid);
    CHECK(q2.step_jobs == q.step_jobs + 3 * JOBS);
    CHECK(q2.step_a < 0.85 * p.step_a && q2.step_a > 0.7e-3);
    ff_log(FF_LOG_INFO, "migrating every iteration: a %.3g ms after the first, %.3g ms after four more at 1 ms", p.step_a * 1e3,
           q2.step_a * 1e3);
    memset(&I, 0, sizeof I);
    run_free(&x);

    /* 3. a step in proportion to its batch and no inference: consolidating saves nothing */
    x = run_new();
    iteration(x, 2, 0, 5e-5, 0, 3, -1);
    ex_rollout_finish(x, &I);
    REQUIRE(ex_rollout_plan_stage(x, 2, 256, 100, -1, -1, &p) == 0 && p.valid);
    CHECK(p.step_a < 0.2 * 5e-5 * 64); /* the fixed part small beside a typical batch's */
    CHECK(fabs(p.step_b - 5e-5) < 0.3 * 5e-5);
    CHECK(p.rt == 0 && p.survivors == 0 && p.migrate_s == p.fused_s);
    ff_log(FF_LOG_INFO, "proportional step: a %.3g ms, b %.3g ms, R_t %.3g", p.step_a * 1e3, p.step_b * 1e3, p.rt);
    run_free(&x);
    TEST_MAIN_END();
}

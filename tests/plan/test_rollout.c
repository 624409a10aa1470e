/* The generation + inference simulator (plan_rollout.c): with measured costs that make the
 * timeline computable by hand (every decode step and prefill 1 s, every sample's forwards 1
 * GPU-second, a KV move 0.5 s), the serial, overlapped and migrated totals are the ones worked
 * out in the comments, the tail moves onto the instance that holds the most; equal lengths make
 * overlap exactly serial and migration useless; on RLHFuse's 65B setting the roofline gives
 * overlapped <= serial and auto migration <= overlapped; bad inputs are refused by name. */
#include <math.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "tests/test_util.h"

static double step_1s(void *ctx, int64_t batch, int64_t context) {
    (void)ctx, (void)batch, (void)context;
    return 1.0;
}
static double infer_1s(void *ctx, int64_t tokens) {
    (void)ctx, (void)tokens;
    return 1.0;
}
static double move_half(void *ctx, int64_t tokens) {
    (void)ctx, (void)tokens;
    return 0.5;
}

static void measured(ff_plan_rollout_input *in, int64_t gpus, const int64_t *lens, int64_t n) {
    ff_plan_rollout_input_defaults(in);
    in->cluster.gpus = gpus;
    in->gen_tp = 1;
    in->samples = n;
    in->lengths = lens;
    in->prompt_len = 1;
    in->max_len = 16;
    in->step_s = step_1s, in->infer_gpu_s = infer_1s, in->move_s = move_half;
}

static double step_per_seq(void *ctx, int64_t batch, int64_t context) {
    (void)ctx, (void)context;
    return 1.0 + (double)batch;
}
static double infer_5s(void *ctx, int64_t tokens) {
    (void)ctx, (void)tokens;
    return 5.0;
}

#define EXACT(a, b) CHECK_CLOSE((a), (b), 1e-12, 0.0)

int main(void) {
    ff_plan_rollout_input in;
    ff_plan_rollout r;

    /* 2 instances; round-robin: instance 0 gets samples 0 and 2 (1 token each), instance 1 gets
     * 1 (1 token) and 3 (9). Prefill 1 s + step 1 s: instance 0 is done at 2, instance 1 at 10.
     * Serial: 10 + 4 GPU-s / 2 = 12. Overlapped: at 2 three forwards wait and one GPU is free
     * (done by 5); at 10 the last one on both GPUs: 10.5. */
    const int64_t a[] = {1, 1, 1, 9};
    measured(&in, 2, a, 4);
    in.migrate = 0;
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    CHECK_EQ_INT(r.instances, 2);
    EXACT(r.overlap.gen_s, 10);
    EXACT(r.serial_s, 12);
    EXACT(r.overlap.total_s, 10.5);
    EXACT(r.migrate.total_s, 10.5); /* off: the same run */
    CHECK_EQ_INT(r.migrate.moved, 0);
    EXACT(r.infer_gpu_s, 4);
    EXACT(r.longest, 9);

    /* 4 instances, 8 samples; instances 2 and 3 each hold a 9-token sample. After the first
     * step (t = 2) two samples still decode: at R_t 0.25 (threshold 2) the one of instance 3
     * moves onto instance 2 (ties go to the lower index), arriving at 2.5; instance 2 decodes
     * its own alone for a step, then both: they end at 10 and 11. Forwards: 6 wait at 2 on 2 GPUs,
     * a third GPU from 2.5; all done before 10; then 1 at 10 and 1 at 11 on all 4: 11.25.
     * Without migration: both tails end at 10, total 10 + 2/4 = 10.5. Constant step costs make
     * consolidation useless, and auto must see that. */
    const int64_t b[] = {1, 1, 1, 1, 1, 1, 9, 9};
    measured(&in, 4, b, 8);
    in.migrate = 0.25;
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    EXACT(r.overlap.total_s, 10.5);
    EXACT(r.migrate.rt, 0.25);
    EXACT(r.migrate.migrate_at_s, 2);
    CHECK_EQ_INT(r.migrate.moved, 1);
    CHECK_EQ_INT(r.migrate.survivors, 1);
    EXACT(r.migrate.moved_tokens, 2); /* prompt 1 + 1 generated */
    EXACT(r.migrate.move_s, 0.5);
    EXACT(r.migrate.gen_s, 11);
    EXACT(r.migrate.total_s, 11.25);
    in.move_latency_s = 0.25; /* once per sender, before its first sample */
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    EXACT(r.migrate.move_s, 0.75);
    in.move_latency_s = 0;
    in.migrate = -1;
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    EXACT(r.migrate.total_s, 10.5);
    CHECK_EQ_INT(r.migrate.moved, 0);
    CHECK(r.n_sweep == FF_PLAN_ROLLOUT_SWEEP);

    /* Survivors: with a step costing 1 s + 1 s per sequence the saturation rule keeps every
     * sample where it is (a batch of 2 costs 1.5 x one), yet one survivor frees the other
     * instance for heavy inference (5 GPU-s a sample); auto with survivors < 0 finds that.
     * Two instances each hold one 9-token tail behind three 1-token samples. */
    const int64_t c[] = {9, 9, 1, 1, 1, 1, 1, 1};
    measured(&in, 2, c, 8);
    in.step_s = step_per_seq, in.infer_gpu_s = infer_5s;
    in.migrate = -1;
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    CHECK_EQ_INT(r.migrate.moved, 0); /* survivors 0: the saturation rule, as before */
    const double rule_s = r.migrate.total_s;
    in.survivors = -1;
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    CHECK_EQ_INT(r.migrate.moved, 1);
    CHECK_EQ_INT(r.migrate.survivors, 1);
    CHECK(r.migrate.total_s < rule_s - 1);
    CHECK(r.migrate.gen_s > r.overlap.gen_s); /* the tail itself is slower on one instance */
    in.survivors = 2;
    CHECK(ff_plan_rollout_simulate(&in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "2 survivors of 2 instances");

    /* The roofline on RLHFuse's largest setting: 65B actor at TP 8 on 64 H100s, reference 65B and
     * reward and critic 33B, responses up to 1024 with a long tail. */
    ff_plan_rollout_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama-65b", &in.actor) == 0);
    REQUIRE(ff_plan_model_preset("llama-65b", &in.infer[0]) == 0);
    REQUIRE(ff_plan_model_preset("llama-33b", &in.infer[1]) == 0);
    REQUIRE(ff_plan_model_preset("llama-33b", &in.infer[2]) == 0);
    in.n_infer = 3;
    in.cluster.gpus = 64;
    in.gen_tp = 8;
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    CHECK_EQ_INT(r.instances, 8);
    CHECK(r.batch_saturation >= 1 && r.batch_saturation <= r.batch_cap);
    CHECK(r.overlap.total_s <= r.serial_s + 1e-9);
    CHECK(r.migrate.total_s <= r.overlap.total_s + 1e-9);
    CHECK(r.migrate.moved > 0);                           /* this tail pays for a move */
    CHECK(r.serial_s / r.migrate.total_s > 1.1);          /* the paper reports 1.2-1.6x */
    CHECK(r.migrate.gen_s >= r.overlap.gen_s - 1e-9);     /* consolidation never speeds the tail itself */
    /* the weights alone: 130 GB over 8 GPUs at 3.35 TB/s is 4.9 ms per step, so >= 1024 steps take >= 5 s */
    CHECK(r.overlap.gen_s > 1024 * ff_plan_params_total(&in.actor) * 2 / 8 / 3.35e12);

    /* equal lengths: every instance ends together, so overlap is serial and nothing moves */
    in.p99_ratio = 1;
    REQUIRE(ff_plan_rollout_simulate(&in, &r) == 0);
    CHECK_CLOSE(r.overlap.total_s, r.serial_s, 1e-12, 1e-12);
    CHECK_CLOSE(r.migrate.total_s, r.serial_s, 1e-12, 1e-12);
    CHECK_EQ_INT(r.migrate.moved, 0);
    char *js = ff_plan_rollout_json(&in, &r);
    REQUIRE(js != NULL);
    CHECK(strstr(js, "\"serial_s\"") && strstr(js, "\"migrate\"") && strstr(js, "\"batch_saturation\""));
    free(js);

    /* refusals */
    in.gen_tp = 3;
    CHECK(ff_plan_rollout_simulate(&in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "gen TP 3 does not divide 64 GPUs");
    in.gen_tp = 1;
    CHECK(ff_plan_rollout_simulate(&in, &r) == -1); /* 130 GB of weights on one 80 GB GPU */
    CHECK_STR_CONTAINS(ff_error_message(), "leaves no room for one sequence");
    in.gen_tp = 8, in.median_len = 2000;
    CHECK(ff_plan_rollout_simulate(&in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "median 2000");
    const int64_t bad[] = {1, 17};
    measured(&in, 2, bad, 2);
    CHECK(ff_plan_rollout_simulate(&in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "sample 1 has length 17 (max 16)");
    measured(&in, 2, a, 4);
    in.move_s = NULL;
    CHECK(ff_plan_rollout_simulate(&in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "all three measured costs");
    measured(&in, 2, a, 4);
    in.migrate = 1.5;
    CHECK(ff_plan_rollout_simulate(&in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "R_t is a fraction");
    TEST_MAIN_END();
}

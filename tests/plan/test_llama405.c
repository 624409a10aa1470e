/* The chapter's section 3.7: Llama 3 405B on 16,384 H100s, the 8K layout TP8-PP16-DP128 and the
 * 128K layout TP8-CP16-PP16-DP8, b = 1, G = 16, v = 1, reproduced by the full planner.
 *
 * The chapter counts "per GPU" with the average stage, L/p = 126/16 = 7.875 layers and
 * 405B/(t p) parameters. The planner places whole layers (7, 8 x 14, 7) and reports the busiest
 * stage's GPU plus the mean over all GPUs. The mean is the chapter's figure and is held to 1%;
 * the busiest stage (8 layers) is held to the chapter's figure times 8/7.875. */
#include <math.h>

#include "fuseflow/plan.h"
#include "tests/test_util.h"

#define PCT1 0.01

/* ZeRO-1 with 1F1B, or ZeRO-2 with all-forward-all-backward (Llama 3's rule for bs < 2 PP): both
 * reduce the gradients once per step, the DP row of the chapter's table. */
static void setup(ff_plan_input *in, bool long_context, int zero) {
    ff_plan_input_defaults(in);
    REQUIRE(ff_plan_model_preset("llama3-405b", &in->model) == 0);
    REQUIRE(ff_plan_cluster_preset("dgx-h100", &in->cluster) == 0);
    in->cluster.gpus = 16384;
    in->layout.tp = 8;
    in->layout.pp = 16;
    in->layout.cp = long_context ? 16 : 1;
    in->layout.zero = zero;
    in->layout.schedule = zero == 2 ? FF_PLAN_AFAB : FF_PLAN_1F1B;
    in->workload.seq = long_context ? 131072 : 8192;
    in->workload.micro_batch = 1;
    in->workload.micro_batches = 16;
    in->workload.grad_reduce_bytes = 4; /* FP32 reduce-scatter, BF16 all-gather: (4 + 2) bytes */
    in->workload.grad_bytes = 2;
}

static void common_rows(const ff_plan_result *r) {
    /* placement: one fewer layer on the first and the last stage */
    CHECK_EQ_INT(r->n_stages, 16);
    CHECK_EQ_INT(r->stages[0].layers, 7);
    CHECK_EQ_INT(r->stages[15].layers, 7);
    for (int s = 1; s < 15; s++) CHECK_EQ_INT(r->stages[s].layers, 8);
    /* one activation tensor 8192 x 16384 x 2 = 268 MB; 504 TP collectives per step on average */
    CHECK_CLOSE(r->traffic[FF_PLAN_TP].message_bytes, 268e6, 0, PCT1);
    CHECK_CLOSE(r->traffic[FF_PLAN_TP].messages, 512.0, 0, 0); /* busiest: 4 x 8 layers x 16 */
    /* the mean over stages: each collective sends 2 (t-1)/t = 1.75 times its message */
    CHECK_CLOSE(r->traffic[FF_PLAN_TP].bytes_mean / (1.75 * r->traffic[FF_PLAN_TP].message_bytes), 504.0, 0, 1e-9);
    /* TP: 504 x 1.75 x 268 MB = 237 GB, on NVLink */
    CHECK_CLOSE(r->traffic[FF_PLAN_TP].bytes_mean, 237e9, 0, PCT1);
    CHECK_CLOSE(r->traffic[FF_PLAN_TP].bytes, 237e9 * 8.0 / 7.875, 0, PCT1);
    CHECK(r->traffic[FF_PLAN_TP].link == FF_PLAN_LINK_NVLINK);
    /* PP: 2 x 16 x 268 MB / 8 for a middle stage = 1.07 GB, printed "1.1 GB" (rounded) */
    CHECK_CLOSE(r->traffic[FF_PLAN_PP].bytes, 2.0 * 16.0 * 268e6 / 8.0, 0, PCT1);
    CHECK_EQ_INT(lround(r->traffic[FF_PLAN_PP].bytes / 1e8), 11);
    CHECK(r->traffic[FF_PLAN_PP].link == FF_PLAN_LINK_NIC);
    /* DP: 3.16 B parameters per GPU, (127/128) x 3.16 B x 6 B = 18.8 GB over the network */
    CHECK_CLOSE(r->params_total / (8.0 * 16.0), 3.16e9, 0, PCT1);
    CHECK_CLOSE(r->traffic[FF_PLAN_DP].bytes_mean, 18.8e9, 0, PCT1);
    CHECK_CLOSE(r->traffic[FF_PLAN_DP].bytes, 18.8e9, 0, PCT1); /* busiest: 3.19 B parameters */
    CHECK(r->traffic[FF_PLAN_DP].link == FF_PLAN_LINK_NIC);
    CHECK(r->traffic[FF_PLAN_DP].group.rail_aligned);
    CHECK_EQ_INT(r->traffic[FF_PLAN_DP].group.size, 128); /* c D = 128 in both layouts */
    /* NVLink time at 450 GB/s: 0.53 s */
    CHECK_CLOSE(r->time.nvlink_bytes_mean / 450e9, 0.53, 0, PCT1);
    /* compute: 6 x 405B x 16.8M tokens / 16,384 GPUs = 2.5 PFLOP, 6.2 s at 400 TFLOP/s; TP is 8.5% of it */
    CHECK_CLOSE(r->tokens_per_step, 16.8e6, 0, PCT1);
    CHECK_CLOSE(r->time.flops_dense_mean, 2.5e15, 0, PCT1);
    CHECK_CLOSE(r->time.flops_dense_mean / 400e12, 6.2, 0, PCT1);
    CHECK_CLOSE((r->time.nvlink_bytes_mean / 450e9) / (r->time.flops_dense_mean / 400e12), 0.085, 0, PCT1);
    /* activations: 34 s b h / 8 = 0.57 GB per layer; 126/16 x 0.57 = 4.5 GB per stage and
     * micro-batch; the first stage holds 16 micro-batches: 72 GB for 7.875 layers. With 7 layers
     * there it is 7/7.875 of that, and "one layer fewer saves about 16 x 0.57 = 9 GB" against a
     * stage of 8 layers. */
    double layer = ff_plan_layer_activation_bytes(34.0, 8192.0, 16384, 8, true);
    CHECK_CLOSE(layer, 0.57e9, 0, PCT1);
    CHECK_CLOSE(r->stages[15].activation_bytes, 4.5e9 * 7.0 / 7.875, 0, PCT1); /* one micro-batch, 7 layers */
    CHECK_CLOSE(r->stages[1].activation_bytes / r->stages[1].in_flight, 4.5e9 * 8.0 / 7.875, 0, PCT1);
    CHECK_CLOSE(r->memory.activation_bytes, 72e9 * 7.0 / 7.875, 0, PCT1);
    CHECK_CLOSE(16.0 * 8.0 * layer - r->memory.activation_bytes, 9e9, 0, 0.02); /* 16 x 0.57 = 9.1 GB */
    /* figure 3.11: stage i holds p - i + 1 micro-batches; the last stage one, 4.5 GB for 7.875 layers */
    for (int s = 0; s < 16; s++) {
        CHECK_CLOSE(r->stages[s].in_flight, 16.0 - s, 0, 1e-12);
        CHECK_CLOSE(r->stages[s].activation_bytes, (16.0 - s) * (double)r->stages[s].layers * layer, 0, 1e-9);
    }
}

static void layout_8k(void) {
    ff_plan_input in;
    setup(&in, false, 1);
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    common_rows(&r);
    CHECK_EQ_INT(r.global_batch, 2048);
    CHECK(r.traffic[FF_PLAN_CP].bytes == 0);
    CHECK(r.traffic[FF_PLAN_CP].link == FF_PLAN_LINK_NONE);
    /* NIC: 1.1 + 18.8 = 20 GB, 0.40 s at 50 GB/s */
    CHECK_CLOSE(r.time.nic_bytes_mean, 20e9, 0, PCT1);
    CHECK_CLOSE(r.time.nic_bytes_mean / 50e9, 0.40, 0, PCT1);
    CHECK_CLOSE(r.time.nvlink_bytes_mean / r.time.nic_bytes_mean, 12.0, 0, 0.02); /* "about twelve times" */
    /* a server of a middle stage sends 8 x (1.07 + 18.98) GB, the chapter's "160 GB per step" */
    CHECK_CLOSE(8.0 * r.stages[1].nic_bytes, 160e9, 0, PCT1);
    /* ZeRO-1 "would keep about 13 GB throughout" */
    CHECK_CLOSE(r.memory.state_bytes, 13e9, 0, PCT1);
    CHECK_CLOSE(r.memory.state_peak_bytes, 13e9, 0, PCT1);
    /* "about 72 GB of activations and up to 13 GB of model state together reach the 80 GB": the
     * second stage (8 layers, 15 micro-batches) is the one that does not fit */
    CHECK(!r.memory.fits);
    CHECK_EQ_INT(r.memory.worst_stage, 1);
    ff_plan_result_clear(&r);
    /* memory, ZeRO-2: 2 + 14/D bytes per parameter, 6.7 GB; about 13 GB while the full gradients
     * accumulate (all-forward-all-backward) */
    setup(&in, false, 2);
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.memory.state_bytes, 6.7e9, 0, PCT1);
    CHECK_CLOSE(r.memory.state_peak_bytes, 13e9, 0, PCT1);
    /* under AFAB the first stage also holds 16 micro-batches: the same activations */
    CHECK_CLOSE(r.stages[0].in_flight, 16.0, 0, 1e-12);
    CHECK_CLOSE(r.traffic[FF_PLAN_DP].bytes_mean, 18.8e9, 0, PCT1); /* one reduce-scatter per step */
    /* DeepSpeed's default ZeRO-2 under 1F1B reduce-scatters after every micro-batch: (G+1) f S
     * with BF16 gradients, here 16 FP32 reduce-scatters and one BF16 all-gather */
    ff_plan_result_clear(&r);
    in.layout.schedule = FF_PLAN_1F1B;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.traffic[FF_PLAN_DP].bytes_mean, 18.8e9 * (16.0 * 4.0 + 2.0) / 6.0, 0, PCT1);
    ff_plan_result_clear(&r);
}

static void layout_128k(void) {
    ff_plan_input in;
    setup(&in, true, 1);
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    common_rows(&r); /* s / c = 8192 tokens per GPU: the same TP, PP and DP rows */
    CHECK_EQ_INT(r.global_batch, 128);
    /* CP: 7.9 x 16 x 190 MB, "about 24 GB", on the network, and the compute waits for it */
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].bytes_mean, 24e9, 0, PCT1);
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].bytes, 24e9 * 8.0 / 7.875, 0, PCT1);
    CHECK(r.traffic[FF_PLAN_CP].link == FF_PLAN_LINK_NIC);
    CHECK(r.traffic[FF_PLAN_CP].compute_waits);
    CHECK(r.traffic[FF_PLAN_CP].group.rail_aligned);
    /* NIC: 24 + 1.1 + 18.8 = 44 GB, 0.87 s */
    CHECK_CLOSE(r.time.nic_bytes_mean, 44e9, 0, PCT1);
    CHECK_CLOSE(r.time.nic_bytes_mean / 50e9, 0.87, 0, PCT1);
    /* the 128K phase runs without checkpointing at the same activations as 8K */
    CHECK_CLOSE(r.memory.activation_bytes, 72e9 * 7.0 / 7.875, 0, PCT1);
    /* every cross-server byte stays on its rail in the order [TP, CP, PP, DP] */
    CHECK(r.cross_domain_on_rails);
    ff_plan_result_clear(&r);
    /* ZeRO-2 by Llama 3's rule (bs = 16 < 2 PP): 6.7 GB of state, 13 GB at the peak */
    setup(&in, true, 2);
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.memory.state_bytes, 6.7e9, 0, PCT1);
    CHECK_CLOSE(r.memory.state_peak_bytes, 13e9, 0, PCT1);
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].bytes_mean, 24e9, 0, PCT1);
    ff_plan_result_clear(&r);
}

int main(void) {
    layout_8k();
    layout_128k();
    TEST_MAIN_END();
}

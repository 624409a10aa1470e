/* The planner on replicated key/value heads (TP a multiple of n_kv, as the model engine runs
 * it, model/tp.c): Llama 3 8B (8 KV heads) at TP 16 holds one KV head per GPU, so its
 * parameters, model state, FLOPs and DP traffic per GPU equal those of the same model with 16
 * KV heads at TP 16, exactly; its activations exceed them by the replicated excess (half a
 * head of K and V per layer and micro-batch), and its TP traffic by the engine's all-reduce of
 * the K/V weight gradients in every layer's backward (n_kv x 2 d h FP32 gradients, ring
 * bytes). At TP dividing n_kv nothing changes (the excess is zero), and a TP that neither
 * divides n_kv nor is a multiple of it is refused naming both. */
#include <math.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "tests/test_util.h"

static void input(ff_plan_input *in, int64_t kv, int64_t tp, int64_t dp, int64_t pp) {
    ff_plan_input_defaults(in);
    REQUIRE(ff_plan_model_preset("llama3-8b", &in->model) == 0);
    in->model.kv_heads = kv;
    in->layout.tp = tp, in->layout.dp = dp, in->layout.pp = pp;
    in->cluster.gpus = tp * dp * pp;
    in->workload.seq = 4096;
    in->workload.micro_batches = 8;
    in->layout.zero = 0;
}

int main(void) {
    const int64_t L = 32, h = 4096, d = 128, G = 8, T = 16, pp = 2, Ls = L / pp;
    const double tokens = 4096;
    ff_plan_input rep, mha;
    ff_plan_result a, b;
    input(&rep, 8, T, 2, pp);  /* each of 8 heads on 2 of 16 GPUs */
    input(&mha, 16, T, 2, pp); /* 16 heads, one per GPU */
    REQUIRE(ff_plan_evaluate(&rep, &a) == 0);
    REQUIRE(ff_plan_evaluate(&mha, &b) == 0);
    for (int64_t s = 0; s < pp; s++) {
        const ff_plan_stage *x = &a.stages[s], *y = &b.stages[s];
        CHECK(x->params == y->params);
        CHECK(x->state_bytes == y->state_bytes && x->state_peak_bytes == y->state_peak_bytes);
        CHECK(x->flops_mb == y->flops_mb);
        CHECK(x->traffic[FF_PLAN_DP] == y->traffic[FF_PLAN_DP] && x->traffic[FF_PLAN_PP] == y->traffic[FF_PLAN_PP]);
        /* half a head of K and V (BF16, [tokens, d] each) more per layer and micro-batch held */
        double excess = x->in_flight * (double)x->layers * 0.5 * 2.0 * tokens * (double)d * 2.0;
        CHECK_CLOSE(x->activation_bytes - y->activation_bytes, excess, 1e-3, 1e-12);
        CHECK(excess > 0);
        /* one all-reduce per layer backward of [8 heads, 2 d h] FP32 gradients over the 16 TP ranks */
        double kv = (double)G * (double)Ls * ff_plan_ring_allreduce_bytes(T, 8.0 * 2.0 * (double)d * (double)h * 4.0);
        CHECK_CLOSE(x->traffic[FF_PLAN_TP] - y->traffic[FF_PLAN_TP], kv, 1.0, 1e-12);
    }
    CHECK_CLOSE(a.traffic[FF_PLAN_TP].messages, b.traffic[FF_PLAN_TP].messages + (double)(G * Ls), 0, 0);
    printf("llama3-8b TP 16 x PP 2 x DP 2, 8 KV heads replicated x 2: TP %.3f GB per GPU per step (%.3f with 16 KV heads), "
           "activations %.3f GB (%.3f), params %.1f M per GPU (equal)\n",
           a.traffic[FF_PLAN_TP].bytes / 1e9, b.traffic[FF_PLAN_TP].bytes / 1e9, a.memory.activation_bytes / 1e9,
           b.memory.activation_bytes / 1e9, a.stages[0].params / 1e6);
    ff_plan_result_clear(&a);
    ff_plan_result_clear(&b);

    /* dividing the KV heads: no excess, no extra collective (the 8-head model at TP 8 costs what
     * its formula says, as before replication existed) */
    input(&rep, 8, 8, 1, 1);
    REQUIRE(ff_plan_evaluate(&rep, &a) == 0);
    CHECK_CLOSE(a.traffic[FF_PLAN_TP].bytes, ff_plan_tp_bytes((double)L, G, 8, tokens, h), 0, 1e-12);
    CHECK_CLOSE(a.traffic[FF_PLAN_TP].messages, 4.0 * (double)(L * G), 0, 0);
    ff_plan_result_clear(&a);
    CHECK(ff_plan_kv_heads_per_rank(8, 16) == 1.0 && ff_plan_kv_heads_per_rank(8, 4) == 2.0);

    /* neither divides: refused with both numbers */
    input(&rep, 8, 12, 2, 1);
    CHECK(ff_plan_evaluate(&rep, &a) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "TP 12 and the 8 key-value heads: neither divides the other");
    return ff_test_failures ? 1 : 0;
}

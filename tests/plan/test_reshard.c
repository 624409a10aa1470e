/* The planner's resharding model (plan_reshard.c) against HybridFlow's byte counts: for TP2 PP2 ->
 * TP1, TP4 -> TP2, TP2 PP2 -> TP2 (8B on one server) and TP8 PP4 -> TP4 (70B on four DGX H100), a
 * rank receives M/(tg pg) - M/(t p) with the 3D-HybridEngine and M - M/(t p) with the naive
 * gather, so received + held = the generation shard, naive >= hybrid, and the peaks are M/(tg pg)
 * and M; where the micro-DP group sits decides NVLink against NIC bytes and the time (the
 * hierarchical all-gather); tg pg = t p moves nothing; a separate pool receives exactly its shard;
 * bad layouts, dtypes and presets are refused with messages naming them. */
#include <math.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "tests/test_util.h"

static int run(const char *model, int64_t t, int64_t p, int64_t gpus, int64_t tg, int64_t pg, int64_t workers,
               ff_plan_reshard_input *in, ff_plan_reshard *r) {
    ff_plan_reshard_input_defaults(in);
    REQUIRE(ff_plan_model_preset(model, &in->model) == 0);
    REQUIRE(ff_plan_cluster_preset("dgx-h100", &in->cluster) == 0);
    in->train.tp = t, in->train.pp = p;
    in->cluster.gpus = gpus;
    in->gen_tp = tg, in->gen_pp = pg;
    in->gen_workers = workers;
    return ff_plan_reshard_evaluate(in, r);
}

#define NEAR(a, b) CHECK_CLOSE((a), (b), 0.0, 1e-12)

/* The formulas and identities of one same-GPU pair. */
static void pair(const char *model, int64_t t, int64_t p, int64_t gpus, int64_t tg, int64_t pg) {
    ff_plan_reshard_input in;
    ff_plan_reshard r;
    REQUIRE(run(model, t, p, gpus, tg, pg, 0, &in, &r) == 0);
    double M = ff_plan_params_total(&in.model) * 2;
    NEAR(r.model_bytes, M);
    NEAR(r.train_shard_bytes, M / (double)(t * p));
    NEAR(r.gen_shard_bytes, M / (double)(tg * pg));
    CHECK_EQ_INT(r.micro_dp, (t * p) / (tg * pg));
    NEAR(r.hybrid.recv_bytes, M / (double)(tg * pg) - M / (double)(t * p));
    NEAR(r.hybrid.recv_bytes + r.train_shard_bytes, r.gen_shard_bytes);
    NEAR(r.hybrid.peak_bytes, M / (double)(tg * pg));
    NEAR(r.naive.recv_bytes, M - M / (double)(t * p));
    NEAR(r.naive.peak_bytes, M);
    NEAR(r.hybrid.nvlink_bytes + r.hybrid.nic_bytes, r.hybrid.recv_bytes);
    NEAR(r.naive.nvlink_bytes + r.naive.nic_bytes, r.naive.recv_bytes);
    CHECK(r.naive.recv_bytes >= r.hybrid.recv_bytes);
    CHECK(r.naive.time_s >= r.hybrid.time_s);
    CHECK(r.rank0.time_s >= r.naive.time_s);
}

int main(void) {
    ff_plan_reshard_input in;
    ff_plan_reshard r;

    pair("llama3-8b", 2, 2, 8, 1, 1);
    pair("llama3-8b", 4, 1, 8, 2, 1);
    pair("llama3-8b", 2, 2, 8, 2, 1);
    pair("llama3-70b", 8, 4, 32, 4, 1);
    pair("llama3-70b", 8, 4, 32, 8, 1);
    pair("llama3-70b", 8, 4, 64, 2, 2);

    /* one server: everything on NVLink, 3 of 4 training shards gathered (TP2 PP2 -> TP1) */
    REQUIRE(run("llama3-8b", 2, 2, 8, 1, 1, 0, &in, &r) == 0);
    double M8 = ff_plan_params_total(&in.model) * 2;
    CHECK_EQ_INT(r.train_dp, 2);
    NEAR(r.hybrid.recv_bytes, 0.75 * M8);
    CHECK(r.hybrid.nic_bytes == 0);
    NEAR(r.hybrid.time_s, 0.75 * M8 / 450e9);
    /* TP4 -> TP2: pairs of neighbouring TP ranks, a quarter of the model each */
    REQUIRE(run("llama3-8b", 4, 1, 8, 2, 1, 0, &in, &r) == 0);
    NEAR(r.hybrid.recv_bytes, 0.25 * M8);
    NEAR(r.naive.recv_bytes, 0.75 * M8);

    /* Llama 3 70B, TP8 PP4 on 4 DGX H100 -> TP4: micro-DP 8 = 2 TP neighbours x 4 stages, the
     * stages on 4 servers: a hierarchical all-gather of 2 per domain x 4 domains */
    REQUIRE(run("llama3-70b", 8, 4, 32, 4, 1, 0, &in, &r) == 0);
    double M = ff_plan_params_total(&in.model) * 2, D = M / 32;
    NEAR(r.hybrid.recv_bytes, 7 * M / 32);
    CHECK_EQ_INT(r.group_per_domain, 2);
    CHECK_EQ_INT(r.group_domains, 4);
    NEAR(r.hybrid.nic_bytes, 3 * D);
    NEAR(r.hybrid.nvlink_bytes, 4 * D);
    NEAR(r.hybrid.time_s, 3 * D / 50e9 + 4 * D / 450e9);
    NEAR(r.naive.recv_bytes, 31 * M / 32);
    NEAR(r.naive.time_s, 3 * D / 50e9 + 28 * D / 450e9);
    /* rank 0 receives 7 shards over NVLink and 24 over its NIC, then sends M down a chain of servers */
    NEAR(r.rank0.time_s, 7 * D / 450e9 + 24 * D / 50e9 + M / 50e9);
    CHECK(r.naive.time_s > 1.7 * r.hybrid.time_s);
    /* fp32 weights double every byte and time */
    double hybrid_bf16 = r.hybrid.time_s;
    in.dtype_bytes = 4;
    REQUIRE(ff_plan_reshard_evaluate(&in, &r) == 0);
    NEAR(r.hybrid.time_s, 2 * hybrid_bf16);
    NEAR(r.model_bytes, 2 * M);

    /* tg pg = t p: nothing moves */
    REQUIRE(run("llama3-70b", 8, 4, 32, 8, 4, 0, &in, &r) == 0);
    CHECK_EQ_INT(r.micro_dp, 1);
    CHECK(r.hybrid.recv_bytes == 0 && r.hybrid.time_s == 0);
    NEAR(r.hybrid.peak_bytes, M / 32);

    /* a separate pool: each generation rank receives exactly its shard from the ranks holding it */
    REQUIRE(run("llama3-70b", 8, 4, 32, 4, 1, 8, &in, &r) == 0);
    NEAR(r.pool.recv_bytes, M / 4);
    CHECK(r.pool.nvlink_bytes == 0);
    CHECK_EQ_INT(r.pool_senders, 8);
    CHECK_EQ_INT(r.pool_replicas, 2);
    NEAR(r.pool_send_bytes, 2 * D);
    NEAR(r.pool.time_s, (M / 4) / 50e9);
    REQUIRE(run("llama3-8b", 2, 1, 2, 4, 1, 4, &in, &r) == 0); /* TP2 -> TP4: one sender each */
    CHECK_EQ_INT(r.pool_senders, 1);
    NEAR(r.pool.recv_bytes, ff_plan_params_total(&in.model) * 2 / 4);

    /* refusals */
    CHECK(run("llama3-70b", 8, 4, 32, 8, 3, 0, &in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "generation TP 8 x PP 3 = 24 does not divide training TP 8 x PP 4 = 32");
    CHECK(run("llama3-70b", 8, 4, 32, 16, 2, 0, &in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "generation TP 16 / PP 2 against training TP 8 / PP 4");
    CHECK(run("llama3-70b", 8, 4, 32, 3, 1, 0, &in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "TP 3 does not divide the 64 query heads of llama3-70b");
    CHECK(run("llama3-8b", 1, 1, 8, 1, 64, 8, &in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "PP 64 has more stages than the 32 layers of llama3-8b");
    CHECK(run("llama3-70b", 8, 4, 32, 4, 1, 6, &in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "6 generation GPUs are not whole replicas of TP 4 x PP 1");
    CHECK(run("llama3-70b", 8, 4, 30, 4, 1, 0, &in, &r) == -1); /* 30 GPUs are not TP x PP x DP */
    REQUIRE(run("llama3-70b", 8, 4, 32, 4, 1, 0, &in, &r) == 0);
    in.dtype_bytes = 3;
    CHECK(ff_plan_reshard_evaluate(&in, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "weights of 3 bytes");
    CHECK(ff_plan_cluster_preset("dgx-a100", &in.cluster) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown cluster preset");
    return ff_test_failures ? 1 : 0;
}

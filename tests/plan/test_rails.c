/* Rails: the rail-only hierarchical all-gather (seeds/004), where the groups of a rank order sit
 * on HB domains (the factor shortcut against visiting every group), and the property of the
 * chapter's section 3.9: with the order TP, CP, PP, DP and TP equal to the server size, every
 * byte that leaves a server travels between GPUs of the same local rank. Also what breaks it. */
#include <math.h>
#include <string.h>

#include "dataflow/plan/plan_internal.h"
#include "fuseflow/plan.h"
#include "tests/test_util.h"

static void model_dense(ff_plan_model *m) {
    memset(m, 0, sizeof *m);
    strcpy(m->name, "test-dense");
    m->layers = 32, m->hidden = 2048, m->heads = 32, m->kv_heads = 16, m->head_dim = 64, m->ffn = 8192, m->vocab = 32000;
    m->gated_mlp = true;
}

static void model_moe(ff_plan_model *m) {
    model_dense(m);
    strcpy(m->name, "test-moe");
    m->experts = 16, m->experts_per_token = 2, m->moe_layers = 16, m->expert_ffn = 2048;
}

static void hier_allgather(void) {
    /* T = (y-1) D / B_nic + (x-1) (y D) / B_hb: rail first, then inside the domain */
    double D = 1e8, hb = 450e9, nic = 50e9;
    CHECK_CLOSE(ff_plan_hier_allgather_s(8, 4, D, hb, nic), 3.0 * D / nic + 7.0 * 4.0 * D / hb, 0, 1e-12);
    CHECK_CLOSE(ff_plan_hier_allgather_s(8, 1, D, hb, nic), 7.0 * D / hb, 0, 1e-12);   /* one domain: a ring on NVLink */
    CHECK_CLOSE(ff_plan_hier_allgather_s(1, 16, D, hb, nic), 15.0 * D / nic, 0, 1e-12); /* one GPU per domain: a ring on the rail */
    /* of the (N-1) D bytes a GPU receives, only (y-1) D cross the network: 3 of 31 for 8 x 4 */
    CHECK_CLOSE(ff_plan_hier_allgather_s(8, 4, D, 1e300, 1.0) / D, 3.0, 0, 1e-12);

    /* the planner uses it for a TP group of 16 on servers of 8: a = 8, y = 2 */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    model_dense(&in.model);
    in.cluster.gpus = 16;
    in.layout.tp = 16;
    in.workload.seq = 4096;
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    const ff_plan_traffic *t = &r.traffic[FF_PLAN_TP];
    CHECK_EQ_INT(t->group.per_domain, 8);
    CHECK_EQ_INT(t->group.domains, 2);
    CHECK(t->link == FF_PLAN_LINK_BOTH);
    CHECK(t->group.rail_aligned);
    CHECK_CLOSE(t->nic_bytes / t->bytes, 1.0 / 15.0, 0, 1e-9);
    /* one phase moves a shard of M/16; 2 phases per all-reduce, 4 all-reduces per layer */
    double shard = 4096.0 * 2048.0 * 2.0 / 16.0, phases = 2.0 * 4.0 * 32.0;
    CHECK_CLOSE(t->wire_s, phases * ff_plan_hier_allgather_s(8, 2, shard, 450e9, 50e9), 0, 1e-9);
    ff_plan_result_clear(&r);

    /* and for DP: Llama 3 405B at 8K, ZeRO-1, the gradient sync after the last micro-batch is a
     * reduce-scatter of FP32 gradients and an all-gather of BF16 weights along the rail (a = 1,
     * y = 128), psi = the busiest stage's parameters per GPU */
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-405b", &in.model) == 0);
    in.cluster.gpus = 16384, in.layout.tp = 8, in.layout.pp = 16, in.workload.seq = 8192, in.workload.micro_batches = 16;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    double psi = r.stages[1].params;
    double expect = ff_plan_hier_allgather_s(1, 128, psi * 4.0 / 128.0, 450e9, 50e9) + ff_plan_hier_allgather_s(1, 128, psi * 2.0 / 128.0, 450e9, 50e9);
    /* plus one step of latency per member along the rail, per phase */
    CHECK_CLOSE(r.time.sync_s, expect + 2.0 * 127.0 * in.cluster.nic_latency_s, 0, 1e-9);
    CHECK(in.cluster.nic_latency_s > 0);
    CHECK_EQ_INT(r.traffic[FF_PLAN_DP].group.per_domain, 1);
    CHECK_EQ_INT(r.traffic[FF_PLAN_DP].group.domains, 128);
    /* the decomposition adds up */
    CHECK_CLOSE(r.time.iteration_s, r.time.bubble_s + r.time.last_s + r.time.sync_s, 0, 1e-12);
    ff_plan_result_clear(&r);
}

/* ---- groups: the factor shortcut equals visiting every group ------------------------------- */

static int dims_of(const char *order, ff_plan_layout *l) { return ff_plan_parse_order(order, l); }

static void groups_shortcut(void) {
    static const char *const orders[] = {"tp,cp,pp,dp", "tp,pp,cp,dp", "tp,dp,pp,cp", "pp,tp,cp,dp", "dp,pp,cp,tp", "tp,ep,cp,pp,dp", "cp,tp,dp,pp"};
    static const int64_t tps[] = {1, 2, 4, 8, 16}, cps[] = {1, 2, 4}, pps[] = {1, 2, 4, 8}, eps[] = {1, 2, 4};
    int compared = 0;
    for (size_t o = 0; o < sizeof orders / sizeof *orders; o++)
        for (size_t a = 0; a < 5; a++)
            for (size_t b = 0; b < 3; b++)
                for (size_t c = 0; c < 4; c++)
                    for (size_t e = 0; e < 3; e++) {
                        ff_plan_input in;
                        ff_plan_input_defaults(&in);
                        model_moe(&in.model);
                        in.cluster.gpus = 128;
                        in.layout.tp = tps[a], in.layout.cp = cps[b], in.layout.pp = pps[c], in.layout.ep = eps[e];
                        REQUIRE(dims_of(orders[o], &in.layout) == 0);
                        in.layout.dp = 128 / (tps[a] * cps[b] * pps[c]);
                        if (in.layout.dp < 1 || in.layout.dp % eps[e]) continue;
                        rankmap m;
                        rankmap_build(&in, &m);
                        REQUIRE(m.gpus == 128);
                        CHECK(rankmap_regular(&m)); /* powers of two on servers of 8 */
                        for (int g = 0; g < G_N; g++) {
                            gstat f, x;
                            group_stat_fast(&m, group_kinds(g), &f);
                            group_stat_exact(&m, group_kinds(g), &x);
                            CHECK_EQ_INT(f.n, x.n);
                            CHECK_EQ_INT(f.a, x.a);
                            CHECK_EQ_INT(f.y, x.y);
                            CHECK(x.grid);
                            compared++;
                        }
                        pplink fast[8], exact[8];
                        pp_links(&m, false, fast);
                        pp_links(&m, true, exact);
                        for (int64_t s = 0; s < in.layout.pp; s++) {
                            CHECK(fast[s].next_cross == exact[s].next_cross && fast[s].next_rail == exact[s].next_rail);
                            CHECK(fast[s].prev_cross == exact[s].prev_cross && fast[s].prev_rail == exact[s].prev_rail);
                        }
                    }
    CHECK(compared > 500);

    /* an irregular map: TP 3 on servers of 8 (24 GPUs): groups straddle servers */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    model_dense(&in.model);
    in.model.kv_heads = 3, in.model.heads = 24, in.model.ffn = 8190, in.model.head_dim = 64;
    in.cluster.gpus = 24;
    in.layout.tp = 3;
    in.layout.dp = 8;
    rankmap m;
    rankmap_build(&in, &m);
    CHECK(!rankmap_regular(&m));
    gstat x;
    group_stat_exact(&m, group_kinds(G_TP), &x);
    CHECK(!x.grid);
    CHECK_EQ_INT(x.min_count, 1); /* e.g. {6, 7, 8}: two in one server, one in the next */
    ff_plan_result r;
    in.workload.seq = 4095; /* SP splits the tokens over TP 3 */
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    /* the worst member ({6, 7, 8}'s rank 8) reaches both partners over its NIC */
    CHECK(r.traffic[FF_PLAN_TP].link == FF_PLAN_LINK_NIC);
    CHECK(!r.traffic[FF_PLAN_TP].group.regular);
    CHECK(!r.traffic[FF_PLAN_TP].group.rail_aligned);
    CHECK(!r.cross_domain_on_rails);
    ff_plan_result_clear(&r);
}

/* ---- the property ------------------------------------------------------------------------- */

typedef struct check {
    int64_t domain;
    int64_t off_rail;          /* edges leaving a server between different local ranks */
    double leaving;            /* bytes leaving servers */
    double sent[4096][FF_PLAN_NDIMS];
} check;

static check ck;

static void visit(int64_t src, int64_t dst, ff_plan_dim dim, double bytes, void *ctx) {
    check *c = ctx;
    REQUIRE(src != dst);
    REQUIRE(bytes > 0);
    c->sent[src][dim] += bytes;
    if (src / c->domain != dst / c->domain) {
        c->leaving += bytes;
        if (src % c->domain != dst % c->domain) c->off_rail++;
    }
}

/* Evaluate, visit every flow, and check that each GPU's flows add up to its stage's bytes. */
static bool flows(const ff_plan_input *in, ff_plan_result *r) {
    if (ff_plan_evaluate(in, r)) return false;
    memset(&ck, 0, sizeof ck);
    ck.domain = in->cluster.domain;
    REQUIRE(ff_plan_traffic_edges(in, r, visit, &ck) == 0);
    int bad = 0;
    for (int64_t g = 0; g < in->cluster.gpus; g++) {
        ff_plan_rank k;
        ff_plan_rank_coords(in, g, &k);
        for (int d = 0; d < FF_PLAN_NDIMS; d++) {
            double want = r->stages[k.stage].traffic[d];
            if (fabs(ck.sent[g][d] - want) > 1e-3 + 1e-9 * want) {
                if (!bad++) fprintf(stderr, "GPU %lld %s: flows add to %.6g, the stage sends %.6g\n", (long long)g, ff_plan_dim_name(d), ck.sent[g][d], want);
            }
        }
    }
    CHECK_EQ_INT(bad, 0);
    return true;
}

static void same_local_rank(void) {
    int layouts = 0;
    const int64_t sizes[] = {64, 256, 1024};
    for (size_t si = 0; si < 3; si++)
        for (int moe = 0; moe < 2; moe++)
            for (int64_t c = 1; c <= 4; c *= 2)
                for (int64_t p = 1; p <= 8; p *= 2)
                    for (int64_t v = 1; v <= 2; v++)
                        for (int64_t e = 1; e <= (moe ? 8 : 1); e *= 2) {
                            int64_t n = sizes[si];
                            if (n % (8 * c * p) || (v > 1 && p < 2)) continue;
                            int64_t d = n / (8 * c * p);
                            if (d % e) continue;
                            ff_plan_input in;
                            ff_plan_input_defaults(&in);
                            if (moe) model_moe(&in.model);
                            else model_dense(&in.model);
                            in.cluster.gpus = n;
                            in.layout.tp = 8, in.layout.cp = c, in.layout.pp = p, in.layout.ep = e, in.layout.vpp = v;
                            in.layout.zero = (int)((c + p + e) % 4);
                            if (in.layout.zero == 2 && v == 1 && p > 1) in.layout.schedule = FF_PLAN_AFAB; /* one reduce-scatter */
                            in.workload.seq = 4096;
                            in.workload.micro_batches = 2 * p;
                            ff_plan_result r;
                            REQUIRE(flows(&in, &r));
                            CHECK_EQ_INT(ck.off_rail, 0);
                            CHECK(r.cross_domain_on_rails);
                            if (d > 1 || p > 1 || c > 1) CHECK(ck.leaving > 0);
                            ff_plan_result_clear(&r);
                            layouts++;
                        }
    CHECK(layouts >= 40);

    /* TP 4 on servers of 8: pipeline neighbours 4 ranks apart land on other local ranks */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    model_dense(&in.model);
    in.cluster.gpus = 64;
    in.layout.tp = 4, in.layout.pp = 4;
    in.workload.micro_batches = 8;
    ff_plan_result r;
    REQUIRE(flows(&in, &r));
    CHECK(ck.off_rail > 0);
    CHECK(!r.cross_domain_on_rails);
    CHECK(!r.traffic[FF_PLAN_PP].group.rail_aligned);
    ff_plan_result_clear(&r);

    /* DP innermost after TP: PP pairs move to distant servers, DP pairs to nearer ones, and the
     * property still holds when TP fills the server */
    in.layout.tp = 8, in.layout.pp = 4;
    REQUIRE(ff_plan_parse_order("tp,dp,cp,pp", &in.layout) == 0);
    REQUIRE(flows(&in, &r));
    CHECK_EQ_INT(ck.off_rail, 0);
    ff_plan_result_clear(&r);

    /* EP over 16 GPUs of two servers (TP 1): 7 of every 8 cells between the servers join GPUs of
     * different local ranks (figure 3.15); rail-only forwards them and is slower than the Clos */
    ff_plan_input_defaults(&in);
    model_moe(&in.model);
    in.cluster.gpus = 16;
    in.layout.tp = 1, in.layout.ep = 16;
    in.workload.seq = 2048;
    REQUIRE(flows(&in, &r));
    CHECK(ck.off_rail > 0);
    CHECK_EQ_INT(ck.off_rail, 16 * 7); /* each GPU: 8 partners in the other server, 7 off its rail */
    CHECK(!r.cross_domain_on_rails);
    CHECK(!r.traffic[FF_PLAN_EP].group.rail_aligned);
    double clos_t = r.time.iteration_s;
    ff_plan_result_clear(&r);
    in.cluster.topology = FF_PLAN_RAIL_ONLY;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK(r.time.iteration_s > clos_t);
    CHECK(r.traffic[FF_PLAN_EP].nvlink_bytes > 0); /* the forwarding hops */
    ff_plan_result_clear(&r);
}

/* A layout whose cross-domain traffic stays on rails runs as fast on rail-only as on the Clos;
 * an oversubscribed Clos slows the network-bound parts. */
static void topologies(void) {
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-70b", &in.model) == 0);
    in.cluster.gpus = 1024;
    in.layout.tp = 8, in.layout.pp = 4, in.layout.cp = 2;
    in.workload.seq = 8192, in.workload.micro_batches = 8;
    in.cluster.nvlink_latency_s = in.cluster.nic_latency_s = 0; /* bandwidth only: time scales with 1/B */
    ff_plan_result a, b, c;
    REQUIRE(ff_plan_evaluate(&in, &a) == 0);
    in.cluster.topology = FF_PLAN_RAIL_ONLY;
    REQUIRE(ff_plan_evaluate(&in, &b) == 0);
    CHECK(a.cross_domain_on_rails);
    CHECK_CLOSE(b.time.iteration_s, a.time.iteration_s, 0, 1e-12);
    in.cluster.topology = FF_PLAN_CLOS;
    in.cluster.oversubscription = 2.0;
    REQUIRE(ff_plan_evaluate(&in, &c) == 0);
    CHECK_CLOSE(c.time.sync_s, 2.0 * a.time.sync_s, 0, 1e-9); /* the rail collective runs at half rate */
    CHECK(c.time.iteration_s > a.time.iteration_s);
    CHECK_CLOSE(c.traffic[FF_PLAN_DP].bytes, a.traffic[FF_PLAN_DP].bytes, 0, 1e-12); /* same bytes, slower */
    ff_plan_result_clear(&a);
    ff_plan_result_clear(&b);
    ff_plan_result_clear(&c);
}

static void network_cost(void) {
    ff_plan_network n;
    /* 16,384 GPUs, radix 64: a 3-tier Clos (2 (k/2)^2 = 2048 < N <= 2 (k/2)^3): 2 x 512 + 256 switches,
     * 3 N links; rail-only: 8 rails of 2048, each a 2-tier Clos of 64 + 32 switches */
    REQUIRE(ff_plan_network_cost(16384, 8, 64, &n) == 0);
    CHECK_EQ_INT(n.clos.tiers, 3);
    CHECK_EQ_INT(n.clos.switches, 1280);
    CHECK_EQ_INT(n.clos.transceivers, 2 * 3 * 16384);
    CHECK_EQ_INT(n.rail_only.tiers, 2);
    CHECK_EQ_INT(n.rail_only.switches, 8 * 96);
    CHECK_EQ_INT(n.rail_only.transceivers, 8 * 2 * 2 * 2048);
    /* 128 GPUs: Clos 2 tiers (4 leaves + 2 spines); rail-only: rails of 16 share switches, 4 per switch */
    REQUIRE(ff_plan_network_cost(128, 8, 64, &n) == 0);
    CHECK_EQ_INT(n.clos.switches, 6);
    CHECK_EQ_INT(n.rail_only.switches, 2);
    CHECK_EQ_INT(n.rail_only.transceivers, 256);
    /* one server: no network */
    REQUIRE(ff_plan_network_cost(8, 8, 64, &n) == 0);
    CHECK_EQ_INT(n.clos.switches, 0);
    CHECK_EQ_INT(n.rail_only.switches, 0);
    /* HB domains of 256 (the rail-only paper's large domains) at 32,768 GPUs, radix 64: rails of 128 */
    REQUIRE(ff_plan_network_cost(32768, 256, 64, &n) == 0);
    CHECK_EQ_INT(n.rail_only.switches, 256 * (4 + 2));
    CHECK(n.rail_only.switches < n.clos.switches && n.rail_only.transceivers < n.clos.transceivers);
    CHECK(ff_plan_network_cost(64, 8, 63, &n) != 0); /* odd radix */
}

int main(void) {
    hier_allgather();
    groups_shortcut();
    same_local_rank();
    topologies();
    network_cost();
    TEST_MAIN_END();
}

/* Pipeline schedules (fuseflow/pipeline.h): the generated streams of GPipe, 1F1B and interleaved
 * 1F1B run through the simulator. Proves: the bubble of every schedule in a table of (p, m, v)
 * equals the closed form, (p-1)/(m+p-1) or (p-1)/(v m+p-1), for equal stage times, and the
 * planner's figure for the same layout; the makespan equals its closed form; peak in-flight is
 * min(p - s, m) for 1F1B, m for GPipe, Megatron's warm-up + 1 for interleaved; each stream's
 * warm-up is Megatron's count; interleaved refuses m % p != 0; every generated schedule of a
 * sweep passes the checker; the same streams with their calls split (sends first) deadlock and
 * the error names the waiting ranks; reordered or missing transfers and a forward before its
 * input are caught; layers are split by the planner's rule; a two-model schedule built by hand
 * (the shape of RLHFuse's fused actor+critic) runs with its hand-computed makespan; the JSON
 * and SVG carry the streams. */
#include <jansson.h>
#include <math.h>
#include <unistd.h>

#include "fuseflow/pipeline.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static const ff_pipe_kind kinds[] = {FF_PIPE_GPIPE, FF_PIPE_1F1B, FF_PIPE_INTERLEAVED};

static void gen(ff_pipe_kind kind, int p, int m, int v, bool fwd_only, ff_pipe_schedule *s) {
    ff_pipe_config c = {.pp = p, .vpp = v, .micro = m, .kind = kind, .forward_only = fwd_only};
    DIE_IF(ff_pipe_generate(&c, s) != 0);
}

static void sim(const ff_pipe_schedule *s, double tf, double tb, ff_pipe_sim *out) {
    ff_pipe_sim_opts o = {.fwd_s = tf, .bwd_s = tb};
    DIE_IF(ff_pipe_simulate(s, &o, out) != 0);
}

/* Forward instructions before the first backward in rank r's stream, counted here. */
static int forwards_before_backward(const ff_pipe_schedule *s, int r) {
    int n = 0;
    for (int64_t i = 0; i < s->streams[r].n; i++) {
        if (s->streams[r].instr[i].op == FF_PIPE_BACKWARD) break;
        n += s->streams[r].instr[i].op == FF_PIPE_FORWARD;
    }
    return n;
}

/* The planner, evaluated on the same layout: Llama 3 70B (80 layers), TP 8, one replica. */
static void planner(ff_plan_schedule kind, int p, int m, int v, ff_plan_result *r) {
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-70b", &in.model) == 0);
    REQUIRE(ff_plan_cluster_preset("dgx-h100", &in.cluster) == 0);
    in.cluster.gpus = 8 * p;
    in.layout.tp = 8;
    in.layout.pp = p;
    in.layout.dp = 1;
    in.layout.vpp = v;
    in.layout.schedule = kind;
    in.workload.micro_batch = 1;
    in.workload.micro_batches = m;
    DIE_IF(ff_plan_evaluate(&in, r) != 0);
}

static void bubble_table(void) {
    static const int table[][3] = {{1, 1, 2}, {1, 4, 3}, {2, 1, 2}, {2, 2, 2}, {2, 8, 4}, {3, 5, 2}, {3, 9, 3}, {4, 4, 2},
                                   {4, 8, 2}, {4, 16, 4}, {5, 10, 2}, {8, 8, 2}, {8, 16, 2}, {8, 32, 5}, {16, 64, 4}, {16, 16, 5}};
    static const double ratio[] = {1.0, 2.0, 3.0}; /* backward / forward */
    static const ff_plan_schedule plan_kind[] = {FF_PLAN_GPIPE, FF_PLAN_1F1B, FF_PLAN_INTERLEAVED};
    for (size_t t = 0; t < sizeof table / sizeof *table; t++)
        for (int k = 0; k < 3; k++)
            for (size_t q = 0; q < 3; q++) {
                int p = table[t][0], m = table[t][1], v = kinds[k] == FF_PIPE_INTERLEAVED ? table[t][2] : 1;
                if (kinds[k] == FF_PIPE_INTERLEAVED && m % p) continue;
                double tf = 1.5, tb = tf * ratio[q];
                ff_pipe_schedule s;
                ff_pipe_sim r;
                gen(kinds[k], p, m, v, false, &s);
                sim(&s, tf, tb, &r);
                double want = (double)(p - 1) / ((double)v * m + p - 1);
                /* whole stage per micro-batch: tf + tb; the fill and drain cost (p - 1) chunks of 1/v */
                double span = m * (tf + tb) + (p - 1) * (tf + tb) / v;
                CHECK_CLOSE(r.bubble_fraction, want, 1e-12, 1e-9);
                CHECK_CLOSE(r.makespan_s, span, 1e-12, 1e-12);
                CHECK_CLOSE(r.bubble_fraction, ff_plan_bubble_fraction(plan_kind[k], p, m, v), 1e-12, 1e-9);
                for (int rank = 0; rank < p; rank++) CHECK_CLOSE(r.ranks[rank].busy_s, m * (tf + tb), 1e-12, 1e-12);
                if (q == 0 && p > 1 && p * v <= 80) {
                    ff_plan_result pr;
                    planner(plan_kind[k], p, m, v, &pr);
                    CHECK_CLOSE(r.bubble_fraction, pr.time.bubble_fraction, 1e-12, 1e-9);
                    ff_plan_result_clear(&pr);
                }
                ff_pipe_sim_clear(&r);
                ff_pipe_schedule_clear(&s);
            }
    /* forward-only pipelines fill and drain the same way: (p-1)/(v m+p-1) of forwards alone */
    for (int k = 0; k < 3; k++) {
        int p = 4, m = 8, v = kinds[k] == FF_PIPE_INTERLEAVED ? 3 : 1;
        ff_pipe_schedule s;
        ff_pipe_sim r;
        gen(kinds[k], p, m, v, true, &s);
        sim(&s, 1, 0, &r);
        CHECK_CLOSE(r.bubble_fraction, 3.0 / (v * 8 + 3), 1e-12, 1e-9);
        for (int rank = 0; rank < p; rank++) {
            CHECK_EQ_INT(r.ranks[rank].peak_in_flight, 1); /* nothing kept for a backward */
            CHECK(s.streams[rank].instr[s.streams[rank].n - 1].op != FF_PIPE_OPTIMIZER_STEP);
        }
        ff_pipe_sim_clear(&r);
        ff_pipe_schedule_clear(&s);
    }
}

static void in_flight_and_warmup(void) {
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 20; m++) {
            ff_pipe_schedule s;
            ff_pipe_sim r;
            /* 1F1B: warm-up min(p - s - 1, m), then 1F1B: min(p - s, m) in flight */
            gen(FF_PIPE_1F1B, p, m, 1, false, &s);
            sim(&s, 1, 2, &r);
            for (int st = 0; st < p; st++) {
                int warm = p - st - 1 < m ? p - st - 1 : m;
                CHECK_EQ_INT(r.ranks[st].peak_in_flight, p - st < m ? p - st : m);
                CHECK_EQ_INT(forwards_before_backward(&s, st), warm < m ? warm + 1 : m);
                CHECK_EQ_INT(r.ranks[st].forwards_before_backward, forwards_before_backward(&s, st));
                CHECK_EQ_INT(r.ranks[st].peak_in_flight, (int)ff_plan_in_flight(FF_PLAN_1F1B, p, m, 1, st));
            }
            ff_pipe_sim_clear(&r);
            ff_pipe_schedule_clear(&s);
            /* GPipe: every forward first, m in flight */
            gen(FF_PIPE_GPIPE, p, m, 1, false, &s);
            sim(&s, 1, 2, &r);
            for (int st = 0; st < p; st++) {
                CHECK_EQ_INT(r.ranks[st].peak_in_flight, m);
                CHECK_EQ_INT(forwards_before_backward(&s, st), m);
            }
            ff_pipe_sim_clear(&r);
            ff_pipe_schedule_clear(&s);
            /* interleaved: 2 (p - s - 1) + (v - 1) p chunk forwards of warm-up, capped at m v, and
             * all of them when m = p (Megatron runs every forward first then) */
            for (int v = 2; v <= 4 && m % p == 0; v++) {
                gen(FF_PIPE_INTERLEAVED, p, m, v, false, &s);
                sim(&s, 1, 2, &r);
                for (int st = 0; st < p; st++) {
                    int total = m * v, warm = m == p ? total : 2 * (p - st - 1) + (v - 1) * p;
                    if (warm > total) warm = total;
                    int fwd_first = warm < total ? warm + 1 : total;
                    CHECK_EQ_INT(forwards_before_backward(&s, st), fwd_first);
                    CHECK_EQ_INT(r.ranks[st].peak_in_flight, fwd_first);
                    /* the planner counts the same chunks (in micro-batches, units / v) except at m = p */
                    if (m != p) CHECK_CLOSE(ff_plan_in_flight(FF_PLAN_INTERLEAVED, p, m, v, st) * v, fwd_first, 1e-9, 0);
                }
                ff_pipe_sim_clear(&r);
                ff_pipe_schedule_clear(&s);
            }
        }
}

static void refusals(void) {
    ff_pipe_schedule s;
    ff_pipe_config c = {.pp = 4, .vpp = 2, .micro = 6, .kind = FF_PIPE_INTERLEAVED};
    CHECK(ff_pipe_generate(&c, &s) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "micro 6 is not a multiple of pp 4");
    c.micro = 8;
    c.vpp = 1;
    CHECK(ff_pipe_generate(&c, &s) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "needs chunks");
    c = (ff_pipe_config){.pp = 4, .vpp = 2, .micro = 8, .kind = FF_PIPE_GPIPE};
    CHECK(ff_pipe_generate(&c, &s) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "vpp 2 with gpipe");
    c = (ff_pipe_config){.pp = 0, .micro = 8, .kind = FF_PIPE_1F1B};
    CHECK(ff_pipe_generate(&c, &s) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "pp 0");
    c = (ff_pipe_config){.pp = 2, .micro = 0, .kind = FF_PIPE_1F1B};
    CHECK(ff_pipe_generate(&c, &s) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "micro 0");
    c = (ff_pipe_config){.pp = 100000, .micro = 100000, .kind = FF_PIPE_1F1B};
    CHECK(ff_pipe_generate(&c, &s) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "instructions");
    c = (ff_pipe_config){.pp = 4, .micro = 8, .kind = FF_PIPE_1F1B, .layers = 3};
    CHECK(ff_pipe_generate(&c, &s) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "4 virtual stages but 3 layers");
    ff_pipe_kind k;
    CHECK(ff_pipe_kind_parse("zb-h1", &k) == -1);
    CHECK(ff_pipe_kind_parse("interleaved", &k) == 0 && k == FF_PIPE_INTERLEAVED);
}

/* Every generated schedule passes the checker, with F m times per virtual stage and the step last. */
static void sweep(void) {
    int runs = 0;
    for (int k = 0; k < 3; k++)
        for (int fo = 0; fo < 2; fo++)
            for (int p = 1; p <= 6; p++)
                for (int m = 1; m <= 12; m++)
                    for (int v = kinds[k] == FF_PIPE_INTERLEAVED ? 2 : 1; v <= (kinds[k] == FF_PIPE_INTERLEAVED ? 3 : 1); v++) {
                        if (kinds[k] == FF_PIPE_INTERLEAVED && m % p) continue;
                        ff_pipe_schedule s;
                        ff_pipe_sim r;
                        gen(kinds[k], p, m, v, fo, &s);
                        ff_pipe_sim_opts o = {.fwd_s = 1, .bwd_s = 2, .hop_s = 0.1, .optimizer_s = 0.5};
                        if (ff_pipe_simulate(&s, &o, &r) != 0) {
                            fprintf(stderr, "%s p %d m %d v %d%s: %s\n", ff_pipe_kind_name(kinds[k]), p, m, v, fo ? " forward-only" : "",
                                    ff_error_message());
                            ff_test_failures++;
                        }
                        for (int rank = 0; rank < p; rank++) {
                            int f = 0, b = 0;
                            const ff_pipe_stream *st = &s.streams[rank];
                            for (int64_t i = 0; i < st->n; i++) f += st->instr[i].op == FF_PIPE_FORWARD, b += st->instr[i].op == FF_PIPE_BACKWARD;
                            CHECK_EQ_INT(f, m * v);
                            CHECK_EQ_INT(b, fo ? 0 : m * v);
                            uint8_t last = st->instr[st->n - 1].op; /* forward-only: the last forward or its send */
                            CHECK(fo ? last == FF_PIPE_FORWARD || last == FF_PIPE_SEND_ACT : last == FF_PIPE_OPTIMIZER_STEP);
                        }
                        ff_pipe_sim_clear(&r);
                        ff_pipe_schedule_clear(&s);
                        runs++;
                    }
    CHECK_EQ_INT(runs, 404);
}

/* Copy of a schedule's streams with every call of several transfers split into calls of one,
 * sends first: what blocking send/recv without grouping does. */
static void ungroup(const ff_pipe_schedule *in, ff_pipe_schedule *out) {
    DIE_IF(ff_pipe_schedule_init(out, in->n_ranks, in->n_models) != 0);
    const ff_pipe_model *m = &in->models[0];
    DIE_IF(ff_pipe_model_set(out, 0, m->micro, m->n_stages, m->stage_rank, m->stage_layers, m->forward_only) != 0);
    for (int r = 0; r < in->n_ranks; r++) {
        const ff_pipe_stream *st = &in->streams[r];
        int32_t call = 0;
        for (int64_t i = 0; i < st->n;) {
            ff_pipe_instr x = st->instr[i];
            if (x.call < 0) {
                DIE_IF(ff_pipe_push(out, r, x) != 0);
                i++;
                continue;
            }
            int64_t e = i;
            while (e < st->n && st->instr[e].call == x.call) e++;
            for (int sends = 1; sends >= 0; sends--)
                for (int64_t j = i; j < e; j++) {
                    ff_pipe_instr y = st->instr[j];
                    bool is_send = y.op == FF_PIPE_SEND_ACT || y.op == FF_PIPE_SEND_GRAD;
                    if (is_send != (sends == 1)) continue;
                    y.call = call++;
                    DIE_IF(ff_pipe_push(out, r, y) != 0);
                }
            i = e;
        }
    }
}

static void deadlock(void) {
    ff_pipe_schedule s, u;
    ff_pipe_sim r;
    gen(FF_PIPE_1F1B, 4, 8, 1, false, &s);
    ungroup(&s, &u);
    CHECK(ff_pipe_simulate(&u, NULL, &r) == -1);
    const char *msg = ff_error_message();
    CHECK_STR_CONTAINS(msg, "deadlock");
    CHECK_STR_CONTAINS(msg, "hint: post a send and the receive");
    /* every rank ends up waiting in a send whose partner waits in a send: 4 ranks stuck */
    CHECK_EQ_INT(r.n_stuck, 4);
    for (int i = 0; i < r.n_stuck; i++) {
        int32_t rank = r.stuck_rank[i];
        uint8_t op = u.streams[rank].instr[r.stuck_instr[i]].op;
        CHECK(op == FF_PIPE_SEND_ACT || op == FF_PIPE_SEND_GRAD);
        char name[32];
        snprintf(name, sizeof name, "rank %d at instruction %lld", (int)rank, (long long)r.stuck_instr[i]);
        CHECK_STR_CONTAINS(msg, name);
    }
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&u);
    /* GPipe's calls hold one transfer each: splitting changes nothing, and it runs */
    ff_pipe_schedule_clear(&s);
    gen(FF_PIPE_GPIPE, 4, 8, 1, false, &s);
    ungroup(&s, &u);
    CHECK(ff_pipe_simulate(&u, NULL, &r) == 0);
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&u);
    ff_pipe_schedule_clear(&s);
}

static int64_t find(const ff_pipe_schedule *s, int r, uint8_t op, int micro) {
    for (int64_t i = 0; i < s->streams[r].n; i++)
        if (s->streams[r].instr[i].op == op && s->streams[r].instr[i].micro == micro) return i;
    return -1;
}

static void broken_streams(void) {
    ff_pipe_schedule s;
    ff_pipe_sim r;
    /* rank 0 sends micro-batch 2's activation before micro-batch 1's: NCCL would hand rank 1 the
     * wrong tensor */
    gen(FF_PIPE_GPIPE, 2, 4, 1, false, &s);
    int64_t a = find(&s, 0, FF_PIPE_SEND_ACT, 1), b = find(&s, 0, FF_PIPE_SEND_ACT, 2);
    REQUIRE(a >= 0 && b >= 0);
    s.streams[0].instr[a].micro = 2;
    s.streams[0].instr[b].micro = 1;
    CHECK(ff_pipe_simulate(&s, NULL, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "send 1 of rank 0 to rank 1");
    CHECK_STR_CONTAINS(ff_error_message(), "not the same tensor");
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
    /* a receive left out */
    gen(FF_PIPE_1F1B, 2, 4, 1, false, &s);
    int64_t i = find(&s, 1, FF_PIPE_RECV_ACT, 3);
    REQUIRE(i >= 0);
    ff_pipe_stream *st = &s.streams[1];
    memmove(&st->instr[i], &st->instr[i + 1], sizeof *st->instr * (size_t)(st->n - i - 1));
    st->n--;
    CHECK(ff_pipe_simulate(&s, NULL, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "rank 0 sends 4 tensors to rank 1, which receives 3 from it");
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
    /* a forward before the receive of its input (swap F1 with the call before it on rank 1) */
    gen(FF_PIPE_GPIPE, 2, 4, 1, false, &s);
    i = find(&s, 1, FF_PIPE_FORWARD, 1);
    REQUIRE(i > 0 && s.streams[1].instr[i - 1].op == FF_PIPE_RECV_ACT);
    ff_pipe_instr t = s.streams[1].instr[i];
    s.streams[1].instr[i] = s.streams[1].instr[i - 1];
    s.streams[1].instr[i - 1] = t;
    CHECK(ff_pipe_simulate(&s, NULL, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "rank 1, instruction");
    CHECK_STR_CONTAINS(ff_error_message(), "(F1): its input, the output of virtual stage 0 on rank 0, is not here yet");
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
    /* a transfer to the wrong peer, and the step before the last backward */
    gen(FF_PIPE_1F1B, 3, 3, 1, false, &s);
    i = find(&s, 0, FF_PIPE_SEND_ACT, 0);
    s.streams[0].instr[i].peer = 2;
    CHECK(ff_pipe_simulate(&s, NULL, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "peer 2, but virtual stage 1 is on rank 1");
    ff_pipe_sim_clear(&r);
    s.streams[0].instr[i].peer = 1;
    st = &s.streams[2];
    i = find(&s, 2, FF_PIPE_BACKWARD, 2);
    t = st->instr[st->n - 1];
    st->instr[st->n - 1] = st->instr[i];
    st->instr[i] = t;
    CHECK(ff_pipe_simulate(&s, NULL, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "micro-batch 2 has not run backward through virtual stage 2 yet");
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
}

static void latency_and_uneven(void) {
    /* p = 2, m = 1, hop h: F, hand over, F, B, hand back, B */
    ff_pipe_schedule s;
    ff_pipe_sim r;
    gen(FF_PIPE_1F1B, 2, 1, 1, false, &s);
    ff_pipe_sim_opts o = {.fwd_s = 1, .bwd_s = 2, .hop_s = 0.25};
    DIE_IF(ff_pipe_simulate(&s, &o, &r) != 0);
    CHECK_CLOSE(r.makespan_s, 2 * (1 + 2) + 2 * 0.25, 1e-12, 0);
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
    /* GPipe with a slow middle stage (forward 1, 2, 1; backward 2, 4, 2), m = 4: each phase
     * takes the sum of its stage times plus m - 1 times the slowest: 4 + 3 x 2 and 8 + 3 x 4 */
    gen(FF_PIPE_GPIPE, 3, 4, 1, false, &s);
    double fwd[3] = {1, 2, 1}, bwd[3] = {2, 4, 2};
    o = (ff_pipe_sim_opts){.fwd_stage_s = {fwd}, .bwd_stage_s = {bwd}};
    DIE_IF(ff_pipe_simulate(&s, &o, &r) != 0);
    CHECK_CLOSE(r.makespan_s, (4 + 3 * 2) + (8 + 3 * 4), 1e-12, 0);
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
}

static void layers(void) {
    int64_t out[64];
    /* Llama 3 405B on 16 stages: 7, 8 x 14, 7, as the planner places it */
    DIE_IF(ff_pipe_place_layers(126, 16, 1, 0, 0, out) != 0);
    CHECK_EQ_INT(out[0], 7);
    CHECK_EQ_INT(out[15], 7);
    for (int k = 1; k < 15; k++) CHECK_EQ_INT(out[k], 8);
    /* Megatron's uneven option: 80 layers, first 6 and last 2 on 4 x 2 virtual stages: 12 each between */
    DIE_IF(ff_pipe_place_layers(80, 4, 2, 6, 2, out) != 0);
    CHECK_EQ_INT(out[0], 6);
    CHECK_EQ_INT(out[7], 2);
    for (int k = 1; k < 7; k++) CHECK_EQ_INT(out[k], 12);
    CHECK(ff_pipe_place_layers(80, 4, 2, 5, 2, out) == -1); /* 73 over 6 */
    CHECK_STR_CONTAINS(ff_error_message(), "divide evenly");
    /* the schedule carries the split; the planner's stages hold the same layers (chunks summed) */
    ff_pipe_config c = {.pp = 4, .vpp = 2, .micro = 8, .kind = FF_PIPE_INTERLEAVED, .layers = 80};
    ff_pipe_schedule s;
    DIE_IF(ff_pipe_generate(&c, &s) != 0);
    ff_plan_result pr;
    planner(FF_PLAN_INTERLEAVED, 4, 8, 2, &pr);
    for (int st = 0; st < 4; st++) CHECK_EQ_INT(s.models[0].stage_layers[st] + s.models[0].stage_layers[st + 4], pr.stages[st].layers);
    ff_plan_result_clear(&pr);
    /* times by layers: 10 layers a stage on average; chunks of 10 take fwd_s x 10/20 */
    double fwd[8], bwd[8];
    DIE_IF(ff_pipe_times_by_layers(&s, 0, 1, 2, fwd, bwd) != 0);
    CHECK_CLOSE(fwd[0], 0.5, 1e-12, 0);
    CHECK_CLOSE(bwd[3], 1.0, 1e-12, 0);
    ff_pipe_sim r;
    ff_pipe_sim_opts o = {.fwd_stage_s = {fwd}, .bwd_stage_s = {bwd}};
    DIE_IF(ff_pipe_simulate(&s, &o, &r) != 0);
    CHECK_CLOSE(r.bubble_fraction, 3.0 / 19, 1e-12, 1e-9);       /* even split: the formula */
    CHECK_EQ_INT(r.ranks[0].peak_layers, 11 * 10); /* 11 chunk forwards of 10 layers each */
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
    /* uneven: 6 and 2 layers at the ends leave the middle 12-layer chunks the bottleneck */
    c.layers_first = 6;
    c.layers_last = 2;
    DIE_IF(ff_pipe_generate(&c, &s) != 0);
    DIE_IF(ff_pipe_times_by_layers(&s, 0, 1, 2, fwd, bwd) != 0);
    DIE_IF(ff_pipe_simulate(&s, &o, &r) != 0);
    CHECK(r.bubble_fraction > 3.0 / 19 + 0.01);
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
}

/* Two models over two ranks in opposite directions (model 0 trains on ranks 0 -> 1, model 1 runs
 * forward-only on ranks 1 -> 0), one micro-batch each, written by hand as RLHFuse's generator
 * would. Unit times: rank 0: F0 of model 0 [0,1]; rank 1: model 1's F [0,1], then model 0's F
 * [1,2] after the hand-over at 1, B [2,4]; rank 0: model 1's F [1,2], model 0's B [4,6], step. */
static void two_models(void) {
    ff_pipe_schedule s;
    DIE_IF(ff_pipe_schedule_init(&s, 2, 2) != 0);
    int32_t fwd_dir[2] = {0, 1}, back_dir[2] = {1, 0};
    DIE_IF(ff_pipe_model_set(&s, 0, 1, 2, fwd_dir, NULL, false) != 0);
    DIE_IF(ff_pipe_model_set(&s, 1, 1, 2, back_dir, NULL, true) != 0);
    typedef ff_pipe_instr I;
    I r0[] = {{FF_PIPE_FORWARD, 0, 0, 0, -1, -1},   {FF_PIPE_SEND_ACT, 0, 0, 0, 1, 0},  {FF_PIPE_RECV_ACT, 1, 0, 0, 1, 1},
              {FF_PIPE_FORWARD, 1, 0, 0, -1, -1},   {FF_PIPE_RECV_GRAD, 0, 0, 0, 1, 2}, {FF_PIPE_BACKWARD, 0, 0, 0, -1, -1},
              {FF_PIPE_OPTIMIZER_STEP, 0, 0, -1, -1, -1}};
    I r1[] = {{FF_PIPE_FORWARD, 1, 0, 0, -1, -1},  {FF_PIPE_SEND_ACT, 1, 0, 0, 0, 0},   {FF_PIPE_RECV_ACT, 0, 0, 0, 0, 0},
              {FF_PIPE_FORWARD, 0, 0, 0, -1, -1},  {FF_PIPE_BACKWARD, 0, 0, 0, -1, -1}, {FF_PIPE_SEND_GRAD, 0, 0, 0, 0, 1},
              {FF_PIPE_OPTIMIZER_STEP, 0, 0, -1, -1, -1}};
    for (size_t i = 0; i < sizeof r0 / sizeof *r0; i++) DIE_IF(ff_pipe_push(&s, 0, r0[i]) != 0);
    for (size_t i = 0; i < sizeof r1 / sizeof *r1; i++) DIE_IF(ff_pipe_push(&s, 1, r1[i]) != 0);
    ff_pipe_sim r;
    ff_pipe_sim_opts o = {.fwd_s = 1, .bwd_s = 2};
    DIE_IF(ff_pipe_simulate(&s, &o, &r) != 0);
    CHECK_CLOSE(r.makespan_s, 6, 1e-12, 0);
    CHECK_CLOSE(r.ranks[1].end_s, 4, 1e-12, 0);
    CHECK_EQ_INT(r.ranks[0].peak_in_flight, 2); /* model 0's activation and model 1's running forward */
    char f[32];
    ff_pipe_instr_format(&s, &r0[2], f, sizeof f);
    CHECK_STR_CONTAINS(f, "1:ra0<1");
    /* model 1 is forward-only: a backward of it is refused */
    s.streams[0].instr[5].model = 1;
    ff_pipe_sim_clear(&r);
    CHECK(ff_pipe_simulate(&s, &o, &r) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "model 1 is forward-only");
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
}

static void outputs(void) {
    ff_pipe_schedule s;
    ff_pipe_sim r;
    gen(FF_PIPE_INTERLEAVED, 2, 4, 2, false, &s);
    sim(&s, 1, 2, &r);
    char *text = ff_pipe_json(&s, &r);
    REQUIRE(text);
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    REQUIRE(j);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "ranks")), 2);
    json_t *list = json_object_get(json_array_get(json_object_get(j, "ranks"), 1), "instructions");
    CHECK_EQ_INT(json_array_size(list), s.streams[1].n);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(list, 0), "op")), "recv_act"));
    json_t *js = json_object_get(j, "simulation");
    CHECK_CLOSE(json_real_value(json_object_get(js, "bubble_fraction")), 1.0 / 9, 1e-12, 1e-9);
    CHECK_CLOSE(json_real_value(json_object_get(js, "formula_bubble_fraction")), 1.0 / 9, 1e-12, 1e-9);
    json_decref(j);
    free(text);
    char path[64];
    snprintf(path, sizeof path, "/tmp/ff_test_pipe_%d.svg", (int)getpid());
    DIE_IF(ff_pipe_write_svg(&s, &r, path) != 0);
    size_t len;
    char *svg = ff_read_file(path, &len);
    REQUIRE(svg);
    int rects = 0;
    for (const char *p = svg; (p = strstr(p, "<rect")); p++) rects++;
    /* background + one row each + 16 forwards, 16 backwards, 2 steps + the 3 legend swatches */
    CHECK_EQ_INT(rects, 1 + 2 + 34 + 3);
    CHECK_STR_CONTAINS(svg, "</svg>");
    free(svg);
    unlink(path);
    ff_pipe_sim_clear(&r);
    ff_pipe_schedule_clear(&s);
}

int main(void) {
    bubble_table();
    in_flight_and_warmup();
    refusals();
    sweep();
    deadlock();
    broken_streams();
    latency_and_uneven();
    layers();
    two_models();
    outputs();
    TEST_MAIN_END();
}

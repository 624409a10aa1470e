/* The worked examples of the chapter "five parallelisms and the traffic they make" (seeds/001),
 * reproduced by the planner: memory per parameter and the ZeRO tables, the GPT-3 175B TP and PP
 * figures, the bubble fractions, the CP cost of the 128K layout and the activation figures.
 * Every check compares the planner's output (a formula of plan.h or a full ff_plan_evaluate)
 * with a figure the chapter prints, within 1%, or with a value worked out by hand from the
 * chapter's formulas and written as a literal, its derivation in the comment. The Llama 3 405B
 * table is in test_llama405.c. Not here: checks of the chapter's own arithmetic. */
#include <math.h>

#include "fuseflow/plan.h"
#include "tests/test_util.h"

#define PCT1 0.01

static void memory_per_parameter(void) {
    /* 3.1: 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter, 12 of them optimizer state */
    CHECK_CLOSE(ff_plan_state_bytes_per_param(0, FF_PLAN_ZS_DEFAULT, 64, 2, false), 16.0, 0, 1e-12);
    /* the 12 are what ZeRO-1 shards: over N = 2^20 GPUs it keeps 2 + 2 + 12 / 2^20 = 4.0000114440918 */
    CHECK_CLOSE(ff_plan_state_bytes_per_param(1, FF_PLAN_ZS_DEFAULT, 1 << 20, 2, false), 4.0000114440918, 0, 1e-12);
    /* the table: 7B -> 112 GB (2 H100s), 70B -> 1.12 TB (14), 405B -> 6.48 TB (81) at 80 GB */
    const double sizes[3] = {7e9, 70e9, 405e9}, state[3] = {112e9, 1.12e12, 6.48e12};
    const int gpus[3] = {2, 14, 81};
    for (int i = 0; i < 3; i++) {
        double b = sizes[i] * ff_plan_state_bytes_per_param(0, FF_PLAN_ZS_DEFAULT, 1, 2, false);
        CHECK_CLOSE(b, state[i], 0, PCT1);
        CHECK_EQ_INT((int)ceil(b / 80e9 - 1e-9), gpus[i]);
    }
    /* and for the presets' exact parameter counts: Llama 3 405B's state is "about 6.48 TB" */
    ff_plan_model m;
    REQUIRE(ff_plan_model_preset("llama3-405b", &m) == 0);
    CHECK_CLOSE(ff_plan_params_total(&m) * 16.0, 6.48e12, 0, PCT1);
    REQUIRE(ff_plan_model_preset("llama3-70b", &m) == 0);
    CHECK_CLOSE(ff_plan_params_total(&m) * 16.0, 1.12e12, 0, PCT1);
}

static void zero_tables(void) {
    /* 3.3, N = 4: plain 16, ZeRO-1 4 + 12/N = 7, ZeRO-2 2 + 14/N = 5.5, ZeRO-3 16/N = 4 */
    CHECK_CLOSE(ff_plan_state_bytes_per_param(0, FF_PLAN_ZS_DEFAULT, 4, 2, false), 16.0, 0, 1e-12);
    CHECK_CLOSE(ff_plan_state_bytes_per_param(1, FF_PLAN_ZS_DEFAULT, 4, 2, false), 7.0, 0, 1e-12);
    CHECK_CLOSE(ff_plan_state_bytes_per_param(2, FF_PLAN_ZS_DEFAULT, 4, 2, false), 5.5, 0, 1e-12);
    CHECK_CLOSE(ff_plan_state_bytes_per_param(3, FF_PLAN_ZS_DEFAULT, 4, 2, false), 4.0, 0, 1e-12);

    /* 3.5's table at D = 8, G = 16, for psi = 1e9 parameters with BF16 gradients on the wire:
     * S = 2 psi = 2e9 bytes, f = (D-1)/D = 7/8, f S = 1.75e9 bytes. By hand from the table's rows:
     *   memory  16; 4 + 12/8 = 5.5; 2 + 14/8 = 3.75 (peak + 2 = 5.75 with full gradients); 16/8 = 2
     *           (peak + 2 = 4 with the weights kept from forward to backward)
     *   traffic 2 f S = 3.5e9; (G+1) f S = 17 x 1.75e9 = 29.75e9; 3 G f S = 48 x 1.75e9 = 84e9;
     *           2 G f S = 32 x 1.75e9 = 56e9 */
    const int64_t D = 8, G = 16;
    const double psi = 1e9;
    struct {
        int zero;
        ff_plan_zero_schedule z;
        double mem, peak, traffic;
    } rows[] = {
        {0, FF_PLAN_ZS_ALLREDUCE, 16.0, 16.0, 3.5e9},     {1, FF_PLAN_ZS_RS_ONCE, 5.5, 5.5, 3.5e9},
        {2, FF_PLAN_ZS_AFAB_ONCE, 3.75, 5.75, 3.5e9},     {2, FF_PLAN_ZS_RS_EACH, 3.75, 3.75, 29.75e9},
        {3, FF_PLAN_ZS_GATHER_EACH, 2.0, 2.0, 84e9},      {2, FF_PLAN_ZS_LOCAL_ONCE, 5.5, 5.5, 3.5e9},
        {3, FF_PLAN_ZS_KEEP_FWD_BWD, 2.0, 4.0, 56e9},     {3, FF_PLAN_ZS_KEEP_STEP, 3.75, 3.75, 29.75e9},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        CHECK_CLOSE(ff_plan_state_bytes_per_param(rows[i].zero, rows[i].z, D, 2, false), rows[i].mem, 0, 1e-12);
        CHECK_CLOSE(ff_plan_state_bytes_per_param(rows[i].zero, rows[i].z, D, 2, true), rows[i].peak, 0, 1e-12);
        CHECK_CLOSE(ff_plan_dp_bytes(rows[i].zero, rows[i].z, D, psi, G, 2), rows[i].traffic, 0, 1e-12);
    }
    /* Llama 3's recipe: FP32 reduce-scatter + BF16 all-gather = (4 + 2) f psi = 6 x 0.875e9 = 5.25e9 */
    CHECK_CLOSE(ff_plan_dp_bytes(1, FF_PLAN_ZS_DEFAULT, D, psi, G, 4), 5.25e9, 0, 1e-12);

    /* DP: "the BF16 gradients of a 70B model take about 140 GB, and a full all-reduce makes each
     * GPU send about 280 GB": Llama 3 70B on 1024 GPUs in pure DP, ZeRO-0, BF16 on the wire */
    CHECK_CLOSE(ff_plan_ring_allreduce_bytes(1024, 140e9), 280e9, 0, PCT1);
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-70b", &in.model) == 0);
    in.cluster.gpus = 1024;
    in.layout.zero = 0;
    in.workload.grad_reduce_bytes = 2;
    in.workload.micro_batches = 16;
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_EQ_INT(r.traffic[FF_PLAN_DP].group.size, 1024);
    CHECK_CLOSE(r.traffic[FF_PLAN_DP].message_bytes, 140e9, 0, PCT1); /* the gradients reduced */
    CHECK_CLOSE(r.traffic[FF_PLAN_DP].bytes, 280e9, 0, PCT1);
    /* one all-reduce per step however many micro-batches (its reduce-scatter and all-gather halves) */
    CHECK_CLOSE(r.traffic[FF_PLAN_DP].messages, 2.0, 0, 0);
    ff_plan_result_clear(&r);
}

static void gpt3_tp_and_pp(void) {
    /* 3.4, GPT-3 175B at TP8, one 2048-token micro-batch: S = 2048 x 12288 x 2 = 50.3 MB per
     * all-reduce; 4 ring all-reduces per layer send 4 x 2 (t-1)/t S = 352 MB; 72 b s h^2 / t FLOPs
     * are 7.0 ms at 400 TFLOP/s; NVLink (450 GB/s) takes 0.78 ms of it, a NIC (50 GB/s) 7.0 ms */
    CHECK_CLOSE(ff_plan_tp_bytes(1.0, 1, 8, 2048.0, 12288), 352e6, 0, PCT1);

    /* the same through the full model: 96 layers, so per layer is the step over 96 */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("gpt3-175b", &in.model) == 0);
    in.cluster.gpus = 8;
    in.layout.tp = 8;
    in.workload.seq = 2048;
    in.workload.micro_batches = 1;
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.traffic[FF_PLAN_TP].message_bytes, 50.3e6, 0, PCT1);
    CHECK_CLOSE(r.traffic[FF_PLAN_TP].bytes / 96.0, 352e6, 0, PCT1);
    CHECK_CLOSE(r.traffic[FF_PLAN_TP].wire_s / 96.0, 0.78e-3, 0, PCT1);
    CHECK(r.traffic[FF_PLAN_TP].link == FF_PLAN_LINK_NVLINK);
    CHECK(r.traffic[FF_PLAN_TP].compute_waits);
    /* the planner also counts the attention scores (6 s^2 d heads / t, 1.4% of the matmuls) and the
     * LM head (0.4%), which the chapter's 72 b s h^2 / t leaves out: within 2% of the 7.0 ms */
    double compute_layer = r.time.compute_s / 96.0, nvlink_layer = r.traffic[FF_PLAN_TP].wire_s / 96.0;
    CHECK_CLOSE(compute_layer, 7.0e-3, 0, 0.02);
    /* "communication share": 0.78 / 7.8 = 10% on NVLink */
    CHECK_CLOSE(nvlink_layer / (nvlink_layer + compute_layer), 0.10, 0.003, 0);
    ff_plan_result_clear(&r);

    /* the 400G column: "every byte of the collective crosses one NIC", servers of one GPU each */
    in.cluster.domain = 1;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK(r.traffic[FF_PLAN_TP].link == FF_PLAN_LINK_NIC);
    CHECK_CLOSE(r.traffic[FF_PLAN_TP].bytes / 96.0, 352e6, 0, PCT1);
    double nic_layer = r.traffic[FF_PLAN_TP].wire_s / 96.0;
    CHECK_CLOSE(nic_layer, 7.0e-3, 0, PCT1);
    CHECK_CLOSE(nic_layer / (nic_layer + r.time.compute_s / 96.0), 0.50, 0.01, 0); /* 7.0 / 14 = 50% */
    ff_plan_result_clear(&r);
    in.cluster.domain = 8;

    /* 3.5: a stage boundary sends 2048 x 12288 x 2 / 8 = 6.3 MB; G = 16 forward and backward:
     * 2 x 16 x 6.3 MB, "about 200 MB" (201 MB) */
    CHECK_CLOSE(ff_plan_pp_bytes(1, 16, 2048.0, 12288, 8), 200e6, 0, PCT1);
    in.cluster.gpus = 32;
    in.layout.pp = 4;
    in.workload.micro_batches = 16;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.traffic[FF_PLAN_PP].message_bytes, 6.3e6, 0, PCT1);
    CHECK_CLOSE(r.traffic[FF_PLAN_PP].bytes, 200e6, 0, PCT1);      /* a middle stage */
    CHECK_CLOSE(r.stages[0].traffic[FF_PLAN_PP], 100.6e6, 0, PCT1); /* the first sends forward only */
    CHECK(r.traffic[FF_PLAN_PP].link == FF_PLAN_LINK_NIC);         /* TP fills the server */
    CHECK(r.traffic[FF_PLAN_PP].group.rail_aligned);
    CHECK(!r.traffic[FF_PLAN_PP].compute_waits);
    /* "three orders of magnitude below the traffic of TP" */
    CHECK(r.traffic[FF_PLAN_TP].bytes / r.traffic[FF_PLAN_PP].bytes > 500.0);
    ff_plan_result_clear(&r);
}

static void bubbles(void) {
    /* GPipe and 1F1B: (p-1)/(G+p-1) of the step, (p-1)/G of compute */
    CHECK_CLOSE(ff_plan_bubble_fraction(FF_PLAN_GPIPE, 8, 8, 1), 0.467, 0, PCT1); /* 7 of 15 units, 47% */
    CHECK_CLOSE(ff_plan_bubble_of_compute(FF_PLAN_1F1B, 8, 8, 1), 0.875, 0, 1e-12);
    CHECK_CLOSE(ff_plan_bubble_fraction(FF_PLAN_1F1B, 8, 8, 1), 7.0 / 15.0, 0, 1e-12);
    /* G = 64: 7/71 = 9.86%; the chapter rounds it to "about 10%" */
    CHECK_CLOSE(ff_plan_bubble_fraction(FF_PLAN_1F1B, 8, 64, 1), 7.0 / 71.0, 0, 1e-12);
    CHECK_EQ_INT(lround(100.0 * ff_plan_bubble_fraction(FF_PLAN_1F1B, 8, 64, 1)), 10);
    /* animation 3.2: p = 4, G = 8: 33 slots, 9 idle, "about 27%" */
    CHECK_CLOSE(ff_plan_bubble_fraction(FF_PLAN_1F1B, 4, 8, 1), 9.0 / 33.0, 0, 1e-12);
    /* 9/33 = 27.3%; the chapter rounds it to 27% */
    CHECK_EQ_INT(lround(100.0 * ff_plan_bubble_fraction(FF_PLAN_1F1B, 4, 8, 1)), 27);
    /* the same bubble for GPipe, but stage 1 holds G activations instead of p */
    CHECK_CLOSE(ff_plan_bubble_fraction(FF_PLAN_GPIPE, 4, 8, 1), ff_plan_bubble_fraction(FF_PLAN_1F1B, 4, 8, 1), 0, 1e-12);
    CHECK_CLOSE(ff_plan_in_flight(FF_PLAN_GPIPE, 4, 8, 1, 0), 8.0, 0, 1e-12);
    CHECK_CLOSE(ff_plan_in_flight(FF_PLAN_1F1B, 4, 8, 1, 0), 4.0, 0, 1e-12);
    CHECK_CLOSE(ff_plan_in_flight(FF_PLAN_AFAB, 16, 16, 1, 0), 16.0, 0, 1e-12);
    /* Llama 3: p = 16, G = 16 under 1F1B: 15/31 = 48%; the fewest chunks that bring it under 25%:
     * v = 3 (15/63 = 23.8%), and v = 2 is not enough (15/47 = 31.9%) */
    CHECK_CLOSE(ff_plan_bubble_fraction(FF_PLAN_1F1B, 16, 16, 1), 15.0 / 31.0, 0, 1e-12);
    CHECK(ff_plan_bubble_fraction(FF_PLAN_INTERLEAVED, 16, 16, 2) > 0.25);
    CHECK(ff_plan_bubble_fraction(FF_PLAN_INTERLEAVED, 16, 16, 3) < 0.25);
    CHECK_CLOSE(ff_plan_bubble_of_compute(FF_PLAN_INTERLEAVED, 16, 16, 3), 15.0 / 48.0, 0, 1e-12);
    /* Table 4 row 1: G = 32, (p-1)/G = 15/32 before interleaving */
    CHECK_CLOSE(ff_plan_bubble_of_compute(FF_PLAN_1F1B, 16, 32, 1), 15.0 / 32.0, 0, 1e-12);
    /* MegaScale: four times the micro-batches cut bubble / compute by 75% */
    CHECK_CLOSE(1.0 - ff_plan_bubble_of_compute(FF_PLAN_1F1B, 16, 64, 1) / ff_plan_bubble_of_compute(FF_PLAN_1F1B, 16, 16, 1), 0.75, 0,
                1e-12);
    /* 1F1B: stage i holds p - i micro-batches at most (figure 3.11: 16, 15, ..., 1) */
    for (int64_t i = 0; i < 16; i++) CHECK_CLOSE(ff_plan_in_flight(FF_PLAN_1F1B, 16, 16, 1, i), (double)(16 - i), 0, 1e-12);

    /* interleaving multiplies the point-to-point messages by v: p = 16, G = 16, v = 3 */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-70b", &in.model) == 0);
    in.cluster.gpus = 128;
    in.layout.tp = 8, in.layout.pp = 16;
    in.workload.seq = 8192, in.workload.micro_batches = 16;
    ff_plan_result a, b;
    REQUIRE(ff_plan_evaluate(&in, &a) == 0);
    in.layout.vpp = 3;
    REQUIRE(ff_plan_evaluate(&in, &b) == 0);
    CHECK_CLOSE(b.traffic[FF_PLAN_PP].messages, 3.0 * a.traffic[FF_PLAN_PP].messages, 0, 1e-12);
    CHECK_CLOSE(b.traffic[FF_PLAN_PP].message_bytes, a.traffic[FF_PLAN_PP].message_bytes, 0, 1e-12);
    CHECK_CLOSE(a.time.bubble_fraction, 15.0 / 31.0, 0, 1e-12);
    CHECK_CLOSE(b.time.bubble_fraction, 15.0 / 63.0, 0, 1e-12);
    CHECK(b.time.bubble_s < a.time.bubble_s);
    /* interleaving holds more activations on the first stage, p + (p-1)/v micro-batches (Megatron's
     * warm-up), but never more than the G of the step: with G = p = 16 all of them */
    CHECK_CLOSE(ff_plan_in_flight(FF_PLAN_INTERLEAVED, 16, 32, 3, 0), 21.0, 0, 1e-12); /* 16 + 15/3 */
    CHECK_CLOSE(b.stages[0].in_flight, 16.0, 0, 1e-12);
    CHECK_CLOSE(b.stages[15].in_flight, 11.0, 0, 1e-12); /* (v-1) p + 1 = 33 chunks on the last, 33/3 */
    ff_plan_result_clear(&a);
    ff_plan_result_clear(&b);
}

static void cp_128k(void) {
    /* 3.6, Llama 3 405B at TP8-CP16-PP16-DP8, 131,072 tokens: K and V of one KV head for the whole
     * sequence 67 MB per layer; an all-gather brings 15/16 of it, 63 MB; three per layer per
     * micro-batch, about 190 MB (188.7 MB); per step 7.9 x 16 x 190 MB, about 24 GB */
    CHECK_CLOSE(ff_plan_cp_bytes(1.0, 1, 16, 131072, 8, 8, 128), 190e6, 0, PCT1);
    CHECK_CLOSE(ff_plan_cp_bytes(126.0 / 16.0, 16, 16, 131072, 8, 8, 128), 24e9, 0, PCT1);
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-405b", &in.model) == 0);
    in.cluster.gpus = 16384;
    in.layout.tp = 8, in.layout.cp = 16, in.layout.pp = 16;
    in.workload.seq = 131072, in.workload.micro_batches = 16;
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_EQ_INT(r.traffic[FF_PLAN_CP].group.size, 16);
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].message_bytes, 67e6, 0, PCT1);
    /* the busiest stage has 8 layers: 16 micro-batches x 8 layers x 3 collectives */
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].messages, 384.0, 0, 0);
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].bytes / r.traffic[FF_PLAN_CP].messages, 63e6, 0, PCT1);
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].bytes / (16.0 * 8.0), 190e6, 0, PCT1);
    /* activations: 34 s b h / (TP CP) per layer, so CP = 16 keeps the 8K phase's 0.57 GB */
    CHECK_CLOSE(ff_plan_layer_activation_bytes(34.0, 131072.0 / 16.0, 16384, 8, true), 0.57e9, 0, PCT1);
    ff_plan_result_clear(&r);
    /* "Set CP to 1: the activations pass 1 TB": 16 micro-batches in flight on the first stage
     * (7 layers here, 7.875 in the chapter's panel) x 34 x 131072 x 16384 / 8 bytes = 1.02 TB */
    in.layout.cp = 1;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK(r.memory.activation_bytes > 1e12);
    CHECK(!r.memory.fits);
    ff_plan_result_clear(&r);
}

static void activations(void) {
    /* 3.1: 34 s b h = 4.56 GB per layer for 405B at 8K */
    CHECK_CLOSE(ff_plan_layer_activation_bytes(34.0, 8192.0, 16384, 1, false), 4.56e9, 0, PCT1);
    /* 126 layers on one GPU (no TP, no PP, one micro-batch): "about 575 GB" */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-405b", &in.model) == 0);
    in.cluster.gpus = 1;
    in.workload.seq = 8192, in.workload.micro_batches = 1;
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.memory.activation_bytes, 575e9, 0, PCT1);
    ff_plan_result_clear(&r);
    /* checkpointing keeps each layer's input, 2 s b h = 2 x 8192 x 16384 = 268,435,456 bytes, for
     * 126 layers, plus the 34 s b h of the one layer being recomputed: 126 x 268,435,456 +
     * 4,563,402,752 = 38,386,270,208 bytes */
    in.layout.checkpoint = true;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.memory.activation_bytes, 38386270208.0, 0, 1e-12);
    ff_plan_result_clear(&r);
    /* without SP, TP splits only the 24 s b h of attention and the MLP (Korthikanti et al.): at
     * t = 8, (10 + 24/8) s b h = 13 x 134,217,728 = 1,744,830,464 bytes */
    CHECK_CLOSE(ff_plan_layer_activation_bytes(34.0, 8192.0, 16384, 8, false), 1744830464.0, 0, 1e-12);
}

static void tokens_per_step(void) {
    /* Megatron Bridge table: B = s b D G: 8B on 8 GPUs (DP 8, G 16), 70B on 64 (TP4 PP8, DP 2, G 64),
     * 405B on 1024 (TP8 PP8 CP2, DP 8, G 64): 1.05 M, 1.05 M, 4.19 M tokens */
    struct {
        const char *model;
        int64_t gpus, tp, pp, cp, G;
        double tokens;
    } rows[] = {{"llama3-8b", 8, 1, 1, 1, 16, 1.05e6}, {"llama3-70b", 64, 4, 8, 1, 64, 1.05e6}, {"llama3-405b", 1024, 8, 8, 2, 64, 4.19e6}};
    for (size_t i = 0; i < 3; i++) {
        ff_plan_input in;
        ff_plan_input_defaults(&in);
        REQUIRE(ff_plan_model_preset(rows[i].model, &in.model) == 0);
        in.cluster.gpus = rows[i].gpus;
        in.layout.tp = rows[i].tp, in.layout.pp = rows[i].pp, in.layout.cp = rows[i].cp;
        in.workload.seq = 8192, in.workload.micro_batches = rows[i].G;
        ff_plan_result r;
        REQUIRE(ff_plan_evaluate(&in, &r) == 0);
        CHECK_CLOSE(r.tokens_per_step, rows[i].tokens, 0, PCT1);
        ff_plan_result_clear(&r);
    }
}

int main(void) {
    memory_per_parameter();
    zero_tables();
    gpt3_tp_and_pp();
    bubbles();
    cp_128k();
    activations();
    tokens_per_step();
    TEST_MAIN_END();
}

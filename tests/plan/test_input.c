/* Planner inputs: presets and their parameter counts against the published ones, the same models
 * read from Hugging Face config.json files, configuration trees with units and shorthands, and
 * every kind of bad input: an unknown preset, malformed config.json, unknown keys, bad units,
 * impossible layouts (each message names the constraint that fails). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/config.h"
#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "tests/test_util.h"

static void presets(void) {
    /* exact counts of the released checkpoints (safetensors index totals) */
    struct {
        const char *name;
        double total, active;
    } rows[] = {
        {"llama3-8b", 8030261248.0, 8030261248.0},
        {"llama3-70b", 70553706496.0, 70553706496.0},
        {"llama3-405b", 405853388800.0, 405853388800.0},
        {"mixtral-8x7b", 46702792704.0, 0.0}, /* active: "12.9B" (Mistral AI), checked below */
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        ff_plan_model m;
        REQUIRE(ff_plan_model_preset(rows[i].name, &m) == 0);
        CHECK_CLOSE(ff_plan_params_total(&m), rows[i].total, 0, 1e-12);
        if (rows[i].active > 0) CHECK_CLOSE(ff_plan_params_active(&m), rows[i].active, 0, 1e-12);
        else CHECK_CLOSE(ff_plan_params_active(&m), 12.9e9, 0, 0.01);
    }
    ff_plan_model m;
    REQUIRE(ff_plan_model_preset("gpt3-175b", &m) == 0);
    CHECK_CLOSE(ff_plan_params_total(&m), 175e9, 0, 0.01);
    /* GPT-3's layer: 12 h^2 plus biases and LayerNorms */
    CHECK_CLOSE(ff_plan_params_attention(&m) + ff_plan_params_mlp(&m), 12.0 * 12288.0 * 12288.0, 0, 1e-3);

    CHECK(ff_plan_model_preset("llama4-2t", &m) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown model preset");
    CHECK_STR_CONTAINS(ff_error_message(), "llama3-405b");
    ff_plan_cluster c;
    REQUIRE(ff_plan_cluster_preset("dgx-h200", &c) == 0);
    CHECK_CLOSE(c.hbm_bytes, 141e9, 0, 1e-12);
    CHECK_CLOSE(c.nvlink_bps, 450e9, 0, 1e-12);
    CHECK_CLOSE(c.nic_bps, 50e9, 0, 1e-12);
    CHECK_EQ_INT(c.domain, 8);
    CHECK(ff_plan_cluster_preset("tpu-v5", &c) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown cluster preset");
}

static const char *llama8b_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"vocab_size\": 128256,"
    " \"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0}";

static const char *mixtral_json =
    "{\"model_type\": \"mixtral\", \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"vocab_size\": 32000, \"num_local_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"tie_word_embeddings\": false}";

static const char *gpt2_json =
    "{\"model_type\": \"gpt2\", \"n_embd\": 768, \"n_head\": 12, \"n_layer\": 12, \"n_positions\": 1024, \"n_inner\": null,"
    " \"vocab_size\": 50257}";

static void hf_config(void) {
    ff_plan_model m, p;
    REQUIRE(ff_plan_model_from_hf_json(llama8b_json, strlen(llama8b_json), "llama/config.json", &m) == 0);
    REQUIRE(ff_plan_model_preset("llama3-8b", &p) == 0);
    CHECK_CLOSE(ff_plan_params_total(&m), ff_plan_params_total(&p), 0, 1e-12);
    CHECK_EQ_INT(m.head_dim, 128);
    CHECK(m.gated_mlp && !m.tied_embeddings && !m.layernorm);
    REQUIRE(ff_plan_model_from_hf_json(mixtral_json, strlen(mixtral_json), "mixtral/config.json", &m) == 0);
    CHECK_EQ_INT(m.experts, 8);
    CHECK_EQ_INT(m.experts_per_token, 2);
    CHECK_EQ_INT(m.moe_layers, 32);
    CHECK_CLOSE(ff_plan_params_total(&m), 46702792704.0, 0, 1e-12);
    /* GPT-2 small: 124,439,808 parameters, tied, biases, LayerNorm, learned positions */
    REQUIRE(ff_plan_model_from_hf_json(gpt2_json, strlen(gpt2_json), "gpt2/config.json", &m) == 0);
    CHECK_CLOSE(ff_plan_params_total(&m), 124439808.0, 0, 1e-12);
    CHECK_EQ_INT(m.ffn, 3072);

    /* the same through a file */
    char path[] = "/tmp/ff_plan_cfg_XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, llama8b_json, strlen(llama8b_json)) == (ssize_t)strlen(llama8b_json));
    close(fd);
    REQUIRE(ff_plan_model_from_hf_config(path, &m) == 0);
    CHECK_EQ_INT(m.layers, 32);
    unlink(path);
    CHECK(ff_plan_model_from_hf_config("/nonexistent/config.json", &m) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/config.json");

    /* malformed files: the message names the file, the place and the problem */
    struct {
        const char *text, *expect;
    } bad[] = {
        {"{\"hidden_size\": 4096,", "cfg.json:1:"},
        {"[1, 2]", "not a JSON object"},
        {"{\"hidden_size\": 4096, \"num_attention_heads\": 32, \"vocab_size\": 10}", "'num_hidden_layers' is missing"},
        {"{\"num_hidden_layers\": \"32\", \"hidden_size\": 4096, \"num_attention_heads\": 32, \"vocab_size\": 10}",
         "'num_hidden_layers' must be a non-negative integer"},
        {"{\"num_hidden_layers\": 2, \"hidden_size\": 100, \"num_attention_heads\": 3, \"vocab_size\": 10, \"intermediate_size\": 8}",
         "not a multiple of 3 heads"},
        {"{\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 10}", "'intermediate_size' is missing"},
        {"{\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 10, \"intermediate_size\": 8,"
         " \"tie_word_embeddings\": \"yes\"}",
         "must be a boolean"},
        {"{\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 10, \"intermediate_size\": 8,"
         " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"shared_expert_intermediate_size\": 8}",
         "shared experts"},
        {"{\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 10, \"intermediate_size\": 8,"
         " \"num_local_experts\": 4}",
         "'num_experts_per_tok' is missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(ff_plan_model_from_hf_json(bad[i].text, strlen(bad[i].text), "cfg.json", &m) != 0);
        CHECK_STR_CONTAINS(ff_error_message(), bad[i].expect);
        CHECK_STR_CONTAINS(ff_error_message(), "cfg.json");
    }
}

static void quantities(void) {
    double v;
    CHECK(ff_plan_parse_quantity("80GB", "GB", &v) == 0 && v == 80e9);
    CHECK(ff_plan_parse_quantity("80 GiB", "GB", &v) == 0 && v == 80.0 * 1073741824.0);
    CHECK(ff_plan_parse_quantity("141", "GB", &v) == 0 && v == 141e9);
    CHECK(ff_plan_parse_quantity("400Gb/s", "Gb/s", &v) == 0 && v == 50e9);
    CHECK(ff_plan_parse_quantity("450GB/s", "Gb/s", &v) == 0 && v == 450e9);
    CHECK(ff_plan_parse_quantity("400", "Gb/s", &v) == 0 && v == 50e9);
    CHECK(ff_plan_parse_quantity("0.4P", "TFLOP/s", &v) == 0 && v == 0.4e15);
    CHECK(ff_plan_parse_quantity("450GB/s", "GB", &v) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "a size such as 80GB");
    CHECK(ff_plan_parse_quantity("fast", "GB/s", &v) != 0);
    CHECK(ff_plan_parse_quantity("-3GB", "GB", &v) != 0);
    CHECK(ff_plan_parse_quantity("3 parsecs", "GB", &v) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown unit 'parsecs'");

    ff_plan_layout l;
    memset(&l, 0, sizeof l);
    REQUIRE(ff_plan_parse_order("tp-cp-ep-dp-pp", &l) == 0);
    CHECK_EQ_INT(l.n_order, 5);
    CHECK_EQ_INT(l.order[4], FF_PLAN_PP);
    CHECK(ff_plan_parse_order("tp,cp,pp", &l) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "lacks 'dp'");
    CHECK(ff_plan_parse_order("tp,cp,pp,dp,tp", &l) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "appears twice");
    CHECK(ff_plan_parse_order("tp,xx,pp,dp", &l) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown dimension 'xx'");
    REQUIRE(ff_plan_parse_layout("TP8-CP16-PP16-DP8", &l) == 0);
    CHECK(l.tp == 8 && l.cp == 16 && l.pp == 16 && l.dp == 8);
    REQUIRE(ff_plan_parse_layout("tp4 ep8 vpp2", &l) == 0);
    CHECK(l.tp == 4 && l.ep == 8 && l.vpp == 2);
    CHECK(ff_plan_parse_layout("TP8-QQ2", &l) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown dimension 'QQ'");
    CHECK(ff_plan_parse_layout("TP0", &l) != 0);
}

/* A configuration tree as the command builds it. */
static int from_yaml(const char *yaml, ff_plan_input *in) {
    ff_config *c = ff_config_parse(yaml, strlen(yaml), "plan.yaml");
    REQUIRE(c);
    int rc = ff_plan_input_from_config(c, NULL, in);
    if (!rc) rc = ff_config_check_unused(c);
    ff_config_destroy(&c);
    return rc;
}

static void config_tree(void) {
    ff_plan_input in;
    const char *yaml = "model: {preset: llama3-405b}\n"
                       "workload: {seq: 131072, micro_batch: 1, micro_batches: 16, grad_reduce: fp32}\n"
                       "layout: {degrees: TP8-CP16-PP16-DP8, zero: 1, order: [tp, cp, pp, dp]}\n"
                       "cluster: {preset: dgx-h100, gpus: 16384, nic: 400Gb/s, hbm: 80GB}\n";
    REQUIRE(from_yaml(yaml, &in) == 0);
    CHECK_EQ_INT(in.layout.cp, 16);
    CHECK_EQ_INT(in.cluster.gpus, 16384);
    CHECK_CLOSE(in.cluster.nic_bps, 50e9, 0, 1e-12);
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_CLOSE(r.traffic[FF_PLAN_CP].bytes_mean, 24e9, 0, 0.01);
    char *json = ff_plan_report_json(&in, &r);
    REQUIRE(json);
    CHECK_STR_CONTAINS(json, "\"activation_bytes\"");
    CHECK_STR_CONTAINS(json, "\"iteration_s\"");
    CHECK_STR_CONTAINS(json, "\"link\": \"nic\"");
    free(json);
    ff_plan_result_clear(&r);

    /* the GPU count follows the degrees when it is not given */
    REQUIRE(from_yaml("model: {preset: llama3-8b}\nlayout: {tp: 2, pp: 2, dp: 2}\n", &in) == 0);
    CHECK_EQ_INT(in.cluster.gpus, 8);
    /* a model from keys alone */
    REQUIRE(from_yaml("model: {layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn: 1024, vocab: 1000}\n", &in) == 0);
    CHECK_EQ_INT(in.model.head_dim, 64);
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    ff_plan_result_clear(&r);

    /* bad trees: misspelled key (with a suggestion), bad enum, bad unit, bad type, two models */
    struct {
        const char *yaml, *expect;
    } bad[] = {
        {"model: {preset: llama3-8b}\nlayout: {tpp: 2}\n", "layout.tpp"},
        {"model: {preset: llama3-8b}\nlayout: {schedule: zigzag}\n", "one of: 1f1b, gpipe, interleaved, afab"},
        {"model: {preset: llama3-8b}\ncluster: {nic: 400 furlongs}\n", "unknown unit 'furlongs'"},
        {"model: {preset: llama3-8b}\nworkload: {seq: long}\n", "'workload.seq' must be an integer"},
        {"model: {preset: llama3-8b, config: x.json}\n", "both a preset"},
        {"model: {preset: gpt5}\n", "unknown model preset"},
        {"model: {preset: llama3-8b}\nlayout: {order: [tp, pp]}\n", "rank order lacks"},
        {"model: {preset: llama3-8b}\nworkload: {grad_reduce: fp8}\n", "one of: bf16, fp32"},
        {"model: {preset: llama3-8b}\nlayout: {tp: -2}\n", "must not be negative"},
        {"model: {preset: llama3-8b}\ncluster: {topology: torus}\n", "one of: clos, rail-only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(from_yaml(bad[i].yaml, &in) != 0);
        CHECK_STR_CONTAINS(ff_error_message(), bad[i].expect);
    }
}

/* Each impossible layout: the message names the constraint. */
static void impossible(void) {
    struct {
        const char *model;
        int64_t gpus, tp, cp, pp, dp, ep, vpp, seq, g;
        int zero;
        ff_plan_schedule sched;
        ff_plan_zero_schedule zs;
        const char *expect;
    } rows[] = {
        {"llama3-405b", 16384, 8, 1, 16, 64, 1, 1, 8192, 16, 1, FF_PLAN_1F1B, 0, "= 8192, but the cluster has 16384 GPUs"},
        {"llama3-405b", 12288, 12, 1, 16, 64, 1, 1, 8192, 16, 1, FF_PLAN_1F1B, 0, "TP 12 and the 8 key-value heads: neither divides the other"},
        {"gpt3-175b", 80, 5, 1, 1, 16, 1, 1, 2048, 1, 1, FF_PLAN_1F1B, 0, "TP 5 and the 96 key-value heads: neither divides the other"},
        {"llama3-8b", 64, 64, 1, 1, 1, 1, 1, 8192, 1, 1, FF_PLAN_1F1B, 0, "TP 64 does not divide the 32 query heads"},
        {"llama3-8b", 64, 1, 1, 64, 1, 1, 1, 8192, 64, 1, FF_PLAN_1F1B, 0, "PP 64 has more stages than the 32 layers"},
        {"llama3-8b", 16, 1, 1, 8, 2, 1, 8, 8192, 8, 1, FF_PLAN_INTERLEAVED, 0, "virtual stages are more than the 32 layers"},
        {"llama3-8b", 64, 8, 1, 1, 8, 8, 1, 8192, 1, 1, FF_PLAN_1F1B, 0, "EP 8 without experts"},
        {"mixtral-8x7b", 64, 8, 1, 1, 8, 3, 1, 8192, 1, 1, FF_PLAN_1F1B, 0, "EP 3 does not divide the 8 experts"},
        {"mixtral-8x7b", 64, 8, 1, 2, 4, 8, 1, 8192, 1, 1, FF_PLAN_1F1B, 0, "EP 8 must divide DP 4"},
        {"llama3-8b", 64, 8, 3, 1, 0, 1, 1, 8192, 1, 1, FF_PLAN_1F1B, 0, "does not divide the 64 GPUs"},
        {"llama3-8b", 128, 8, 16, 1, 0, 1, 1, 8200, 1, 1, FF_PLAN_1F1B, 0, "multiple of 2 x CP = 32"},
        {"llama3-8b", 32, 8, 1, 4, 1, 1, 2, 8192, 6, 1, FF_PLAN_INTERLEAVED, 0, "a multiple of PP (4)"},
        {"llama3-8b", 32, 8, 1, 4, 1, 1, 1, 8192, 8, 1, FF_PLAN_INTERLEAVED, 0, "needs chunks"},
        {"llama3-8b", 32, 8, 1, 4, 1, 1, 2, 8192, 8, 1, FF_PLAN_GPIPE, 0, "gpipe has no interleaved chunks"},
        {"llama3-8b", 32, 8, 1, 4, 1, 1, 1, 8192, 8, 2, FF_PLAN_1F1B, FF_PLAN_ZS_AFAB_ONCE, "needs all forwards before the backwards"},
        {"llama3-8b", 32, 8, 1, 4, 1, 1, 1, 8192, 8, 1, FF_PLAN_1F1B, FF_PLAN_ZS_GATHER_EACH, "belongs to ZeRO-3, not ZeRO-1"},
        {"llama3-8b", 32, 8, 1, 4, 1, 1, 1, 8192, 8, 5, FF_PLAN_1F1B, 0, "ZeRO stage 5"},
        {"llama3-8b", 12, 4, 1, 1, 3, 1, 1, 8192, 1, 1, FF_PLAN_1F1B, 0, "do not fill HB domains of 8"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        ff_plan_input in;
        ff_plan_input_defaults(&in);
        REQUIRE(ff_plan_model_preset(rows[i].model, &in.model) == 0);
        in.cluster.gpus = rows[i].gpus;
        in.layout.tp = rows[i].tp, in.layout.cp = rows[i].cp, in.layout.pp = rows[i].pp, in.layout.dp = rows[i].dp;
        in.layout.ep = rows[i].ep, in.layout.vpp = rows[i].vpp, in.layout.zero = rows[i].zero;
        in.layout.schedule = rows[i].sched, in.layout.zero_schedule = rows[i].zs;
        in.workload.seq = rows[i].seq, in.workload.micro_batches = rows[i].g;
        ff_plan_result r;
        int rc = ff_plan_evaluate(&in, &r);
        CHECK(rc != 0);
        if (rc == 0) {
            fprintf(stderr, "row %zu was accepted\n", i);
            ff_plan_result_clear(&r);
            continue;
        }
        CHECK_STR_CONTAINS(ff_error_message(), rows[i].expect);
    }
    /* an impossible global batch, and uneven stages that do not divide */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-405b", &in.model) == 0);
    in.cluster.gpus = 16384, in.layout.tp = 8, in.layout.pp = 16, in.workload.micro_batches = 0, in.workload.global_batch = 1000;
    ff_plan_result r;
    CHECK(ff_plan_evaluate(&in, &r) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "global batch of 1000 sequences is not a multiple of micro-batch 1 x DP 128");
    in.workload.global_batch = 2048, in.layout.layers_first = 5;
    CHECK(ff_plan_evaluate(&in, &r) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "leave 121 layers for 15 stages");
    /* Megatron's uneven option: 6 on the first, 6 on the last, 114 over 14 stages does not divide;
     * 7 and 7 leave 112 = 14 x 8 */
    in.layout.layers_first = 7, in.layout.layers_last = 7;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    CHECK_EQ_INT(r.stages[0].layers, 7);
    CHECK_EQ_INT(r.stages[1].layers, 8);
    CHECK_EQ_INT(r.global_batch, 2048);
    CHECK_EQ_INT(r.micro_batches, 16);
    ff_plan_result_clear(&r);
    /* balanced placements put the shorter stages at both ends, and interleaving spreads over v p */
    ff_plan_layout l;
    memset(&l, 0, sizeof l);
    int64_t out[64];
    ff_plan_model m;
    REQUIRE(ff_plan_model_preset("llama3-405b", &m) == 0);
    l.pp = 16, l.vpp = 1;
    REQUIRE(ff_plan_place_layers(&m, &l, out) == 0);
    CHECK(out[0] == 7 && out[15] == 7 && out[1] == 8 && out[14] == 8);
    m.layers = 30, l.pp = 8;
    REQUIRE(ff_plan_place_layers(&m, &l, out) == 0);
    CHECK(out[0] == 3 && out[7] == 3 && out[3] == 4);
    m.layers = 33;
    REQUIRE(ff_plan_place_layers(&m, &l, out) == 0);
    int64_t sum = 0;
    for (int i = 0; i < 8; i++) sum += out[i];
    CHECK_EQ_INT(sum, 33);
    CHECK(out[0] == 4 && out[7] == 4);
    m.layers = 126, l.pp = 8, l.vpp = 2;
    REQUIRE(ff_plan_place_layers(&m, &l, out) == 0);
    CHECK(out[0] == 7 && out[15] == 7 && out[8] == 8);
}

int main(void) {
    presets();
    hf_config();
    quantities();
    config_tree();
    impossible();
    TEST_MAIN_END();
}

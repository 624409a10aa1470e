/* config.json and model folders: real configs of each family parse to the right values,
 * everything the engine does not run is refused by name, weights are checked against the
 * config, and folders are written atomically and read back identical. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuseflow/modelio.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static char g_dir[256];

static void test_real_configs(void) {
    ff_model_config c;
    REQUIRE(ff_hf_config_load("tests/modelio/data/configs/llama3.2-1b.json", &c) == 0);
    CHECK(!strcmp(c.model_type, "llama"));
    CHECK_EQ_INT(c.vocab_size, 128256);
    CHECK_EQ_INT(c.hidden_size, 2048);
    CHECK_EQ_INT(c.num_key_value_heads, 8);
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK(c.tie_word_embeddings);
    CHECK(!c.attention_bias);
    CHECK_CLOSE(c.rope_theta, 500000.0, 0, 0);
    CHECK_CLOSE(c.rms_norm_eps, 1e-5, 0, 0);
    CHECK_EQ_INT(c.rope_scaling.kind, FF_ROPE_SCALING_LLAMA3);
    CHECK_CLOSE(c.rope_scaling.factor, 32.0, 0, 0);
    CHECK_EQ_INT(c.rope_scaling.original_max_position_embeddings, 8192);
    CHECK_EQ_INT(c.n_eos, 3);
    CHECK_EQ_INT(c.eos_token_ids[2], 128009);
    CHECK_EQ_INT(c.bos_token_id, 128000);
    CHECK_EQ_INT(c.pad_token_id, -1);
    CHECK(!c.value_head);

    REQUIRE(ff_hf_config_load("tests/modelio/data/configs/qwen2.5-0.5b.json", &c) == 0);
    CHECK(!strcmp(c.model_type, "qwen2"));
    CHECK(c.attention_bias); /* Qwen2 always has q/k/v biases */
    CHECK_EQ_INT(c.head_dim, 64);
    CHECK_EQ_INT(c.num_key_value_heads, 2);
    CHECK_EQ_INT(c.n_eos, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 151645);

    REQUIRE(ff_hf_config_load("tests/modelio/data/configs/mistral-7b-v0.3.json", &c) == 0);
    CHECK(!strcmp(c.model_type, "mistral"));
    CHECK(!c.tie_word_embeddings);
    CHECK_EQ_INT(c.head_dim, 128);

    CHECK(ff_hf_config_load("tests/modelio/data/configs/mistral-7b-v0.1.json", &c) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "mistral-7b-v0.1.json");
    CHECK_STR_CONTAINS(ff_error_message(), "'sliding_window' 4096 is smaller than the context");

    CHECK(ff_hf_config_load("/nonexistent/config.json", &c) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/config.json: cannot open");
}

static void expect_config_error(const char *json, const char *needle) {
    ff_model_config c;
    if (ff_hf_config_parse(json, strlen(json), "cfg.json", &c) == 0) {
        fprintf(stderr, "accepted: %s\n", json);
        ff_test_failures++;
        return;
    }
    CHECK_STR_CONTAINS(ff_error_message(), "cfg.json: ");
    CHECK_STR_CONTAINS(ff_error_message(), needle);
}

static void test_config_rules(void) {
    ff_model_config c;
    /* defaults: a bare model_type gets Hugging Face's */
    REQUIRE(ff_hf_config_parse("{\"model_type\": \"llama\"}", 23, NULL, &c) == 0);
    CHECK_EQ_INT(c.vocab_size, 32000);
    CHECK_EQ_INT(c.intermediate_size, 11008);
    CHECK_EQ_INT(c.num_key_value_heads, 32);
    CHECK_EQ_INT(c.max_position_embeddings, 2048);
    CHECK_EQ_INT(c.bos_token_id, 1);
    CHECK_EQ_INT(c.eos_token_ids[0], 2);
    CHECK_CLOSE(c.rms_norm_eps, 1e-6, 0, 0);
    const char *mis = "{\"architectures\": [\"MistralForCausalLM\"], \"sliding_window\": null}";
    REQUIRE(ff_hf_config_parse(mis, strlen(mis), NULL, &c) == 0);
    CHECK_EQ_INT(c.num_key_value_heads, 8);
    CHECK_EQ_INT(c.max_position_embeddings, 131072);
    const char *nokv = "{\"model_type\": \"llama\", \"num_attention_heads\": 8, \"hidden_size\": 256, \"num_key_value_heads\": null}";
    REQUIRE(ff_hf_config_parse(nokv, strlen(nokv), NULL, &c) == 0);
    CHECK_EQ_INT(c.num_key_value_heads, 8);
    CHECK_EQ_INT(c.head_dim, 32);
    const char *v5 = "{\"model_type\": \"qwen2\", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}}";
    REQUIRE(ff_hf_config_parse(v5, strlen(v5), NULL, &c) == 0);
    CHECK_CLOSE(c.rope_theta, 1e6, 0, 0);
    const char *rm = "{\"architectures\": [\"LlamaForSequenceClassification\"], \"id2label\": {\"0\": \"LABEL_0\"}, \"pad_token_id\": 0}";
    REQUIRE(ff_hf_config_parse(rm, strlen(rm), NULL, &c) == 0);
    CHECK(c.value_head);
    CHECK_EQ_INT(c.pad_token_id, 0);
    const char *eos_null = "{\"model_type\": \"llama\", \"eos_token_id\": null, \"bos_token_id\": null}";
    REQUIRE(ff_hf_config_parse(eos_null, strlen(eos_null), NULL, &c) == 0);
    CHECK_EQ_INT(c.n_eos, 0);
    CHECK_EQ_INT(c.bos_token_id, -1);

    expect_config_error("{\"architectures\": [\"GPT2LMHeadModel\"]}", "unsupported architecture 'GPT2LMHeadModel'");
    expect_config_error("{\"model_type\": \"gemma\"}", "unsupported model_type 'gemma'");
    expect_config_error("{}", "neither 'model_type' nor 'architectures'");
    expect_config_error("{\"model_type\": \"qwen2\", \"architectures\": [\"LlamaForCausalLM\"]}", "'model_type' is 'qwen2' but");
    expect_config_error("{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", "unsupported 'hidden_act'");
    expect_config_error("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}", "unsupported rope scaling 'yarn'");
    expect_config_error("{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", "unsupported rope scaling 'linear'");
    expect_config_error("{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}", "needs \"low_freq_factor\"");
    expect_config_error("{\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 4096, \"max_window_layers\": 4}",
                        "sliding-window attention is not supported");
    expect_config_error("{\"model_type\": \"llama\", \"mlp_bias\": true}", "'mlp_bias'");
    expect_config_error("{\"model_type\": \"llama\", \"attention_bias\": true}", "o_proj bias");
    expect_config_error("{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"gptq\"}}", "quantised checkpoints");
    expect_config_error("{\"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_key_value_heads\": 5}", "must divide");
    expect_config_error("{\"model_type\": \"llama\", \"hidden_size\": 100, \"num_attention_heads\": 3}", "not divisible");
    expect_config_error("{\"model_type\": \"llama\", \"hidden_size\": \"big\"}", "'hidden_size' must be an integer");
    expect_config_error("{\"model_type\": \"llama\", \"vocab_size\": 0}", "'vocab_size' must be positive");
    expect_config_error("{\"model_type\": \"llama\", \"eos_token_id\": 32000}", "special token id 32000 is outside the vocabulary");
    expect_config_error("{\"model_type\": \"llama\", \"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", "at most 8");
    expect_config_error("{\"model_type\": \"llama\", \"eos_token_id\": \"2\"}", "'eos_token_id' must be an integer");
    expect_config_error("{\"model_type\": \"llama\", \"tie_word_embeddings\": 1}", "must be true or false");
    expect_config_error("{\"architectures\": [\"Qwen2ForSequenceClassification\"], \"num_labels\": 3}", "with 3 labels");
    expect_config_error("{\"model_type\": \"llama\",", "malformed JSON");
    expect_config_error("[1]", "must be a JSON object");
    expect_config_error("{\"model_type\": \"llama\", \"head_dim\": 3}", "'head_dim' must be positive and even");
}

static int same_config(const ff_model_config *a, const ff_model_config *b) {
    return !strcmp(a->model_type, b->model_type) && a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size && a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads && a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim &&
           a->max_position_embeddings == b->max_position_embeddings && a->rope_theta == b->rope_theta && a->rms_norm_eps == b->rms_norm_eps &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->attention_bias == b->attention_bias &&
           a->rope_scaling.kind == b->rope_scaling.kind && a->rope_scaling.factor == b->rope_scaling.factor &&
           a->rope_scaling.low_freq_factor == b->rope_scaling.low_freq_factor && a->rope_scaling.high_freq_factor == b->rope_scaling.high_freq_factor &&
           a->rope_scaling.original_max_position_embeddings == b->rope_scaling.original_max_position_embeddings && a->value_head == b->value_head &&
           a->bos_token_id == b->bos_token_id && a->pad_token_id == b->pad_token_id && a->n_eos == b->n_eos &&
           !memcmp(a->eos_token_ids, b->eos_token_ids, sizeof(int32_t) * (size_t)a->n_eos);
}

static void test_config_roundtrip(void) {
    const char *files[3] = {"llama3.2-1b", "qwen2.5-0.5b", "mistral-7b-v0.3"};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/modelio/data/configs/%s.json", files[i]);
        ff_model_config a, b;
        REQUIRE(ff_hf_config_load(path, &a) == 0);
        for (int vh = 0; vh < 2; vh++) {
            a.value_head = vh;
            char *text = ff_hf_config_dump(&a, "bfloat16");
            REQUIRE(text);
            if (ff_hf_config_parse(text, strlen(text), "dumped", &b) != 0) fprintf(stderr, "%s\n%s\n", ff_error_message(), text);
            CHECK(same_config(&a, &b));
            free(text);
        }
    }
}

/* A small config with every kind of tensor: GQA, biases (qwen2), untied head. */
static ff_model_config small_config(const char *type, bool tied) {
    ff_model_config c;
    REQUIRE(ff_hf_config_defaults(type, &c) == 0);
    c.vocab_size = 40;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 4;
    c.max_position_embeddings = 64;
    c.tie_word_embeddings = tied;
    c.bos_token_id = 1;
    c.eos_token_ids[0] = 2;
    c.n_eos = 1;
    return c;
}

static ff_tensor_set *weights_for(const ff_model_config *c) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(ff_hf_expected_tensors(c, w) == 0);
    ff_rng r;
    ff_rng_seed(&r, 3);
    for (size_t i = 0; i < w->n; i++)
        for (int64_t k = 0; k < ff_host_tensor_numel(&w->items[i]); k++) w->items[i].data[k] = (float)ff_rng_normal(&r);
    return w;
}

static void test_weights_check(void) {
    ff_model_config c = small_config("qwen2", false);
    ff_tensor_set *w = weights_for(&c);
    /* 2 layers x (2 norms + 4 proj + 3 biases + 3 mlp) + embed + norm + lm_head */
    CHECK_EQ_INT(w->n, 2 * 12 + 3);
    CHECK(ff_tensor_set_find(w, "model.layers.1.self_attn.k_proj.bias") != NULL);
    CHECK_EQ_INT(ff_tensor_set_find(w, "model.layers.0.self_attn.k_proj.weight")->shape[0], 8);
    CHECK(ff_hf_check_weights(&c, w, "m") == 0);

    /* wrong shape */
    ff_host_tensor *t = ff_tensor_set_find(w, "model.layers.1.mlp.down_proj.weight");
    int64_t keep = t->shape[1];
    t->shape[1] = 23;
    CHECK(ff_hf_check_weights(&c, w, "m") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "m: tensor 'model.layers.1.mlp.down_proj.weight' has shape [16, 23], expected [16, 24]");
    t->shape[1] = keep;

    /* missing tensor: a qwen2 config over llama weights (no biases) */
    ff_model_config l = small_config("llama", false);
    ff_tensor_set *lw = weights_for(&l);
    CHECK(ff_hf_check_weights(&c, lw, "m") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "missing tensor 'model.layers.0.self_attn.q_proj.bias'");
    /* unexpected: qwen2 weights under a llama config */
    CHECK(ff_hf_check_weights(&l, w, "m") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'");
    /* too few layers in the config */
    l.num_hidden_layers = 1;
    CHECK(ff_hf_check_weights(&l, lw, "m") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unexpected tensor 'model.layers.1.");
    l.num_hidden_layers = 2;

    /* tied: an lm_head equal to the embedding is dropped, a different one refused */
    ff_model_config tc = small_config("llama", true);
    ff_host_tensor *emb = ff_tensor_set_find(lw, "model.embed_tokens.weight");
    ff_host_tensor *head = ff_tensor_set_find(lw, "lm_head.weight");
    CHECK(ff_hf_check_weights(&tc, lw, "m") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "different 'lm_head.weight'");
    memcpy(head->data, emb->data, sizeof(float) * 40 * 16);
    int64_t shape1[1] = {2};
    REQUIRE(ff_tensor_set_add(lw, "model.layers.0.self_attn.rotary_emb.inv_freq", 1, shape1));
    size_t before = lw->n;
    CHECK(ff_hf_check_weights(&tc, lw, "m") == 0);
    CHECK_EQ_INT(lw->n, before - 2);
    CHECK(ff_tensor_set_find(lw, "lm_head.weight") == NULL);

    /* a value head: score.weight required, lm_head optional */
    ff_model_config v = small_config("llama", false);
    v.value_head = true;
    CHECK(ff_hf_check_weights(&v, lw, "m") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "missing tensor 'score.weight'");
    int64_t sshape[2] = {1, 16};
    REQUIRE(ff_tensor_set_add(lw, "score.weight", 2, sshape));
    CHECK(ff_hf_check_weights(&v, lw, "m") == 0);
    ff_tensor_set_destroy(&lw);
    ff_tensor_set_destroy(&w);
}

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

static void test_folders(void) {
    ff_model_config c = small_config("llama", true);
    c.vocab_size = FF_BYTES_VOCAB;
    ff_tensor_set *w = weights_for(&c);
    ff_tokenizer *tok = ff_tokenizer_new_bytes();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/tiny", g_dir);
    REQUIRE(ff_model_dir_save(dir, &c, w, tok, FF_DTYPE_F32) == 0);
    char p[600];
    const char *files[4] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        CHECK(access(p, F_OK) == 0);
    }
    ff_model_config c2;
    ff_tensor_set *w2;
    REQUIRE(ff_model_dir_load(dir, &c2, &w2) == 0);
    CHECK(same_config(&c, &c2));
    CHECK_EQ_INT(w2->n, w->n);
    for (size_t i = 0; i < w->n; i++) {
        ff_host_tensor *b = ff_tensor_set_find(w2, w->items[i].name);
        REQUIRE(b);
        CHECK(!memcmp(b->data, w->items[i].data, sizeof(float) * (size_t)ff_host_tensor_numel(b)));
    }
    ff_tensor_set_destroy(&w2);
    ff_tokenizer *t2 = ff_tokenizer_load_dir(dir);
    REQUIRE(t2);
    CHECK_EQ_INT(ff_tokenizer_eos(t2), FF_BYTES_EOS);
    ff_tokenizer_destroy(&t2);

    /* overwrite as bf16 and without a tokenizer: the old folder is replaced as a whole
     * (its tokenizer files are gone), and no staging folder is left behind */
    snprintf(p, sizeof p, "%s/extra.txt", dir);
    REQUIRE(ff_write_file_atomic(p, "x", 1) == 0);
    REQUIRE(ff_model_dir_save(dir, &c, w, NULL, FF_DTYPE_BF16) == 0);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/models", g_dir);
    CHECK_EQ_INT(count_entries(p, "tiny"), 1);
    REQUIRE(ff_model_dir_load(dir, &c2, &w2) == 0);
    ff_host_tensor *a = ff_tensor_set_find(w2, "model.norm.weight"), *b = ff_tensor_set_find(w, "model.norm.weight");
    CHECK_CLOSE(a->data[3], ff_bf16_to_f32(ff_f32_to_bf16(b->data[3])), 0, 0);
    ff_tensor_set_destroy(&w2);

    /* a failed save leaves the old folder as it was: a config the writer refuses */
    ff_model_config bad = c;
    snprintf(bad.model_type, sizeof bad.model_type, "gpt2");
    CHECK(ff_model_dir_save(dir, &bad, w, NULL, FF_DTYPE_F32) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unsupported model_type 'gpt2'");
    CHECK_EQ_INT(count_entries(p, "tiny"), 1);
    REQUIRE(ff_model_dir_load(dir, &c2, &w2) == 0);
    ff_tensor_set_destroy(&w2);

    /* load errors name the folder and the problem */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    REQUIRE(unlink(p) == 0);
    CHECK(ff_model_dir_load(dir, &c2, &w2) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no model.safetensors");
    CHECK(w2 == NULL);
    /* weights with the wrong shape for the config */
    ff_model_config other = c;
    other.intermediate_size = 32;
    ff_tensor_set *wo = weights_for(&other);
    REQUIRE(ff_safetensors_save(p, wo, FF_DTYPE_F32, NULL) == 0);
    CHECK(ff_model_dir_load(dir, &c2, &w2) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "has shape [32, 16], expected [24, 16]");
    /* a non-finite weight */
    w->items[2].data[1] = NAN;
    REQUIRE(ff_safetensors_save(p, w, FF_DTYPE_F32, NULL) == 0);
    CHECK(ff_model_dir_load(dir, &c2, &w2) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "non-finite value at element 1");
    ff_tensor_set_destroy(&wo);
    ff_tensor_set_destroy(&w);
    ff_tokenizer_destroy(&tok);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ff_test_md_%d", (int)getpid());
    REQUIRE(ff_mkdirs(g_dir) == 0);
    test_real_configs();
    test_config_rules();
    test_config_roundtrip();
    test_weights_check();
    test_folders();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_MAIN_END();
}

/* `fuseflow init`: a randomly initialised model folder (config.json, model.safetensors,
 * tokenizer.json, tokenizer_config.json), so the bundled examples need no download.
 *
 * The architecture comes from a preset or a YAML file with config.json's keys; presets are
 * YAML text read by the same code, and `key=value` arguments override either. Weights are
 * drawn as Hugging Face initialises them (ff_model_init_weights): same seed, same folder. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/config.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

static const char *CMD = "init";

/* ~1.0M parameters with the byte tokenizer: learns the bundled task in minutes on 2 cores */
static const char *k_tiny = "model_type: llama\n"
                            "hidden_size: 128\n"
                            "intermediate_size: 512\n"
                            "num_hidden_layers: 4\n"
                            "num_attention_heads: 4\n"
                            "num_key_value_heads: 2\n"
                            "max_position_embeddings: 256\n"
                            "rope_theta: 10000.0\n"
                            "rms_norm_eps: 1.0e-5\n"
                            "tie_word_embeddings: true\n";
/* ~25M parameters */
static const char *k_small = "model_type: llama\n"
                             "hidden_size: 512\n"
                             "intermediate_size: 1536\n"
                             "num_hidden_layers: 8\n"
                             "num_attention_heads: 8\n"
                             "num_key_value_heads: 4\n"
                             "max_position_embeddings: 1024\n"
                             "rope_theta: 10000.0\n"
                             "rms_norm_eps: 1.0e-5\n"
                             "tie_word_embeddings: true\n";

static void help(void) {
    printf("usage: fuseflow init (--preset NAME | --config FILE.yaml) --out DIR [options] [key=value ...]\n\n"
           "Writes a randomly initialised model folder: config.json, model.safetensors,\n"
           "tokenizer.json and tokenizer_config.json (Hugging Face layout).\n\n"
           "options:\n"
           "  --preset NAME      tiny (~1M parameters) or small (~25M), Llama architecture\n"
           "  --config FILE      a YAML file with config.json's keys (see below)\n"
           "  --out DIR          the model folder to write (written whole, atomically)\n"
           "  --tokenizer T      'bytes' (default: 256 byte ids + <|bos|> 256, <|eos|> 257,\n"
           "                     <|pad|> 258), or a tokenizer.json file or a folder holding one\n"
           "  --seed S           initialisation seed (default 0)\n"
           "  --dtype D          f32 (default), bf16 or f16 for model.safetensors\n"
           "  --force            replace DIR if it exists\n"
           "  key=value          override a key, e.g. num_hidden_layers=2\n\n"
           "config keys (defaults: Hugging Face's for model_type):\n"
           "  model_type (llama, qwen2, mistral), vocab_size (default: the tokenizer's size),\n"
           "  hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,\n"
           "  num_key_value_heads, head_dim, max_position_embeddings, rope_theta, rms_norm_eps,\n"
           "  tie_word_embeddings, value_head (adds score.weight [1, hidden]: a critic or reward\n"
           "  model), initializer_range (0.02)\n\n"
           "examples:\n"
           "  fuseflow init --preset tiny --out runs/tiny\n"
           "  fuseflow init --preset small --out runs/small num_hidden_layers=4 --seed 7\n");
}

static bool dir_nonempty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno != ENOENT; /* a file, or unreadable: do not overwrite */
    struct dirent *e;
    bool any = false;
    while (!any && (e = readdir(d))) any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return any;
}

static ff_tokenizer *load_tokenizer(const char *spec) {
    if (!strcmp(spec, "bytes")) return ff_tokenizer_new_bytes();
    struct stat st;
    if (stat(spec, &st) == 0 && S_ISDIR(st.st_mode)) return ff_tokenizer_load_dir(spec);
    return ff_tokenizer_load(spec);
}

/* Read the architecture from the YAML tree; the tokenizer gives the vocabulary and ids. */
static int read_config(ff_config *y, const ff_tokenizer *tok, ff_model_config *c, double *init_range) {
    const char *mt;
    if (ff_config_get_str(y, "model_type", "llama", &mt) < 0) return -1;
    if (ff_hf_config_defaults(mt, c) != 0) {
        char where[256] = "";
        ff_cnode *n = ff_cnode_find(ff_config_root(y), "model_type");
        if (n) ff_cnode_where(n, where, sizeof where);
        return ff_error_wrap("%s", where);
    }
    int64_t v;
    const int64_t big = 1 << 30;
#define INT_KEY(key, field, lo)                                          \
    do {                                                                 \
        if (ff_config_get_int_in(y, #key, c->field, lo, big, &v) < 0) return -1; \
        c->field = (int32_t)v;                                           \
    } while (0)
    c->vocab_size = ff_tokenizer_vocab_size(tok);
    INT_KEY(vocab_size, vocab_size, ff_tokenizer_vocab_size(tok));
    INT_KEY(hidden_size, hidden_size, 1);
    INT_KEY(intermediate_size, intermediate_size, 1);
    INT_KEY(num_hidden_layers, num_hidden_layers, 1);
    INT_KEY(num_attention_heads, num_attention_heads, 1);
    c->num_key_value_heads = c->num_attention_heads;
    INT_KEY(num_key_value_heads, num_key_value_heads, 1);
    c->head_dim = c->hidden_size % c->num_attention_heads == 0 ? c->hidden_size / c->num_attention_heads : 0;
    INT_KEY(head_dim, head_dim, 2);
    INT_KEY(max_position_embeddings, max_position_embeddings, 2);
#undef INT_KEY
    if (ff_config_get_double_in(y, "rope_theta", c->rope_theta, 1e-6, 1e12, &c->rope_theta) < 0 ||
        ff_config_get_double_in(y, "rms_norm_eps", c->rms_norm_eps, 1e-12, 1.0, &c->rms_norm_eps) < 0 ||
        ff_config_get_double_in(y, "initializer_range", 0.02, 1e-6, 10.0, init_range) < 0 ||
        ff_config_get_bool(y, "tie_word_embeddings", false, &c->tie_word_embeddings) < 0 ||
        ff_config_get_bool(y, "value_head", false, &c->value_head) < 0)
        return -1;
    c->bos_token_id = ff_tokenizer_bos(tok);
    c->pad_token_id = ff_tokenizer_pad(tok);
    c->n_eos = 0;
    if (ff_tokenizer_eos(tok) >= 0) c->eos_token_ids[c->n_eos++] = ff_tokenizer_eos(tok);
    if (ff_config_check_unused(y) != 0) return -1;
    /* the same text must also pass the config.json reader (sizes that divide, ...) */
    char *text = ff_hf_config_dump(c, "float32");
    if (!text) return -1;
    ff_model_config check;
    int rc = ff_hf_config_parse(text, strlen(text), "the configuration", &check);
    free(text);
    if (rc != 0) return -1;
    return ff_model_config_check(c, "the configuration");
}

int ff_cmd_init(int argc, char **argv) {
    const char *preset = NULL, *cfg_path = NULL, *out = NULL, *tok_spec = "bytes", *dtype_s = "f32";
    int64_t seed = 0;
    bool force = false;
    const ffio_opt opts[] = {
        {"preset", FFIO_STR, &preset, 0, 0},     {"config", FFIO_STR, &cfg_path, 0, 0},     {"out", FFIO_STR, &out, 0, 0},
        {"tokenizer", FFIO_STR, &tok_spec, 0, 0}, {"seed", FFIO_INT, &seed, 0, 9e18},        {"dtype", FFIO_STR, &dtype_s, 0, 0},
        {"force", FFIO_FLAG, &force, 0, 0},
    };
    char *overrides[256];
    int n_over;
    int pr = ffio_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), overrides, 256, &n_over);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (!out) return ffio_usage(CMD, "--out DIR is required");
    if (!preset == !cfg_path) return ffio_usage(CMD, "give one of --preset NAME or --config FILE.yaml");
    ff_dtype dtype;
    if (!strcmp(dtype_s, "f32"))
        dtype = FF_DTYPE_F32;
    else if (!strcmp(dtype_s, "bf16"))
        dtype = FF_DTYPE_BF16;
    else if (!strcmp(dtype_s, "f16"))
        dtype = FF_DTYPE_F16;
    else
        return ffio_usage(CMD, "--dtype must be f32, bf16 or f16, got '%s'", dtype_s);
    if (!force && dir_nonempty(out))
        return ffio_usage(CMD, "%s already exists; choose another --out or pass --force to replace it", out);

    ff_config *y = NULL;
    if (preset) {
        const char *text = !strcmp(preset, "tiny") ? k_tiny : !strcmp(preset, "small") ? k_small : NULL;
        if (!text) return ffio_usage(CMD, "unknown preset '%s' (available: tiny, small)", preset);
        char name[64];
        snprintf(name, sizeof name, "preset '%s'", preset);
        y = ff_config_parse(text, strlen(text), name);
    } else {
        y = ff_config_load(cfg_path);
    }
    ff_tokenizer *tok = NULL;
    ff_tensor_set *w = NULL;
    int rc = 1;
    ff_model_config c;
    double init_range = 0.02;
    if (!y || ff_config_apply_overrides(y, n_over, overrides) != 0) goto out;
    if (!(tok = load_tokenizer(tok_spec))) goto out;
    if (read_config(y, tok, &c, &init_range) != 0) goto out;
    if (!(w = ff_tensor_set_new()) || ff_model_init_weights(&c, (uint64_t)seed, init_range, w) != 0) goto out;
    if (ff_model_dir_save(out, &c, w, tok, dtype) != 0) goto out;
    int64_t params = 0;
    for (size_t i = 0; i < w->n; i++) params += ff_host_tensor_numel(&w->items[i]);
    char ps[32];
    ffio_human((double)params, ps, sizeof ps);
    printf("wrote %s: %s, %s parameters (%d layers, hidden %d, %d/%d heads, vocab %d%s%s), %s, seed %lld\n", out, c.model_type, ps,
           c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size,
           c.tie_word_embeddings ? ", tied embeddings" : "", c.value_head ? ", value head" : "", ff_dtype_name(dtype), (long long)seed);
    rc = 0;
out:
    if (rc) ffio_fail(CMD);
    ff_tensor_set_destroy(&w);
    ff_tokenizer_destroy(&tok);
    ff_config_destroy(&y);
    return rc;
}

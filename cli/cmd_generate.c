/* `fuseflow generate`: sample continuations of a prompt from a model folder.
 *
 * The prompt is encoded with the folder's tokenizer (and its template, e.g. a BOS, unless
 * --raw). Generation stops at an end-of-sequence id (config.json's eos_token_id), at a stop
 * string, or after --max-new-tokens. A stop string that is one token stops decoding at once;
 * a longer one is found in the decoded text afterwards and the text cut there (decoding
 * still runs to eos or the token limit). Same seed, same output. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/backend.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"

static const char *CMD = "generate";

static void help(void) {
    printf("usage: fuseflow generate --model DIR --prompt TEXT [options]\n\n"
           "Samples continuations of TEXT. Prints each completion (the prompt is not repeated).\n\n"
           "options:\n"
           "  --model DIR            model folder with tokenizer.json\n"
           "  --prompt TEXT          the prompt\n"
           "  --max-new-tokens N     at most N generated tokens (default 64)\n"
           "  --temperature T        0 = greedy (default 1.0)\n"
           "  --top-k K              sample among the K most likely tokens (default 0: off)\n"
           "  --top-p P              nucleus sampling, 0 < P <= 1 (default 1: off)\n"
           "  --seed S               random seed (default 0); sample j uses its own stream\n"
           "  --stop STR             stop at STR (repeatable; C escapes \\n \\t \\\\ work)\n"
           "  --n N                  completions of the prompt (default 1)\n"
           "  --raw                  do not apply the tokenizer's template (e.g. BOS)\n"
           "  --json                 one JSON line per completion: text, tokens, logprobs, finish\n"
           "  --device D             cpu (default), cpu:N, cuda, cuda:N (also --backend D); cuda\n"
           "                         multiplies in bf16 unless FF_CUDA_MATH=tf32 or fp32 (exact)\n"
           "  --weights W            fp32 or bf16 (the default on cuda, fp32 on the cpu): the weight\n"
           "                         matrices held in bf16, half the memory (docs/model.md \"bf16 weights\")\n"
           "  --kv-dtype D           fp32 or bf16 (the default on cuda, fp32 on the cpu): the KV cache's\n"
           "                         keys and values, half its memory\n"
           "  --eager                decode kernel by kernel: no CUDA graphs (on cuda each decode step is\n"
           "                         otherwise one replayed graph; docs/cuda.md \"Graphs\")\n\n"
           "example:\n"
           "  fuseflow generate --model runs/sft/final --prompt '12+34=' --temperature 0 --max-new-tokens 8\n");
}

/* "\n", "\t", "\\" in stop strings typed on a command line */
static char *unescape(const char *s) {
    char *o = ff_malloc(strlen(s) + 1);
    if (!o) return NULL;
    size_t m = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            o[m++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
        } else {
            o[m++] = *p;
        }
    }
    o[m] = '\0';
    return o;
}

static const char *finish_name(ff_finish_reason f) { return f == FF_FINISH_STOP ? "stop" : f == FF_FINISH_LENGTH ? "length" : "aborted"; }

int ff_cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *prompt = NULL, *device = "cpu", *weights = NULL, *kv_dtype = NULL;
    bool bf16 = false, kv16 = false;
    int64_t max_new = 64, top_k = 0, seed = 0, n = 1;
    double temperature = 1.0, top_p = 1.0;
    bool raw = false, as_json = false, eager = false;
    const ffio_opt opts[] = {
        {"model", FFIO_STR, &model_dir, 0, 0},
        {"prompt", FFIO_STR, &prompt, 0, 0},
        {"device", FFIO_STR, &device, 0, 0},
        {"backend", FFIO_STR, &device, 0, 0},
        {"weights", FFIO_STR, &weights, 0, 0},
        {"kv-dtype", FFIO_STR, &kv_dtype, 0, 0},
        {"max-new-tokens", FFIO_INT, &max_new, 1, 1 << 20},
        {"top-k", FFIO_INT, &top_k, 0, 1 << 30},
        {"seed", FFIO_INT, &seed, 0, 9e18},
        {"n", FFIO_INT, &n, 1, 4096},
        {"temperature", FFIO_DOUBLE, &temperature, 0, 1000},
        {"top-p", FFIO_DOUBLE, &top_p, 1e-9, 1},
        {"raw", FFIO_FLAG, &raw, 0, 0},
        {"json", FFIO_FLAG, &as_json, 0, 0},
        {"eager", FFIO_FLAG, &eager, 0, 0},
    };
    /* --stop may repeat: take it out before the table parser sees it */
    char **rest = ff_malloc((size_t)argc * sizeof *rest);
    char **stops = ff_malloc((size_t)argc * sizeof *stops);
    if (!rest || !stops) {
        free(rest);
        free(stops);
        return ffio_fail(CMD);
    }
    int n_rest = 0, n_stops = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "--stop")) {
            if (i + 1 >= argc) {
                free(rest);
                free(stops);
                return ffio_usage(CMD, "--stop needs a value");
            }
            stops[n_stops++] = argv[++i];
        } else if (i > 0 && !strncmp(argv[i], "--stop=", 7)) {
            stops[n_stops++] = argv[i] + 7;
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    char *pos[1];
    int n_pos;
    int pr = ffio_parse(CMD, n_rest, rest, opts, (int)(sizeof opts / sizeof opts[0]), pos, 0, &n_pos);
    free(rest);
    if (pr == 1) help();
    if (pr) {
        free(stops);
        return pr == 1 ? 0 : pr;
    }
    if (!model_dir || !prompt) {
        free(stops);
        return ffio_usage(CMD, "--model DIR and --prompt TEXT are required");
    }
    /* on a GPU as HF holds a bf16 model: bf16 weights and KV cache unless told otherwise */
    const bool cuda = !strncmp(device, "cuda", 4);
    if (!weights) weights = cuda ? "bf16" : "fp32";
    if (!kv_dtype) kv_dtype = cuda ? "bf16" : "fp32";
    if (ffio_weights(CMD, weights, &bf16)) {
        free(stops);
        return 2;
    }
    if (strcmp(kv_dtype, "fp32") && strcmp(kv_dtype, "bf16")) {
        free(stops);
        return ffio_usage(CMD, "--kv-dtype wants fp32 or bf16, got '%s'", kv_dtype);
    }
    kv16 = !strcmp(kv_dtype, "bf16");

    ff_model_config cfg;
    ff_tokenizer *tok = NULL;
    ff_backend *be = NULL;
    ff_model *m = NULL;
    int32_t *ids = NULL, n_ids = 0, *stop_ids = NULL, n_stop_ids = 0;
    char **stop_text = NULL; /* unescaped stop strings */
    ff_gen_output *outs = NULL;
    int32_t n_outs = 0;
    int rc = 1;

    char cfg_path[FF_PATH_MAX];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model_dir);
    if (ff_hf_config_load(cfg_path, &cfg) != 0) { /* the weights are read straight into the model, below */
        ff_checkpoint_error(model_dir);
        goto out;
    }
    if (!(tok = ff_tokenizer_load_dir(model_dir))) {
        ff_error_wrap("%s: generate needs the model folder's tokenizer", model_dir);
        goto out;
    }
    ff_encode_opts eo = {!raw, true};
    if (ff_tokenizer_encode(tok, prompt, strlen(prompt), &eo, &ids, &n_ids) != 0) goto out;
    if (n_ids < 1) {
        ff_error_set("--prompt", "give a non-empty prompt", "the prompt encodes to no tokens");
        goto out;
    }
    if (n_ids + 1 > cfg.max_position_embeddings) {
        ff_error_set("--prompt", NULL, "the prompt has %d tokens; the model's context is %d", n_ids, cfg.max_position_embeddings);
        goto out;
    }
    /* stop ids: eos, plus each stop string that is a single token */
    stop_ids = ff_malloc((size_t)(cfg.n_eos + n_stops + 1) * sizeof *stop_ids);
    stop_text = ff_calloc((size_t)n_stops + 1, sizeof *stop_text);
    if (!stop_ids || !stop_text) goto out;
    for (int i = 0; i < cfg.n_eos; i++) stop_ids[n_stop_ids++] = cfg.eos_token_ids[i];
    for (int i = 0; i < n_stops; i++) {
        if (!(stop_text[i] = unescape(stops[i]))) goto out;
        if (!*stop_text[i]) {
            ff_error_set("--stop", NULL, "empty stop string");
            goto out;
        }
        int32_t *sid, ns;
        ff_encode_opts plain = {false, true};
        if (ff_tokenizer_encode(tok, stop_text[i], strlen(stop_text[i]), &plain, &sid, &ns) != 0) goto out;
        if (ns == 1) stop_ids[n_stop_ids++] = sid[0];
        free(sid);
    }
    if (!(be = ff_backend_new(device)) ||
        !(m = ff_model_load_dir(be, model_dir, &(ff_model_opts){.inference = true, .bf16_weights = bf16}, &cfg)))
        goto out;

    ff_gen_request req = {0};
    req.id = 1;
    req.prompt = ids;
    req.prompt_len = n_ids;
    req.n_samples = (int32_t)n;
    req.seed = (uint64_t)seed;
    ff_sampling_default(&req.sampling);
    req.sampling.temperature = (float)temperature;
    req.sampling.top_k = (int32_t)top_k;
    req.sampling.top_p = (float)top_p;
    int32_t room = cfg.max_position_embeddings - n_ids;
    req.sampling.max_new_tokens = (int32_t)(max_new < room ? max_new : room);
    req.sampling.stop_tokens = n_stop_ids ? stop_ids : NULL;
    req.sampling.n_stop = n_stop_ids;
    ff_generator_config gc = {.max_slots = (int32_t)n, .max_seq_len = n_ids + req.sampling.max_new_tokens, .max_prefill_tokens = n_ids,
                              .kv_bf16 = kv16, .eager = eager};
    if (ff_model_generate(m, &gc, &req, 1, &outs, &n_outs) != 0) goto out;

    for (int32_t s = 0; s < n_outs; s++) {
        ff_gen_output *o = &outs[s];
        /* the text without a trailing eos; cut at the first stop string */
        int32_t nt = o->n_tokens;
        bool is_eos = false;
        for (int i = 0; nt > 0 && i < cfg.n_eos; i++) is_eos |= o->tokens[nt - 1] == cfg.eos_token_ids[i];
        char *text;
        size_t tl;
        if (ff_tokenizer_decode(tok, o->tokens, is_eos ? nt - 1 : nt, true, &text, &tl) != 0) goto out;
        const char *finish = finish_name(o->finish);
        size_t cut = tl;
        for (int i = 0; i < n_stops; i++) {
            char *hit = memmem(text, tl, stop_text[i], strlen(stop_text[i]));
            if (hit && (size_t)(hit - text) < cut) cut = (size_t)(hit - text);
        }
        if (cut < tl) {
            /* keep the tokens up to the one that completes the stop string */
            int32_t keep = nt;
            for (int32_t k = 1; k <= nt; k++) {
                char *pre;
                size_t pl;
                if (ff_tokenizer_decode(tok, o->tokens, k, true, &pre, &pl) != 0) {
                    free(text);
                    goto out;
                }
                bool found = false;
                for (int i = 0; i < n_stops && !found; i++) found = memmem(pre, pl, stop_text[i], strlen(stop_text[i])) != NULL;
                free(pre);
                if (found) {
                    keep = k;
                    break;
                }
            }
            o->n_tokens = keep;
            tl = cut;
            text[tl] = '\0';
            finish = "stop";
        }
        if (as_json) {
            char *clean = ff_utf8_lossy(text, tl, NULL);
            json_t *toks = json_array(), *lps = json_array();
            for (int32_t i = 0; i < o->n_tokens; i++) {
                json_array_append_new(toks, json_integer(o->tokens[i]));
                json_array_append_new(lps, json_real(o->logprobs[i]));
            }
            json_t *j = json_pack("{s:i, s:s, s:o, s:o, s:s}", "sample", (int)o->sample, "text", clean ? clean : "", "tokens", toks, "logprobs", lps,
                                  "finish", finish);
            char *line = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
            if (line) printf("%s\n", line);
            free(line);
            json_decref(j);
            free(clean);
        } else {
            if (n_outs > 1) printf("--- sample %d (%d tokens, %s)\n", (int)o->sample, o->n_tokens, finish);
            fwrite(text, 1, tl, stdout);
            printf("\n");
        }
        free(text);
    }
    rc = 0;
out:
    if (rc) ffio_fail(CMD);
    for (int32_t s = 0; s < n_outs; s++) ff_gen_output_free(&outs[s]);
    free(outs);
    for (int i = 0; stop_text && i < n_stops; i++) free(stop_text[i]);
    free(stop_text);
    free(stops);
    free(stop_ids);
    free(ids);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_tokenizer_destroy(&tok);
    return rc;
}

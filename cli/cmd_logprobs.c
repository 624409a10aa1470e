/* `fuseflow logprobs`: per-token log-probabilities of given sequences under a model.
 *
 * Input: JSONL, one object per line, {"tokens": [ids...]} or {"text": "..."} (encoded with the
 * model folder's tokenizer). Output: one line per input line, in order,
 * {"logprobs": [...]} with log p(token[t] | tokens[<t]) for t = 1..n-1 (the first token has
 * no prefix, so the list is one shorter than the sequence).
 *
 * Every line is read and checked before the model runs, so bad input fails fast with the
 * line number; the output file appears only when complete (written to FILE.tmp.PID and
 * renamed). Sequences are packed into batches of up to --batch-tokens tokens. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/backend.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"

static const char *CMD = "logprobs";

static void help(void) {
    printf("usage: fuseflow logprobs --model DIR --input FILE.jsonl [--output FILE] [options]\n\n"
           "For each input line, the log-probability of every token given its prefix.\n"
           "input lines:  {\"tokens\": [256, 49, 50]}  or  {\"text\": \"12+34=\"} (needs DIR/tokenizer.json)\n"
           "output lines: {\"logprobs\": [-3.21, -0.05]}  (one shorter than the sequence)\n\n"
           "options:\n"
           "  --model DIR          model folder (config.json, model.safetensors, tokenizer.json)\n"
           "  --input FILE         JSONL input\n"
           "  --output FILE        JSONL output (default: stdout); written whole or not at all\n"
           "  --add-special        encode \"text\" lines with the tokenizer's template (e.g. BOS)\n"
           "  --batch-tokens N     tokens per forward pass (default 8192)\n"
           "  --device D           cpu (default), cpu:N (N threads), cuda, cuda:N (also --backend D);\n"
           "                       cuda multiplies in bf16 unless FF_CUDA_MATH=tf32 or fp32 (exact)\n"
           "  --weights W          fp32 or bf16 (the default on cuda, fp32 on the cpu): the weight\n"
           "                       matrices held in bf16, half the memory (docs/model.md \"bf16 weights\")\n\n"
           "example:\n"
           "  fuseflow logprobs --model runs/tiny --input seqs.jsonl --output logprobs.jsonl\n");
}

typedef struct seq {
    int32_t *ids;
    int32_t n;
} seq;

static void free_seqs(seq *s, size_t n) {
    for (size_t i = 0; i < n; i++) free(s[i].ids);
    free(s);
}

/* Read and check every line (at least one). NULL + error naming file:line. */
static seq *read_input(const char *path, const ff_model_config *cfg, const ff_tokenizer *tok, bool add_special, size_t *n_out) {
    ff_jsonl *r = ff_jsonl_open(path);
    if (!r) return NULL;
    seq *s = NULL;
    size_t n = 0, cap = 0;
    json_t *o = NULL;
    int got;
    char where[FF_PATH_MAX];
    while ((got = ff_jsonl_next(r, &o)) == 1) {
        snprintf(where, sizeof where, "%s:%d", path, ff_jsonl_line(r));
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            seq *ns = ff_realloc(s, cap * sizeof *s);
            if (!ns) goto fail;
            s = ns;
        }
        seq *q = &s[n];
        q->ids = NULL;
        q->n = 0;
        json_t *tokens = json_object_get(o, "tokens"), *text = json_object_get(o, "text");
        if (json_is_array(tokens)) {
            size_t len = json_array_size(tokens);
            q->ids = ff_malloc((len ? len : 1) * sizeof *q->ids);
            if (!q->ids) goto fail;
            n++; /* owned from here on */
            for (size_t i = 0; i < len; i++) {
                json_t *x = json_array_get(tokens, i);
                if (!json_is_integer(x)) {
                    ff_error_set(where, NULL, "token %zu is not an integer", i);
                    goto fail;
                }
                json_int_t id = json_integer_value(x);
                if (id < 0 || id >= cfg->vocab_size) {
                    ff_error_set(where, "token ids must be in [0, vocab_size)", "token id %lld at position %zu is out of range for vocab_size %d", (long long)id,
                                 i, cfg->vocab_size);
                    goto fail;
                }
                q->ids[i] = (int32_t)id;
            }
            q->n = (int32_t)len;
        } else if (json_is_string(text)) {
            if (!tok) {
                ff_error_set(where, "give {\"tokens\": [...]} or add tokenizer.json to the model folder", "a \"text\" line needs a tokenizer, and the model folder has none");
                goto fail;
            }
            ff_encode_opts eo = {add_special, true};
            if (ff_tokenizer_encode(tok, json_string_value(text), json_string_length(text), &eo, &q->ids, &q->n) != 0) {
                ff_error_wrap("%s", where);
                goto fail;
            }
            n++;
            for (int32_t i = 0; i < q->n; i++)
                if (q->ids[i] >= cfg->vocab_size) {
                    ff_error_set(where, "the tokenizer does not match the model", "token id %d is out of range for vocab_size %d", q->ids[i], cfg->vocab_size);
                    goto fail;
                }
        } else {
            ff_error_set(where, NULL, "expected {\"tokens\": [ids...]} or {\"text\": \"...\"}");
            goto fail;
        }
        if (q->n < 1) {
            ff_error_set(where, NULL, "the sequence is empty");
            goto fail;
        }
        if (q->n > cfg->max_position_embeddings) {
            ff_error_set(where, NULL, "%d tokens, more than the model's max_position_embeddings %d", q->n, cfg->max_position_embeddings);
            goto fail;
        }
        json_decref(o);
        o = NULL;
    }
    if (got < 0) goto fail;
    if (n == 0) {
        ff_error_set(path, "write one JSON object per line: {\"tokens\": [256, 49, 50]} or {\"text\": \"12+34=\"}",
                     "no input lines: the file is empty or holds only blank lines");
        goto fail;
    }
    ff_jsonl_close(&r);
    *n_out = n;
    return s;
fail:
    json_decref(o);
    ff_jsonl_close(&r);
    free_seqs(s, n);
    return NULL;
}

typedef struct sink {
    FILE *f;           /* stdout */
    ff_atomic_file af; /* or a file */
    bool to_file;
} sink;

static int sink_write(sink *k, const char *s, size_t n) {
    if (k->to_file) return ff_atomic_file_write(&k->af, s, n);
    if (fwrite(s, 1, n, k->f) != n) return ff_error_set("stdout", NULL, "write failed");
    return 0;
}

/* {"logprobs":[...]} with %.9g (float32 round trip) */
static int write_line(sink *k, const float *lp, int32_t n, char **buf, size_t *cap) {
    size_t need = 32 + (size_t)n * 18;
    if (need > *cap) {
        char *b = ff_realloc(*buf, need);
        if (!b) return -1;
        *buf = b;
        *cap = need;
    }
    size_t m = (size_t)snprintf(*buf, *cap, "{\"logprobs\":[");
    for (int32_t i = 0; i < n; i++) m += (size_t)snprintf(*buf + m, *cap - m, "%s%.9g", i ? "," : "", (double)lp[i]);
    m += (size_t)snprintf(*buf + m, *cap - m, "]}\n");
    return sink_write(k, *buf, m);
}

int ff_cmd_logprobs(int argc, char **argv) {
    const char *model_dir = NULL, *input = NULL, *output = NULL, *device = "cpu", *weights = NULL;
    bool bf16 = false;
    int64_t batch_tokens = 8192;
    bool add_special = false;
    const ffio_opt opts[] = {
        {"model", FFIO_STR, &model_dir, 0, 0},   {"input", FFIO_STR, &input, 0, 0},     {"output", FFIO_STR, &output, 0, 0},
        {"device", FFIO_STR, &device, 0, 0},     {"backend", FFIO_STR, &device, 0, 0},
        {"weights", FFIO_STR, &weights, 0, 0},
        {"batch-tokens", FFIO_INT, &batch_tokens, 1, 1 << 24},
        {"add-special", FFIO_FLAG, &add_special, 0, 0},
    };
    char *pos[1];
    int n_pos;
    int pr = ffio_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), pos, 0, &n_pos);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (!model_dir || !input) return ffio_usage(CMD, "--model DIR and --input FILE are required");
    if (!weights) weights = strncmp(device, "cuda", 4) ? "fp32" : "bf16"; /* a GPU's default, as HF holds a bf16 model */
    if (ffio_weights(CMD, weights, &bf16)) return 2;

    ff_model_config cfg;
    ff_tokenizer *tok = NULL;
    ff_backend *be = NULL;
    ff_model *m = NULL;
    seq *seqs = NULL;
    size_t n_seqs = 0;
    int32_t *tokens = NULL, *starts = NULL, *targets = NULL;
    float *lp = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    sink k = {stdout, {.fd = -1}, output != NULL};
    bool file_open = false;
    int rc = 1;

    char cfg_path[FF_PATH_MAX];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model_dir);
    if (ff_hf_config_load(cfg_path, &cfg) != 0) { /* the weights are read straight into the model, below */
        ff_checkpoint_error(model_dir);
        goto out;
    }
    char tp[FF_PATH_MAX];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", model_dir);
    FILE *tf = fopen(tp, "r");
    if (tf) {
        fclose(tf);
        if (!(tok = ff_tokenizer_load_dir(model_dir))) goto out;
    }
    if (!(seqs = read_input(input, &cfg, tok, add_special, &n_seqs))) goto out;
    if (!(be = ff_backend_new(device)) ||
        !(m = ff_model_load_dir(be, model_dir, &(ff_model_opts){.inference = true, .bf16_weights = bf16}, &cfg)))
        goto out;
    if (!ff_model_has_lm_head(m)) {
        ff_error_set(model_dir, "log-probs need a model with an LM head", "this is a value model without lm_head.weight");
        goto out;
    }
    int32_t max_len = 1;
    for (size_t i = 0; i < n_seqs; i++) max_len = seqs[i].n > max_len ? seqs[i].n : max_len;
    int64_t cap_tokens = batch_tokens > max_len ? batch_tokens : max_len; /* one sequence always fits */
    tokens = ff_malloc((size_t)cap_tokens * sizeof *tokens);
    targets = ff_malloc((size_t)cap_tokens * sizeof *targets);
    lp = ff_malloc((size_t)cap_tokens * sizeof *lp);
    starts = ff_malloc((n_seqs + 1) * sizeof *starts);
    if (!tokens || !targets || !lp || !starts) goto out;
    if (output) {
        if (ff_atomic_file_begin(&k.af, output) != 0) goto out;
        file_open = true;
    }
    for (size_t first = 0; first < n_seqs;) {
        /* pack sequences [first, last) */
        size_t last = first;
        int32_t T = 0;
        starts[0] = 0;
        while (last < n_seqs && (last == first || T + seqs[last].n <= cap_tokens)) {
            memcpy(tokens + T, seqs[last].ids, (size_t)seqs[last].n * sizeof *tokens);
            T += seqs[last].n;
            starts[last - first + 1] = T;
            last++;
        }
        int32_t S = (int32_t)(last - first);
        ff_batch_shift_targets(tokens, starts, S, targets);
        ff_batch b = {T, S, tokens, starts, targets};
        ff_forward_opts fo = {false, 0};
        ff_forward_out fout = {lp, NULL, NULL, NULL};
        if (ff_model_forward(m, &b, &fo, &fout) != 0) goto out;
        /* position t predicts token t + 1: the log-probs of tokens 1..n-1 of each sequence */
        for (int32_t s = 0; s < S; s++)
            if (write_line(&k, lp + starts[s], starts[s + 1] - starts[s] - 1, &line, &line_cap) != 0) goto out;
        first = last;
    }
    if (file_open) {
        file_open = false;
        if (ff_atomic_file_commit(&k.af) != 0) goto out;
    } else if (fflush(stdout) != 0) {
        ff_error_set("stdout", NULL, "write failed");
        goto out;
    }
    rc = 0;
out:
    if (rc) ffio_fail(CMD);
    if (file_open) ff_atomic_file_abort(&k.af);
    free(line);
    free(tokens);
    free(targets);
    free(lp);
    free(starts);
    free_seqs(seqs, n_seqs);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_tokenizer_destroy(&tok);
    return rc;
}

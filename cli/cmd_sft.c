/* `fuseflow sft`: supervised fine-tuning from JSONL prompt/response pairs.
 *
 * Each example is prompt (encoded with the tokenizer's template) + response + eos; the loss
 * is the token-mean cross-entropy of the response tokens only (the prompt is masked). A step
 * takes batch_size examples from a seeded shuffle of the training set (a new permutation per
 * epoch), optionally in micro-batches of at most micro_batch_tokens tokens whose gradients
 * add up to the same update. Progress goes to stderr, metrics to OUT/metrics.jsonl.
 *
 * Checkpoints (OUT/checkpoints/step-NNNNNNNN) hold the model folder, the AdamW state and the
 * trainer state (step, epoch, position in the epoch's order), written atomically; --resume
 * continues from the newest one and reproduces the losses of an uninterrupted run (the data
 * order is a function of (seed, epoch), the optimizer state is exact, weights are F32).
 * Ctrl-C finishes the step, saves a checkpoint and exits. */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/backend.h"
#include "fuseflow/config.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

static const char *CMD = "sft";

static void help(void) {
    printf("usage: fuseflow sft --config FILE.yaml [--resume] [key=value ...]\n\n"
           "Fine-tunes a model folder on JSONL lines {\"prompt\": ..., \"response\": ...}; the loss\n"
           "covers the response (and the eos after it), not the prompt. Prints a progress line\n"
           "per step (a live line on a terminal), evaluates on held-out data, saves checkpoints.\n\n"
           "options:\n"
           "  --config FILE      the run (keys below; examples/sft_arith.yaml is a full example)\n"
           "  --resume           continue from the newest checkpoint in OUT/checkpoints\n"
           "  key=value          override a key, e.g. train.steps=50 optim.lr=1e-3\n\n"
           "keys (defaults in brackets):\n"
           "  model              model folder to start from (config.json, weights, tokenizer)\n"
           "  out                run folder: checkpoints/, final/, metrics.jsonl, config.yaml\n"
           "  device             cpu, cpu:N, cuda, cuda:N [cpu]\n"
           "  save_dtype         dtype of OUT/final: f32, bf16, f16 [f32]\n"
           "  data.train         training JSONL\n"
           "  data.test          held-out JSONL [none]\n"
           "  train.steps        optimizer steps [100]\n"
           "  train.batch_size   sequences per step [32]\n"
           "  train.micro_batch_tokens  tokens per forward/backward, 0 = whole batch [0]\n"
           "  train.seed         data order seed [1]\n"
           "  train.log_every    a permanent progress line every N steps [1]\n"
           "  train.eval_every   held-out loss and exact match every N steps, 0 = off [0]\n"
           "  train.eval_samples held-out examples used for eval [200]\n"
           "  train.save_every   checkpoint every N steps, 0 = only at the end [0]\n"
           "  train.keep_checkpoints  newest checkpoints kept [2]\n"
           "  train.stop_after   stop after this step with a checkpoint, 0 = run to the end [0];\n"
           "                     e.g. to split a run across time-limited jobs (then --resume)\n"
           "  optim.lr [1e-3], optim.weight_decay [0.01], optim.beta1 [0.9], optim.beta2 [0.999],\n"
           "  optim.eps [1e-8], optim.max_grad_norm [1.0], optim.warmup_steps [0],\n"
           "  optim.min_lr_ratio [0.1] (cosine decay to lr * min_lr_ratio over train.steps)\n\n"
           "example:\n"
           "  fuseflow sft --config examples/sft_arith.yaml train.steps=200\n");
}

/* ---- the run's settings ----------------------------------------------------------------- */

typedef struct settings {
    const char *model, *out, *device, *train_path, *test_path;
    ff_dtype save_dtype;
    int64_t steps, batch_size, micro_tokens, seed, log_every, eval_every, eval_samples, save_every, keep, stop_after;
    ff_adamw_config optim;
} settings;

static int required_str(ff_config *c, const char *key, const char **out) {
    int r = ff_config_get_str(c, key, NULL, out);
    if (r < 0) return -1;
    if (r == 1 || !*out || !**out) return ff_error_set(NULL, "see 'fuseflow sft --help'", "the config has no '%s'", key);
    return 0;
}

static int read_settings(ff_config *c, settings *s) {
    memset(s, 0, sizeof *s);
    const char *dt;
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    int dti;
    if (required_str(c, "model", &s->model) || required_str(c, "out", &s->out) || required_str(c, "data.train", &s->train_path) ||
        ff_config_get_str(c, "data.test", NULL, &s->test_path) < 0 || ff_config_get_str(c, "device", "cpu", &s->device) < 0 ||
        ff_config_get_enum(c, "save_dtype", dtypes, 3, 0, &dti) < 0)
        return -1;
    (void)dt;
    s->save_dtype = dti == 0 ? FF_DTYPE_F32 : dti == 1 ? FF_DTYPE_BF16 : FF_DTYPE_F16;
    const int64_t big = (int64_t)1 << 40;
    if (ffio_cfg_int(c, "train.steps", 100, 1, big, &s->steps) || ffio_cfg_int(c, "train.batch_size", 32, 1, 1 << 20, &s->batch_size) ||
        ffio_cfg_int(c, "train.micro_batch_tokens", 0, 0, 1 << 28, &s->micro_tokens) || ffio_cfg_int(c, "train.seed", 1, 0, big, &s->seed) ||
        ffio_cfg_int(c, "train.log_every", 1, 1, big, &s->log_every) || ffio_cfg_int(c, "train.eval_every", 0, 0, big, &s->eval_every) ||
        ffio_cfg_int(c, "train.eval_samples", 200, 1, big, &s->eval_samples) || ffio_cfg_int(c, "train.save_every", 0, 0, big, &s->save_every) ||
        ffio_cfg_int(c, "train.keep_checkpoints", 2, 1, 1 << 20, &s->keep) || ffio_cfg_int(c, "train.stop_after", 0, 0, big, &s->stop_after))
        return -1;
    ff_adamw_config *o = &s->optim;
    ff_adamw_config_default(o);
    o->lr = 1e-3;
    o->max_grad_norm = 1.0;
    o->min_lr_ratio = 0.1;
    if (ffio_cfg_double(c, "optim.lr", o->lr, 0, 10, &o->lr) || ffio_cfg_double(c, "optim.weight_decay", o->weight_decay, 0, 10, &o->weight_decay) ||
        ffio_cfg_double(c, "optim.beta1", o->beta1, 0, 0.999999, &o->beta1) || ffio_cfg_double(c, "optim.beta2", o->beta2, 0, 0.99999999, &o->beta2) ||
        ffio_cfg_double(c, "optim.eps", o->eps, 1e-30, 1, &o->eps) || ffio_cfg_double(c, "optim.max_grad_norm", o->max_grad_norm, 0, 1e9, &o->max_grad_norm) ||
        ffio_cfg_int(c, "optim.warmup_steps", 0, 0, big, &o->warmup_steps) ||
        ffio_cfg_double(c, "optim.min_lr_ratio", o->min_lr_ratio, 0, 1, &o->min_lr_ratio))
        return -1;
    o->total_steps = s->steps;
    return ff_config_check_unused(c);
}

/* ---- data ----------------------------------------------------------------------------------- */

typedef struct dataset {
    int32_t *tokens; /* all examples back to back */
    int64_t *start;  /* [n + 1] */
    int32_t *prompt_len;
    char **response; /* the reference text, for exact match */
    int64_t n;
    int32_t max_len;
} dataset;

static void dataset_free(dataset *d) {
    free(d->tokens);
    free(d->start);
    free(d->prompt_len);
    for (int64_t i = 0; d->response && i < d->n; i++) free(d->response[i]);
    free(d->response);
    memset(d, 0, sizeof *d);
}

static int dataset_load(dataset *d, const char *path, const ff_tokenizer *tok, const ff_model_config *cfg, int32_t eos, int64_t limit) {
    memset(d, 0, sizeof *d);
    ff_jsonl *r = ff_jsonl_open(path);
    if (!r) return -1;
    size_t cap_ex = 0, cap_tok = 0, n_tok = 0;
    json_t *o = NULL;
    int got = 0, rc = -1;
    char where[4200];
    int32_t *p = NULL, *q = NULL;
    while (d->n < limit && (got = ff_jsonl_next(r, &o)) == 1) {
        snprintf(where, sizeof where, "%s:%d", path, ff_jsonl_line(r));
        json_t *jp = json_object_get(o, "prompt"), *jr = json_object_get(o, "response");
        if (!json_is_string(jp) || !json_is_string(jr)) {
            ff_error_set(where, "each line is {\"prompt\": \"...\", \"response\": \"...\"}", "expected string fields \"prompt\" and \"response\"");
            goto out;
        }
        int32_t np, nr;
        ff_encode_opts with_template = {true, true}, plain = {false, true};
        if (ff_tokenizer_encode(tok, json_string_value(jp), json_string_length(jp), &with_template, &p, &np) != 0 ||
            ff_tokenizer_encode(tok, json_string_value(jr), json_string_length(jr), &plain, &q, &nr) != 0) {
            ff_error_wrap("%s", where);
            goto out;
        }
        int32_t len = np + nr + 1;
        if (np < 1) {
            ff_error_set(where, NULL, "the prompt encodes to no tokens");
            goto out;
        }
        if (len > cfg->max_position_embeddings) {
            ff_error_set(where, "shorten the example or use a model with a longer context", "%d tokens with eos, more than max_position_embeddings %d", len,
                         cfg->max_position_embeddings);
            goto out;
        }
        if ((size_t)d->n + 1 >= cap_ex) {
            cap_ex = cap_ex ? 2 * cap_ex : 1024;
            int64_t *ns = ff_realloc(d->start, (cap_ex + 1) * sizeof *ns);
            if (ns) d->start = ns;
            int32_t *npl = ns ? ff_realloc(d->prompt_len, cap_ex * sizeof *npl) : NULL;
            if (npl) d->prompt_len = npl;
            char **nrs = npl ? ff_realloc(d->response, cap_ex * sizeof *nrs) : NULL;
            if (!nrs) goto out;
            d->response = nrs;
        }
        if (n_tok + (size_t)len > cap_tok) {
            cap_tok = (cap_tok ? 2 * cap_tok : 1 << 16) + (size_t)len;
            int32_t *nt = ff_realloc(d->tokens, cap_tok * sizeof *nt);
            if (!nt) goto out;
            d->tokens = nt;
        }
        if (!(d->response[d->n] = ff_strdup(json_string_value(jr)))) goto out;
        d->start[d->n] = (int64_t)n_tok;
        memcpy(d->tokens + n_tok, p, (size_t)np * sizeof *p);
        memcpy(d->tokens + n_tok + np, q, (size_t)nr * sizeof *q);
        d->tokens[n_tok + (size_t)np + (size_t)nr] = eos;
        for (int32_t i = 0; i < len; i++)
            if (d->tokens[n_tok + (size_t)i] >= cfg->vocab_size) {
                ff_error_set(where, "the tokenizer does not match the model", "token id %d is out of range for vocab_size %d", d->tokens[n_tok + (size_t)i],
                             cfg->vocab_size);
                d->n++;
                goto out;
            }
        n_tok += (size_t)len;
        d->prompt_len[d->n] = np;
        d->n++;
        d->start[d->n] = (int64_t)n_tok;
        if (len > d->max_len) d->max_len = len;
        free(p);
        free(q);
        p = q = NULL;
        json_decref(o);
        o = NULL;
    }
    if (d->n < limit && got < 0) goto out;
    if (d->n == 0) {
        ff_error_set(path, "one JSON object per line: {\"prompt\": \"12+34=\", \"response\": \"46\"} (`fuseflow dataset arith` "
                     "writes such files)", "no examples: the file is empty or holds only blank lines");
        goto out;
    }
    rc = 0;
out:
    free(p);
    free(q);
    json_decref(o);
    ff_jsonl_close(&r);
    if (rc) dataset_free(d);
    return rc;
}

/* Examples in a step: order[pos..] of the epoch's permutation, a function of (seed, epoch). */
static void epoch_order(int64_t *order, int64_t n, uint64_t seed, int64_t epoch) {
    ff_rng r;
    ff_rng_seed(&r, seed * 0x9e3779b97f4a7c15ULL + (uint64_t)epoch);
    for (int64_t i = 0; i < n; i++) order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)ff_rng_below(&r, (uint64_t)(i + 1));
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* ---- one packed batch ------------------------------------------------------------------- */

typedef struct packed {
    int32_t *tokens, *starts, *targets;
    float *mask, *lp, *dlp;
    int32_t T, S;
    size_t cap_t, cap_s;
} packed;

static void packed_free(packed *b) {
    free(b->tokens);
    free(b->starts);
    free(b->targets);
    free(b->mask);
    free(b->lp);
    free(b->dlp);
}

static int packed_reserve(packed *b, size_t T, size_t S) {
    if (T > b->cap_t) {
        int32_t *a = ff_realloc(b->tokens, T * 4), *c = a ? ff_realloc(b->targets, T * 4) : NULL;
        if (a) b->tokens = a;
        if (c) b->targets = c;
        float *m = c ? ff_realloc(b->mask, T * 4) : NULL;
        if (m) b->mask = m;
        float *l = m ? ff_realloc(b->lp, T * 4) : NULL;
        if (l) b->lp = l;
        float *dl = l ? ff_realloc(b->dlp, T * 4) : NULL;
        if (!dl) return -1;
        b->dlp = dl;
        b->cap_t = T;
    }
    if (S + 1 > b->cap_s) {
        int32_t *s = ff_realloc(b->starts, (S + 1) * 4);
        if (!s) return -1;
        b->starts = s;
        b->cap_s = S + 1;
    }
    return 0;
}

/* Pack examples ex[0..k) with the response mask; *mask_sum = response tokens. 0 or -1. */
static int pack(packed *b, const dataset *d, const int64_t *ex, int32_t k, double *mask_sum) {
    size_t need = 0;
    for (int32_t i = 0; i < k; i++) need += (size_t)(d->start[ex[i] + 1] - d->start[ex[i]]);
    if (packed_reserve(b, need, (size_t)k) != 0) return -1;
    b->T = 0;
    b->S = k;
    b->starts[0] = 0;
    for (int32_t i = 0; i < k; i++) {
        int64_t e = ex[i];
        int32_t len = (int32_t)(d->start[e + 1] - d->start[e]);
        memcpy(b->tokens + b->T, d->tokens + d->start[e], (size_t)len * 4);
        b->T += len;
        b->starts[i + 1] = b->T;
    }
    ff_batch_shift_targets(b->tokens, b->starts, b->S, b->targets);
    double sum = 0;
    for (int32_t i = 0; i < k; i++) {
        int32_t s0 = b->starts[i], s1 = b->starts[i + 1], pl = d->prompt_len[ex[i]];
        for (int32_t t = s0; t < s1; t++) {
            /* position t predicts token t + 1: a response token when t + 1 >= prompt end */
            b->mask[t] = (t + 1 < s1 && t + 1 - s0 >= pl) ? 1.0f : 0.0f;
            sum += b->mask[t];
        }
    }
    *mask_sum = sum;
    return 0;
}

/* Split ex[0..n) into runs of at most max_tokens tokens (at least one example each). */
static int32_t next_micro(const dataset *d, const int64_t *ex, int32_t n, int64_t max_tokens) {
    if (max_tokens <= 0) return n;
    int64_t t = 0;
    int32_t k = 0;
    while (k < n) {
        int64_t len = d->start[ex[k] + 1] - d->start[ex[k]];
        if (k > 0 && t + len > max_tokens) break;
        t += len;
        k++;
    }
    return k;
}

/* ---- evaluation ------------------------------------------------------------------------- */

static int eval_loss(ff_model *m, const dataset *d, int64_t n, int64_t micro_tokens, packed *b, double *out) {
    int64_t *ex = ff_malloc((size_t)n * sizeof *ex);
    if (!ex) return -1;
    for (int64_t i = 0; i < n; i++) ex[i] = i;
    double loss = 0, count = 0;
    int64_t cap = micro_tokens > 0 ? micro_tokens : 4096;
    for (int64_t i = 0; i < n;) {
        int32_t k = next_micro(d, ex + i, (int32_t)(n - i), cap);
        double ms;
        if (pack(b, d, ex + i, k, &ms) != 0) {
            free(ex);
            return -1;
        }
        ff_batch fb = {b->T, b->S, b->tokens, b->starts, b->targets};
        ff_forward_opts fo = {false, 0};
        ff_forward_out fout = {b->lp, NULL, NULL, NULL};
        if (ff_model_forward(m, &fb, &fo, &fout) != 0) {
            free(ex);
            return -1;
        }
        loss += ff_sft_loss(b->lp, b->mask, b->T, 1.0f, NULL) * (ms > 1 ? ms : 1);
        count += ms;
        i += k;
    }
    free(ex);
    *out = loss / (count > 1 ? count : 1);
    return 0;
}

/* Greedy answers to the first n prompts; exact match of the decoded response (without eos). */
static int eval_exact(ff_model *m, const ff_tokenizer *tok, const dataset *d, int64_t n, int32_t max_pos, int64_t *hits) {
    *hits = 0;
    int32_t max_new = 2;
    for (int64_t i = 0; i < n; i++) {
        int32_t rl = (int32_t)(d->start[i + 1] - d->start[i]) - d->prompt_len[i];
        if (rl + 2 > max_new) max_new = rl + 2;
    }
    int32_t max_prompt = 1;
    for (int64_t i = 0; i < n; i++) max_prompt = d->prompt_len[i] > max_prompt ? d->prompt_len[i] : max_prompt;
    if (max_prompt + max_new > max_pos) max_new = max_pos - max_prompt;
    ff_gen_request *reqs = ff_calloc((size_t)n, sizeof *reqs);
    if (!reqs) return -1;
    for (int64_t i = 0; i < n; i++) {
        reqs[i].id = (uint64_t)i;
        reqs[i].prompt = d->tokens + d->start[i];
        reqs[i].prompt_len = d->prompt_len[i];
        reqs[i].n_samples = 1;
        ff_sampling_default(&reqs[i].sampling);
        reqs[i].sampling.temperature = 0;
        reqs[i].sampling.max_new_tokens = max_new;
    }
    ff_generator_config gc = {n < 64 ? (int32_t)n : 64, max_prompt + max_new, 0};
    ff_gen_output *outs = NULL;
    int32_t n_outs = 0;
    int rc = ff_model_generate(m, &gc, reqs, (int32_t)n, &outs, &n_outs);
    free(reqs);
    if (rc != 0) return -1;
    const ff_model_config *cfg = ff_model_config_of(m);
    for (int32_t k = 0; k < n_outs && rc == 0; k++) {
        ff_gen_output *o = &outs[k];
        int32_t nt = o->n_tokens;
        bool eos = false;
        for (int i = 0; nt > 0 && i < cfg->n_eos; i++) eos |= o->tokens[nt - 1] == cfg->eos_token_ids[i];
        char *text;
        size_t tl;
        if (ff_tokenizer_decode(tok, o->tokens, eos ? nt - 1 : nt, true, &text, &tl) != 0) {
            rc = -1;
            break;
        }
        const char *want = d->response[o->id];
        if (eos && tl == strlen(want) && !memcmp(text, want, tl)) (*hits)++;
        free(text);
    }
    for (int32_t k = 0; k < n_outs; k++) ff_gen_output_free(&outs[k]);
    free(outs);
    return rc;
}

/* ---- checkpoints ------------------------------------------------------------------------ */

typedef struct trainer_state {
    int64_t step, epoch, pos, tokens_seen;
} trainer_state;

static int save_checkpoint(const settings *s, ff_model *m, ff_optimizer *opt, const ff_tokenizer *tok, const trainer_state *ts, int64_t n_train) {
    char dir[4096], tmp[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/checkpoints/step-%08lld", s->out, (long long)ts->step);
    if (ff_atomic_dir_begin(dir, tmp, sizeof tmp) != 0) return -1;
    ff_tensor_set *w = ff_tensor_set_new(), *os = ff_tensor_set_new();
    json_t *j = NULL;
    char *text = NULL;
    int rc = -1;
    if (!w || !os || ff_model_export_weights(m, w) != 0 || ff_model_files_write(tmp, ff_model_config_of(m), w, tok, FF_DTYPE_F32) != 0) goto out;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if (ff_optimizer_export_state(opt, os) != 0 || ff_safetensors_save(path, os, FF_DTYPE_F32, NULL) != 0) goto out;
    j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "step", (json_int_t)ts->step, "epoch", (json_int_t)ts->epoch, "pos", (json_int_t)ts->pos,
                  "tokens_seen", (json_int_t)ts->tokens_seen, "seed", (json_int_t)s->seed, "n_train", (json_int_t)n_train, "train", s->train_path);
    text = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    if (!text || ff_write_file_atomic(path, text, strlen(text)) != 0) goto out;
    rc = 0;
out:
    free(text);
    json_decref(j);
    ff_tensor_set_destroy(&w);
    ff_tensor_set_destroy(&os);
    if (rc != 0) {
        ff_atomic_dir_abort(tmp);
        return -1;
    }
    return ff_atomic_dir_commit(tmp, dir);
}

static void prune_checkpoints(const settings *s) {
    int64_t *steps;
    int n = ff_checkpoint_steps(s->out, &steps);
    for (int i = 0; i + s->keep < n; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/checkpoints/step-%08lld", s->out, (long long)steps[i]);
        if (ff_remove_tree(dir) != 0) ff_warn("%s", ff_error_message());
    }
    free(steps);
}

static int load_trainer_state(const char *dir, trainer_state *ts, const settings *s, int64_t n_train) {
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) return ff_error_set(path, NULL, "cannot read: %s", err.text);
    json_int_t step = -1, epoch = -1, pos = -1, seen = 0, seed = -1, n = -1;
    int bad = json_unpack(j, "{s:I, s:I, s:I, s:I, s:I, s:I}", "step", &step, "epoch", &epoch, "pos", &pos, "tokens_seen", &seen, "seed", &seed, "n_train", &n);
    json_decref(j);
    if (bad || step < 0 || epoch < 0 || pos < 0) return ff_error_set(path, NULL, "missing or bad step/epoch/pos");
    if (seed != s->seed || n != n_train)
        return ff_error_set(path, "resume with the same data and train.seed, or start a new run folder",
                            "the checkpoint was made with seed %lld on %lld examples; this run has seed %lld and %lld examples", (long long)seed,
                            (long long)n, (long long)s->seed, (long long)n_train);
    if (pos > n_train) return ff_error_set(path, NULL, "position %lld is beyond the %lld examples", (long long)pos, (long long)n_train);
    ts->step = step;
    ts->epoch = epoch;
    ts->pos = pos;
    ts->tokens_seen = seen;
    return 0;
}

/* Keep metrics.jsonl lines of steps <= step (a resumed run rewrites what follows). */
static int truncate_metrics(const char *path, int64_t step) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *line = NULL, *keep = NULL;
    size_t cap = 0, kn = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        json_int_t st = j ? json_integer_value(json_object_get(j, "step")) : 0;
        json_decref(j);
        if (!j || st > step) continue;
        char *nk = realloc(keep, kn + (size_t)n + 1);
        if (!nk) {
            rc = ff_error_set(path, NULL, "out of memory");
            break;
        }
        keep = nk;
        memcpy(keep + kn, line, (size_t)n);
        kn += (size_t)n;
    }
    fclose(f);
    free(line);
    if (rc == 0) rc = ff_write_file_atomic(path, keep ? keep : "", kn);
    free(keep);
    return rc;
}

/* ---- the command -------------------------------------------------------------------------- */

static volatile sig_atomic_t g_interrupted = 0;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void metrics_line(FILE *f, json_t *j) {
    if (!f || !j) {
        json_decref(j);
        return;
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (s) fprintf(f, "%s\n", s);
    fflush(f);
    free(s);
    json_decref(j);
}

int ff_cmd_sft(int argc, char **argv) {
    const char *cfg_path = NULL;
    bool resume = false;
    const ffio_opt opts[] = {{"config", FFIO_STR, &cfg_path, 0, 0}, {"resume", FFIO_FLAG, &resume, 0, 0}};
    char *overrides[256];
    int n_over;
    int pr = ffio_parse(CMD, argc, argv, opts, 2, overrides, 256, &n_over);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (!cfg_path) return ffio_usage(CMD, "--config FILE is required");

    settings s;
    ff_config *y = ff_config_load(cfg_path);
    ff_model_config mc;
    ff_tensor_set *w = NULL, *ostate = NULL;
    ff_tokenizer *tok = NULL;
    ff_backend *be = NULL;
    ff_model *m = NULL;
    ff_optimizer *opt = NULL;
    dataset train = {0}, test = {0};
    packed b = {0};
    int64_t *order = NULL, *steps = NULL;
    FILE *metrics = NULL;
    int rc = 1;
    trainer_state ts = {0, 0, 0, 0};
    const char *model_dir;
    char path[4200], ck[4200] = "";

    if (!y || ff_config_apply_overrides(y, n_over, overrides) != 0 || read_settings(y, &s) != 0) goto out;
    model_dir = s.model;
    if (resume) {
        int n = ff_checkpoint_steps(s.out, &steps);
        if (n == 0) {
            ff_error_set(s.out, "run without --resume to start", "--resume: no checkpoint in %s/checkpoints", s.out);
            goto out;
        }
        snprintf(ck, sizeof ck, "%s/checkpoints/step-%08lld", s.out, (long long)steps[n - 1]);
        model_dir = ck;
    }
    if (ff_model_dir_load(model_dir, &mc, &w) != 0) goto out;
    if (!(tok = ff_tokenizer_load_dir(model_dir))) {
        ff_error_wrap("%s: sft needs the model folder's tokenizer", model_dir);
        goto out;
    }
    int32_t eos = mc.n_eos > 0 ? mc.eos_token_ids[0] : ff_tokenizer_eos(tok);
    if (eos < 0) {
        ff_error_set(model_dir, "set eos_token_id in config.json", "the model has no end-of-sequence token to end responses with");
        goto out;
    }
    if (dataset_load(&train, s.train_path, tok, &mc, eos, INT64_MAX) != 0) goto out;
    if (s.test_path && dataset_load(&test, s.test_path, tok, &mc, eos, s.eval_samples) != 0) goto out;
    if (!(be = ff_backend_new(s.device)) || !(m = ff_model_new(be, &mc, w))) goto out;
    ff_tensor_set_destroy(&w);
    if (!(opt = ff_optimizer_new(m, &s.optim))) goto out;
    {
        /* size the training workspace once for the largest micro-batch */
        int64_t bs = s.batch_size < train.n ? s.batch_size : train.n, most = bs * train.max_len;
        if (s.micro_tokens > 0 && s.micro_tokens < most) most = s.micro_tokens > train.max_len ? s.micro_tokens : train.max_len;
        if (most > INT32_MAX || ff_model_reserve(m, (int32_t)most) != 0) goto out;
    }
    if (resume) {
        snprintf(path, sizeof path, "%s/optimizer.safetensors", ck);
        if (!(ostate = ff_tensor_set_new()) || ff_safetensors_load(path, ostate) != 0 || ff_optimizer_import_state(opt, ostate) != 0 ||
            load_trainer_state(ck, &ts, &s, train.n) != 0)
            goto out;
        ff_tensor_set_destroy(&ostate);
        if (ts.step >= s.steps) {
            ff_error_set(ck, "raise train.steps to train further", "the checkpoint is at step %lld, train.steps is %lld", (long long)ts.step, (long long)s.steps);
            goto out;
        }
    }
    if (ff_mkdirs(s.out) != 0) goto out;
    snprintf(path, sizeof path, "%s/config.yaml", s.out);
    FILE *cf = fopen(path, "w");
    if (!cf || ff_config_write(y, cf) != 0) {
        if (cf) fclose(cf);
        ff_error_set(path, NULL, "cannot write the effective config");
        goto out;
    }
    fclose(cf);
    snprintf(path, sizeof path, "%s/metrics.jsonl", s.out);
    if (resume ? truncate_metrics(path, ts.step) != 0 : (unlink(path), 0)) goto out;
    if (!(metrics = fopen(path, "a"))) {
        ff_error_set(path, NULL, "cannot open for appending");
        goto out;
    }

    int32_t B = (int32_t)(s.batch_size < train.n ? s.batch_size : train.n);
    if (!(order = ff_malloc((size_t)train.n * sizeof *order))) goto out;
    epoch_order(order, train.n, (uint64_t)s.seed, ts.epoch);
    char ps[32];
    ffio_human((double)ff_model_param_count(m), ps, sizeof ps);
    fprintf(stderr, "sft: %s (%s parameters) on %lld examples%s%s, %lld steps of %d sequences, lr %g, %s%s\n", s.model, ps, (long long)train.n,
            test.n ? ", held-out " : "", test.n ? s.test_path : "", (long long)s.steps, B, s.optim.lr, ff_backend_name(be),
            resume ? ", resumed" : "");
    if (resume) fprintf(stderr, "sft: resuming from %s (step %lld)\n", ck, (long long)ts.step);

    signal(SIGINT, on_sigint);
    bool tty = isatty(fileno(stderr));
    double ema_step = 0;
    int64_t t_start = ff_now_ns();
    int64_t *ex = ff_malloc((size_t)B * sizeof *ex);
    if (!ex) goto out;
    bool saved_last = false;
    while (ts.step < s.steps) {
        int64_t t0 = ff_now_ns();
        /* the step's examples */
        for (int32_t i = 0; i < B; i++) {
            if (ts.pos == train.n) {
                ts.epoch++;
                ts.pos = 0;
                epoch_order(order, train.n, (uint64_t)s.seed, ts.epoch);
            }
            ex[i] = order[ts.pos++];
        }
        double total_mask = 0;
        int64_t step_tokens = 0;
        for (int32_t i = 0; i < B; i++) {
            int64_t len = train.start[ex[i] + 1] - train.start[ex[i]];
            step_tokens += len;
            total_mask += (double)(len - train.prompt_len[ex[i]]);
        }
        ff_model_zero_grad(m);
        double loss = 0;
        for (int32_t i = 0; i < B;) {
            int32_t k = next_micro(&train, ex + i, B - i, s.micro_tokens);
            double ms;
            if (pack(&b, &train, ex + i, k, &ms) != 0) goto out_ex;
            ff_batch fb = {b.T, b.S, b.tokens, b.starts, b.targets};
            ff_forward_opts fo = {true, 0};
            ff_forward_out fout = {b.lp, NULL, NULL, NULL};
            if (ff_model_forward(m, &fb, &fo, &fout) != 0) goto out_ex;
            double l = ff_sft_loss(b.lp, b.mask, b.T, (float)(ms / total_mask), b.dlp);
            loss += l * ms / total_mask;
            if (ff_model_backward(m, b.dlp, NULL, NULL) != 0) goto out_ex;
            i += k;
        }
        ff_optim_stats st;
        if (ff_optimizer_step(opt, &st) != 0) {
            ff_error_wrap("step %lld (loss %g)", (long long)ts.step + 1, loss);
            goto out_ex;
        }
        ts.step++;
        ts.tokens_seen += step_tokens;
        double dt = (double)(ff_now_ns() - t0) / 1e9;
        ema_step = ema_step == 0 ? dt : 0.9 * ema_step + 0.1 * dt;
        double tps = (double)step_tokens / (dt > 0 ? dt : 1e-9);
        metrics_line(metrics, json_pack("{s:I, s:f, s:f, s:f, s:I, s:f, s:f}", "step", (json_int_t)ts.step, "loss", loss, "lr", st.lr, "grad_norm",
                                        st.grad_norm, "tokens", (json_int_t)step_tokens, "tokens_per_s", tps,
                                        "elapsed_s", (double)(ff_now_ns() - t_start) / 1e9));
        char eta[32], tp[32];
        ffio_duration(ema_step * (double)(s.steps - ts.step), eta, sizeof eta);
        ffio_human(tps, tp, sizeof tp);
        bool permanent = ts.step % s.log_every == 0 || ts.step == s.steps || ts.step == 1;
        if (permanent || tty)
            fprintf(stderr, "%sstep %6lld/%lld | loss %.4f | lr %.2e | grad %.3f | %s tok/s | ETA %s%s", tty ? "\r\033[K" : "", (long long)ts.step,
                    (long long)s.steps, loss, st.lr, st.grad_norm, tp, eta, permanent ? "\n" : "");
        saved_last = false;
        if (s.eval_every > 0 && test.n && (ts.step % s.eval_every == 0 || ts.step == s.steps)) {
            double el;
            int64_t hits;
            int64_t te0 = ff_now_ns();
            if (eval_loss(m, &test, test.n, s.micro_tokens, &b, &el) != 0 || eval_exact(m, tok, &test, test.n, mc.max_position_embeddings, &hits) != 0)
                goto out_ex;
            fprintf(stderr, "%seval @ %lld | held-out loss %.4f | exact match %.1f%% (%lld/%lld) | %.1fs\n", tty ? "\r\033[K" : "", (long long)ts.step, el,
                    100.0 * (double)hits / (double)test.n, (long long)hits, (long long)test.n, (double)(ff_now_ns() - te0) / 1e9);
            metrics_line(metrics, json_pack("{s:I, s:f, s:f, s:I}", "step", (json_int_t)ts.step, "eval_loss", el, "exact_match",
                                            (double)hits / (double)test.n, "eval_samples", (json_int_t)test.n));
        }
        bool stop_early = s.stop_after > 0 && ts.step == s.stop_after && ts.step < s.steps;
        bool save_now = (s.save_every > 0 && ts.step % s.save_every == 0) || ts.step == s.steps || g_interrupted || stop_early;
        if (save_now) {
            if (save_checkpoint(&s, m, opt, tok, &ts, train.n) != 0) goto out_ex;
            prune_checkpoints(&s);
            saved_last = true;
        }
        if (stop_early) {
            fprintf(stderr, "%ssft: stopped after step %lld (train.stop_after); continue with --resume\n", tty ? "\r\033[K" : "", (long long)ts.step);
            free(ex);
            rc = 0;
            goto out;
        }
        if (g_interrupted) {
            fprintf(stderr, "%ssft: interrupted; saved %s/checkpoints/step-%08lld (continue with --resume)\n", tty ? "\r\033[K" : "", s.out,
                    (long long)ts.step);
            free(ex);
            rc = 130;
            goto out;
        }
    }
    (void)saved_last;
    /* the final model, in the requested dtype */
    snprintf(path, sizeof path, "%s/final", s.out);
    w = ff_tensor_set_new();
    if (!w || ff_model_export_weights(m, w) != 0 || ff_model_dir_save(path, &mc, w, tok, s.save_dtype) != 0) goto out_ex;
    fprintf(stderr, "sft: done in %.1fs (%lld tokens); model in %s\n", (double)(ff_now_ns() - t_start) / 1e9, (long long)ts.tokens_seen, path);
    rc = 0;
out_ex:
    free(ex);
out:
    signal(SIGINT, SIG_DFL);
    if (rc == 1) ffio_fail(CMD);
    if (metrics) fclose(metrics);
    free(order);
    free(steps);
    packed_free(&b);
    dataset_free(&train);
    dataset_free(&test);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_tokenizer_destroy(&tok);
    ff_tensor_set_destroy(&w);
    ff_tensor_set_destroy(&ostate);
    ff_config_destroy(&y);
    return rc;
}

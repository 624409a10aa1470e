/* ff_sft_run: supervised fine-tuning of a model folder on JSONL prompt/response pairs (see
 * include/fuseflow/sft.h): the settings from the config, the examples tokenized and packed
 * with the response mask, the training loop with held-out evaluation, checkpoints in the run
 * folder of fuseflow/train_dir.h, resume.
 *
 * Not here: parsing arguments and printing progress (cli/cmd_sft.c), the folder's rules
 * (model/io/train_dir.c). */
#include "fuseflow/sft.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/config.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"

/* Keys whose change on --resume keeps the run's meaning: where and when it logs, evaluates
 * and saves, where it runs, the stored dtype of the final model. docs/model-files.md. */
static const char *const harmless_keys[] = {"out", "device", "save_dtype", "data.test", "train.logger", "train.log_every", "train.eval_every",
                                            "train.eval_samples", "train.save_every", "train.keep_checkpoints", "train.stop_after",
                                            NULL};
static const char *const sft_folders[] = {"final", NULL};
static const char *const sft_files[] = {"curves.png", NULL}; /* `fuseflow sft` draws it at the end (cli/cmd_plot.c) */

/* ---- the run's settings ----------------------------------------------------------------- */

typedef struct settings {
    const char *model, *out, *device, *train_path, *test_path;
    ff_dtype save_dtype;
    int64_t steps, batch_size, micro_tokens, seed, log_every, eval_every, eval_samples, save_every, keep, stop_after;
    unsigned loggers; /* FF_LOGGER_* (config.h): train.logger */
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
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    int dti;
    if (required_str(c, "model", &s->model) || required_str(c, "out", &s->out) || required_str(c, "data.train", &s->train_path) ||
        ff_config_get_str(c, "data.test", NULL, &s->test_path) < 0 || ff_config_get_str(c, "device", "cpu", &s->device) < 0 ||
        ff_config_get_enum(c, "save_dtype", dtypes, 3, 0, &dti) < 0)
        return -1;
    s->save_dtype = dti == 0 ? FF_DTYPE_F32 : dti == 1 ? FF_DTYPE_BF16 : FF_DTYPE_F16;
    const int64_t big = (int64_t)1 << 40;
    if (ff_config_get_int_in(c, "train.steps", 100, 1, big, &s->steps) < 0 ||
        ff_config_get_int_in(c, "train.batch_size", 32, 1, 1 << 20, &s->batch_size) < 0 ||
        ff_config_get_int_in(c, "train.micro_batch_tokens", 0, 0, 1 << 28, &s->micro_tokens) < 0 ||
        ff_config_get_int_in(c, "train.seed", 1, 0, big, &s->seed) < 0 || ff_config_get_int_in(c, "train.log_every", 1, 1, big, &s->log_every) < 0 ||
        ff_config_get_int_in(c, "train.eval_every", 0, 0, big, &s->eval_every) < 0 ||
        ff_config_get_int_in(c, "train.eval_samples", 200, 1, big, &s->eval_samples) < 0 ||
        ff_config_get_int_in(c, "train.save_every", 0, 0, big, &s->save_every) < 0 ||
        ff_config_get_int_in(c, "train.keep_checkpoints", 2, 1, 1 << 20, &s->keep) < 0 ||
        ff_config_get_int_in(c, "train.stop_after", 0, 0, big, &s->stop_after) < 0 ||
        ff_config_get_loggers(c, "train.logger", &s->loggers) < 0)
        return -1;
    ff_adamw_config *o = &s->optim;
    ff_adamw_config_default(o);
    o->lr = 1e-3;
    o->max_grad_norm = 1.0;
    o->min_lr_ratio = 0.1;
    if (ff_config_get_double_in(c, "optim.lr", o->lr, 0, 10, &o->lr) < 0 ||
        ff_config_get_double_in(c, "optim.weight_decay", o->weight_decay, 0, 10, &o->weight_decay) < 0 ||
        ff_config_get_double_in(c, "optim.beta1", o->beta1, 0, 0.999999, &o->beta1) < 0 ||
        ff_config_get_double_in(c, "optim.beta2", o->beta2, 0, 0.99999999, &o->beta2) < 0 ||
        ff_config_get_double_in(c, "optim.eps", o->eps, 1e-30, 1, &o->eps) < 0 ||
        ff_config_get_double_in(c, "optim.max_grad_norm", o->max_grad_norm, 0, 1e9, &o->max_grad_norm) < 0 ||
        ff_config_get_int_in(c, "optim.warmup_steps", 0, 0, big, &o->warmup_steps) < 0 ||
        ff_config_get_double_in(c, "optim.min_lr_ratio", o->min_lr_ratio, 0, 1, &o->min_lr_ratio) < 0)
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
    char where[FF_PATH_MAX];
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
    ff_generator_config gc = {.max_slots = n < 64 ? (int32_t)n : 64, .max_seq_len = max_prompt + max_new};
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
    int64_t step, tokens_seen;
} trainer_state;

static int save_checkpoint(ff_train_dir *td, const settings *s, const ff_config *cfg, ff_model *m, ff_optimizer *opt,
                           const ff_tokenizer *tok, const trainer_state *ts, const ff_data_order *order) {
    char tmp[FF_PATH_MAX], path[FF_PATH_MAX];
    if (ff_train_dir_stage(td, ts->step, tmp, sizeof tmp) != 0) return -1;
    ff_tensor_set *w = ff_tensor_set_new(), *os = ff_tensor_set_new();
    json_t *j = NULL;
    char *text = NULL;
    int rc = -1;
    if (!w || !os || ff_model_export_weights(m, w) != 0 || ff_model_files_write(tmp, ff_model_config_of(m), w, tok, FF_DTYPE_F32) != 0) goto out;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if (ff_optimizer_export_state(opt, os) != 0 || ff_safetensors_save(path, os, FF_DTYPE_F32, NULL) != 0) goto out;
    j = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "step", (json_int_t)ts->step, "epoch", (json_int_t)order->epoch, "pos",
                  (json_int_t)order->cursor, "tokens_seen", (json_int_t)ts->tokens_seen, "seed", (json_int_t)s->seed, "n_train",
                  (json_int_t)order->n, "train", s->train_path);
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
    return ff_train_dir_commit(td, ts->step, tmp, cfg, (int)s->keep);
}

/* The trainer state of checkpoint dir; the data position goes to *epoch, *pos. */
static int load_trainer_state(const char *dir, trainer_state *ts, const settings *s, int64_t n_train, int64_t *epoch, int64_t *pos) {
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) return ff_error_set(path, NULL, "cannot read: %s", err.text);
    json_int_t step = -1, ep = -1, ps = -1, seen = 0, seed = -1, n = -1;
    int bad = json_unpack(j, "{s:I, s:I, s:I, s:I, s:I, s:I}", "step", &step, "epoch", &ep, "pos", &ps, "tokens_seen", &seen, "seed", &seed, "n_train", &n);
    json_decref(j);
    if (bad || step < 0 || ep < 0 || ps < 0) return ff_error_set(path, NULL, "missing or bad step/epoch/pos");
    if (seed != s->seed || n != n_train)
        return ff_error_set(path, "resume with the same data and train.seed, or start a new run folder",
                            "the checkpoint was made with seed %lld on %lld examples; this run has seed %lld and %lld examples", (long long)seed,
                            (long long)n, (long long)s->seed, (long long)n_train);
    if (ps > n_train) return ff_error_set(path, NULL, "position %lld is beyond the %lld examples", (long long)ps, (long long)n_train);
    ts->step = step;
    ts->tokens_seen = seen;
    *epoch = ep;
    *pos = ps;
    return 0;
}

/* ---- the run ------------------------------------------------------------------------------ */

typedef struct run {
    const ff_sft_opts *o;
    settings s;
    ff_config *y;
    ff_train_dir td;
    ff_model_config mc;
    ff_tokenizer *tok;
    ff_backend *be;
    ff_model *m;
    ff_optimizer *opt;
    dataset train, test;
    packed b;
    ff_data_order order;
    trainer_state ts;
    int64_t *ex; /* [batch] the step's examples */
    int32_t B;
    int64_t t_start;
} run;

static void emit(run *r, ff_sft_event *e) {
    e->step = r->ts.step;
    e->steps = r->s.steps;
    e->console = (r->s.loggers & FF_LOGGER_CONSOLE) != 0;
    if (r->o->on_event) r->o->on_event(r->o->event_ud, e);
}

static int metrics(run *r, json_t *j) {
    int rc = j ? ff_train_dir_metrics(&r->td, j) : ff_error_set(r->s.out, NULL, "metrics: out of memory");
    json_decref(j);
    return rc;
}

/* Load everything before the first step: the folder, the model (the checkpoint's when
 * resuming), data, backend, optimizer, the trainer state. */
static int setup(run *r) {
    const ff_sft_opts *o = r->o;
    settings *s = &r->s;
    ff_tensor_set *w = NULL, *ostate = NULL;
    int rc = -1;
    if (!o->config) return ff_error_set("sft", "fuseflow sft --config FILE.yaml", "no config");
    if (!(r->y = ff_config_load(o->config)) || ff_config_apply_overrides(r->y, o->n_overrides, o->overrides) != 0 ||
        read_settings(r->y, s) != 0)
        return -1;
    ff_train_dir_spec spec = {.cmd = "sft", .out = s->out, .out_key = "out", .step_key = "step", .resume = o->resume,
                              .files = sft_files, .folders = sft_folders, .harmless = harmless_keys, .loggers = s->loggers};
    if (ff_train_dir_open(&r->td, &spec) != 0) return -1;
    if (o->resume && ff_train_dir_check_config(&r->td, r->y, o->resume_with_changes) != 0) return -1;
    const char *model_dir = o->resume ? r->td.checkpoint : s->model;
    if (ff_model_dir_load(model_dir, &r->mc, &w) != 0) goto out;
    if (!(r->tok = ff_tokenizer_load_dir(model_dir))) {
        ff_error_wrap("%s: sft needs the model folder's tokenizer", model_dir);
        goto out;
    }
    int32_t eos = r->mc.n_eos > 0 ? r->mc.eos_token_ids[0] : ff_tokenizer_eos(r->tok);
    if (eos < 0) {
        ff_error_set(model_dir, "set eos_token_id in config.json", "the model has no end-of-sequence token to end responses with");
        goto out;
    }
    if (dataset_load(&r->train, s->train_path, r->tok, &r->mc, eos, INT64_MAX) != 0) goto out;
    if (s->test_path && dataset_load(&r->test, s->test_path, r->tok, &r->mc, eos, s->eval_samples) != 0) goto out;
    if (!(r->be = ff_backend_new(s->device)) || !(r->m = ff_model_new_from(r->be, &r->mc, &w, NULL))) goto out;
    if (!(r->opt = ff_optimizer_new(r->m, &s->optim))) goto out;
    r->B = (int32_t)(s->batch_size < r->train.n ? s->batch_size : r->train.n);
    {
        /* size the training workspace once for the largest micro-batch */
        int64_t most = (int64_t)r->B * r->train.max_len;
        if (s->micro_tokens > 0 && s->micro_tokens < most) most = s->micro_tokens > r->train.max_len ? s->micro_tokens : r->train.max_len;
        if (most > INT32_MAX || ff_model_reserve(r->m, (int32_t)most) != 0) goto out;
    }
    int64_t epoch = 0, pos = 0;
    if (o->resume) {
        char path[FF_PATH_MAX];
        snprintf(path, sizeof path, "%s/optimizer.safetensors", r->td.checkpoint);
        if (!(ostate = ff_tensor_set_new()) || ff_safetensors_load(path, ostate) != 0 || ff_optimizer_import_state(r->opt, ostate) != 0 ||
            load_trainer_state(r->td.checkpoint, &r->ts, s, r->train.n, &epoch, &pos) != 0)
            goto out;
        if (r->ts.step >= s->steps) {
            ff_error_set(r->td.checkpoint, "raise train.steps to train further (with --resume-with-changes)",
                         "the checkpoint is at step %lld, train.steps is %lld", (long long)r->ts.step, (long long)s->steps);
            goto out;
        }
    }
    if (ff_data_order_init(&r->order, r->train.n, (uint64_t)s->seed, true, epoch, pos) != 0) goto out;
    if (!(r->ex = ff_malloc((size_t)r->B * sizeof *r->ex))) goto out;
    if (ff_train_dir_start(&r->td, r->y) != 0) goto out;
    rc = 0;
out:
    ff_tensor_set_destroy(&w);
    ff_tensor_set_destroy(&ostate);
    return rc;
}

/* One optimizer step on the next B examples. */
static int step(run *r) {
    const settings *s = &r->s;
    int64_t t0 = ff_now_ns();
    for (int32_t i = 0; i < r->B; i++) r->ex[i] = ff_data_order_next(&r->order);
    double total_mask = 0;
    int64_t step_tokens = 0;
    for (int32_t i = 0; i < r->B; i++) {
        int64_t len = r->train.start[r->ex[i] + 1] - r->train.start[r->ex[i]];
        step_tokens += len;
        total_mask += (double)(len - r->train.prompt_len[r->ex[i]]);
    }
    ff_model_zero_grad(r->m);
    double loss = 0;
    packed *b = &r->b;
    for (int32_t i = 0; i < r->B;) {
        int32_t k = next_micro(&r->train, r->ex + i, r->B - i, s->micro_tokens);
        double ms;
        if (pack(b, &r->train, r->ex + i, k, &ms) != 0) return -1;
        ff_batch fb = {b->T, b->S, b->tokens, b->starts, b->targets};
        ff_forward_opts fo = {true, 0};
        ff_forward_out fout = {b->lp, NULL, NULL, NULL};
        if (ff_model_forward(r->m, &fb, &fo, &fout) != 0) return -1;
        double l = ff_sft_loss(b->lp, b->mask, b->T, (float)(ms / total_mask), b->dlp);
        loss += l * ms / total_mask;
        if (ff_model_backward(r->m, b->dlp, NULL, NULL) != 0) return -1;
        i += k;
    }
    ff_optim_stats st;
    if (ff_optimizer_step(r->opt, &st) != 0) return ff_error_wrap("step %lld (loss %g)", (long long)r->ts.step + 1, loss);
    r->ts.step++;
    r->ts.tokens_seen += step_tokens;
    double dt = (double)(ff_now_ns() - t0) / 1e9;
    double tps = (double)step_tokens / (dt > 0 ? dt : 1e-9);
    /* on a device, the most its backend held during the step (the next step's peak starts here) */
    ff_backend_memory bm;
    ff_backend_memory_of(r->be, &bm);
    ff_backend_memory_reset_peak(r->be);
    json_t *mj = json_pack("{s:I, s:f, s:f, s:f, s:I, s:f, s:f}", "step", (json_int_t)r->ts.step, "loss", loss, "lr", st.lr, "grad_norm",
                           st.grad_norm, "tokens", (json_int_t)step_tokens, "tokens_per_s", tps, "elapsed_s",
                           (double)(ff_now_ns() - r->t_start) / 1e9);
    if (mj && bm.capacity > 0) {
        json_object_set_new(mj, "device_peak_bytes", json_integer((json_int_t)bm.peak));
        json_object_set_new(mj, "device_capacity_bytes", json_integer((json_int_t)bm.capacity));
    }
    if (metrics(r, mj) != 0) return -1;
    int64_t t = r->ts.step;
    ff_sft_event e = {.kind = FF_SFT_STEP, .loss = loss, .lr = st.lr, .grad_norm = st.grad_norm, .step_s = dt, .tokens = step_tokens,
                      .log_line = t % s->log_every == 0 || t == s->steps || t == 1,
                      .device_peak = bm.capacity > 0 ? bm.peak : 0, .device_capacity = bm.capacity};
    emit(r, &e);
    return 0;
}

static int evaluate(run *r) {
    double el;
    int64_t hits, t0 = ff_now_ns();
    if (eval_loss(r->m, &r->test, r->test.n, r->s.micro_tokens, &r->b, &el) != 0 ||
        eval_exact(r->m, r->tok, &r->test, r->test.n, r->mc.max_position_embeddings, &hits) != 0)
        return -1;
    ff_sft_event e = {.kind = FF_SFT_EVAL, .eval_loss = el, .hits = hits, .n_test = r->test.n, .eval_s = (double)(ff_now_ns() - t0) / 1e9};
    emit(r, &e);
    return metrics(r, json_pack("{s:I, s:f, s:f, s:I}", "step", (json_int_t)r->ts.step, "eval_loss", el, "exact_match",
                                (double)hits / (double)r->test.n, "eval_samples", (json_int_t)r->test.n));
}

static int train(run *r, ff_sft_result *res) {
    const settings *s = &r->s;
    while (r->ts.step < s->steps) {
        if (step(r) != 0) return -1;
        int64_t t = r->ts.step;
        if (s->eval_every > 0 && r->test.n && (t % s->eval_every == 0 || t == s->steps) && evaluate(r) != 0) return -1;
        bool interrupted = r->o->interrupt && *r->o->interrupt;
        bool stop_early = s->stop_after > 0 && t == s->stop_after && t < s->steps;
        if ((s->save_every > 0 && t % s->save_every == 0) || t == s->steps || interrupted || stop_early) {
            if (save_checkpoint(&r->td, s, r->y, r->m, r->opt, r->tok, &r->ts, &r->order) != 0) return -1;
            ff_sft_event e = {.kind = FF_SFT_SAVED, .path = r->td.checkpoint};
            emit(r, &e);
        }
        if (interrupted || stop_early) {
            snprintf(res->checkpoint, sizeof res->checkpoint, "%s", r->td.checkpoint);
            return interrupted ? FF_SFT_INTERRUPTED : FF_SFT_STOPPED;
        }
    }
    /* the final model, in the requested dtype */
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/final", s->out);
    ff_tensor_set *w = ff_tensor_set_new();
    int rc = !w || ff_model_export_weights(r->m, w) != 0 || ff_model_dir_save(path, &r->mc, w, r->tok, s->save_dtype) != 0 ? -1 : FF_SFT_DONE;
    ff_tensor_set_destroy(&w);
    if (rc == FF_SFT_DONE) {
        ff_sft_event e = {.kind = FF_SFT_END, .path = path, .tokens = r->ts.tokens_seen, .elapsed_s = (double)(ff_now_ns() - r->t_start) / 1e9};
        emit(r, &e);
    }
    return rc;
}

int ff_sft_run(const ff_sft_opts *o, ff_sft_result *res) {
    ff_sft_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    run *r = ff_calloc(1, sizeof *r);
    if (!r) return -1;
    r->o = o;
    r->td.checkpoint_step = -1;
    int rc = setup(r);
    if (r->s.out) snprintf(res->out, sizeof res->out, "%s", r->s.out);
    if (rc == 0) {
        r->t_start = ff_now_ns();
        ff_sft_event e = {.kind = FF_SFT_START, .model = r->s.model, .test_path = r->test.n ? r->s.test_path : NULL,
                          .backend = ff_backend_name(r->be), .resumed_from = o->resume ? r->td.checkpoint : NULL,
                          .params = ff_model_param_count(r->m), .n_train = r->train.n, .n_test = r->test.n, .batch = r->B, .lr = r->s.optim.lr};
        emit(r, &e);
        rc = train(r, res);
        if (rc < 0) {
            char note[FF_PATH_MAX];
            ff_error_set(NULL, NULL, "%s; %s", ff_error_message(), ff_train_dir_resume_note(&r->td, note, sizeof note));
        }
    }
    res->step = r->ts.step;
    ff_train_dir_close(&r->td);
    free(r->ex);
    ff_data_order_free(&r->order);
    packed_free(&r->b);
    dataset_free(&r->train);
    dataset_free(&r->test);
    ff_optimizer_destroy(&r->opt);
    ff_model_destroy(&r->m);
    ff_backend_destroy(&r->be);
    ff_tokenizer_destroy(&r->tok);
    ff_config_destroy(&r->y);
    free(r);
    return rc;
}

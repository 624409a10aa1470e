/* Scoring over micro-batches: per-token log-probs and entropy (actor, reference), per-token
 * values (critic), reward-model scores (value head at the last token), on a whole model or
 * over a pipeline (the forward-only schedule, the results sent to every rank); and the
 * packing of samples into model batches that the trainer shares.
 *
 * Not here: which samples to score (the executor's scheduler), rewards from rules
 * (dataflow/reward.c). */
#include <assert.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/roles/roles_internal.h"

/* ---- packing ---------------------------------------------------------------------------------- */

static int grow_i32(int32_t **p, size_t n) {
    int32_t *q = ff_realloc(*p, n * sizeof *q);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int grow_f32(float **p, size_t n) {
    float *q = ff_realloc(*p, n * sizeof *q);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int pack_reserve(rl_pack *p, size_t T, size_t S, size_t Tr) {
    if (T > p->cap_t) {
        size_t c = T + T / 2;
        if (grow_i32(&p->tokens, c) || grow_i32(&p->targets, c) || grow_f32(&p->t_a, c) || grow_f32(&p->t_b, c) ||
            grow_f32(&p->t_c, c) || grow_f32(&p->t_da, c) || grow_f32(&p->t_db, c) || grow_f32(&p->t_dc, c))
            return -1;
        p->cap_t = c;
    }
    if (S + 1 > p->cap_s) {
        size_t c = S + 1 + S / 2;
        if (grow_i32(&p->starts, c) || grow_i32(&p->resp_off, c)) return -1;
        p->cap_s = c;
    }
    if (Tr + 1 > p->cap_r) {
        size_t c = Tr + 1 + Tr / 2;
        if (grow_i32(&p->resp_pos, c)) return -1;
        for (size_t i = 0; i < sizeof p->r / sizeof p->r[0]; i++)
            if (grow_f32(&p->r[i], c)) return -1;
        p->cap_r = c;
    }
    return 0;
}

int rl_pack_build(rl_pack *p, const ff_rl_sample *samples, const int32_t *idx, int32_t n, bool with_targets) {
    assert(n >= 1);
    size_t T = 0, Tr = 0;
    for (int32_t k = 0; k < n; k++) {
        const ff_rl_sample *s = &samples[idx ? idx[k] : k];
        if (!s->prompt || s->prompt_len < 1)
            return ff_error_set("sample", "every sample needs at least one prompt token", "sample %d has an empty prompt",
                                idx ? idx[k] : k);
        if (s->response_len < 0 || (s->response_len > 0 && !s->response))
            return ff_error_set("sample", NULL, "sample %d has a bad response (length %d)", idx ? idx[k] : k, s->response_len);
        T += (size_t)s->prompt_len + (size_t)s->response_len;
        Tr += (size_t)s->response_len;
    }
    if (T > INT32_MAX) return ff_error_set("pack", "use smaller micro-batches", "%zu tokens in one batch", T);
    if (pack_reserve(p, T, (size_t)n, Tr)) return -1;
    int32_t t = 0, r = 0;
    p->starts[0] = 0;
    p->resp_off[0] = 0;
    for (int32_t k = 0; k < n; k++) {
        const ff_rl_sample *s = &samples[idx ? idx[k] : k];
        memcpy(p->tokens + t, s->prompt, (size_t)s->prompt_len * sizeof(int32_t));
        if (s->response_len) memcpy(p->tokens + t + s->prompt_len, s->response, (size_t)s->response_len * sizeof(int32_t));
        for (int32_t j = 0; j < s->response_len; j++) p->resp_pos[r + j] = t + s->prompt_len - 1 + j;
        t += s->prompt_len + s->response_len;
        r += s->response_len;
        p->starts[k + 1] = t;
        p->resp_off[k + 1] = r;
    }
    p->T = t;
    p->S = n;
    p->Tr = r;
    p->has_targets = with_targets;
    if (with_targets) ff_batch_shift_targets(p->tokens, p->starts, n, p->targets);
    return 0;
}

void rl_pack_free(rl_pack *p) {
    free(p->tokens);
    free(p->starts);
    free(p->targets);
    free(p->resp_off);
    free(p->resp_pos);
    free(p->t_a);
    free(p->t_b);
    free(p->t_c);
    free(p->t_da);
    free(p->t_db);
    free(p->t_dc);
    for (size_t i = 0; i < sizeof p->r / sizeof p->r[0]; i++) free(p->r[i]);
    memset(p, 0, sizeof *p);
}

ff_batch rl_pack_batch(const rl_pack *p) {
    return (ff_batch){.n_tokens = p->T, .n_seqs = p->S, .tokens = p->tokens, .seq_start = p->starts, .targets = p->has_targets ? p->targets : NULL};
}

void rl_pack_gather(const rl_pack *p, const float *src, float *dst) {
    for (int32_t j = 0; j < p->Tr; j++) dst[j] = src[p->resp_pos[j]];
}

void rl_pack_scatter(const rl_pack *p, const float *src, float *dst) {
    memset(dst, 0, (size_t)p->T * sizeof *dst);
    for (int32_t j = 0; j < p->Tr; j++) dst[p->resp_pos[j]] = src[j];
}

const char *rl_col_name(rl_col c) {
    static const char *const names[] = {"mask", "old_logprob", "advantages", "ref_logprob", "old_values", "returns"};
    return names[c];
}

static const float *col_of(const ff_rl_sample *s, rl_col c) {
    switch (c) {
    case RL_COL_MASK: return s->mask;
    case RL_COL_OLD_LOGPROB: return s->old_logprob;
    case RL_COL_ADVANTAGES: return s->advantages;
    case RL_COL_REF_LOGPROB: return s->ref_logprob;
    case RL_COL_OLD_VALUES: return s->old_values;
    case RL_COL_RETURNS: return s->returns;
    }
    return NULL;
}

int rl_pack_column(const rl_pack *p, const ff_rl_sample *samples, const int32_t *idx, rl_col c, bool allow_missing, float fill,
                   float *dst) {
    for (int32_t k = 0; k < p->S; k++) {
        const ff_rl_sample *s = &samples[idx ? idx[k] : k];
        const float *src = col_of(s, c);
        float *d = dst + p->resp_off[k];
        int32_t R = s->response_len;
        if (src) {
            memcpy(d, src, (size_t)R * sizeof *d);
        } else if (allow_missing || R == 0) {
            for (int32_t j = 0; j < R; j++) d[j] = fill;
        } else {
            return ff_error_set("sample", "the executor must fill this column before training",
                                "sample %d has no '%s' column", idx ? idx[k] : k, rl_col_name(c));
        }
    }
    return 0;
}

/* ---- scoring ------------------------------------------------------------------------------------ */

/* Consecutive samples from `from` that fit one micro-batch (at least one). */
static int32_t micro_end(const ff_rl_sample *s, int32_t from, int32_t n, const ff_score_opts *o) {
    int32_t max_n = o && o->micro_batch_size > 0 ? o->micro_batch_size : INT32_MAX;
    int64_t max_t = o && o->micro_batch_tokens > 0 ? o->micro_batch_tokens : 0;
    if (max_t == 0 && max_n == INT32_MAX) max_t = 4096;
    if (max_t == 0) max_t = INT64_MAX;
    int64_t tok = 0;
    int32_t k = from;
    while (k < n && k - from < max_n) {
        int64_t len = ff_rl_sample_tokens(&s[k]);
        if (k > from && tok + len > max_t) break;
        tok += len;
        k++;
    }
    return k;
}

typedef enum { SCORE_LOGPROBS, SCORE_VALUES, SCORE_LAST_VALUE } score_kind;

/* The results of packed micro-batch p (samples s [p->S], the first the caller's sample i0)
 * from the model's outputs lp, ent, val [T] (those the kind computes). */
static void take_results(const rl_pack *p, const ff_rl_sample *s, int32_t i0, score_kind kind, const float *lp,
                         const float *ent, const float *val, float *const *a, float *const *b, float *scores) {
    for (int32_t k = 0; k < p->S; k++) {
        const int32_t *pos = p->resp_pos + p->resp_off[k];
        int32_t R = s[k].response_len;
        if (kind == SCORE_LOGPROBS) {
            for (int32_t j = 0; j < R; j++) a[i0 + k][j] = lp[pos[j]];
            if (b)
                for (int32_t j = 0; j < R; j++) b[i0 + k][j] = ent[pos[j]];
        } else if (kind == SCORE_VALUES) {
            for (int32_t j = 0; j < R; j++) a[i0 + k][j] = val[pos[j]];
        } else {
            scores[i0 + k] = val[p->starts[k + 1] - 1];
        }
    }
}

static int score_whole(ff_model *m, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, score_kind kind,
                       float *const *a, float *const *b, float *scores) {
    rl_pack p = {0};
    int rc = 0;
    for (int32_t i = 0; i < n && rc == 0;) {
        int32_t e = micro_end(samples, i, n, o);
        if (rl_pack_build(&p, samples + i, NULL, e - i, kind == SCORE_LOGPROBS)) {
            rc = ff_error_wrap("samples %d..%d", i, e - 1);
            break;
        }
        ff_batch bt = rl_pack_batch(&p);
        ff_forward_opts fo = {.train = false, .temperature = o ? o->temperature : 0};
        ff_forward_out out = {0};
        if (kind == SCORE_LOGPROBS) {
            out.logprobs = p.t_a;
            if (b) out.entropy = p.t_b;
        } else {
            out.values = p.t_c;
        }
        if (ff_model_forward(m, &bt, &fo, &out)) {
            rc = ff_error_wrap("score samples %d..%d", i, e - 1);
            break;
        }
        take_results(&p, samples + i, i, kind, p.t_a, p.t_b, p.t_c, a, b, scores);
        i = e;
    }
    rl_pack_free(&p);
    return rc;
}

/* Over a pipeline: every micro-batch packed, the forward-only schedule of the placement (the
 * interleaved one padded with one-token micro-batches to a multiple of pp), the outputs of the
 * last virtual stage's rank sent to the others in one grouped call, the results taken on
 * every rank. */
/* The last stage's results [count floats at res] to the other stages, as the transfers x say.
 * A device transport moves device memory only (NCCL): there the results go through a buffer of
 * its backend, the copy back waiting for the transfers. */
static int exchange_results(const ff_pipe_transport *tr, ff_pipe_xfer *x, int nx, float *res, size_t count) {
    if (!tr->device) return tr->call(tr->ctx, x, nx);
    ff_buffer *buf = ff_buffer_new(tr->device, sizeof(float) * count);
    if (!buf) return -1;
    ff_stream *st = ff_backend_stream(tr->device);
    ff_dptr d = ff_dptr_of(buf, 0);
    ff_memcpy_h2d(st, d, res, sizeof(float) * count);
    for (int i = 0; i < nx; i++) x[i].buf = ff_dptr_addr(d);
    int rc = tr->call(tr->ctx, x, nx);
    if (rc == 0) {
        ff_memcpy_d2h(st, res, d, sizeof(float) * count);
        rc = ff_stream_sync(st);
    }
    ff_buffer_destroy(&buf);
    return rc;
}

static int score_pipe(ff_model *m, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, score_kind kind,
                      float *const *a, float *const *b, float *scores) {
    const ff_roles_pipe *pp = o->pipe;
    const ff_pipe_transport *tr = pp->transport;
    const int32_t P = tr->size;
    int32_t n_real = 0;
    for (int32_t i = 0; i < n; i = micro_end(samples, i, n, o)) n_real++;
    const int32_t n_micro = pp->kind == FF_PIPE_INTERLEAVED ? (n_real + P - 1) / P * P : n_real;
    const int nout = kind == SCORE_LOGPROBS ? (b ? 2 : 1) : 1;
    rl_pack *packs = ff_calloc((size_t)n_micro, sizeof *packs);
    ff_batch *bt = ff_malloc(sizeof *bt * (size_t)n_micro);
    ff_forward_out *outs = ff_calloc((size_t)n_micro, sizeof *outs);
    int32_t *first = ff_malloc(sizeof *first * (size_t)n_micro);
    ff_pipe_xfer *x = ff_malloc(sizeof *x * (size_t)P);
    float *res = NULL;
    ff_pipe_schedule s = {0};
    ff_pipe_exec *e = NULL;
    int rc = -1;
    if (!packs || !bt || !outs || !first || !x) goto done;
    int64_t T = 0;
    for (int32_t j = 0, i = 0; j < n_micro; j++) {
        const bool real = j < n_real;
        const int32_t e_ = real ? micro_end(samples, i, n, o) : i;
        if (rl_pack_build(&packs[j], real ? samples + i : rl_pipe_pad(), NULL, real ? e_ - i : 1, kind == SCORE_LOGPROBS)) {
            ff_error_wrap("samples %d..%d", i, e_ - 1);
            goto done;
        }
        bt[j] = rl_pack_batch(&packs[j]);
        first[j] = i;
        if (real) T += packs[j].T;
        i = e_;
    }
    if (!(res = ff_malloc(sizeof(float) * (size_t)(T > 0 ? T : 1) * (size_t)nout))) goto done;
    for (int32_t j = 0, off = 0; j < n_real; j++) { /* [nout][T]: log-probs or values, then entropy */
        if (kind == SCORE_LOGPROBS) {
            outs[j].logprobs = res + off;
            if (b) outs[j].entropy = res + T + off;
        } else {
            outs[j].values = res + off;
        }
        off += packs[j].T;
    }
    if (rl_pipe_schedule(m, pp, n_micro, true, &s)) goto done;
    ff_pipe_exec_model em = {.model = m, .temperature = o->temperature, .logprobs = kind == SCORE_LOGPROBS,
                             .entropy = kind == SCORE_LOGPROBS && b, .values = kind != SCORE_LOGPROBS};
    if (!(e = ff_pipe_exec_new(&s, tr->rank, tr, &em))) goto done;
    ff_pipe_run r = {.micro = {bt}, .outs = {outs}};
    if (ff_pipe_exec_run(e, &r, NULL)) goto done;
    const int32_t last = s.models[0].stage_rank[s.models[0].n_stages - 1];
    int nx = 0;
    const size_t count = (size_t)T * (size_t)nout;
    if (tr->rank == last) {
        for (int32_t q = 0; q < P; q++)
            if (q != last) x[nx++] = (ff_pipe_xfer){.kind = FF_PIPE_XFER_SEND, .peer = q, .buf = res, .count = count};
    } else {
        x[nx++] = (ff_pipe_xfer){.kind = FF_PIPE_XFER_RECV, .peer = last, .buf = res, .count = count};
    }
    if (count > 0 && exchange_results(tr, x, nx, res, count)) {
        ff_error_wrap("score: the results from the last stage (rank %d)", last);
        goto done;
    }
    for (int32_t j = 0; j < n_real; j++) {
        const float *lp = outs[j].logprobs, *ent = outs[j].entropy, *val = outs[j].values;
        take_results(&packs[j], samples + first[j], first[j], kind, lp, ent, val, a, b, scores);
    }
    rc = 0;
done:
    ff_pipe_exec_destroy(&e);
    ff_pipe_schedule_clear(&s);
    for (int32_t j = 0; packs && j < n_micro; j++) rl_pack_free(&packs[j]);
    free(packs);
    free(bt);
    free(outs);
    free(first);
    free(x);
    free(res);
    return rc;
}

static int score(ff_model *m, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, score_kind kind,
                 float *const *a, float *const *b, float *scores) {
    assert(m && samples && n >= 0);
    const ff_roles_pipe *pp = o ? o->pipe : NULL;
    if (rl_pipe_check(m, pp, "score")) return -1;
    if (n == 0) return 0;
    const ff_model_config *cfg = ff_model_config_of(m);
    if (kind == SCORE_LOGPROBS && !ff_model_has_lm_head(m))
        return ff_error_set("score", "use the actor or reference model", "log-probs need an LM head, and this model is a critic");
    if (kind != SCORE_LOGPROBS && !cfg->value_head)
        return ff_error_set("score", "load a critic or reward model (value_head in config.json, score.weight)",
                            "values need a value head, and this model has none");
    return rl_pipe_on(pp) ? score_pipe(m, samples, n, o, kind, a, b, scores) : score_whole(m, samples, n, o, kind, a, b, scores);
}

int ff_score_logprobs(ff_model *m, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, float *const *logprobs,
                      float *const *entropy) {
    assert(logprobs || n == 0);
    return score(m, samples, n, o, SCORE_LOGPROBS, logprobs, entropy, NULL);
}

int ff_score_values(ff_model *critic, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, float *const *values) {
    assert(values || n == 0);
    return score(critic, samples, n, o, SCORE_VALUES, values, NULL, NULL);
}

int ff_score_reward_model(ff_model *rm, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, float *scores) {
    assert(scores || n == 0);
    return score(rm, samples, n, o, SCORE_LAST_VALUE, NULL, NULL, scores);
}

/* The rollout engine: a queue of generation requests over a policy model, decoded with
 * continuous batching by ff_generator (model/generate.c does the slots, the shared prefill
 * and the per-sample RNG streams); this layer fixes the log-prob convention for RL, counts
 * what it did, hands finished samples out one by one or all at once in request order,
 * guards weight sync against sequences in flight, and moves decoding samples out of and into
 * the engine (ff_rollout_export / ff_rollout_import over the generator's, with the caller's
 * request ids).
 *
 * Not here: where prompts come from or where samples go (the executor), chunked prefill and
 * paged KV (model.h lists what the generator does not do). */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/roles/roles_internal.h"

/* Request ids are the engine's own sequence numbers inside the generator (so ff_rollout_run
 * can order by arrival even when callers reuse ids); the caller's id is mapped back. */
typedef struct req_info {
    uint64_t user_id;
    int64_t first;   /* the position of its sample `sample0` in arrival order */
    int32_t n;
    int32_t sample0; /* its first sample's index: 0, or a moved-in sample's own */
} req_info;

struct ff_rollout {
    ff_model *m;
    ff_rollout_config c;
    ff_generator *g;
    req_info *reqs; /* by internal id - base */
    uint64_t base, next_id;
    size_t cap;
    int64_t samples_added; /* since the table started over: arrival positions */
    int64_t untaken;       /* samples added and not yet taken or vanished */
    ff_rollout_stats stats;
    int64_t pf_tokens0; /* the generator's prefill counters at the last stats reset */
    double pf_s0;
    int64_t graph0, eager0; /* the generator's decode steps at the last ff_rollout_decode_steps_take */
    bool graphs_on;         /* the generator's decode graphs, until a failed capture turned them off (a warning) */
};

void ff_rollout_config_default(ff_rollout_config *c) {
    memset(c, 0, sizeof *c);
    c->max_slots = 64;
    c->max_seq_len = 256;
    c->logprob_mode = FF_LOGPROB_TEMPERATURE;
}

ff_rollout *ff_rollout_new(ff_model *m, const ff_rollout_config *cin) {
    assert(m);
    ff_rollout_config c;
    if (cin)
        c = *cin;
    else
        ff_rollout_config_default(&c);
    if (!ff_model_has_lm_head(m))
        return ff_error_set("rollout", "generate with the actor", "the model has no LM head (a critic)"), NULL;
    if ((int)c.logprob_mode < 0 || (int)c.logprob_mode > 2)
        return ff_error_set("rollout", NULL, "unknown logprob_mode %d", (int)c.logprob_mode), NULL;
    int32_t max_pos = ff_model_config_of(m)->max_position_embeddings;
    if (c.max_seq_len > max_pos) c.max_seq_len = max_pos;
    ff_rollout *r = ff_calloc(1, sizeof *r);
    if (!r) return NULL;
    r->m = m;
    r->c = c;
    ff_generator_config gc = {.max_slots = c.max_slots, .max_seq_len = c.max_seq_len,
                              .max_prefill_tokens = c.max_prefill_tokens > 0 ? c.max_prefill_tokens : c.max_seq_len, .pipe = c.pipe,
                              .kv_block_rows = c.kv_block_rows, .kv_blocks = c.kv_blocks, .kv_bf16 = c.kv_bf16, .eager = c.eager};
    r->g = ff_generator_new(m, &gc);
    if (!r->g) {
        free(r);
        ff_error_wrap("rollout");
        return NULL;
    }
    r->base = r->next_id = 1;
    ff_generator_graph_stats gs;
    ff_generator_graph_stats_of(r->g, &gs);
    r->graphs_on = gs.on;
    return r;
}

void ff_rollout_destroy(ff_rollout **pr) {
    if (!pr || !*pr) return;
    ff_rollout *r = *pr;
    ff_generator_destroy(&r->g);
    free(r->reqs);
    free(r);
    *pr = NULL;
}

ff_model *ff_rollout_model(const ff_rollout *r) { return r->m; }

/* Room in the request table for the next internal id; its index, or -1 (out of memory). */
static int64_t reserve(ff_rollout *r) {
    size_t slot = (size_t)(r->next_id - r->base);
    if (slot >= r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        req_info *n = ff_realloc(r->reqs, cap * sizeof *n);
        if (!n) return -1;
        r->reqs = n;
        r->cap = cap;
    }
    return (int64_t)slot;
}

int ff_rollout_add(ff_rollout *r, const ff_rollout_request *q) {
    assert(r && q);
    int64_t slot = reserve(r);
    if (slot < 0) return -1;
    ff_gen_request g = {
        .id = r->next_id,
        .prompt = q->prompt,
        .prompt_len = q->prompt_len,
        .n_samples = q->n,
        .sampling = q->sampling,
        .seed = q->seed,
    };
    g.sampling.logprob_mode = r->c.logprob_mode;
    if (ff_generator_submit(r->g, &g)) return ff_error_wrap("rollout request %llu", (unsigned long long)q->id);
    r->reqs[slot] = (req_info){q->id, r->samples_added, q->n, 0};
    r->samples_added += q->n;
    r->untaken += q->n;
    r->stats.prefill_tokens += q->prompt_len;
    r->next_id++;
    return 0;
}

int ff_rollout_step(ff_rollout *r) {
    int32_t before = ff_generator_pending(r->g);
    if (before == 0) return 0;
    int64_t t0 = ff_now_ns();
    if (ff_generator_step(r->g)) return -1;
    int32_t running = ff_generator_running(r->g);
    r->stats.steps++;
    if (running > r->stats.max_running) r->stats.max_running = running;
    r->stats.busy_s += (double)(ff_now_ns() - t0) * 1e-9;
    int64_t pt;
    double ps;
    ff_generator_prefill_stats(r->g, &pt, &ps);
    r->stats.prefilled_tokens = pt - r->pf_tokens0, r->stats.prefill_s = ps - r->pf_s0;
    return before - ff_generator_pending(r->g);
}

int32_t ff_rollout_pending(const ff_rollout *r) { return ff_generator_pending(r->g); }
int32_t ff_rollout_running(const ff_rollout *r) { return ff_generator_running(r->g); }
int32_t ff_rollout_room(const ff_rollout *r) { return ff_generator_room(r->g); }
int32_t ff_rollout_kv_peak_take(ff_rollout *r, int32_t *pool, int32_t *block_rows) {
    int32_t used, peak;
    ff_generator_kv_blocks(r->g, &used, &peak, pool);
    *block_rows = ff_generator_kv_block_rows(r->g);
    ff_generator_kv_peak_reset(r->g);
    return peak;
}

/* Bookkeeping of a sample leaving the engine (taken or vanished). When nothing is left in
 * flight or untaken, the request table starts over. */
static void forget(ff_rollout *r, int64_t k) {
    r->untaken -= k;
    if (r->untaken == 0 && ff_generator_pending(r->g) == 0) {
        r->base = r->next_id;
        r->samples_added = 0;
    }
}

static void account(ff_rollout *r, ff_gen_output *o) {
    r->stats.samples_done++;
    r->stats.decode_tokens += o->n_tokens;
    o->id = r->reqs[o->id - r->base].user_id;
}

int ff_rollout_take(ff_rollout *r, ff_gen_output *out) {
    if (!ff_generator_pop(r->g, out)) return 0;
    account(r, out);
    forget(r, 1);
    return 1;
}

int32_t ff_rollout_abort(ff_rollout *r, uint64_t id) {
    int32_t ended = 0;
    for (uint64_t k = r->base; k < r->next_id; k++) {
        if (r->reqs[k - r->base].user_id != id) continue;
        int32_t p0 = ff_generator_pending(r->g), run0 = ff_generator_running(r->g);
        int32_t e = ff_generator_abort(r->g, k);
        int32_t produced = run0 - ff_generator_running(r->g); /* running ones come out as ABORTED */
        ended += e;
        (void)p0;
        r->untaken -= e - produced; /* waiting ones vanish */
    }
    forget(r, 0);
    return ended;
}

const ff_rollout_stats *ff_rollout_stats_of(const ff_rollout *r) { return &r->stats; }
void ff_rollout_decode_steps_take(ff_rollout *r, int64_t *graph_steps, int64_t *eager_steps) {
    ff_generator_graph_stats gs;
    ff_generator_graph_stats_of(r->g, &gs);
    if (r->graphs_on && !gs.on) { /* a capture failed */
        ff_warn("rollout: decode steps run kernel by kernel from now on, not as CUDA graphs: %s", gs.off_why);
        r->graphs_on = false;
    }
    *graph_steps = gs.replays - r->graph0;
    *eager_steps = gs.eager_steps - r->eager0;
    r->graph0 = gs.replays;
    r->eager0 = gs.eager_steps;
}
void ff_rollout_stats_reset(ff_rollout *r) {
    memset(&r->stats, 0, sizeof r->stats);
    ff_generator_prefill_stats(r->g, &r->pf_tokens0, &r->pf_s0);
}

/* A finished sample's place in arrival order (o->id still the internal id). */
static int64_t arrival(const ff_rollout *r, const ff_gen_output *o) {
    const req_info *q = &r->reqs[o->id - r->base];
    return q->first + (o->sample - q->sample0);
}

int ff_rollout_run(ff_rollout *r, ff_gen_output **outs, int32_t *n_outs) {
    *outs = NULL;
    *n_outs = 0;
    while (ff_rollout_pending(r) > 0)
        if (ff_rollout_step(r) < 0) return -1;
    /* everything is finished: order by arrival, then sample */
    int64_t first = -1, last = -1;
    size_t count = 0;
    ff_gen_output o;
    ff_gen_output *res = NULL;
    size_t cap = 0;
    int rc = 0;
    while (ff_generator_pop(r->g, &o)) {
        if (rc == 0 && count == cap) {
            cap = cap ? 2 * cap : 64;
            ff_gen_output *n = ff_realloc(res, cap * sizeof *n);
            if (n)
                res = n;
            else
                rc = -1;
        }
        if (rc) {
            ff_gen_output_free(&o);
            continue;
        }
        res[count++] = o;
    }
    if (rc) {
        for (size_t i = 0; i < count; i++) ff_gen_output_free(&res[i]);
        free(res);
        return -1;
    }
    /* order by arrival position (keys are distinct): a counting placement */
    for (size_t i = 0; i < count; i++) {
        int64_t key = arrival(r, &res[i]);
        if (first < 0 || key < first) first = key;
        if (key > last) last = key;
    }
    if (count > 0) {
        size_t span = (size_t)(last - first + 1);
        int32_t *at = ff_malloc(span * sizeof *at);
        ff_gen_output *sorted = at ? ff_malloc(count * sizeof *sorted) : NULL;
        if (!sorted) {
            free(at);
            for (size_t i = 0; i < count; i++) ff_gen_output_free(&res[i]);
            free(res);
            return -1;
        }
        for (size_t k = 0; k < span; k++) at[k] = -1;
        for (size_t i = 0; i < count; i++) at[arrival(r, &res[i]) - first] = (int32_t)i;
        size_t j = 0;
        for (size_t k = 0; k < span; k++)
            if (at[k] >= 0) sorted[j++] = res[at[k]];
        free(at);
        free(res);
        res = sorted;
        for (size_t i = 0; i < count; i++) account(r, &res[i]);
    }
    forget(r, (int64_t)count);
    *outs = res;
    *n_outs = (int32_t)count;
    return 0;
}

int ff_rollout_export(ff_rollout *r, uint64_t id, int32_t sample, bool with_kv, ff_rollout_seq_state *out) {
    assert(r && out);
    memset(out, 0, sizeof *out);
    bool known = false;
    for (uint64_t k = r->base; k < r->next_id; k++) {
        const req_info *q = &r->reqs[k - r->base];
        if (q->user_id != id || sample < q->sample0 || sample >= q->sample0 + q->n) continue;
        known = true;
        if (ff_generator_export(r->g, k, sample, with_kv, out)) continue; /* a reused id: try the next */
        out->id = id;
        r->stats.exported++;
        forget(r, 1);
        return 0;
    }
    if (!known)
        return ff_error_set("rollout export", "export a sample of a request added to this engine",
                            "request %llu has no sample %d here", (unsigned long long)id, sample);
    return ff_error_wrap("rollout export of request %llu sample %d", (unsigned long long)id, sample);
}

int ff_rollout_import(ff_rollout *r, const ff_rollout_seq_state *s) {
    assert(r && s);
    if (s->sampling.logprob_mode != r->c.logprob_mode)
        return ff_error_set("rollout import", "move sequences between engines of the same logprob_mode",
                            "the sequence's log-probs are of mode %d; this engine reports mode %d",
                            (int)s->sampling.logprob_mode, (int)r->c.logprob_mode);
    int64_t slot = reserve(r);
    if (slot < 0) return -1;
    ff_gen_seq_state inside = *s; /* the arrays are only read */
    inside.id = r->next_id;
    int64_t t0 = ff_now_ns();
    if (ff_generator_import(r->g, &inside))
        return ff_error_wrap("rollout import of request %llu sample %d", (unsigned long long)s->id, s->sample);
    r->reqs[slot] = (req_info){s->id, r->samples_added, 1, s->sample};
    r->samples_added++;
    r->untaken++;
    r->next_id++;
    r->stats.imported++;
    if (!s->kv.data) {
        r->stats.recomputed_tokens += s->prompt_len + s->n_gen - 1;
        r->stats.recompute_s += (double)(ff_now_ns() - t0) * 1e-9;
    }
    return 0;
}

int ff_rollout_sync_weights(ff_rollout *r, ff_model *trained) {
    assert(r && trained);
    if (ff_generator_running(r->g) > 0)
        return ff_error_set("weight sync", "finish or abort the running samples first",
                            "%d sequences are decoding; new weights would change their policy mid-sequence",
                            ff_generator_running(r->g));
    if (ff_model_copy_params(r->m, trained)) return ff_error_wrap("weight sync");
    return 0;
}

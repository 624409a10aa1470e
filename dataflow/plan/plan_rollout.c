/* Planner: one iteration's generation and inference stage, simulated at cluster scale, serial,
 * overlapped per sample, and overlapped with RLHFuse's long-tail migration (seeds/000, section 4):
 * once few samples still decode, they move (their KV cache) onto a few survivor instances and
 * the freed instances run the inference models' forwards on the finished samples. The decode
 * step and the forwards cost what a roofline says (weights and KV cache read from HBM against
 * FLOP/s, the TP all-reduces) unless the caller gives measured costs. docs/planner.md,
 * "Generation and inference (RLHFuse)", states the model and what it leaves out.
 * Not here: running anything (the runtime's migration is the workers'), prefix sharing,
 * preemption, the weight loads of the inference models (RLHFuse overlaps them), and the
 * contention of inference with the transfers. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

#define WHERE "rollout plan"

void ff_plan_rollout_input_defaults(ff_plan_rollout_input *in) {
    memset(in, 0, sizeof *in);
    ff_plan_cluster_preset("dgx-h100", &in->cluster);
    in->gen_tp = 1;
    in->samples = 512;
    in->prompt_len = 512;
    in->max_len = 1024;
    in->median_len = 128;
    in->p99_ratio = 10;
    in->seed = 1;
    in->migrate = -1;
    in->dtype_bytes = 2;
}

/* ---- costs ------------------------------------------------------------------------------ */

/* Per GPU of an instance of tg GPUs (the roofline), or the caller's measured costs. */
typedef struct costs {
    const ff_plan_rollout_input *in;
    double weight_bytes;   /* actor weights on one GPU */
    double kv_token_bytes; /* KV cache of one token on one GPU (all layers) */
    double flops_token;    /* 2 x active parameters / tg: one token's matrix products on one GPU */
    double attn_flops;     /* per token of context per generated token on one GPU: 4 L heads d / tg */
    double ar_latency_s;   /* one decode step's TP all-reduces: latency part */
    double ar_bytes_seq;   /* and bytes per sequence of the batch, at the ring's factor */
} costs;

static double step_cost(const costs *c, int64_t batch, double context) {
    const ff_plan_rollout_input *in = c->in;
    if (in->step_s) return in->step_s(in->cost_ctx, batch, (int64_t)context);
    const ff_plan_cluster *k = &in->cluster;
    double mem = (c->weight_bytes + c->kv_token_bytes * context) / k->hbm_bps;
    double comp = (c->flops_token * (double)batch + c->attn_flops * context) / k->flops;
    return (mem > comp ? mem : comp) + c->ar_latency_s + c->ar_bytes_seq * (double)batch / k->nvlink_bps;
}

/* The prompts' prefill of newly admitted sequences: compute-bound. */
static double prefill_cost(const costs *c, int64_t seqs) {
    const ff_plan_rollout_input *in = c->in;
    if (seqs == 0) return 0;
    if (in->step_s) return in->step_s(in->cost_ctx, seqs, seqs * in->prompt_len); /* measured: one step's worth */
    double n = (double)in->prompt_len;
    return (double)seqs * (c->flops_token * n + c->attn_flops * n * n / 2) / in->cluster.flops;
}

static double model_flops_token(const ff_plan_model *m) { return 2.0 * ff_plan_params_active(m); }

/* GPU-seconds of every inference model's forward over a sample of `tokens` tokens. */
static double infer_cost(const ff_plan_rollout_input *in, int64_t tokens) {
    if (in->infer_gpu_s) return in->infer_gpu_s(in->cost_ctx, tokens);
    double t = (double)tokens, s = 0;
    for (int i = 0; i < in->n_infer; i++) {
        const ff_plan_model *m = &in->infer[i];
        s += model_flops_token(m) * t + 2.0 * (double)(m->layers * m->heads * m->head_dim) * t * t; /* causal: 4 L h d t^2 / 2 */
    }
    return s / in->cluster.flops;
}

/* Seconds to move `tokens` tokens of KV cache between two instances: each GPU sends its TP shard
 * over its own link, NVLink inside a server, the NIC across. */
static double move_cost(const costs *c, int64_t tokens, bool same_domain) {
    const ff_plan_rollout_input *in = c->in;
    if (in->move_s) return in->move_s(in->cost_ctx, tokens);
    return c->kv_token_bytes * (double)tokens / (same_domain ? in->cluster.nvlink_bps : in->cluster.nic_bps);
}

/* ---- the simulation --------------------------------------------------------------------- */

typedef struct sample {
    int64_t len, gen; /* response tokens in all, and so far */
    double arrive;    /* a moved sample joins its new instance then */
    double done;      /* its last token's time */
} sample;

typedef struct inst {
    int64_t *q; /* sample indices, admitted ones first: [0, run) running, [run, n) waiting */
    int64_t n, run;
    double t;       /* end of its last step */
    double free_at; /* when it stopped generating (its last sample, or its last send) */
    bool active;
} inst;

typedef struct sim {
    const ff_plan_rollout_input *in;
    const costs *c;
    int64_t ni, ns, cap, sat;
    sample *s;
    inst *is;
    int64_t *pool; /* [ns x ni]: each instance's queue storage */
} sim;

/* Waiting samples that have arrived join the running ones, up to the KV cap; returns how many
 * need their prompt's prefill (those never started; moved ones bring their cache). */
static int64_t admit(sim *m, inst *x, int64_t *prefill) {
    *prefill = 0;
    for (int64_t k = x->run; k < x->n && x->run < m->cap; k++) {
        sample *s = &m->s[x->q[k]];
        if (s->arrive > x->t) continue;
        int64_t tmp = x->q[x->run];
        x->q[x->run] = x->q[k];
        x->q[k] = tmp;
        if (s->gen == 0) (*prefill)++;
        x->run++;
    }
    return x->run;
}

/* instance a before b: more samples, then the lower index */
static bool before(const inst *is, int64_t a, int64_t b) { return is[a].n > is[b].n || (is[a].n == is[b].n && a < b); }

/* insertion sort of instance indices by their sample count, descending (qsort_r is not C11) */
static void sort_by_count(int64_t *idx, int64_t n, const inst *is) {
    for (int64_t i = 1; i < n; i++) {
        int64_t v = idx[i], j = i;
        while (j > 0 && before(is, v, idx[j - 1])) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* Move every sample of the instances outside the survivors (those holding the most samples, so
 * the fewest move) onto them: `want` of them, or with want 0 the fewest whose batch stays within
 * the saturation size. now: the decision's time; a sender finishes its step in flight first. */
static void migrate(sim *m, double now, int64_t want, ff_plan_rollout_run *r) {
    int64_t remaining = 0, holders = 0;
    int64_t *idx = ff_calloc((size_t)m->ni, sizeof *idx);
    int64_t *load = ff_calloc((size_t)m->ni, sizeof *load);
    if (!idx || !load) goto out;
    for (int64_t i = 0; i < m->ni; i++) {
        remaining += m->is[i].n;
        if (m->is[i].n) idx[holders++] = i;
    }
    int64_t per = m->sat < m->cap ? m->sat : m->cap;
    int64_t k = want > 0 ? want : (remaining + per - 1) / per;
    if (k < 1) k = 1;
    if (k >= holders) goto out; /* nothing to consolidate */
    sort_by_count(idx, holders, m->is);
    for (int64_t j = 0; j < k; j++) load[j] = m->is[idx[j]].n;
    r->migrate_at_s = now;
    r->survivors = k;
    double slowest = 0;
    for (int64_t j = k; j < holders; j++) {
        inst *from = &m->is[idx[j]];
        double sent_s = m->in->move_latency_s, start = from->t > now ? from->t : now;
        for (int64_t q = 0; q < from->n; q++) {
            int64_t id = from->q[q];
            sample *s = &m->s[id];
            int64_t best = 0;
            for (int64_t u = 1; u < k; u++)
                if (load[u] < load[best]) best = u;
            inst *to = &m->is[idx[best]];
            int64_t tokens = s->gen ? m->in->prompt_len + s->gen : 0; /* a waiting sample moves as its prompt */
            bool same = (idx[j] * m->in->gen_tp) / m->in->cluster.domain == (idx[best] * m->in->gen_tp) / m->in->cluster.domain;
            sent_s += move_cost(m->c, tokens, same);
            s->arrive = start + sent_s;
            if (s->arrive - now > slowest) slowest = s->arrive - now;
            to->q[to->n++] = id;
            load[best]++;
            r->moved++;
            r->moved_tokens += (double)tokens;
        }
        from->n = from->run = 0;
        from->free_at = start + sent_s;
        from->active = false;
    }
    r->move_s = slowest;
out:
    free(idx);
    free(load);
}

typedef struct event {
    double t, gpus, work;
} event;

static int cmp_event(const void *a, const void *b) {
    double x = ((const event *)a)->t, y = ((const event *)b)->t;
    return (x > y) - (x < y);
}

/* The inference stage as a fluid: finished samples' forwards queue as work (GPU-seconds) and the
 * GPUs freed so far drain it; after the last event every GPU does. */
static double drain(event *ev, int64_t n) {
    qsort(ev, (size_t)n, sizeof *ev, cmp_event);
    double t = 0, gpus = 0, work = 0;
    for (int64_t i = 0; i < n; i++) {
        double dt = ev[i].t - t;
        if (dt > 0 && gpus > 0) work = work > gpus * dt ? work - gpus * dt : 0;
        t = ev[i].t;
        gpus += ev[i].gpus;
        work += ev[i].work;
    }
    return t + (gpus > 0 ? work / gpus : 0);
}

/* One run: rt 0 without migration; survivors as migrate()'s want. Fills r (gen_s, total_s, the
 * migration); 0 or -1 + error. */
static int simulate_run(sim *m, const int64_t *lens, double rt, int64_t survivors, ff_plan_rollout_run *r, double *serial_s) {
    memset(r, 0, sizeof *r);
    const ff_plan_rollout_input *in = m->in;
    for (int64_t i = 0; i < m->ns; i++) m->s[i] = (sample){.len = lens[i]};
    for (int64_t i = 0; i < m->ni; i++) m->is[i] = (inst){.q = m->pool + i * m->ns, .active = true};
    for (int64_t i = 0; i < m->ns; i++) { /* round-robin dispatch, as the controller deals groups */
        inst *x = &m->is[i % m->ni];
        x->q[x->n++] = i;
    }
    int64_t decoding = m->ns;
    const int64_t threshold = (int64_t)floor(rt * (double)m->ns);
    bool migrated = rt <= 0;
    for (;;) {
        inst *x = NULL;
        for (int64_t i = 0; i < m->ni; i++)
            if (m->is[i].active && (!x || m->is[i].t < x->t)) x = &m->is[i];
        if (!x) break;
        int64_t pre;
        if (admit(m, x, &pre) == 0) {
            double next = INFINITY; /* waiting for moved samples, or done */
            for (int64_t k = 0; k < x->n; k++)
                if (m->s[x->q[k]].arrive < next) next = m->s[x->q[k]].arrive;
            if (x->n && next > x->t) {
                x->t = next;
                continue;
            }
            x->active = false;
            x->free_at = x->t;
            continue;
        }
        double context = 0;
        for (int64_t k = 0; k < x->run; k++) context += (double)(in->prompt_len + m->s[x->q[k]].gen);
        x->t += prefill_cost(m->c, pre) + step_cost(m->c, x->run, context);
        for (int64_t k = 0; k < x->run;) {
            sample *s = &m->s[x->q[k]];
            if (++s->gen < s->len) {
                k++;
                continue;
            }
            s->done = x->t;
            x->q[k] = x->q[x->run - 1]; /* the last running one takes its place, a waiting one the last's */
            x->q[x->run - 1] = x->q[x->n - 1];
            x->run--, x->n--;
            decoding--;
        }
        if (!migrated && decoding > 0 && decoding <= threshold) {
            migrated = true;
            migrate(m, x->t, survivors, r);
            r->rt = r->survivors ? rt : 0; /* no survivors: nothing to consolidate, the run goes on as it is */
        }
    }
    event *ev = ff_calloc((size_t)(m->ns + m->ni), sizeof *ev);
    if (!ev) return ff_error_wrap(WHERE);
    for (int64_t i = 0; i < m->ns; i++) {
        ev[i] = (event){.t = m->s[i].done, .work = infer_cost(in, in->prompt_len + m->s[i].len)};
        if (m->s[i].done > r->gen_s) r->gen_s = m->s[i].done;
    }
    for (int64_t i = 0; i < m->ni; i++) ev[m->ns + i] = (event){.t = m->is[i].free_at, .gpus = (double)in->gen_tp};
    double work = 0;
    for (int64_t i = 0; i < m->ns; i++) work += ev[i].work;
    if (serial_s) *serial_s = r->gen_s + work / (double)in->cluster.gpus;
    r->total_s = drain(ev, m->ns + m->ni); /* sorts ev */
    free(ev);
    return 0;
}

static int check_input(const ff_plan_rollout_input *in) {
    const ff_plan_cluster *k = &in->cluster;
    if (in->cluster.gpus < 1) return ff_error_set(WHERE, "give the GPUs of the stage (--gpus N)", "no GPUs");
    if (in->gen_tp < 1 || k->gpus % in->gen_tp)
        return ff_error_set(WHERE, "generation instances are whole TP groups", "gen TP %lld does not divide %lld GPUs",
                            (long long)in->gen_tp, (long long)k->gpus);
    if (in->samples < 1 || in->prompt_len < 1 || in->max_len < 1)
        return ff_error_set(WHERE, NULL, "samples %lld, prompt %lld and max length %lld must be positive", (long long)in->samples,
                            (long long)in->prompt_len, (long long)in->max_len);
    if (in->samples > 1000000 || k->gpus / in->gen_tp > 65536 || in->max_len > 1000000)
        return ff_error_set(WHERE, "the simulator steps every token of every instance", "%lld samples, %lld instances, %lld tokens: too large",
                            (long long)in->samples, (long long)(k->gpus / in->gen_tp), (long long)in->max_len);
    if (!in->lengths && (!(in->median_len >= 1) || !(in->p99_ratio >= 1) || in->median_len > (double)in->max_len))
        return ff_error_set(WHERE, "lengths are log-normal: median >= 1 and at most the maximum, p99 ratio >= 1",
                            "median %g, p99 ratio %g, maximum %lld", in->median_len, in->p99_ratio, (long long)in->max_len);
    if (in->migrate > 1) return ff_error_set(WHERE, "R_t is a fraction of the samples (0: off, < 0: auto)", "migrate %g", in->migrate);
    if (in->survivors >= k->gpus / in->gen_tp && in->survivors > 0)
        return ff_error_set(WHERE, "survivors are fewer than the instances (0: the saturation rule, < 0: the best count)",
                            "%lld survivors of %lld instances", (long long)in->survivors, (long long)(k->gpus / in->gen_tp));
    bool measured = in->step_s || in->infer_gpu_s || in->move_s;
    if (measured && !(in->step_s && in->infer_gpu_s && in->move_s))
        return ff_error_set(WHERE, "give all three measured costs or none", "some of step_s, infer_gpu_s, move_s are missing");
    if (!measured) {
        if (!(k->hbm_bps > 0) || !(k->flops > 0) || !(k->nvlink_bps > 0) || !(k->nic_bps > 0) || k->domain < 1)
            return ff_error_set(WHERE, "name a cluster preset or give --hbm-bw, --flops, --nvlink, --nic", "the cluster lacks a rate");
        const ff_plan_model *a = &in->actor;
        if (a->layers < 1 || a->hidden < 1 || a->heads < 1 || a->kv_heads < 1 || a->head_dim < 1)
            return ff_error_set(WHERE, "give the actor (--model)", "no actor model");
        if (a->heads % in->gen_tp || (a->kv_heads % in->gen_tp && in->gen_tp % a->kv_heads))
            return ff_error_set(WHERE, "choose a generation TP dividing the heads", "TP %lld and %s's %lld heads (%lld key-value)",
                                (long long)in->gen_tp, a->name, (long long)a->heads, (long long)a->kv_heads);
    }
    for (int64_t i = 0; in->lengths && i < in->samples; i++)
        if (in->lengths[i] < 1 || in->lengths[i] > in->max_len)
            return ff_error_set(WHERE, "lengths lie in 1 .. max length", "sample %lld has length %lld (max %lld)", (long long)i,
                                (long long)in->lengths[i], (long long)in->max_len);
    return 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int ff_plan_rollout_simulate(const ff_plan_rollout_input *in, ff_plan_rollout *out) {
    memset(out, 0, sizeof *out);
    if (check_input(in)) return -1;
    const ff_plan_cluster *k = &in->cluster;
    const ff_plan_model *a = &in->actor;
    const double tg = (double)in->gen_tp;
    costs c = {.in = in};
    if (!in->step_s) {
        c.weight_bytes = ff_plan_params_total(a) * in->dtype_bytes / tg;
        c.kv_token_bytes = 2.0 * (double)a->layers * ff_plan_kv_heads_per_rank(a->kv_heads, in->gen_tp) * (double)a->head_dim * in->dtype_bytes;
        c.flops_token = model_flops_token(a) / tg;
        c.attn_flops = 4.0 * (double)(a->layers * a->heads * a->head_dim) / tg;
        if (in->gen_tp > 1) { /* two all-reduces of [b, h] per layer (after attention, after the MLP) */
            c.ar_latency_s = 2.0 * (double)a->layers * 2.0 * (tg - 1) * k->nvlink_latency_s;
            c.ar_bytes_seq = 2.0 * (double)a->layers * ff_plan_ring_allreduce_bytes(in->gen_tp, (double)a->hidden * in->dtype_bytes);
        }
    }
    sim m = {.in = in, .c = &c, .ni = k->gpus / in->gen_tp, .ns = in->samples};
    out->instances = m.ni;
    if (in->step_s) {
        m.cap = m.ns;
    } else {
        double room = 0.9 * k->hbm_bytes - c.weight_bytes; /* vLLM's default share of the memory */
        double per_seq = c.kv_token_bytes * (double)(in->prompt_len + in->max_len);
        m.cap = room > 0 ? (int64_t)floor(room / per_seq) : 0;
        if (m.cap < 1)
            return ff_error_set(WHERE, "use a larger generation TP or a shorter maximum length",
                                "%s at TP %lld leaves no room for one sequence of %lld tokens in %.0f GB", a->name,
                                (long long)in->gen_tp, (long long)(in->prompt_len + in->max_len), k->hbm_bytes / 1e9);
        if (m.cap > m.ns) m.cap = m.ns;
    }
    out->batch_cap = m.cap;
    /* saturation: the largest batch whose step costs at most 1.25 x one sequence's, each at the
     * median's context (decoding is memory-bound until the matrix products catch up) */
    double ctx = (double)in->prompt_len + (in->lengths ? 0.0 : in->median_len);
    double one = step_cost(&c, 1, ctx);
    m.sat = 1;
    for (int64_t b = 2; b <= m.cap && step_cost(&c, b, (double)b * ctx) <= 1.25 * one; b++) m.sat = b;
    out->batch_saturation = m.sat;

    int64_t *lens = ff_calloc((size_t)m.ns, sizeof *lens), *sorted = ff_calloc((size_t)m.ns, sizeof *sorted);
    m.s = ff_calloc((size_t)m.ns, sizeof *m.s);
    m.is = ff_calloc((size_t)m.ni, sizeof *m.is);
    m.pool = ff_calloc((size_t)(m.ns * m.ni), sizeof *m.pool);
    int rc = lens && sorted && m.s && m.is && m.pool ? 0 : ff_error_wrap(WHERE);
    if (rc == 0) {
        ff_rng rng;
        ff_rng_seed(&rng, in->seed);
        const double sigma = log(in->p99_ratio) / 2.3263478740408408; /* z of the 99th percentile */
        for (int64_t i = 0; i < m.ns; i++) {
            if (in->lengths) {
                lens[i] = in->lengths[i];
                continue;
            }
            double l = floor(in->median_len * exp(sigma * ff_rng_normal(&rng)) + 0.5);
            lens[i] = l < 1 ? 1 : l > (double)in->max_len ? in->max_len : (int64_t)l;
        }
        memcpy(sorted, lens, (size_t)m.ns * sizeof *lens);
        qsort(sorted, (size_t)m.ns, sizeof *sorted, cmp_i64);
        out->median_len = (double)sorted[m.ns / 2];
        out->p99_len = (double)sorted[(int64_t)floor(0.99 * (double)(m.ns - 1))];
        out->longest = (double)sorted[m.ns - 1];
        for (int64_t i = 0; i < m.ns; i++) out->infer_gpu_s += infer_cost(in, in->prompt_len + lens[i]);
    }
    /* the survivor counts to try: the one asked for, or the saturation rule and, with
     * survivors < 0, every count up to FF_PLAN_ROLLOUT_MAX_SURVIVORS as well */
    int64_t counts[FF_PLAN_ROLLOUT_MAX_SURVIVORS + 1], ncounts = 0;
    counts[ncounts++] = in->survivors > 0 ? in->survivors : 0;
    for (int64_t k = 1; in->survivors < 0 && k < m.ni && k <= FF_PLAN_ROLLOUT_MAX_SURVIVORS; k++) counts[ncounts++] = k;
    if (rc == 0) rc = simulate_run(&m, lens, 0, 0, &out->overlap, &out->serial_s);
    if (rc == 0 && in->migrate != 0) {
        static const double grid[FF_PLAN_ROLLOUT_SWEEP] = {0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5};
        const int nrt = in->migrate > 0 ? 1 : FF_PLAN_ROLLOUT_SWEEP;
        out->migrate = out->overlap;
        bool first = true;
        for (int i = 0; rc == 0 && i < nrt; i++) {
            const double rt = in->migrate > 0 ? in->migrate : grid[i];
            double best = INFINITY;
            for (int64_t q = 0; rc == 0 && q < ncounts; q++) {
                ff_plan_rollout_run r;
                rc = simulate_run(&m, lens, rt, counts[q], &r, NULL);
                if (rc == 0 && r.total_s < best) best = r.total_s;
                /* a fixed threshold reports its run even when it loses to the overlap */
                if (rc == 0 && ((in->migrate > 0 && (first || r.total_s < out->migrate.total_s)) || r.total_s < out->migrate.total_s))
                    out->migrate = r, first = false;
            }
            if (in->migrate < 0) {
                out->sweep_rt[i] = rt;
                out->sweep_s[i] = best;
                out->n_sweep = i + 1;
            }
        }
    }
    if (rc == 0 && in->migrate == 0) out->migrate = out->overlap;
    free(lens);
    free(sorted);
    free(m.s);
    free(m.is);
    free(m.pool);
    return rc;
}

/* ---- reports ---------------------------------------------------------------------------- */

static const char *infer_names(const ff_plan_rollout_input *in, char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < in->n_infer; i++) {
        strncat(buf, i ? ", " : "", n - strlen(buf) - 1);
        strncat(buf, in->infer[i].name, n - strlen(buf) - 1);
    }
    return in->n_infer ? buf : "none";
}

void ff_plan_rollout_write(const ff_plan_rollout_input *in, const ff_plan_rollout *r, FILE *out) {
    char names[320];
    fprintf(out, "generation + inference: %s on %lld GPUs of %s, %lld instances of TP %lld\n",
            in->step_s ? "measured costs" : in->actor.name, (long long)in->cluster.gpus, in->cluster.name[0] ? in->cluster.name : "custom",
            (long long)r->instances, (long long)in->gen_tp);
    fprintf(out, "  inference models: %s (%.1f GPU-s of forwards)\n", infer_names(in, names, sizeof names), r->infer_gpu_s);
    fprintf(out, "  %lld samples, prompt %lld, responses median %.0f, p99 %.0f, longest %.0f (max %lld)\n", (long long)in->samples,
            (long long)in->prompt_len, r->median_len, r->p99_len, r->longest, (long long)in->max_len);
    fprintf(out, "  decode batch: at most %lld per instance (KV memory), saturation %lld\n", (long long)r->batch_cap,
            (long long)r->batch_saturation);
    fprintf(out, "  serial        %9.2f s   (generation %.2f s, then inference)\n", r->serial_s, r->overlap.gen_s);
    fprintf(out, "  overlapped    %9.2f s   %.2fx serial (inference on instances whose samples are done)\n", r->overlap.total_s,
            r->serial_s / r->overlap.total_s);
    if (r->migrate.survivors)
        fprintf(out,
                "  migration     %9.2f s   %.2fx serial, %.2fx overlapped (R_t %.3g: %lld samples moved at %.2f s onto %lld "
                "instances, %.0f tokens of KV in %.3f s)\n",
                r->migrate.total_s, r->serial_s / r->migrate.total_s, r->overlap.total_s / r->migrate.total_s, r->migrate.rt,
                (long long)r->migrate.moved, r->migrate.migrate_at_s, (long long)r->migrate.survivors, r->migrate.moved_tokens,
                r->migrate.move_s);
    else
        fprintf(out, "  migration     %9.2f s   (none pays: %s)\n", r->migrate.total_s,
                in->migrate == 0 ? "off" : "the tail is already on few instances");
    if (r->n_sweep) {
        fprintf(out, "  R_t sweep:");
        for (int i = 0; i < r->n_sweep; i++) fprintf(out, " %.3g:%.2f", r->sweep_rt[i], r->sweep_s[i]);
        fprintf(out, "\n");
    }
}

static json_t *run_json(const ff_plan_rollout_run *r) {
    return json_pack("{s:f,s:f,s:f,s:f,s:I,s:I,s:f,s:f}", "gen_s", r->gen_s, "total_s", r->total_s, "rt", r->rt, "migrate_at_s",
                     r->migrate_at_s, "moved", (json_int_t)r->moved, "survivors", (json_int_t)r->survivors, "moved_tokens",
                     r->moved_tokens, "move_s", r->move_s);
}

char *ff_plan_rollout_json(const ff_plan_rollout_input *in, const ff_plan_rollout *r) {
    json_t *sweep = json_array();
    for (int i = 0; sweep && i < r->n_sweep; i++) json_array_append_new(sweep, json_pack("[f,f]", r->sweep_rt[i], r->sweep_s[i]));
    json_t *o = json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:o,s:o,s:o}", "actor", in->step_s ? "measured" : in->actor.name,
                          "gpus", (json_int_t)in->cluster.gpus, "instances", (json_int_t)r->instances, "samples",
                          (json_int_t)in->samples, "batch_cap", (json_int_t)r->batch_cap, "batch_saturation",
                          (json_int_t)r->batch_saturation, "median_len", r->median_len, "p99_len", r->p99_len, "infer_gpu_s",
                          r->infer_gpu_s, "serial_s", r->serial_s, "overlap_s", r->overlap.total_s, "overlap", run_json(&r->overlap),
                          "migrate", run_json(&r->migrate), "sweep", sweep ? sweep : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) ff_error_set(WHERE, NULL, "out of memory writing JSON");
    return s;
}

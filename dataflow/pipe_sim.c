/* The pipeline checker and simulator (fuseflow/pipeline.h): every rank's stream run against
 * the others. Static checks first (fields, peers, which send meets which receive, each
 * instruction's data present when the rank reaches it, every micro-batch through every
 * stage), then the timed run, which finds deadlocks. Not here: building schedules
 * (pipe_schedule.c), printing them (pipe_report.c).
 *
 * Why the checks can be static: a rank runs its stream in order and a call returns only when
 * its transfers are done (its receives, with eager sends), so whether a forward has its input
 * depends on that rank's stream alone; and NCCL pairs the k-th send of a channel with its k-th
 * receive, whenever posted. */
#include "fuseflow/pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"

enum { ST_FWD = 1, ST_BWD = 2, ST_ACT_IN = 4, ST_GRAD_IN = 8 };

typedef struct sim {
    const ff_pipe_schedule *s;
    ff_pipe_sim_opts o;
    int64_t *base;     /* [n_ranks + 1] global index of each rank's first instruction */
    int64_t n;
    int32_t *vs;       /* [n] virtual stage of the instruction (-1: step) */
    int64_t *partner;  /* [n] the transfer it meets (-1: compute) */
    double *dur;       /* [n] compute seconds */
    double *post, *done; /* [n] when a transfer was posted, and done (-1: not yet) */
    int64_t mbase[FF_PIPE_MAX_MODELS];
    uint8_t *state;    /* per (model, micro, virtual stage): ST_* */
    int32_t *chunks_on; /* [n_models][n_ranks] */
} sim;

static bool is_comm(uint8_t op) { return op >= FF_PIPE_SEND_ACT && op <= FF_PIPE_RECV_GRAD; }
static bool is_send(uint8_t op) { return op == FF_PIPE_SEND_ACT || op == FF_PIPE_SEND_GRAD; }
static bool is_act(uint8_t op) { return op == FF_PIPE_SEND_ACT || op == FF_PIPE_RECV_ACT; }

static const ff_pipe_instr *instr_at(const sim *x, int32_t r, int64_t i) { return &x->s->streams[r].instr[i]; }

/* "rank 2, instruction 7 (F3.1)" */
static const char *where(const sim *x, int32_t r, int64_t i, char *buf, size_t cap) {
    char f[64];
    ff_pipe_instr_format(x->s, instr_at(x, r, i), f, sizeof f);
    snprintf(buf, cap, "rank %d, instruction %lld (%s)", (int)r, (long long)i, f);
    return buf;
}

static uint8_t *state_of(const sim *x, int model, int32_t micro, int32_t vs) {
    return &x->state[x->mbase[model] + (int64_t)micro * x->s->models[model].n_stages + vs];
}

/* Fields, stages, peers and the shape of calls: rank r's instruction i alone. */
static int check_fields(sim *x, int32_t r, int64_t i, int64_t *last_call) {
    const ff_pipe_schedule *s = x->s;
    const ff_pipe_instr *in = instr_at(x, r, i);
    char w[128];
    int64_t g = x->base[r] + i;
    x->vs[g] = -1;
    if (in->op >= FF_PIPE_NOPS) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "unknown op %d", in->op);
    if (in->model >= s->n_models) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "model %d: the schedule has %d", in->model, (int)s->n_models);
    const ff_pipe_model *m = &s->models[in->model];
    if (in->op != FF_PIPE_OPTIMIZER_STEP) {
        if (in->micro < 0 || in->micro >= m->micro)
            return ff_error_set(where(x, r, i, w, sizeof w), NULL, "micro-batch %d: model %d has %d", (int)in->micro, in->model, (int)m->micro);
        int32_t k = ff_pipe_stage_of(s, in->model, r, in->chunk);
        if (k < 0) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "rank %d holds no chunk %d of model %d", (int)r, in->chunk, in->model);
        x->vs[g] = k;
    }
    if (!is_comm(in->op)) {
        if (in->call != -1) return ff_error_set(where(x, r, i, w, sizeof w), "only sends and receives belong to calls", "call %d on a compute instruction", (int)in->call);
        return 0;
    }
    if (in->call < 0) return ff_error_set(where(x, r, i, w, sizeof w), "give every transfer the id of its grouped call", "call %d", (int)in->call);
    if (in->call < *last_call) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "call %d after call %lld: call ids ascend along a stream", (int)in->call, (long long)*last_call);
    if (in->call == *last_call && !(i > 0 && is_comm(instr_at(x, r, i - 1)->op) && instr_at(x, r, i - 1)->call == in->call))
        return ff_error_set(where(x, r, i, w, sizeof w), "a call's transfers are consecutive", "call %d resumes after other instructions", (int)in->call);
    *last_call = in->call;
    int32_t k = x->vs[g];
    int32_t other = (in->op == FF_PIPE_SEND_ACT || in->op == FF_PIPE_RECV_GRAD) ? k + 1 : k - 1;
    if (other < 0 || other >= m->n_stages)
        return ff_error_set(where(x, r, i, w, sizeof w), NULL, "virtual stage %d is the %s stage of model %d: there is no stage to %s", (int)k,
                            other < 0 ? "first" : "last", in->model, is_send(in->op) ? "send to" : "receive from");
    if (m->stage_rank[other] == r)
        return ff_error_set(where(x, r, i, w, sizeof w), "consecutive stages on one rank hand over in memory", "virtual stage %d is on this rank too",
                            (int)other);
    if (in->peer != m->stage_rank[other])
        return ff_error_set(where(x, r, i, w, sizeof w), NULL, "peer %d, but virtual stage %d is on rank %d", (int)in->peer, (int)other,
                            (int)m->stage_rank[other]);
    return 0;
}

/* Pair the k-th send of every channel with its k-th receive, and check they name one tensor. */
static int pair_transfers(sim *x) {
    const ff_pipe_schedule *s = x->s;
    int32_t P = s->n_ranks;
    /* channels in an open-addressed table keyed by (src, dst) */
    int64_t n_comm = 0;
    for (int64_t g = 0; g < x->n; g++) x->partner[g] = -1;
    for (int32_t r = 0; r < P; r++)
        for (int64_t i = 0; i < s->streams[r].n; i++) n_comm += is_comm(instr_at(x, r, i)->op);
    if (!n_comm) return 0;
    size_t cap = 16;
    while (cap < 2 * (size_t)n_comm) cap *= 2;
    uint64_t *keys = ff_malloc(cap * sizeof *keys);
    int64_t *chan = ff_malloc((size_t)x->n * sizeof *chan); /* channel of each transfer */
    int64_t *counts = ff_calloc(cap * 2, sizeof *counts);   /* [slot][send, recv] */
    int64_t *off = ff_malloc((cap * 2 + 1) * sizeof *off);
    int64_t *list = ff_malloc((size_t)n_comm * sizeof *list);
    int64_t *fill = ff_calloc(cap * 2, sizeof *fill);
    int rc = -1;
    if (!keys || !chan || !counts || !off || !list || !fill) goto done;
    for (size_t j = 0; j < cap; j++) keys[j] = UINT64_MAX;
    for (int32_t r = 0; r < P; r++)
        for (int64_t i = 0; i < s->streams[r].n; i++) {
            const ff_pipe_instr *in = instr_at(x, r, i);
            if (!is_comm(in->op)) continue;
            uint32_t src = (uint32_t)(is_send(in->op) ? r : in->peer), dst = (uint32_t)(is_send(in->op) ? in->peer : r);
            uint64_t key = (uint64_t)src << 32 | dst;
            size_t j = (size_t)(ff_hash_fnv1a(&key, sizeof key, FF_HASH_FNV1A_INIT) & (cap - 1));
            while (keys[j] != UINT64_MAX && keys[j] != key) j = (j + 1) & (cap - 1);
            keys[j] = key;
            chan[x->base[r] + i] = (int64_t)j;
            counts[2 * j + !is_send(in->op)]++;
        }
    off[0] = 0;
    for (size_t j = 0; j < 2 * cap; j++) off[j + 1] = off[j] + counts[j];
    for (int32_t r = 0; r < P; r++)
        for (int64_t i = 0; i < s->streams[r].n; i++) {
            const ff_pipe_instr *in = instr_at(x, r, i);
            if (!is_comm(in->op)) continue;
            size_t slot = 2 * (size_t)chan[x->base[r] + i] + !is_send(in->op);
            list[off[slot] + fill[slot]++] = x->base[r] + i;
        }
    for (size_t j = 0; j < cap; j++) {
        if (keys[j] == UINT64_MAX) continue;
        int32_t src = (int32_t)(keys[j] >> 32), dst = (int32_t)(keys[j] & 0xffffffffu);
        int64_t ns = counts[2 * j], nr = counts[2 * j + 1];
        if (ns != nr) {
            ff_error_set("pipeline", "every send needs a receive on the other side, in the same order",
                         "rank %d sends %lld tensors to rank %d, which receives %lld from it", (int)src, (long long)ns, (int)dst, (long long)nr);
            goto done;
        }
        for (int64_t k = 0; k < ns; k++) {
            int64_t a = list[off[2 * j] + k], b = list[off[2 * j + 1] + k];
            int64_t ia = a - x->base[src], ib = b - x->base[dst];
            const ff_pipe_instr *sa = instr_at(x, src, ia), *rb = instr_at(x, dst, ib);
            int32_t want = x->vs[a] + (sa->op == FF_PIPE_SEND_ACT ? 1 : -1);
            if (is_act(sa->op) != is_act(rb->op) || sa->model != rb->model || sa->micro != rb->micro || x->vs[b] != want) {
                char wa[128], wb[128];
                ff_error_set("pipeline", "both sides must list a channel's transfers in the same order",
                             "send %lld of rank %d to rank %d (%s) meets receive %lld of rank %d from rank %d (%s): not the same tensor", (long long)k,
                             (int)src, (int)dst, where(x, src, ia, wa, sizeof wa), (long long)k, (int)dst, (int)src, where(x, dst, ib, wb, sizeof wb));
                goto done;
            }
            x->partner[a] = b;
            x->partner[b] = a;
        }
    }
    rc = 0;
done:
    free(keys);
    free(chan);
    free(counts);
    free(off);
    free(list);
    free(fill);
    return rc;
}

/* Rank r's stream in order: each instruction's data is there, nothing runs twice; in flight,
 * busy time and durations. */
static int check_stream(sim *x, int32_t r, ff_pipe_rank_stats *st) {
    const ff_pipe_schedule *s = x->s;
    char w[128];
    int32_t in_flight = 0, fwds = 0;
    int64_t layers = 0;
    bool seen_bwd = false, stepped[FF_PIPE_MAX_MODELS] = {false};
    for (int64_t i = 0; i < s->streams[r].n; i++) {
        const ff_pipe_instr *in = instr_at(x, r, i);
        const ff_pipe_model *m = &s->models[in->model];
        int64_t g = x->base[r] + i;
        int32_t k = x->vs[g];
        uint8_t *stt = k >= 0 ? state_of(x, in->model, in->micro, k) : NULL;
        int64_t lay = k >= 0 && m->stage_layers ? m->stage_layers[k] : 0;
        int32_t chunks = x->chunks_on[in->model * s->n_ranks + r];
        x->dur[g] = 0;
        switch (in->op) {
        case FF_PIPE_FORWARD:
            if (*stt & ST_FWD) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "this forward ran before");
            if (k > 0 && !(*stt & ST_ACT_IN) && !(m->stage_rank[k - 1] == r && (*state_of(x, in->model, in->micro, k - 1) & ST_FWD)))
                return ff_error_set(where(x, r, i, w, sizeof w), "receive the input (RECV_ACT) before the forward",
                                    "its input, the output of virtual stage %d on rank %d, is not here yet", (int)(k - 1), (int)m->stage_rank[k - 1]);
            *stt |= ST_FWD;
            x->dur[g] = x->o.fwd_stage_s[in->model] ? x->o.fwd_stage_s[in->model][k] : x->o.fwd_s / chunks;
            if (!seen_bwd) fwds++;
            in_flight++;
            layers += lay;
            if (in_flight > st->peak_in_flight) st->peak_in_flight = in_flight;
            if (layers > st->peak_layers) st->peak_layers = layers;
            if (m->forward_only) in_flight--, layers -= lay; /* nothing kept for a backward */
            break;
        case FF_PIPE_BACKWARD:
            if (m->forward_only) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "model %d is forward-only", in->model);
            if (!(*stt & ST_FWD)) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "its forward has not run on this rank");
            if (*stt & ST_BWD) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "this backward ran before");
            if (k < m->n_stages - 1 && !(*stt & ST_GRAD_IN) &&
                !(m->stage_rank[k + 1] == r && (*state_of(x, in->model, in->micro, k + 1) & ST_BWD)))
                return ff_error_set(where(x, r, i, w, sizeof w), "receive the gradient (RECV_GRAD) before the backward",
                                    "the gradient of its output, from virtual stage %d on rank %d, is not here yet", (int)(k + 1),
                                    (int)m->stage_rank[k + 1]);
            *stt |= ST_BWD;
            x->dur[g] = x->o.bwd_stage_s[in->model] ? x->o.bwd_stage_s[in->model][k] : x->o.bwd_s / chunks;
            seen_bwd = true;
            in_flight--;
            layers -= lay;
            break;
        case FF_PIPE_SEND_ACT:
            if (!(*stt & ST_FWD)) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "sends an activation its forward has not made");
            break;
        case FF_PIPE_SEND_GRAD:
            if (!(*stt & ST_BWD)) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "sends a gradient its backward has not made");
            break;
        case FF_PIPE_RECV_ACT:
        case FF_PIPE_RECV_GRAD: {
            uint8_t bit = in->op == FF_PIPE_RECV_ACT ? ST_ACT_IN : ST_GRAD_IN;
            if (*stt & bit) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "received before");
            *stt |= bit;
            break;
        }
        case FF_PIPE_OPTIMIZER_STEP:
            if (m->forward_only) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "model %d is forward-only: no step", in->model);
            if (stepped[in->model]) return ff_error_set(where(x, r, i, w, sizeof w), NULL, "a second step of model %d", in->model);
            for (int32_t j = 0; j < m->n_stages; j++) {
                if (m->stage_rank[j] != r) continue;
                for (int32_t mb = 0; mb < m->micro; mb++)
                    if (!(*state_of(x, in->model, mb, j) & ST_BWD))
                        return ff_error_set(where(x, r, i, w, sizeof w), "step after the rank's last backward",
                                            "micro-batch %d has not run backward through virtual stage %d yet", (int)mb, (int)j);
            }
            stepped[in->model] = true;
            x->dur[g] = x->o.optimizer_s;
            break;
        }
        st->busy_s += x->dur[g];
    }
    st->forwards_before_backward = fwds;
    for (int i = 0; i < s->n_models; i++)
        if (!s->models[i].forward_only && x->chunks_on[i * s->n_ranks + r] > 0 && !stepped[i])
            return ff_error_set("pipeline", "end a training stream with OPTIMIZER_STEP", "rank %d never steps model %d", (int)r, i);
    return 0;
}

/* Every micro-batch through every virtual stage: forward once, backward once (training). */
static int check_complete(const sim *x) {
    const ff_pipe_schedule *s = x->s;
    for (int i = 0; i < s->n_models; i++) {
        const ff_pipe_model *m = &s->models[i];
        for (int32_t mb = 0; mb < m->micro; mb++)
            for (int32_t k = 0; k < m->n_stages; k++) {
                uint8_t st = *state_of(x, i, mb, k);
                if (!(st & ST_FWD) || (!m->forward_only && !(st & ST_BWD)))
                    return ff_error_set("pipeline", "every micro-batch runs forward through every stage, and backward",
                                        "model %d, micro-batch %d never runs %s through virtual stage %d (rank %d)", i, (int)mb,
                                        st & ST_FWD ? "backward" : "forward", (int)k, (int)m->stage_rank[k]);
            }
    }
    return 0;
}

/* The timed run. Returns 0 when every stream ran to its end, 1 on a deadlock. */
static int run(sim *x, ff_pipe_sim *out, double *clock, int64_t *pc) {
    const ff_pipe_schedule *s = x->s;
    int32_t P = s->n_ranks, *stack = ff_malloc(sizeof(int32_t) * (size_t)P);
    uint8_t *queued = ff_calloc((size_t)P, 1);
    if (!stack || !queued) {
        free(stack);
        free(queued);
        return -1;
    }
    int32_t top = 0;
    for (int32_t r = P - 1; r >= 0; r--) stack[top++] = r, queued[r] = 1;
    for (int64_t g = 0; g < x->n; g++) x->post[g] = x->done[g] = -1;
    while (top) {
        int32_t r = stack[--top];
        queued[r] = 0;
        const ff_pipe_stream *st = &s->streams[r];
        while (pc[r] < st->n) {
            int64_t i = pc[r], g = x->base[r] + i;
            const ff_pipe_instr *in = &st->instr[i];
            if (!is_comm(in->op)) {
                out->start_s[r][i] = clock[r];
                clock[r] += x->dur[g];
                out->end_s[r][i] = clock[r];
                pc[r]++;
                continue;
            }
            int64_t e = i;
            while (e < st->n && is_comm(st->instr[e].op) && st->instr[e].call == in->call) e++;
            if (x->post[g] < 0)
                for (int64_t j = i; j < e; j++) {
                    int64_t a = x->base[r] + j, b = x->partner[a];
                    const bool snd = is_send(st->instr[j].op);
                    x->post[a] = clock[r];
                    if (x->o.eager_sends && snd) x->done[a] = x->post[a]; /* the rank goes on */
                    if (x->post[b] < 0) continue;
                    if (x->o.eager_sends) { /* the data left at the send's post; the receive takes it when there */
                        const int64_t sa = snd ? a : b, rb = snd ? b : a;
                        x->done[rb] = fmax(x->post[sa] + x->o.hop_s, x->post[rb]);
                    } else {
                        x->done[a] = x->done[b] = fmax(x->post[a], x->post[b]) + x->o.hop_s;
                    }
                    int32_t q = s->streams[r].instr[j].peer;
                    if (!queued[q]) stack[top++] = q, queued[q] = 1;
                }
            double t = clock[r];
            bool all = true;
            for (int64_t j = i; j < e && all; j++) {
                double d = x->done[x->base[r] + j];
                if (d < 0) all = false;
                t = fmax(t, d);
            }
            if (!all) break;
            for (int64_t j = i; j < e; j++) {
                out->start_s[r][j] = x->post[x->base[r] + j];
                out->end_s[r][j] = x->done[x->base[r] + j];
            }
            clock[r] = t;
            pc[r] = e;
        }
    }
    free(stack);
    free(queued);
    for (int32_t r = 0; r < P; r++)
        if (pc[r] < s->streams[r].n) return 1;
    return 0;
}

/* Name every waiting rank, the transfers it waits for, and where their partners wait. */
static int report_deadlock(sim *x, ff_pipe_sim *out, const int64_t *pc) {
    const ff_pipe_schedule *s = x->s;
    int32_t P = s->n_ranks, n = 0;
    for (int32_t r = 0; r < P; r++) n += pc[r] < s->streams[r].n;
    out->stuck_rank = ff_malloc(sizeof(int32_t) * (size_t)n);
    out->stuck_instr = ff_malloc(sizeof(int64_t) * (size_t)n);
    if (!out->stuck_rank || !out->stuck_instr) return -1;
    char msg[4096];
    size_t len = (size_t)snprintf(msg, sizeof msg, "deadlock: %d of %d ranks wait forever:", (int)n, (int)P);
    for (int32_t r = 0; r < P; r++) {
        if (pc[r] >= s->streams[r].n) continue;
        int64_t i = pc[r];
        out->stuck_rank[out->n_stuck] = r;
        out->stuck_instr[out->n_stuck++] = i;
        if (out->n_stuck > 6) continue; /* the message keeps the first few; stuck_* has all */
        const ff_pipe_stream *st = &s->streams[r];
        char f[64];
        ff_pipe_instr_format(s, &st->instr[i], f, sizeof f);
        if (len < sizeof msg) len += (size_t)snprintf(msg + len, sizeof msg - len, " rank %d at instruction %lld (call %d) waits for", (int)r, (long long)i, (int)st->instr[i].call);
        for (int64_t j = i; j < st->n && is_comm(st->instr[j].op) && st->instr[j].call == st->instr[i].call; j++) {
            int64_t a = x->base[r] + j, b = x->partner[a];
            if (x->done[a] >= 0) continue;
            int32_t q = st->instr[j].peer;
            char fa[64], fq[64];
            ff_pipe_instr_format(s, &st->instr[j], fa, sizeof fa);
            if (pc[q] < s->streams[q].n)
                ff_pipe_instr_format(s, &s->streams[q].instr[pc[q]], fq, sizeof fq);
            else
                snprintf(fq, sizeof fq, "the end");
            if (len < sizeof msg)
                len += (size_t)snprintf(msg + len, sizeof msg - len, " %s (rank %d would post the matching %s at instruction %lld but waits at %lld, %s);",
                                        fa, (int)q, is_send(st->instr[j].op) ? "receive" : "send", (long long)(b - x->base[q]), (long long)pc[q], fq);
        }
    }
    if (out->n_stuck > 6 && len < sizeof msg) snprintf(msg + len, sizeof msg - len, " and %d more", (int)(out->n_stuck - 6));
    return ff_error_set("pipeline", "post a send and the receive that must happen with it in one grouped call (Megatron pairs send forward with receive backward)",
                        "%s", msg);
}

void ff_pipe_sim_clear(ff_pipe_sim *sim) {
    if (!sim) return;
    free(sim->ranks);
    if (sim->start_s) free(sim->start_s[0]);
    if (sim->end_s) free(sim->end_s[0]);
    free(sim->start_s);
    free(sim->end_s);
    free(sim->stuck_rank);
    free(sim->stuck_instr);
    memset(sim, 0, sizeof *sim);
}

static int check_opts(const ff_pipe_schedule *s, const ff_pipe_sim_opts *o) {
    double scalars[] = {o->fwd_s, o->bwd_s, o->hop_s, o->optimizer_s};
    for (size_t i = 0; i < sizeof scalars / sizeof *scalars; i++)
        if (!isfinite(scalars[i]) || scalars[i] < 0) return ff_error_set("pipeline simulation", NULL, "times must be finite and >= 0, got %g", scalars[i]);
    for (int i = 0; i < s->n_models; i++)
        for (int32_t k = 0; k < s->models[i].n_stages; k++) {
            double f = o->fwd_stage_s[i] ? o->fwd_stage_s[i][k] : 0, b = o->bwd_stage_s[i] ? o->bwd_stage_s[i][k] : 0;
            if (!isfinite(f) || f < 0 || !isfinite(b) || b < 0)
                return ff_error_set("pipeline simulation", NULL, "model %d, virtual stage %d: times must be finite and >= 0", i, (int)k);
        }
    return 0;
}

int ff_pipe_times_by_layers(const ff_pipe_schedule *s, int model, double fwd_s, double bwd_s, double *fwd, double *bwd) {
    if (model < 0 || model >= s->n_models || !s->models[model].stage_layers)
        return ff_error_set("pipeline", "generate the schedule with layers", "model %d has no layer placement", model);
    const ff_pipe_model *m = &s->models[model];
    int64_t total = 0;
    for (int32_t k = 0; k < m->n_stages; k++) total += m->stage_layers[k];
    if (total <= 0) return ff_error_set("pipeline", NULL, "model %d has no layers", model);
    double mean = (double)total / s->n_ranks;
    for (int32_t k = 0; k < m->n_stages; k++) {
        fwd[k] = fwd_s * (double)m->stage_layers[k] / mean;
        bwd[k] = bwd_s * (double)m->stage_layers[k] / mean;
    }
    return 0;
}

int ff_pipe_simulate(const ff_pipe_schedule *s, const ff_pipe_sim_opts *o, ff_pipe_sim *out) {
    memset(out, 0, sizeof *out);
    static const ff_pipe_sim_opts defaults = {.fwd_s = 1, .bwd_s = 2};
    sim x = {.s = s, .o = o ? *o : defaults};
    x.o.eager_sends = x.o.eager_sends || s->eager_sends; /* such streams run no other way */
    if (check_opts(s, &x.o) != 0) return -1;
    int32_t P = s->n_ranks;
    int64_t n_state = 0;
    for (int i = 0; i < s->n_models; i++) {
        x.mbase[i] = n_state;
        n_state += (int64_t)s->models[i].micro * s->models[i].n_stages;
        if (!s->models[i].stage_rank) return ff_error_set("pipeline", "call ff_pipe_model_set", "model %d has no stages", i);
    }
    x.base = ff_malloc(sizeof(int64_t) * ((size_t)P + 1));
    if (!x.base) return -1;
    x.base[0] = 0;
    for (int32_t r = 0; r < P; r++) x.base[r + 1] = x.base[r] + s->streams[r].n;
    x.n = x.base[P];
    size_t n = (size_t)(x.n ? x.n : 1);
    int rc = -1;
    double *clock = ff_calloc((size_t)P, sizeof *clock);
    int64_t *pc = ff_calloc((size_t)P, sizeof *pc);
    x.vs = ff_malloc(n * sizeof *x.vs);
    x.partner = ff_malloc(n * sizeof *x.partner);
    x.dur = ff_malloc(n * sizeof *x.dur);
    x.post = ff_malloc(n * sizeof *x.post);
    x.done = ff_malloc(n * sizeof *x.done);
    x.state = ff_calloc((size_t)(n_state ? n_state : 1), 1);
    x.chunks_on = ff_calloc((size_t)s->n_models * (size_t)P, sizeof *x.chunks_on);
    out->n_ranks = P;
    out->ranks = ff_calloc((size_t)P, sizeof *out->ranks);
    out->start_s = ff_calloc((size_t)P, sizeof *out->start_s);
    out->end_s = ff_calloc((size_t)P, sizeof *out->end_s);
    double *start_block = ff_calloc(n, sizeof(double)), *end_block = ff_calloc(n, sizeof(double));
    if (out->start_s && out->end_s) {
        for (int32_t r = 0; r < P; r++) {
            out->start_s[r] = start_block ? start_block + x.base[r] : NULL;
            out->end_s[r] = end_block ? end_block + x.base[r] : NULL;
        }
    } else {
        free(start_block);
        free(end_block);
    }
    if (!clock || !pc || !x.vs || !x.partner || !x.dur || !x.post || !x.done || !x.state || !x.chunks_on || !out->ranks || !out->start_s ||
        !out->end_s || !start_block || !end_block)
        goto done;
    for (int i = 0; i < s->n_models; i++)
        for (int32_t k = 0; k < s->models[i].n_stages; k++) x.chunks_on[i * P + s->models[i].stage_rank[k]]++;
    for (int32_t r = 0; r < P; r++) {
        int64_t last_call = -1;
        for (int64_t i = 0; i < s->streams[r].n; i++)
            if (check_fields(&x, r, i, &last_call) != 0) goto done;
    }
    if (pair_transfers(&x) != 0) goto done;
    for (int32_t r = 0; r < P; r++)
        if (check_stream(&x, r, &out->ranks[r]) != 0) goto done;
    if (check_complete(&x) != 0) goto done;
    int ran = run(&x, out, clock, pc);
    if (ran < 0) goto done;
    if (ran == 1) {
        report_deadlock(&x, out, pc);
        goto done;
    }
    double busy = 0;
    for (int32_t r = 0; r < P; r++) {
        out->ranks[r].end_s = clock[r];
        if (clock[r] > out->makespan_s) out->makespan_s = clock[r];
        busy += out->ranks[r].busy_s;
    }
    for (int32_t r = 0; r < P; r++) out->ranks[r].idle_s = out->makespan_s - out->ranks[r].busy_s;
    out->bubble_fraction = out->makespan_s > 0 ? 1.0 - busy / ((double)P * out->makespan_s) : 0.0;
    rc = 0;
done:
    free(x.base);
    free(clock);
    free(pc);
    free(x.vs);
    free(x.partner);
    free(x.dur);
    free(x.post);
    free(x.done);
    free(x.state);
    free(x.chunks_on);
    return rc;
}

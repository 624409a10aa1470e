/* The subtask kinds of an RL worker (`fuseflow worker` serves them; `fuseflow run` sends
 * them). Each handler checks the subtask's tensors and arguments, calls the engines of
 * rlw_engine.c and writes its outputs. docs/run.md lists the kinds and their tensors.
 *
 *   rl.init      config, overrides (U8 text); roles, backend, resume, updates_actor,
 *                updates_critic, slots, max_seq, name, tp, tp_rank, pp, pp_rank, dp, dp_rank and
 *                gen_tp .. gen_dp_rank (a generation layout of its own on these workers; the subtask
 *                names the rank's pool group, whose communicator TP splits)
 *                                                              -> params I64 [5], memory, role_bytes
 *   rl.generate  prompt I32, plen I32 [k], seed I64 [k]; n, temperature, top_p, top_k,
 *                max_new                 -> rlen, finish I32 [k n], resp I32, logprob F32
 *                (deferred: the step hook decodes every open job together; under TP each
 *                job runs to its end in its handler, the same steps on every TP rank)
 *   rl.logprob   samples; role (actor|gen|ref), mb, entropy     -> logprob [, entropy] F32
 *   rl.value     samples; mb                                    -> values F32
 *   rl.score     samples; mb                                    -> score F32 [n]
 *   rl.train     samples + per-token columns + mb I32; role, denom, timeline, stage_times
 *                                          -> metrics F64 [, pipe_times F64 [n, 5] over a pipeline]
 *                                             [, stage_times F64 [2, pp] over a pipeline, when asked]
 *   rl.train_fused  the actor's and the critic's rl.train inputs, prefixed "actor." / "critic.";
 *                denom_actor, denom_critic, timeline, fuse_instance (JSON); fuse_schedule I32;
 *                critic.split I32 [r + 1]: the critic's r replicas in the actor's pipeline
 *                (1: the same pp), replica b's micro-batches [split[b], split[b + 1]) of critic.mb
 *                                          -> metrics F64 [2, FF_RL_NM] [, pipe_times]
 *   rl.sync      mode (local|bcast)                              -> received I64 [1] (bytes from other ranks)
 *   rl.save      role, dir
 *   rl.digest    role                                           -> hash I64 [1], sum F64 [1]
 *   rl.migrate_out peer, how, link_bps, prefill_tps: at the next step boundary the open jobs'
 *                unfinished sequences go to member `peer` of the subtask's group (ff_coll
 *                send); each job completes with its finished samples and "state_len" I64
 *                [k n] (the moved ones' bytes)       -> moved I64 [4]
 *   rl.migrate_in  peer: receive member peer's sequences (in the handler), continue them here
 *                (deferred)     -> tag I64 [m, 2], xfer F64 [3], rlen, finish I32 [m], resp I32, logprob F32
 *   on a device, every result of rl.generate, rl.logprob, rl.value, rl.score, rl.train,
 *                rl.train_fused and rl.sync carries device_peak I64 [2] (the backend's most held
 *                since the previous one, what it holds now); rl.init checks that the trained
 *                roles' optimizer steps fit on the device (rlw_engine.c, check_device_memory)
 *   every generation result also carries prefill F64 [2] (tokens, seconds: the measured rate)
 *                and kv I64 [3] (the most KV blocks the rollout held since its previous result, its pool, positions per block)
 *   with roles.<ref|reward>.weights: on_demand (docs/run.md "Weights on demand"): rl.migrate_out
 *                takes prefetch (role bits: start loading those weights now, on a helper
 *                thread); every generation result carries weights_held I64 [1] (those roles'
 *                weight bytes on the backend when the job began) and every inference of such
 *                a role weights F64 [FF_RL_W_N] (the load it needed)
 *
 * "samples" are prompt I32 [sum plen], plen I32 [n], resp I32 [sum rlen], rlen I32 [n].
 * Under TP every TP rank of a replica gets the subtask and computes; only TP rank 0 returns
 * the per-sample outputs (generate, logprob, value, score), the others none.
 *
 * Not here: the engines (rlw_engine.c). */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/rl_worker.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"
#include "workers/rl/rlw.h"

typedef struct mig_in {
    ff_task *t;
    uint8_t *states; /* [bytes] */
    int64_t *lens;   /* [3 m]: each state's bytes, then the tags (ff_task_id, response) */
    int32_t m;
} mig_in;

static void mig_in_free(mig_in *q) {
    free(q->states), free(q->lens);
    q->states = NULL, q->lens = NULL;
}

struct ff_rlworker {
    rlw *eng;
    ff_task **open; /* deferred rl.generate tasks */
    int nopen, cap;
    /* a deferred rl.migrate_out: done by the step hook between two steps once no sample waits
     * for a slot, so that the steps (and their batches) are those the worker would have run */
    ff_task *mig_out;
    ff_coll_comm *mig_comm; /* its group's, and the survivor's member index in it */
    int mig_peer;
    rlw_mig_costs mig_costs;
    /* deferred rl.migrate_in tasks not imported yet, with the states received for each: they
     * join at a step without a prefill (none waiting), so that their rows never share a
     * forward with a prompt's (on a backend without batch invariance, FF_BATCH_INVARIANT=0 or
     * CUDA, a prefill rounds by its row count) */
    mig_in *mig_in;
    int nmig_in, mig_in_cap;
};

ff_rlworker *ff_rlworker_new(void) {
    ff_rlworker *r = ff_calloc(1, sizeof *r);
    if (!r) return NULL;
    r->eng = rlw_new();
    if (!r->eng) {
        free(r);
        return NULL;
    }
    return r;
}

void ff_rlworker_destroy(ff_rlworker **pr) {
    if (!pr || !*pr) return;
    rlw_destroy(&(*pr)->eng);
    free((*pr)->open);
    for (int i = 0; i < (*pr)->nmig_in; i++) mig_in_free(&(*pr)->mig_in[i]);
    free((*pr)->mig_in);
    free(*pr);
    *pr = NULL;
}

/* ---- tensors and arguments --------------------------------------------------------------- */
static const ff_tensor *input(ff_task *t, const char *name, ff_dtype dt, bool optional) {
    for (int i = 0; i < ff_task_ninputs(t); i++) {
        const ff_tensor *x = ff_task_input(t, i);
        if (strcmp(x->name, name)) continue;
        if (x->dtype != dt || x->ndim != 1) {
            ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: input '%s' must be a 1-D %s tensor", ff_task_kind(t), name,
                         ff_dtype_name(dt));
            return NULL;
        }
        return x;
    }
    if (!optional) ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: no input '%s'", ff_task_kind(t), name);
    return NULL;
}

static bool arg_int(ff_task *t, const char *key, int64_t dflt, int64_t *out) {
    if (!ff_msg_find_arg(ff_task_subtask(t), key)) {
        *out = dflt;
        return true;
    }
    if (ff_msg_arg_int(ff_task_subtask(t), key, out) == 0) return true;
    ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: %s", ff_task_kind(t), ff_error_message());
    return false;
}

static bool arg_float(ff_task *t, const char *key, double dflt, double *out) {
    if (!ff_msg_find_arg(ff_task_subtask(t), key)) {
        *out = dflt;
        return true;
    }
    if (ff_msg_arg_float(ff_task_subtask(t), key, out) == 0) return true;
    ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: %s", ff_task_kind(t), ff_error_message());
    return false;
}

/* A string argument copied into buf (empty when absent). */
static bool arg_str(ff_task *t, const char *key, char *buf, size_t cap) {
    buf[0] = 0;
    if (!ff_msg_find_arg(ff_task_subtask(t), key)) return true;
    const char *p;
    size_t len;
    if (ff_msg_arg_str(ff_task_subtask(t), key, &p, &len) != 0 || len >= cap) {
        ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: argument '%s' must be a string under %zu bytes", ff_task_kind(t), key, cap);
        return false;
    }
    memcpy(buf, p, len);
    buf[len] = 0;
    return true;
}

static bool role_arg(ff_task *t, unsigned allowed, unsigned *role) {
    char name[32];
    if (!arg_str(t, "role", name, sizeof name)) return false;
    static const struct {
        const char *name;
        unsigned bit;
    } roles[] = {{"actor", FF_RL_ACTOR}, {"gen", FF_RL_GEN}, {"critic", FF_RL_CRITIC}, {"ref", FF_RL_REF}, {"reward", FF_RL_REWARD}};
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (!strcmp(name, roles[i].name) && (allowed & roles[i].bit)) {
            *role = roles[i].bit;
            return true;
        }
    ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: role '%s' is not one this kind serves", ff_task_kind(t), name);
    return false;
}

static int64_t sum_lens(const ff_tensor *x, bool *ok, int32_t min) {
    int64_t s = 0;
    const int32_t *v = x->data;
    for (int64_t i = 0; i < x->shape[0]; i++) {
        if (v[i] < min) *ok = false;
        s += v[i];
    }
    return s;
}

/* The packed samples of a subtask, checked: lengths add up, prompts non-empty, every
 * per-token column has one value per response token. *ntok (NULL: not wanted) gets the
 * number of response tokens. */
/* The samples and columns of tensors named PREFIX + the protocol's names ("" for most kinds;
 * "actor." and "critic." in rl.train_fused). */
static bool read_samples_of(ff_task *t, const char *prefix, rlw_samples *in, int64_t *ntok) {
    memset(in, 0, sizeof *in);
    char n[4][64], cn[FF_RL_NCOL][64];
    const char *base[4] = {FF_RL_T_PROMPT, FF_RL_T_PLEN, FF_RL_T_RESP, FF_RL_T_RLEN};
    for (int k = 0; k < 4; k++) snprintf(n[k], sizeof n[k], "%s%s", prefix, base[k]);
    for (int k = 0; k < FF_RL_NCOL; k++) snprintf(cn[k], sizeof cn[k], "%s%s", prefix, ff_rl_col_names[k]);
    const ff_tensor *p = input(t, n[0], FF_DTYPE_I32, false), *pl = p ? input(t, n[1], FF_DTYPE_I32, false) : NULL;
    const ff_tensor *r = pl ? input(t, n[2], FF_DTYPE_I32, false) : NULL, *rl = r ? input(t, n[3], FF_DTYPE_I32, false) : NULL;
    if (!p || !pl || !r || !rl) return false;
    bool ok = pl->shape[0] == rl->shape[0];
    int64_t P = sum_lens(pl, &ok, 1), R = sum_lens(rl, &ok, 0);
    if (!ok || P != p->shape[0] || R != r->shape[0]) {
        ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: sample lengths do not match the packed tokens", ff_task_kind(t));
        return false;
    }
    in->n = (int32_t)pl->shape[0];
    in->prompt = p->data, in->plen = pl->data, in->resp = r->data, in->rlen = rl->data;
    for (int k = 0; k < FF_RL_NCOL; k++) {
        bool present = false;
        for (int i = 0; i < ff_task_ninputs(t); i++) present |= !strcmp(ff_task_input(t, i)->name, cn[k]);
        const ff_tensor *c = present ? input(t, cn[k], FF_DTYPE_F32, false) : NULL;
        if (present && !c) return false;
        if (c && c->shape[0] != R) {
            ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: column '%s' has %lld values for %lld response tokens", ff_task_kind(t),
                         cn[k], (long long)c->shape[0], (long long)R);
            return false;
        }
        in->col[k] = c ? c->data : NULL;
    }
    if (ntok) *ntok = R;
    return true;
}

static bool read_samples(ff_task *t, rlw_samples *in, int64_t *ntok) { return read_samples_of(t, "", in, ntok); }

/* ---- rl.init ------------------------------------------------------------------------------ */
static char *text_of(const ff_tensor *x) {
    char *s = ff_malloc(x ? x->nbytes + 1 : 1);
    if (!s) return NULL;
    if (x && x->nbytes) memcpy(s, x->data, x->nbytes);
    s[x ? x->nbytes : 0] = 0;
    return s;
}

/* A layout place: PREFIX tp, tp_rank, pp, pp_rank, dp, dp_rank (prefix "gen_": all absent
 * means the generation copy shares the place, tp 0). */
static bool place_arg(ff_task *t, const char *prefix, rlw_place *p) {
    static const char *const keys[6] = {"tp", "tp_rank", "pp", "pp_rank", "dp", "dp_rank"};
    const int64_t dflt[6] = {prefix[0] ? 0 : 1, 0, 1, 0, 1, 0};
    int64_t v[6];
    for (int i = 0; i < 6; i++) {
        char key[32];
        snprintf(key, sizeof key, "%s%s", prefix, keys[i]);
        if (!arg_int(t, key, dflt[i], &v[i])) return false;
    }
    *p = (rlw_place){(int32_t)v[0], (int32_t)v[1], (int32_t)v[2], (int32_t)v[3], (int32_t)v[4], (int32_t)v[5]};
    if (prefix[0] && v[0] == 0) return true;
    bool ok = true;
    for (int i = 0; i < 6; i += 2)
        ok = ok && v[i] >= 1 && v[i] <= FF_MSG_MAX_MEMBERS && v[i + 1] >= 0 && v[i + 1] < v[i];
    if (ok && v[0] * v[2] * v[4] > FF_MSG_MAX_MEMBERS) ok = false;
    if (!ok)
        ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.init: %sTP rank %lld of %lld, stage %lld of %lld, replica %lld of %lld", prefix,
                     (long long)v[1], (long long)v[0], (long long)v[3], (long long)v[2], (long long)v[5], (long long)v[4]);
    return ok;
}

static int k_init(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    if (r->nopen) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.init: generation jobs are still open");
    const ff_tensor *cfg = input(t, "config", FF_DTYPE_U8, false), *ov = input(t, "overrides", FF_DTYPE_U8, true);
    int64_t roles, ua, uc, slots, max_seq;
    char backend[64], resume[FF_PATH_MAX], name[FF_PATH_MAX];
    if (!cfg || !arg_int(t, "roles", 0, &roles) || !arg_int(t, "updates_actor", 0, &ua) || !arg_int(t, "updates_critic", 0, &uc) ||
        !arg_int(t, "slots", 64, &slots) || !arg_int(t, "max_seq", 256, &max_seq) || !arg_str(t, "backend", backend, sizeof backend) ||
        !arg_str(t, "resume", resume, sizeof resume) || !arg_str(t, "name", name, sizeof name))
        return -1;
    rlw_place at[2];
    if (!place_arg(t, "", &at[0]) || !place_arg(t, "gen_", &at[1])) return -1;
    char *text = text_of(cfg), *over = text_of(ov);
    int rc = -1;
    if (text && over) {
        rlw_init_args a = {.config = text,
                           .config_name = name[0] ? name : "run config",
                           .overrides = over,
                           .roles = (unsigned)roles,
                           .backend = backend,
                           .resume_dir = resume[0] ? resume : NULL,
                           .total_updates = {ua, uc},
                           .slots = (int32_t)slots,
                           .max_seq_len = (int32_t)max_seq,
                           .main = at[0],
                           .gen = at[1],
                           .group = ff_task_comm(t)};
        rc = rlw_init(r->eng, &a);
    }
    free(text);
    free(over);
    if (rc) return -1;
    /* what the roles need beside what the process holds once they are loaded (the trained
     * roles' gradients and optimizer state become resident with their first step) */
    int64_t *params = ff_task_output(t, FF_RL_T_PARAMS, FF_DTYPE_I64, 1, (int64_t[]){FF_RL_NROLES});
    int64_t *mem = ff_task_output(t, FF_RL_T_MEMORY, FF_DTYPE_I64, 1, (int64_t[]){FF_RL_MEM_N});
    int64_t *rb = ff_task_output(t, FF_RL_T_ROLE_BYTES, FF_DTYPE_I64, 2, (int64_t[]){FF_RL_NROLES, FF_RL_RB_N});
    if (!params || !mem || !rb) return -1;
    for (int i = 0; i < FF_RL_NROLES; i++) {
        params[i] = rlw_param_count(r->eng, 1u << i);
        rlw_role_bytes(r->eng, 1u << i, rb + (size_t)i * FF_RL_RB_N);
    }
    ff_resident res = ff_resident_memory();
    mem[FF_RL_MEM_RSS] = (int64_t)res.now;
    mem[FF_RL_MEM_PEAK] = (int64_t)res.peak;
    ff_backend_memory bm;
    rlw_backend_memory(r->eng, &bm);
    mem[FF_RL_MEM_DEV] = bm.in_use;
    mem[FF_RL_MEM_DEV_CAP] = bm.capacity;
    mem[FF_RL_MEM_DEV_FREE] = rlw_device_free(r->eng);
    return 0;
}

/* ---- rl.generate (deferred) ----------------------------------------------------------------- */
static void forget_open(ff_rlworker *r, ff_task *t) {
    for (int i = 0; i < r->nopen; i++)
        if (r->open[i] == t) {
            r->open[i] = r->open[--r->nopen];
            return;
        }
}

static int gen_outputs(ff_task *t, rlw *eng, const rlw_gen_done *d) {
    int64_t kn = (int64_t)d->k * d->n;
    int32_t *rlen = ff_task_output(t, FF_RL_T_RLEN, FF_DTYPE_I32, 1, &kn);
    int32_t *fin = ff_task_output(t, FF_RL_T_FINISH, FF_DTYPE_I32, 1, &kn);
    int32_t *resp = ff_task_output(t, FF_RL_T_RESP, FF_DTYPE_I32, 1, &d->total);
    float *lp = ff_task_output(t, FF_RL_T_LOGPROB, FF_DTYPE_F32, 1, &d->total);
    double *pf = ff_task_output(t, FF_RL_T_PREFILL, FF_DTYPE_F64, 1, (int64_t[]){2});
    int64_t *kv = ff_task_output(t, FF_RL_T_KV, FF_DTYPE_I64, 1, (int64_t[]){5});
    if (!rlen || !fin || !resp || !lp || !pf || !kv) return -1;
    rlw_gen_kv_take(eng, kv); /* the steps since the previous result: each step in one result */
    if (kn) { /* none: an rl.migrate_in whose source had nothing left */
        memcpy(rlen, d->rlen, (size_t)kn * sizeof *rlen);
        memcpy(fin, d->finish, (size_t)kn * sizeof *fin);
    }
    if (d->total) {
        memcpy(resp, d->tokens, (size_t)d->total * sizeof *resp);
        memcpy(lp, d->logprobs, (size_t)d->total * sizeof *lp);
    }
    int64_t ptok;
    rlw_gen_prefill_rate(eng, &ptok, &pf[1]); /* the cost model's prefill rate, measured here */
    pf[0] = (double)ptok;
    if (!d->moved) return 0;
    int64_t *sl = ff_task_output(t, FF_RL_T_STATE_LEN, FF_DTYPE_I64, 1, &kn);
    if (!sl) return -1;
    memcpy(sl, d->moved, (size_t)kn * sizeof *sl);
    return 0;
}

/* On a device, the most its backend held since the previous report (FF_RL_T_DEVICE_PEAK). The
 * peak is reset here: each report covers the work since the last. */
static int device_peak_out(ff_task *t, ff_rlworker *r) {
    ff_backend_memory bm;
    rlw_backend_memory(r->eng, &bm);
    if (bm.capacity <= 0) return 0;
    int64_t *o = ff_task_output(t, FF_RL_T_DEVICE_PEAK, FF_DTYPE_I64, 1, (int64_t[]){FF_RL_DP_N});
    if (!o) return -1;
    o[FF_RL_DP_PEAK] = bm.peak, o[FF_RL_DP_HELD] = bm.in_use, o[FF_RL_DP_FREE] = rlw_device_free(r->eng);
    rlw_backend_reset_peak(r->eng);
    return 0;
}

static void on_gen_done(void *ctx, const rlw_gen_done *d) {
    ff_rlworker *r = ctx;
    ff_task *t = d->owner;
    int rc = gen_outputs(t, r->eng, d);
    if (rc == 0) rc = device_peak_out(t, r);
    forget_open(r, t);
    ff_task_complete(t, rc);
}

/* A TP job's end, inside its handler: TP rank 0 returns the samples. */
typedef struct gen_run {
    ff_rlworker *r;
    int rc;
} gen_run;

static void on_gen_run(void *ctx, const rlw_gen_done *d) {
    gen_run *g = ctx;
    if (rlw_returns_outputs(g->r->eng, FF_RL_GEN)) g->rc = gen_outputs(d->owner, g->r->eng, d);
}

static int k_generate(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    const ff_tensor *p = input(t, FF_RL_T_PROMPT, FF_DTYPE_I32, false), *pl = input(t, FF_RL_T_PLEN, FF_DTYPE_I32, false);
    const ff_tensor *sd = input(t, "seed", FF_DTYPE_I64, false);
    int64_t n, top_k, max_new, len_max;
    double temp, top_p, len_median, len_ratio;
    if (!p || !pl || !sd || !arg_int(t, "n", 1, &n) || !arg_int(t, "top_k", 0, &top_k) || !arg_int(t, "max_new", 16, &max_new) ||
        !arg_float(t, "temperature", 1.0, &temp) || !arg_float(t, "top_p", 1.0, &top_p) ||
        !arg_float(t, "len_median", 0, &len_median) || !arg_float(t, "len_p99_ratio", 10, &len_ratio) ||
        !arg_int(t, "len_max", 0, &len_max))
        return -1;
    if (len_max < 0 || len_max > INT32_MAX)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.generate: len_max = %lld is outside [0, %d] (0: max_new)",
                            (long long)len_max, INT32_MAX);
    /* the engine holds both as int32: a larger value must not wrap into a small one */
    if (max_new < 1 || max_new > INT32_MAX)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.generate: max_new = %lld is outside [1, %d] (tokens per sample)",
                            (long long)max_new, INT32_MAX);
    if (top_k < 0 || top_k > INT32_MAX)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.generate: top_k = %lld is outside [0, %d] (0 turns top-k off)",
                            (long long)top_k, INT32_MAX);
    bool ok = sd->shape[0] == pl->shape[0] && pl->shape[0] >= 1 && n >= 1 && n <= 1 << 20;
    if (!ok || sum_lens(pl, &ok, 1) != p->shape[0] || !ok)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.generate: prompts, lengths and seeds do not match");
    if (pl->shape[0] > INT32_MAX / n) /* the engine counts a job's k n samples in an int32 */
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.generate: %lld prompts x %lld samples are too many",
                            (long long)pl->shape[0], (long long)n);
    if (r->nopen == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        ff_task **v = ff_realloc(r->open, (size_t)cap * sizeof *v);
        if (!v) return -1;
        r->open = v;
        r->cap = cap;
    }
    rlw_sampling sp = {(float)temp, (float)top_p, (int32_t)top_k, (int32_t)max_new, (float)len_median, (float)len_ratio, (int32_t)len_max};
    if (rlw_weights_on_demand(r->eng, FF_RL_REF) || rlw_weights_on_demand(r->eng, FF_RL_REWARD)) {
        int64_t *held = ff_task_output(t, FF_RL_T_WEIGHTS_HELD, FF_DTYPE_I64, 1, (int64_t[]){1});
        if (!held) return -1;
        *held = rlw_weights_held(r->eng);
    }
    if (rlw_gen_lockstep(r->eng)) { /* in lockstep with the other TP ranks: to the end, here */
        gen_run g = {r, 0};
        if (rlw_gen_run(r->eng, t, p->data, pl->data, sd->data, (int32_t)pl->shape[0], (int32_t)n, &sp, on_gen_run, &g) != 0) return -1;
        return g.rc ? g.rc : device_peak_out(t, r);
    }
    if (rlw_gen_add(r->eng, t, p->data, pl->data, sd->data, (int32_t)pl->shape[0], (int32_t)n, &sp) != 0) return -1;
    if (ff_task_defer(t) != 0) {
        rlw_gen_abort(r->eng, t);
        return -1;
    }
    r->open[r->nopen++] = t;
    return 0;
}

/* ---- long-tail migration ------------------------------------------------------------------ */
/* The states go from the source to the survivor over the subtasks' group ("migrate", a
 * communicator over the generation workers), never through the controller: a header I64 [4]
 * (magic, sequences m, state bytes, how), then in one grouped call I64 [3 m] (each state's
 * bytes, its rl.generate subtask's id, its response in that job) and the U8 bytes. */
#define MIG_MAGIC 0x46464d4947ll /* "FFMIG" */
enum { MIG_HDR = 4 };

typedef struct mig_send {
    ff_coll_comm *comm;
    int peer, how;
} mig_send;

static int mig_send_fn(void *ctx, const rlw_mig_batch *b) {
    mig_send *ms = ctx;
    int64_t hdr[MIG_HDR] = {MIG_MAGIC, b->m, b->bytes, ms->how};
    int64_t *meta = ff_malloc((size_t)(3 * b->m + 1) * sizeof *meta);
    if (!meta) return -1;
    for (int32_t i = 0; i < b->m; i++)
        meta[i] = b->lens[i], meta[b->m + i] = (int64_t)ff_task_id(b->owners[i]), meta[2 * b->m + i] = b->index[i];
    int rc = ff_coll_group_start();
    if (rc == 0) {
        rc |= ff_coll_send(hdr, MIG_HDR, FF_DTYPE_I64, ms->peer, ms->comm, NULL);
        if (b->m) {
            rc |= ff_coll_send(meta, (size_t)(3 * b->m), FF_DTYPE_I64, ms->peer, ms->comm, NULL);
            rc |= ff_coll_send(b->states, (size_t)b->bytes, FF_DTYPE_U8, ms->peer, ms->comm, NULL);
        }
        rc |= ff_coll_group_end();
    }
    free(meta);
    return rc ? ff_error_wrap("rl.migrate_out: sending %d sequences to member %d", b->m, ms->peer) : 0;
}

/* The peer argument: a member of the subtask's group other than this one. */
static bool peer_arg(ff_task *t, ff_coll_comm **comm, int *peer) {
    int64_t p;
    if (!arg_int(t, "peer", -1, &p)) return false;
    *comm = ff_task_comm(t);
    if (!*comm)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: group '%s' has no communicator here (the controller makes the migrate group)",
                            ff_task_kind(t), ff_task_group(t)),
               false;
    if (p < 0 || p >= ff_coll_comm_size(*comm) || p == ff_coll_comm_rank(*comm))
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s: peer %lld is not another member of the %d in group '%s'", ff_task_kind(t),
                            (long long)p, ff_coll_comm_size(*comm), ff_task_group(t)),
               false;
    *peer = (int)p;
    return true;
}

static void migrate_out_now(ff_rlworker *r) {
    ff_task *t = r->mig_out;
    r->mig_out = NULL;
    rlw_mig_report rep;
    mig_send ms = {r->mig_comm, r->mig_peer, r->mig_costs.how};
    int64_t *o = ff_task_output(t, FF_RL_T_MOVED, FF_DTYPE_I64, 1, (int64_t[]){4});
    /* each migrated job's rl.generate completes inside, through on_gen_done */
    int rc = o && rlw_gen_migrate_out(r->eng, &r->mig_costs, mig_send_fn, &ms, on_gen_done, r, &rep) == 0 ? 0 : -1;
    if (rc) ff_task_fail(t, FF_STATUS_FAILED, "%s", ff_error_message());
    else o[0] = rep.moved, o[1] = rep.bytes, o[2] = rep.positions, o[3] = rep.how;
    ff_task_complete(t, rc);
}

static int k_migrate_out(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    int64_t how, prefetch;
    double link, prefill;
    ff_coll_comm *comm;
    int peer;
    if (!arg_int(t, "how", RLW_MIG_KV, &how) || !arg_float(t, "link_bps", 0, &link) || !arg_float(t, "prefill_tps", 0, &prefill) ||
        !arg_int(t, "prefetch", 0, &prefetch) || !peer_arg(t, &comm, &peer))
        return -1;
    if (how < RLW_MIG_KV || how > RLW_MIG_AUTO)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.migrate_out: how = %lld (0 kv, 1 recompute, 2 auto)", (long long)how);
    if (r->mig_out) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.migrate_out: one is already waiting for the next step");
    if (rlw_gen_lockstep(r->eng))
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.migrate_out: a TP or PP generation replica does not migrate its samples");
    if (ff_task_defer(t) != 0) return -1;
    /* freed by this move, the worker takes inference next: its weights load meanwhile */
    rlw_weights_prefetch(r->eng, (unsigned)prefetch);
    r->mig_out = t, r->mig_comm = comm, r->mig_peer = peer;
    r->mig_costs = (rlw_mig_costs){(int)how, link, prefill};
    return 0;
}

static bool grow_open(ff_rlworker *r) {
    if (r->nopen < r->cap) return true;
    int cap = r->cap ? 2 * r->cap : 64;
    ff_task **v = ff_realloc(r->open, (size_t)cap * sizeof *v);
    if (!v) return false;
    r->open = v;
    r->cap = cap;
    return true;
}

/* The survivor's side, in the handler (between two steps): the states from the source, at
 * once (the source sends at its next step boundary), kept until the engine takes them. */
static int k_migrate_in(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    ff_coll_comm *comm;
    int peer;
    if (!peer_arg(t, &comm, &peer)) return -1;
    if (rlw_gen_lockstep(r->eng))
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.migrate_in: a TP or PP generation replica does not take migrated samples");
    if (r->nmig_in == r->mig_in_cap) {
        int cap = r->mig_in_cap ? 2 * r->mig_in_cap : 8;
        mig_in *v = ff_realloc(r->mig_in, (size_t)cap * sizeof *v);
        if (!v) return -1;
        r->mig_in = v;
        r->mig_in_cap = cap;
    }
    int64_t hdr[MIG_HDR];
    if (ff_coll_recv(hdr, MIG_HDR, FF_DTYPE_I64, peer, comm, NULL) != 0)
        return ff_task_fail(t, FF_STATUS_FAILED, "rl.migrate_in: from member %d: %s", peer, ff_error_message());
    const int64_t m = hdr[1], bytes = hdr[2];
    if (hdr[0] != MIG_MAGIC || m < 0 || m > INT32_MAX || bytes < m || (m == 0) != (bytes == 0))
        return ff_task_fail(t, FF_STATUS_FAILED, "rl.migrate_in: member %d sent a header of %lld sequences in %lld bytes (magic %llx)", peer,
                            (long long)m, (long long)bytes, (unsigned long long)hdr[0]);
    mig_in q = {t, ff_malloc((size_t)(bytes ? bytes : 1)), ff_malloc((size_t)(3 * m + 1) * sizeof *q.lens), (int32_t)m};
    if (!q.states || !q.lens) {
        mig_in_free(&q);
        return -1;
    }
    int64_t t0 = ff_now_ns();
    int rc = m ? ff_coll_group_start() : 0;
    if (m && rc == 0) {
        rc |= ff_coll_recv(q.lens, (size_t)(3 * m), FF_DTYPE_I64, peer, comm, NULL);
        rc |= ff_coll_recv(q.states, (size_t)bytes, FF_DTYPE_U8, peer, comm, NULL);
        rc |= ff_coll_group_end();
    }
    double secs = (double)(ff_now_ns() - t0) * 1e-9;
    int64_t sum = 0;
    bool ok = rc == 0;
    for (int64_t i = 0; ok && i < m; i++) {
        ok = q.lens[i] >= 1 && q.lens[i] <= bytes - sum;
        sum += ok ? q.lens[i] : 0;
    }
    if (rc != 0 || !ok || sum != bytes) {
        mig_in_free(&q);
        return rc != 0 ? ff_task_fail(t, FF_STATUS_FAILED, "rl.migrate_in: from member %d: %s", peer, ff_error_message())
                       : ff_task_fail(t, FF_STATUS_FAILED, "rl.migrate_in: member %d sent %lld state lengths that do not add up to %lld bytes",
                                      peer, (long long)m, (long long)bytes);
    }
    /* what the controller gets instead of the states: whose they are, and what came */
    int64_t *tag = ff_task_output(t, FF_RL_T_TAG, FF_DTYPE_I64, 2, (int64_t[]){m, 2});
    double *xf = ff_task_output(t, FF_RL_T_XFER, FF_DTYPE_F64, 1, (int64_t[]){3});
    if (!tag || !xf) {
        mig_in_free(&q);
        return -1;
    }
    for (int64_t i = 0; i < m; i++) tag[2 * i] = q.lens[m + i], tag[2 * i + 1] = q.lens[2 * m + i];
    xf[0] = (double)bytes, xf[1] = secs, xf[2] = (double)hdr[3];
    if (m == 0) { /* everything finished on the source before its step boundary */
        mig_in_free(&q);
        rlw_gen_done d = {t, 0, 1, NULL, NULL, NULL, NULL, 0, NULL};
        return gen_outputs(t, r->eng, &d);
    }
    if (ff_task_defer(t) != 0) {
        mig_in_free(&q);
        return -1;
    }
    r->mig_in[r->nmig_in++] = q;
    return 0;
}

/* The waiting rl.migrate_in states into the engine, in order, each once the engine has the
 * slots for it (the step hook, no sample waiting): a survivor that took other work (a dead
 * worker's groups) takes the states as its sequences finish. */
static void migrate_in_now(ff_rlworker *r) {
    int i = 0;
    for (; i < r->nmig_in; i++) {
        mig_in *q = &r->mig_in[i];
        ff_task *t = q->t;
        if (!ff_task_cancelled(t) && q->m > rlw_gen_free_slots(r->eng) && r->nopen) break; /* after some finish */
        if (ff_task_cancelled(t)) {
            ff_task_fail(t, FF_STATUS_CANCELLED, "rl.migrate_in: cancelled");
            ff_task_complete(t, -1);
        } else if (!grow_open(r) || rlw_gen_import(r->eng, t, q->states, q->lens, q->m) != 0) {
            ff_task_fail(t, FF_STATUS_FAILED, "%s", ff_error_message());
            ff_task_complete(t, -1);
        } else {
            r->open[r->nopen++] = t;
        }
        mig_in_free(q);
    }
    memmove(r->mig_in, r->mig_in + i, (size_t)(r->nmig_in - i) * sizeof *r->mig_in);
    r->nmig_in -= i;
}

static int step(ff_worker *w, void *ud) {
    (void)w;
    ff_rlworker *r = ud;
    for (int i = 0; i < r->nopen;) {
        ff_task *t = r->open[i];
        if (!ff_task_cancelled(t)) {
            i++;
            continue;
        }
        rlw_gen_abort(r->eng, t);
        r->open[i] = r->open[--r->nopen];
        ff_task_fail(t, FF_STATUS_CANCELLED, "rl.generate: cancelled");
        ff_task_complete(t, -1);
    }
    if (r->mig_out && ff_task_cancelled(r->mig_out)) {
        ff_task_fail(r->mig_out, FF_STATUS_CANCELLED, "rl.migrate_out: cancelled");
        ff_task_complete(r->mig_out, -1);
        r->mig_out = NULL;
    }
    if (r->mig_out && !rlw_gen_waiting(r->eng)) migrate_out_now(r); /* between two steps */
    if (r->nmig_in && !rlw_gen_waiting(r->eng)) migrate_in_now(r);
    if (!r->nopen) return 0;
    if (rlw_gen_step(r->eng, on_gen_done, r) != 0) {
        rlw_gen_clear(r->eng); /* the worker fails every open job with this error */
        r->nopen = 0;
        r->mig_out = NULL;
        for (int i = 0; i < r->nmig_in; i++) mig_in_free(&r->mig_in[i]);
        r->nmig_in = 0;
        return -1;
    }
    return 0;
}

/* ---- scoring -------------------------------------------------------------------------------- */
/* A per-sample F32 output [n]: an output tensor on TP rank 0, a buffer of the caller's to
 * free (*scratch) on the other TP ranks, which compute the same and return nothing. */
static float *sample_output(ff_task *t, ff_rlworker *r, unsigned role, const char *name, int64_t n, float **scratch) {
    if (rlw_returns_outputs(r->eng, role)) return ff_task_output(t, name, FF_DTYPE_F32, 1, &n);
    *scratch = ff_malloc((size_t)(n ? n : 1) * sizeof **scratch);
    return *scratch;
}

/* The load an on-demand role's inference needed (rlw_weights_last), its times relative to the
 * handler's start t0 (the controller places them on the trace). */
static int weights_out(ff_task *t, ff_rlworker *r, unsigned role, int64_t t0) {
    const rlw_load *l = rlw_weights_last(r->eng, role);
    if (!l) return 0;
    double *o = ff_task_output(t, FF_RL_T_WEIGHTS, FF_DTYPE_F64, 1, (int64_t[]){FF_RL_W_N});
    if (!o) return -1;
    o[FF_RL_W_BYTES] = (double)l->bytes, o[FF_RL_W_LOAD_S] = l->load_s, o[FF_RL_W_WAITED_S] = l->waited_s;
    o[FF_RL_W_HELD] = (double)l->held, o[FF_RL_W_PREFETCHED] = l->prefetched;
    o[FF_RL_W_START] = l->bytes ? (double)(l->start_ns - t0) * 1e-9 : 0;
    o[FF_RL_W_END] = l->bytes ? (double)(l->end_ns - t0) * 1e-9 : 0;
    return 0;
}

static int k_logprob(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    const int64_t t0 = ff_now_ns();
    rlw_samples in;
    unsigned role;
    int64_t R, mb, want_ent;
    if (!read_samples(t, &in, &R) || !role_arg(t, FF_RL_ACTOR | FF_RL_GEN | FF_RL_REF, &role) || !arg_int(t, "mb", 0, &mb) ||
        !arg_int(t, FF_RL_T_ENTROPY, 0, &want_ent))
        return -1;
    float *s1 = NULL, *s2 = NULL;
    float *lp = sample_output(t, r, role, FF_RL_T_LOGPROB, R, &s1);
    float *ent = want_ent ? sample_output(t, r, role, FF_RL_T_ENTROPY, R, &s2) : NULL;
    int rc = !lp || (want_ent && !ent) ? -1 : rlw_logprob(r->eng, role, &in, (int32_t)mb, lp, ent);
    free(s1), free(s2);
    return rc || weights_out(t, r, role, t0) ? -1 : device_peak_out(t, r);
}

static int k_value(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    rlw_samples in;
    int64_t R, mb;
    if (!read_samples(t, &in, &R) || !arg_int(t, "mb", 0, &mb)) return -1;
    float *scratch = NULL, *v = sample_output(t, r, FF_RL_CRITIC, FF_RL_T_VALUES, R, &scratch);
    int rc = v ? rlw_values(r->eng, &in, (int32_t)mb, v) : -1;
    free(scratch);
    return rc ? rc : device_peak_out(t, r);
}

static int k_score(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    const int64_t t0 = ff_now_ns();
    rlw_samples in;
    int64_t mb;
    if (!read_samples(t, &in, NULL) || !arg_int(t, "mb", 0, &mb)) return -1;
    float *scratch = NULL, *s = sample_output(t, r, FF_RL_REWARD, FF_RL_T_SCORE, in.n, &scratch);
    int rc = s ? rlw_reward_model(r->eng, &in, (int32_t)mb, s) : -1;
    free(scratch);
    return rc || weights_out(t, r, FF_RL_REWARD, t0) ? -1 : device_peak_out(t, r);
}

/* ---- training, sync, checkpoints ------------------------------------------------------------ */
/* The actor's last move of its gradients and AdamW state (rlw_offload), when there was one. */
static int offload_out(ff_task *t, ff_rlworker *r, bool reload) {
    double v[3];
    if (!rlw_offload(r->eng, reload, v)) return 0;
    double *o = ff_task_output(t, FF_RL_T_OFFLOAD, FF_DTYPE_F64, 1, (int64_t[]){3});
    if (!o) return -1;
    memcpy(o, v, sizeof v);
    return 0;
}

static int k_train(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    rlw_samples in;
    unsigned role;
    double denom;
    const ff_tensor *mb = NULL;
    if (!read_samples(t, &in, NULL) || !role_arg(t, FF_RL_ACTOR | FF_RL_CRITIC, &role) || !arg_float(t, "denom", 0, &denom) ||
        !(mb = input(t, "mb", FF_DTYPE_I32, false)))
        return -1;
    if (mb->shape[0] < 2) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.train: 'mb' needs at least two offsets");
    int64_t timeline, want_times;
    if (!arg_int(t, "timeline", 0, &timeline) || !arg_int(t, "stage_times", 0, &want_times)) return -1;
    double *m = ff_task_output(t, FF_RL_T_METRICS, FF_DTYPE_F64, 1, (int64_t[]){FF_RL_NM});
    if (!m) return -1;
    if (rlw_train(r->eng, role, &in, mb->data, (int32_t)mb->shape[0] - 1, denom, ff_task_comm(t), m) != 0) return -1;
    if (role == FF_RL_ACTOR && offload_out(t, r, true) != 0) return -1;
    const double *fwd, *bwd;
    const int32_t ns = want_times ? rlw_train_stage_times(r->eng, &fwd, &bwd) : 0;
    if (ns > 0) {
        double *o = ff_task_output(t, FF_RL_T_STAGE_TIMES, FF_DTYPE_F64, 2, (int64_t[]){2, ns});
        if (!o) return -1;
        memcpy(o, fwd, (size_t)ns * sizeof *o);
        memcpy(o + ns, bwd, (size_t)ns * sizeof *o);
    }
    const double *rows;
    int64_t n = timeline ? rlw_train_timeline(r->eng, &rows) : 0;
    if (n > 0) { /* every rank's: the controller draws each rank's instructions */
        double *o = ff_task_output(t, FF_RL_T_PIPE_TIMES, FF_DTYPE_F64, 2, (int64_t[]){n, 5});
        if (!o) return -1;
        memcpy(o, rows, (size_t)n * 5 * sizeof *o);
    }
    return device_peak_out(t, r);
}

/* The fused schedule tensor (rl_protocol.h) of an instance's nodes into *out. */
static int read_schedule(ff_task *t, const ff_fuse_instance *inst, ff_fuse_schedule *out) {
    const ff_tensor *x = input(t, FF_RL_T_FUSE_SCHEDULE, FF_DTYPE_I32, false);
    if (!x) return -1;
    const int32_t *v = x->data;
    const int64_t n = x->shape[0];
    if (ff_fuse_schedule_init(out, inst->nodes)) return -1;
    int64_t at = 0;
    for (int32_t node = 0; node < inst->nodes; node++) {
        const int64_t c = at < n ? v[at++] : -1;
        if (c < 0 || at + 2 * c > n) break;
        for (int64_t k = 0; k < c; k++, at += 2) {
            if (v[at] < 0 || v[at] >= inst->n_models || (v[at + 1] != 0 && v[at + 1] != 1)) {
                at = -1;
                break;
            }
            if (ff_fuse_schedule_push(out, node, (ff_fuse_task){(uint8_t)v[at], (uint8_t)v[at + 1]})) {
                ff_fuse_schedule_free(out);
                return -1;
            }
        }
        if (at < 0) break;
        if (node == inst->nodes - 1 && at == n) return 0;
    }
    ff_fuse_schedule_free(out);
    return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.train_fused: '%s' is not %d nodes' task lists (count, then (model, 0|1) pairs)",
                        FF_RL_T_FUSE_SCHEDULE, (int)inst->nodes);
}

static int k_train_fused(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    rlw_samples in[2];
    const int32_t *mbv[2];
    int32_t nm[2];
    double denom[2];
    static const char *const pre[2] = {"actor.", "critic."};
    for (int i = 0; i < 2; i++) {
        char key[32];
        snprintf(key, sizeof key, "%smb", pre[i]);
        const ff_tensor *mb;
        if (!read_samples_of(t, pre[i], &in[i], NULL) || !(mb = input(t, key, FF_DTYPE_I32, false))) return -1;
        if (mb->shape[0] < 2) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.train_fused: '%s' needs at least two offsets", key);
        mbv[i] = mb->data, nm[i] = (int32_t)mb->shape[0] - 1;
        if (!arg_float(t, i ? "denom_critic" : "denom_actor", 0, &denom[i])) return -1;
    }
    int64_t timeline;
    char *json = NULL;
    const char *p;
    size_t len;
    if (!arg_int(t, "timeline", 0, &timeline)) return -1;
    if (ff_msg_arg_str(ff_task_subtask(t), "fuse_instance", &p, &len) != 0)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.train_fused: no 'fuse_instance' (the instance's JSON): %s", ff_error_message());
    if (!(json = ff_malloc(len + 1))) return -1;
    memcpy(json, p, len);
    json[len] = 0;
    ff_fuse_instance inst;
    const int prc = ff_fuse_instance_parse(json, "rl.train_fused fuse_instance", &inst);
    free(json);
    if (prc) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s", ff_error_message());
    const ff_tensor *split = input(t, "critic.split", FF_DTYPE_I32, false);
    if (!split) return -1;
    if (split->shape[0] < 2) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.train_fused: 'critic.split' needs at least two bounds");
    const rlw_split cs = {split->data, (int32_t)split->shape[0] - 1};
    ff_fuse_schedule sched;
    if (read_schedule(t, &inst, &sched)) return -1;
    double *m = ff_task_output(t, FF_RL_T_METRICS, FF_DTYPE_F64, 2, (int64_t[]){2, FF_RL_NM});
    int rc = m ? rlw_train_fused(r->eng, in, mbv, nm, &cs, denom, &inst, &sched, ff_task_comm(t), m) : -1;
    ff_fuse_schedule_free(&sched);
    if (rc || offload_out(t, r, true) != 0) return -1;
    const double *rows;
    int64_t n = timeline ? rlw_train_timeline(r->eng, &rows) : 0;
    if (n > 0) {
        double *o = ff_task_output(t, FF_RL_T_PIPE_TIMES, FF_DTYPE_F64, 2, (int64_t[]){n, 5});
        if (!o) return -1;
        memcpy(o, rows, (size_t)n * 5 * sizeof *o);
    }
    return device_peak_out(t, r);
}

static int k_sync(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    char mode[16];
    if (!arg_str(t, "mode", mode, sizeof mode)) return -1;
    int rc;
    if (!strcmp(mode, "local")) rc = rlw_sync_local(r->eng);
    else if (!strcmp(mode, "reshard")) rc = rlw_sync_reshard(r->eng, ff_task_comm(t));
    else return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.sync: mode '%s' (local or reshard)", mode);
    if (rc) return -1;
    int64_t *got = ff_task_output(t, FF_RL_T_RECEIVED, FF_DTYPE_I64, 1, (int64_t[]){1});
    if (!got) return -1;
    *got = rlw_sync_received(r->eng);
    if (offload_out(t, r, false) != 0) return -1;
    int64_t d[3];
    if (rlw_sync_delta(r->eng, d)) {
        int64_t *o = ff_task_output(t, FF_RL_T_SYNC_DELTA, FF_DTYPE_I64, 1, (int64_t[]){3});
        if (!o) return -1;
        memcpy(o, d, sizeof d);
    }
    return device_peak_out(t, r);
}

static int k_save(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    unsigned role;
    char dir[FF_PATH_MAX];
    if (!role_arg(t, FF_RL_ACTOR | FF_RL_CRITIC, &role) || !arg_str(t, "dir", dir, sizeof dir)) return -1;
    if (!dir[0]) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "rl.save: no dir");
    return rlw_save(r->eng, role, dir, ff_task_comm(t));
}

static int k_digest(ff_task *t, void *ud) {
    ff_rlworker *r = ud;
    unsigned role;
    if (!role_arg(t, FF_RL_ACTOR | FF_RL_GEN | FF_RL_CRITIC | FF_RL_REF | FF_RL_REWARD, &role)) return -1;
    uint64_t h;
    double s;
    if (rlw_digest(r->eng, role, &h, &s) != 0) return -1;
    int64_t *ho = ff_task_output(t, "hash", FF_DTYPE_I64, 1, (int64_t[]){1});
    double *so = ff_task_output(t, "sum", FF_DTYPE_F64, 1, (int64_t[]){1});
    if (!ho || !so) return -1;
    memcpy(ho, &h, sizeof h);
    *so = s;
    return 0;
}

int ff_rlworker_register(ff_rlworker *r, ff_worker *w) {
    static const struct {
        const char *kind;
        ff_task_fn fn;
    } kinds[] = {{FF_RL_INIT, k_init},       {FF_RL_GENERATE, k_generate}, {FF_RL_LOGPROB, k_logprob},
                 {FF_RL_VALUE, k_value},     {FF_RL_SCORE, k_score},       {FF_RL_TRAIN, k_train}, {FF_RL_TRAIN_FUSED, k_train_fused},
                 {FF_RL_SYNC, k_sync},       {FF_RL_SAVE, k_save},         {FF_RL_DIGEST, k_digest},
                 {FF_RL_MIGRATE_OUT, k_migrate_out}, {FF_RL_MIGRATE_IN, k_migrate_in}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        if (ff_worker_register(w, kinds[i].kind, kinds[i].fn, r, 0) != 0) return -1;
    ff_worker_set_step(w, step, r);
    return 0;
}

int ff_rlworker_setup(ff_worker *w, void *ud) { return ff_rlworker_register(ud, w); }

/* Resharding (fuseflow/reshard.h) across processes over ff_coll's cpu backend: each rank a
 * forked process holding a training shard (TP t x PP p) of weights W1 and a generation shard
 * (TP tg x PP pg) created from other weights W0. After the transition every generation shard
 * must be byte-equal to slicing the whole W1 in the generation layout (a model built from
 * the whole tensors), and each rank must have received, counted, exactly its generation shard
 * minus the training shard it held: 4 (P_gen - P_train) bytes for parameter counts P (the
 * formula M/(tg pg) - M/(t p) with the exact shard sizes; a stage's tied copy of the embedding
 * is held data too), by the plan and by the run.
 *
 * Colocated layouts follow HybridFlow's mapping (docs/planner.md "Resharding"): training rank
 * i + t s, generation TP index i / (t/tg), stage s / (p/pg), micro-DP groups of t/tg
 * neighbouring TP ranks x p/pg neighbouring stages, the gather inside each. Also: replicated
 * key/value heads (t > num_key_value_heads), tied embeddings over stages, bf16 on the wire
 * (equal to rounding W1 to bf16), a generation pool on ranks of its own (each generation rank
 * receives all of its shard, no rank sends more than its shard per receiver), and a layout
 * pair that does not cover (refused, naming the tensor), and small buckets (several groups of
 * sends and receives per run, each rank cutting its own). Memory: the generation copy's
 * parameters are released between syncs (0 bytes) and restored for the transition, so the
 * peak is the training shard + its gradients + optimizer state, or those + the generation
 * shard; never a whole model unless tg pg = 1.
 *
 * Delta syncs (opts.delta) into a pool of its own, TP 2 -> 2 x TP 1, fp32 and bf16 on the
 * wire, in small buckets: over several syncs (the first, none changed, small updates of a few elements, all
 * changed, a receiver's copy corrupted) the delta copy equals a dense sync's bit for bit;
 * the stats show the first sync dense, an unchanged one sparse with nothing changed and the
 * bytes saved, small updates sparse, a large one dense by choice, and the corrupted copy
 * caught by the hash and resent dense (the next sync clean again).
 *
 * Every case runs twice: through host memory, and with opts.device (each piece packed, moved
 * and unpacked in the models' buffers; the cpu ff_coll reads the cpu backend's memory): the
 * same bits and bytes. Two cases sync into a generation copy with bf16 weights (fp32 and
 * bf16 on the wire). opts.device with delta is refused. */
#include <inttypes.h>

#include "fuseflow/backend.h"
#include "fuseflow/model.h"
#include "fuseflow/reshard.h"
#include "tests/coll/coll_test.h"
#include "tests/model/model_test_util.h"

typedef struct tcase {
    const char *name;
    int t, p, tg, pg;  /* training and generation layouts */
    int pool;          /* > 0: generation on pool ranks of their own (pool = their count, dp = pool / (tg pg)) */
    int layers, kv;
    bool tied, bf16;
    bool bad;          /* a generation layout the training shards do not cover inside the groups */
    int64_t bucket;    /* staging per bucket (0: the default, one bucket for these models) */
    bool w16;          /* the generation copy holds bf16 weights (ff_model_opts.bf16_weights) */
    bool device;       /* opts.device: every piece moved on the models' backend (run_cases sets it) */
} tcase;

/* ff_model_comm on ff_coll */
static int c_sum(void *c, float *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F32, FF_COLL_SUM, c, NULL); }
static int c_max(void *c, float *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F32, FF_COLL_MAX, c, NULL); }
static int c_sum64(void *c, double *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F64, FF_COLL_SUM, c, NULL); }
static int c_gather(void *c, const float *in, float *out, size_t n) { return ff_coll_all_gather(in, out, n, FF_DTYPE_F32, c, NULL); }

static ff_model_comm mcomm(ff_coll_comm *c) {
    return (ff_model_comm){.rank = c ? ff_coll_comm_rank(c) : 0, .size = c ? ff_coll_comm_size(c) : 1, .ctx = c,
                           .all_reduce_sum = c_sum, .all_reduce_max = c_max, .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather};
}

/* A model of layout (tp rank of tp, stage s of pp: layers split evenly) from whole weights. */
static ff_model *shard_model(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *w, ff_coll_comm *tp, int s, int pp,
                             bool inference, bool w16) {
    int32_t first = s * (cfg->num_hidden_layers / pp), count = cfg->num_hidden_layers / pp;
    ff_model_stage st = {.n_chunks = 1, .first_layer = &first, .n_layers = &count};
    ff_model_comm mc = mcomm(tp);
    ff_model_opts o = {.inference = inference, .comm = tp && ff_coll_comm_size(tp) > 1 ? &mc : NULL, .stage = pp > 1 ? &st : NULL,
                       .bf16_weights = w16};
    return ff_model_new_opts(be, cfg, w, &o);
}

static int64_t shard_numel_of(const ff_model_tensor_info *t) {
    if (t->axis < 0) return t->full[0] * t->full[1];
    return t->axis == 0 ? t->len * t->full[1] : t->full[0] * t->len;
}

/* parameters excluding a pipeline stage's tied copy (the bytes of the shard proper) */
static int64_t own_params(const ff_model *m) {
    int64_t n = ff_model_param_count(m);
    for (int i = 0; i < ff_model_n_tensors(m); i++) {
        ff_model_tensor_info t;
        ff_model_tensor_info_of(m, i, &t);
        if (t.copy) n -= t.axis == 0 ? t.len * t.full[1] : t.full[0] * t.full[1];
    }
    return n;
}

static int rank_main(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg) {
    (void)id;
    const tcase *c = arg;
    int fails = 0;
    ff_model_config cfg = tiny_config(64, 32, 64, c->layers, 4, c->kv, c->tied, false, false);
    ff_backend *be = ff_backend_new("cpu:1");
    ff_tensor_set *w1 = ff_tensor_set_new(), *w0 = ff_tensor_set_new();
    REQUIRE(be && w1 && w0 && ff_model_init_weights(&cfg, 11, 0.2, w1) == 0 && ff_model_init_weights(&cfg, 12, 0.2, w0) == 0);
    const int ntrain = c->t * c->p;
    const bool trains = rank < ntrain, gens = c->pool ? rank >= ntrain : true;
    /* the training place (rank = i + t s) and, colocated, HybridFlow's generation place */
    const int i = rank % c->t, s = rank / c->t % c->p;
    const int a = c->t / c->tg, b = c->p / c->pg;
    int ig, sg, rep;
    if (c->pool) {
        const int k = rank - ntrain;
        ig = k % c->tg, sg = k / c->tg % c->pg, rep = k / (c->tg * c->pg);
    } else if (c->bad) { /* contiguous generation TP groups: rank i's shard is i / tg's, not i / (t / tg)'s */
        ig = i % c->tg, sg = s / b, rep = (i / c->tg) + a * (s % b);
    } else {
        ig = i / a, sg = s / b, rep = (i % a) + a * (s % b);
    }
    /* the groups: training TP (colour: stage), generation TP (colour: replica, stage) */
    ff_coll_comm *tp = NULL, *gtp = NULL, *group = NULL;
    REQUIRE(ff_coll_comm_split(comm, trains ? s : FF_COLL_SPLIT_NOCOLOR, i, &tp) == 0);
    REQUIRE(ff_coll_comm_split(comm, gens ? rep * c->pg + sg : FF_COLL_SPLIT_NOCOLOR, ig, &gtp) == 0);
    /* the transition's group: the micro-DP group (colocated), everyone (a pool of its own) */
    if (c->pool) group = comm;
    else REQUIRE(ff_coll_comm_split(comm, sg * c->tg + ig, rep, &group) == 0);
    ff_model *src = trains ? shard_model(be, &cfg, w1, tp, s, c->p, false, false) : NULL;
    ff_model *dst = gens ? shard_model(be, &cfg, w0, gtp, sg, c->pg, true, c->w16) : NULL;
    ff_model *ref = gens ? shard_model(be, &cfg, w1, gtp, sg, c->pg, true, c->w16) : NULL; /* w16: rounded as it loads */
    REQUIRE((!trains || src) && (!gens || (dst && ref)));
    ff_optimizer *opt = NULL;
    if (src) {
        ff_adamw_config ac;
        ff_adamw_config_default(&ac);
        REQUIRE((opt = ff_optimizer_new(src, &ac)));
    }
    /* memory: training (the copy released), then the transition (restored) */
    ff_model_memory ms = {0}, md = {0};
    if (src) ff_model_memory_of(src, &ms);
    const int64_t train_bytes = ms.params + ms.grads + (opt ? ff_optimizer_state_bytes(opt) : 0);
    if (dst) {
        RCHECK(ff_model_release_params(dst) == 0 && !ff_model_params_held(dst), "release: %s", ff_error_message());
        ff_model_memory_of(dst, &md);
        RCHECK(md.params == 0, "a released copy holds %" PRId64 " parameter bytes", md.params);
        RCHECK(ff_model_restore_params(dst) == 0 && ff_model_params_held(dst), "restore: %s", ff_error_message());
        ff_model_memory_of(dst, &md);
    }
    if (src) RCHECK(ff_model_release_params(src) != 0, "a trainable model gave its parameters back");
    ff_error_clear();

    const ff_reshard_opts ro = {.bf16 = c->bf16, .bucket_bytes = c->bucket, .device = c->device};
    ff_reshard_plan *plan = ff_reshard_plan_new(group, src, dst, &ro);
    if (c->bad) {
        /* a rank whose generation shard lies partly outside its group's training shards */
        RCHECK(!plan && strstr(ff_error_message(), "no rank of the group holds"), "a layout pair that does not cover: %s",
               plan ? "planned" : ff_error_message());
        goto done;
    }
    RCHECK(plan, "plan: %s", ff_error_message());
    if (!plan) goto done;
    /* small buckets: each rank cuts its own (its shards differ), several per run */
    if (c->bucket) RCHECK(ff_reshard_plan_buckets(plan) > 4, "%" PRId64 " buckets of %" PRId64 " bytes", ff_reshard_plan_buckets(plan), c->bucket);
    else RCHECK(ff_reshard_plan_buckets(plan) == 1, "%" PRId64 " buckets of the default size", ff_reshard_plan_buckets(plan));
    ff_reshard_stats st;
    RCHECK(ff_reshard_run(plan, src, dst, &st) == 0, "run: %s", ff_error_message());
    /* bytes: the plan's and the run's, against the formula */
    const int64_t es = c->bf16 ? 2 : 4;
    /* every piece of the training shard (a stage's tied copy too) lies in the generation shard */
    const int64_t want = dst ? es * (ff_model_param_count(dst) - (src ? ff_model_param_count(src) : 0)) : 0;
    RCHECK(st.received == want && ff_reshard_plan_received(plan) == want,
           "received %" PRId64 " bytes (plan %" PRId64 "), formula %" PRId64, st.received, ff_reshard_plan_received(plan), want);
    RCHECK(st.sent == ff_reshard_plan_sent(plan), "sent %" PRId64 ", plan %" PRId64, st.sent, ff_reshard_plan_sent(plan));
    if (c->pool && src) /* each generation replica takes each piece from one training rank */
        RCHECK(st.sent <= es * own_params(src) * (c->pool / (c->tg * c->pg)), "a training rank sent %" PRId64 " bytes", st.sent);
    /* the weights: byte-equal to slicing W1 (rounded to bf16 on the wire) */
    if (dst) {
        const int64_t n = ff_model_param_count(dst);
        float *got = malloc((size_t)n * sizeof *got), *exp = malloc((size_t)n * sizeof *exp);
        REQUIRE(got && exp && n == ff_model_param_count(ref));
        ff_model_read_params(dst, got);
        ff_model_read_params(ref, exp);
        if (c->bf16)
            for (int64_t k = 0; k < n; k++) exp[k] = ff_bf16_to_f32(ff_f32_to_bf16(exp[k]));
        int64_t diff = 0;
        for (int64_t k = 0; k < n; k++) diff += memcmp(&got[k], &exp[k], sizeof(float)) != 0;
        RCHECK(diff == 0, "%" PRId64 " of %" PRId64 " parameters differ from slicing the trained weights", diff, n);
        free(got), free(exp);
        /* peak weight memory: the training shard + gradients + optimizer, or those + the
         * generation shard, which is a whole model only at tg pg = 1 */
        const int64_t whole = 4 * own_params(ref) * c->tg * c->pg; /* about: norms are replicated */
        if (!c->w16) RCHECK(md.params == 4 * ff_model_param_count(ref), "the copy holds %" PRId64 " bytes", md.params);
        if (c->tg * c->pg > 1) RCHECK(md.params < 4 * ff_model_param_count(ref) * c->tg * c->pg && md.params < whole + 1,
                                      "the generation shard is %" PRId64 " bytes", md.params);
        if (getenv("FF_TEST_VERBOSE"))
            printf("%s rank %d: received %" PRId64 " B (%" PRId64 " messages), local %" PRId64 " B, peak %" PRId64
                   " B (training %" PRId64 " + generation %" PRId64 ")\n",
                   c->name, rank, st.received, st.messages, st.local, train_bytes + md.params, train_bytes, md.params);
    }
done:
    ff_reshard_plan_destroy(&plan);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&src), ff_model_destroy(&dst), ff_model_destroy(&ref);
    if (group != comm) ff_coll_comm_destroy(&group);
    ff_coll_comm_destroy(&tp), ff_coll_comm_destroy(&gtp);
    ff_tensor_set_destroy(&w1), ff_tensor_set_destroy(&w0);
    ff_backend_destroy(&be);
    (void)nranks;
    return fails;
}

/* ---- delta syncs --------------------------------------------------------------------- */

/* w -> w (1 + 1e-3) for about pct % of the elements, chosen by the value's bits and the sync
 * (replicas of a tensor change alike); pct 100: w (1.5) everywhere */
static void update(ff_model *m, int sync, int pct) {
    for (int i = 0; i < ff_model_n_tensors(m); i++) {
        ff_model_tensor_info t;
        ff_model_tensor_info_of(m, i, &t);
        const int64_t n = shard_numel_of(&t);
        float *v = malloc((size_t)n * sizeof *v);
        REQUIRE(v && ff_model_read_tensor(m, t.name, false, v) == 0);
        for (int64_t k = 0; k < n; k++) {
            uint32_t b;
            memcpy(&b, &v[k], 4);
            const uint64_t h = (b ^ (uint64_t)sync * 0x9e3779b97f4a7c15ULL) * 0xff51afd7ed558ccdULL;
            if (pct >= 100) v[k] *= 1.5f;
            else if ((int)((h >> 33) % 100) < pct) v[k] *= 1.001f;
        }
        REQUIRE(ff_model_write_tensor(m, t.name, v) == 0);
        free(v);
    }
}

static int delta_main(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg) {
    (void)id, (void)nranks;
    const bool bf16 = *(const bool *)arg;
    int fails = 0;
    ff_model_config cfg = tiny_config(64, 32, 64, 2, 4, 4, false, false, false);
    ff_backend *be = ff_backend_new("cpu:1");
    ff_tensor_set *w1 = ff_tensor_set_new(), *w0 = ff_tensor_set_new();
    REQUIRE(be && w1 && w0 && ff_model_init_weights(&cfg, 11, 0.2, w1) == 0 && ff_model_init_weights(&cfg, 12, 0.2, w0) == 0);
    const bool trains = rank < 2; /* TP 2 on ranks 0, 1; generation replicas TP 1 on 2, 3 */
    ff_coll_comm *tp = NULL;
    REQUIRE(ff_coll_comm_split(comm, trains ? 0 : FF_COLL_SPLIT_NOCOLOR, rank, &tp) == 0);
    ff_model *src = trains ? shard_model(be, &cfg, w1, tp, 0, 1, false, false) : NULL;
    ff_model *dd = trains ? NULL : shard_model(be, &cfg, w0, NULL, 0, 1, true, false); /* delta-synced */
    ff_model *dn = trains ? NULL : shard_model(be, &cfg, w0, NULL, 0, 1, true, false); /* dense-synced */
    REQUIRE(trains ? src != NULL : dd && dn);
    /* the delta plan in small buckets: senders (TP 2 shards) and receivers (whole tensors) cut
     * their own at different tensors, the plan at the union, so each round pairs up */
    ff_reshard_opts od = {.bf16 = bf16, .delta = true, .bucket_bytes = 4096}, on = {.bf16 = bf16};
    /* a delta sync's hashes are the host's: not on the device (refused on every rank before any collective) */
    ff_reshard_plan *pv = ff_reshard_plan_new(comm, src, dd, &(ff_reshard_opts){.delta = true, .device = true});
    RCHECK(!pv && strstr(ff_error_message(), "opts.device with delta"), "device with delta: %s", pv ? "planned" : ff_error_message());
    ff_reshard_plan_destroy(&pv);
    ff_reshard_plan *pd = ff_reshard_plan_new(comm, src, dd, &od), *pn = ff_reshard_plan_new(comm, src, dn, &on);
    REQUIRE(pd && pn);
    RCHECK(ff_reshard_plan_buckets(pd) > 4, "%" PRId64 " buckets", ff_reshard_plan_buckets(pd));
    const int64_t es = bf16 ? 2 : 4;
    RCHECK(ff_reshard_plan_kept_bytes(pd) == ff_reshard_plan_sent(pd) && ff_reshard_plan_kept_bytes(pn) == 0,
           "kept %" PRId64 " bytes, sent %" PRId64, ff_reshard_plan_kept_bytes(pd), ff_reshard_plan_sent(pd));
    if (src) RCHECK(ff_reshard_plan_kept_bytes(pd) > 0, "a sender keeps nothing");
    enum { FIRST, SAME, SMALL1, SMALL2, ALL, CORRUPT, AFTER, NSYNC };
    const int pct[NSYNC] = {0, 0, 2, 2, 100, 2, 2};
    const int64_t n = dd ? ff_model_param_count(dd) : 0;
    float *a = malloc((size_t)(n ? n : 1) * sizeof *a), *b = malloc((size_t)(n ? n : 1) * sizeof *b);
    REQUIRE(a && b);
    for (int k = 0; k < NSYNC; k++) {
        if (src && pct[k]) update(src, k, pct[k]);
        if (dd && k == CORRUPT && rank == 2) { /* one element of the first tensor off */
            ff_model_tensor_info t;
            ff_model_tensor_info_of(dd, 0, &t);
            float *v = malloc((size_t)shard_numel_of(&t) * sizeof *v);
            REQUIRE(v && ff_model_read_tensor(dd, t.name, false, v) == 0);
            v[0] += 1.0f;
            REQUIRE(ff_model_write_tensor(dd, t.name, v) == 0);
            free(v);
        }
        ff_reshard_stats sd, sn;
        RCHECK(ff_reshard_run(pd, src, dd, &sd) == 0 && ff_reshard_run(pn, src, dn, &sn) == 0, "sync %d: %s", k, ff_error_message());
        RCHECK(sd.bytes_saved == sn.received - sd.received, "sync %d: saved %" PRId64 ", dense %" PRId64 " - delta %" PRId64, k,
               sd.bytes_saved, sn.received, sd.received);
        if (!dd) continue;
        ff_model_read_params(dd, a), ff_model_read_params(dn, b);
        int64_t diff = 0;
        for (int64_t e = 0; e < n; e++) diff += memcmp(&a[e], &b[e], 4) != 0;
        RCHECK(diff == 0, "sync %d: %" PRId64 " of %" PRId64 " parameters differ from the dense sync's", k, diff, n);
        const int64_t pieces = sd.pieces_sparse + sd.pieces_dense; /* a resent piece counts dense */
        RCHECK(pieces == sn.messages && sn.received == es * n, "sync %d: %" PRId64 " pieces, dense %" PRId64 " messages", k, pieces,
               sn.messages);
        if (getenv("FF_TEST_VERBOSE"))
            printf("%s rank %d sync %d: %" PRId64 " of %" PRId64 " changed, %" PRId64 " sparse, %" PRId64 " dense, %" PRId64
                   " fallbacks, received %" PRId64 " B (dense %" PRId64 ")\n",
                   bf16 ? "bf16" : "fp32", rank, k, sd.delta_changed, sd.delta_elems, sd.pieces_sparse, sd.pieces_dense, sd.fallbacks,
                   sd.received, sn.received);
        const bool corrupt = k == CORRUPT && rank == 2;
        RCHECK(sd.fallbacks == (corrupt ? 1 : 0), "sync %d: %" PRId64 " fallbacks", k, sd.fallbacks);
        if (k == FIRST)
            RCHECK(sd.delta_elems == 0 && sd.pieces_sparse == 0 && sd.bytes_saved < 0, "the first sync: %" PRId64 " compared, %" PRId64 " sparse",
                   sd.delta_elems, sd.pieces_sparse);
        else
            RCHECK(sd.delta_elems == n, "sync %d: %" PRId64 " of %" PRId64 " elements compared", k, sd.delta_elems, n);
        if (k == SAME)
            RCHECK(sd.delta_changed == 0 && sd.pieces_dense == 0 && sd.received < sn.received / 20,
                   "nothing changed: %" PRId64 " changed, %" PRId64 " dense, %" PRId64 " B", sd.delta_changed, sd.pieces_dense, sd.received);
        if (k == SMALL1 || k == SMALL2 || k == AFTER)
            RCHECK(sd.delta_changed > 0 && sd.delta_changed < n / 10 && sd.pieces_sparse > 0 && sd.bytes_saved > sn.received / 2,
                   "sync %d, small: %" PRId64 " changed, %" PRId64 " sparse, saved %" PRId64 " B", k, sd.delta_changed, sd.pieces_sparse,
                   sd.bytes_saved);
        if (k == ALL)
            RCHECK(sd.delta_changed > n * 9 / 10 && sd.pieces_sparse == 0 && sd.received > sn.received,
                   "all changed: %" PRId64 " changed, %" PRId64 " sparse", sd.delta_changed, sd.pieces_sparse);
    }
    free(a), free(b);
    ff_reshard_plan_destroy(&pd), ff_reshard_plan_destroy(&pn);
    ff_model_destroy(&src), ff_model_destroy(&dd), ff_model_destroy(&dn);
    ff_coll_comm_destroy(&tp);
    ff_tensor_set_destroy(&w1), ff_tensor_set_destroy(&w0);
    ff_backend_destroy(&be);
    return fails;
}

int main(void) {
    const tcase cases[] = {
        {"TP2 PP2 -> TP1", 2, 2, 1, 1, 0, 4, 4, false, false, false, 0, false, false},
        {"TP2 PP2 -> TP1 in buckets of 8 KiB", 2, 2, 1, 1, 0, 4, 4, false, false, false, 8192, false, false},
        {"TP2 PP2 -> 2 x TP2 on a pool of its own in buckets of 8 KiB", 2, 2, 2, 1, 4, 4, 4, false, false, false, 8192, false, false},
        {"TP4 -> TP2", 4, 1, 2, 1, 0, 4, 4, false, false, false, 0, false, false},
        {"TP2 PP2 -> TP2", 2, 2, 2, 1, 0, 4, 4, false, false, false, 0, false, false},
        {"TP2 PP2 -> TP1 PP2", 2, 2, 1, 2, 0, 4, 4, false, false, false, 0, false, false},
        {"TP4 -> TP1, replicated KV heads", 4, 1, 1, 1, 0, 2, 2, false, false, false, 0, false, false},
        {"TP2 PP2 -> TP1, tied embeddings", 2, 2, 1, 1, 0, 4, 4, true, false, false, 0, false, false},
        {"TP2 -> TP1, bf16 on the wire", 2, 1, 1, 1, 0, 2, 4, false, true, false, 0, false, false},
        {"TP2 PP2 -> 2 x TP2 on a pool of its own", 2, 2, 2, 1, 4, 4, 4, false, false, false, 0, false, false},
        {"TP4 -> TP2 in contiguous groups (not covered)", 4, 1, 2, 1, 0, 2, 4, false, false, true, 0, false, false},
        {"TP2 PP2 -> TP1 into bf16 weights", 2, 2, 1, 1, 0, 4, 4, false, false, false, 0, true, false},
        {"TP2 PP2 -> TP2 into bf16 weights, bf16 on the wire, buckets of 8 KiB", 2, 2, 2, 1, 0, 4, 4, true, true, false, 8192, true, false},
    };
    /* each case through host memory, then on the models' backend (opts.device: the same bits,
     * the same bytes) */
    for (int dev = 0; dev < 2; dev++)
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            tcase c = cases[k];
            c.device = dev;
            run_opts ro = default_run();
            const int n = c.t * c.p + c.pool;
            int failed = run_ranks(n, &ro, rank_main, &c);
            CHECK(failed == 0);
            if (failed) fprintf(stderr, "case '%s'%s: %d of %d ranks failed\n", c.name, dev ? " on the device" : "", failed, n);
        }
    for (int k = 0; k < 2; k++) {
        const bool bf16 = k == 1;
        run_opts ro = default_run();
        int failed = run_ranks(4, &ro, delta_main, (void *)&bf16);
        CHECK(failed == 0);
        if (failed) fprintf(stderr, "delta syncs (%s): %d of 4 ranks failed\n", bf16 ? "bf16" : "fp32", failed);
    }
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

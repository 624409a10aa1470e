/* The weight transition train -> generate of an actor on the same ranks (issue 11, the
 * 3D-HybridEngine): 4 ranks, each a process with ff_coll's cpu backend over shared memory and
 * a cpu:1 backend, one model of a few hundred MB fp32, trained at TP 2 x PP 2 and generating
 * at TP 2 (micro-DP groups of 2) and at TP 1 (one group of 4). Three paths, the same models,
 * the same run:
 *   hybrid  ff_reshard inside the micro-DP groups of HybridFlow's mapping (the plan made once,
 *           outside the timing): each rank receives its generation shard minus its own; and
 *           the same with opts.device (every piece packed, moved and unpacked in the models'
 *           buffers, as workers sync now), beside it
 *   naive   every rank gathers the whole model (ff_reshard into a whole copy: M - M/(t p)
 *           received), then slices its generation shard out of it
 *   bcast   the sync fuseflow had before: each stage's TP group gathers whole tensors
 *           (ff_model_export_weights), each tensor is broadcast from its stage's TP rank 0 to
 *           every rank, which loads its slices (ff_model_load_weights)
 *   in place the same transition into a view of the training shard (ff_model_opts.view_of):
 *           its own buffer (given back and taken again before each run, as between syncs,
 *           untimed) receives the missing part; the local part is not copied. Beside it the weight
 *           bytes a rank holds while generating, measured (ff_model_memory_of): the separate
 *           copy's training shard + generation shard against the view's generation shard
 * and the formula's bytes per rank, M/(tg pg) - M/(t p), at the all-gather bandwidth measured
 * in the same micro-DP groups (ff_coll_all_gather_v of a training shard each, all groups at
 * once). Times are the slowest
 * rank's, the median of --reps runs.
 *
 * Delta syncs (ff_reshard_opts.delta), where they apply: a generation pool keeping its copy,
 * here TP 2 on ranks 0, 1 -> a whole copy on each of ranks 2, 3; per changed fraction (a part
 * of the elements scaled by 1.01, which changes their bf16 value), a delta sync against a
 * dense one of the same weights, bytes (the most one rank received) and time, bf16 and fp32.
 *
 *   bench_reshard [--hidden 1024] [--layers 8] [--reps 3]
 *
 * Offload (roles.actor.offload): on every rank at once, its training shard (trainable, AdamW)
 * gives its gradients back and moves its AdamW state to host memory, then takes both back:
 * the bytes and the slowest rank's time each way (on the CPU backend a memcpy between two
 * allocations; on a GPU the PCIe copy).
 *
 * Not here: a separate generation pool (tests/reshard), the run around it (fuseflow run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuseflow/backend.h"
#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/model.h"
#include "fuseflow/reshard.h"
#include "fuseflow/util.h"
#include "bench_util.h"

enum { RANKS = 4, MAXREPS = 16, NCASES = 2, NDELTA = 7 };

typedef struct opts {
    int hidden, layers, reps;
} opts;

typedef struct result {
    int ok;
    int64_t params; /* the whole model's */
    struct {
        double hybrid_s, naive_s, bcast_s, gather_bw; /* bytes/s one rank receives in an all-gather */
        double device_s; /* hybrid with opts.device: every piece moved in the models' buffers */
        int64_t hybrid_bytes, naive_bytes, bcast_bytes; /* the busiest rank's */
        int64_t gen_bytes, train_bytes;                 /* a generation and a training shard (rank 0's) */
        int64_t off_formula; /* the most a rank's received bytes differ from its shard difference */
        /* in place: the generation shard as a view of the training shard (ff_model_opts.view_of) */
        double inplace_s;
        int64_t inplace_bytes;                  /* the busiest rank's received */
        int64_t copy_weights, inplace_weights;  /* the most weight bytes a rank holds generating, measured */
        int64_t inplace_off;                    /* the most a rank's own view bytes differ from its received */
    } c[NCASES];
    struct {
        double dense_s, delta_s, changed; /* changed: the share of compared elements */
        int64_t dense_bytes, delta_bytes, kept_bytes;
    } d[NDELTA];
    /* roles.actor.offload on every rank at once: its training shard's AdamW state to host
     * memory and back, the gradients released and restored (the slowest rank's median) */
    double off_s, back_s;
    int64_t off_bytes, grad_bytes; /* rank 0's */
} result;

static const struct { int tg, pg; } cases[NCASES] = {{2, 1}, {1, 1}};
static const struct { bool bf16; double frac; } deltas[NDELTA] = {{true, 0}, {true, 0.001}, {true, 0.01}, {true, 0.1}, {true, 0.3}, {true, 1}, {false, 1}};
enum { T = 2, P = 2 };

static int c_sum(void *c, float *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F32, FF_COLL_SUM, c, NULL); }
static int c_max(void *c, float *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F32, FF_COLL_MAX, c, NULL); }
static int c_sum64(void *c, double *b, size_t n) { return ff_coll_all_reduce(b, b, n, FF_DTYPE_F64, FF_COLL_SUM, c, NULL); }
static int c_gather(void *c, const float *in, float *out, size_t n) { return ff_coll_all_gather(in, out, n, FF_DTYPE_F32, c, NULL); }

static ff_model *shard(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *w, ff_coll_comm *tp, ff_model_comm *mc, int s,
                       int pp, const ff_model *view_of) {
    int32_t first = s * (cfg->num_hidden_layers / pp), count = cfg->num_hidden_layers / pp;
    ff_model_stage st = {.n_chunks = 1, .first_layer = &first, .n_layers = &count};
    *mc = (ff_model_comm){.rank = tp ? ff_coll_comm_rank(tp) : 0, .size = tp ? ff_coll_comm_size(tp) : 1, .ctx = tp,
                          .all_reduce_sum = c_sum, .all_reduce_max = c_max, .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather};
    ff_model_opts o = {.inference = true, .comm = mc->size > 1 ? mc : NULL, .stage = pp > 1 ? &st : NULL, .view_of = view_of};
    return ff_model_new_opts(be, cfg, w, &o);
}

static double slowest(ff_coll_comm *c, double t) {
    ff_coll_all_reduce(&t, &t, 1, FF_DTYPE_F64, FF_COLL_MAX, c, NULL);
    return t;
}
static int64_t most(ff_coll_comm *c, int64_t b) {
    ff_coll_all_reduce(&b, &b, 1, FF_DTYPE_I64, FF_COLL_MAX, c, NULL);
    return b;
}
/* dst's shard of every tensor out of a whole model on this rank (host copies, no checks) */
static int slice_from(ff_model *whole, ff_model *dst, float *full, float *part) {
    for (int i = 0; i < ff_model_n_tensors(dst); i++) {
        ff_model_tensor_info t;
        ff_model_tensor_info_of(dst, i, &t);
        if (ff_model_read_tensor(whole, t.name, false, full) != 0) return -1;
        const float *from = full;
        if (t.axis == 0) {
            from = full + t.start * t.full[1];
        } else if (t.axis == 1) {
            for (int64_t r = 0; r < t.full[0]; r++) memcpy(part + r * t.len, full + r * t.full[1] + t.start, (size_t)t.len * 4);
            from = part;
        }
        if (ff_model_write_tensor(dst, t.name, from) != 0) return -1;
    }
    return 0;
}

/* fuseflow's sync before resharding (rlw_sync_bcast): the stage's TP group exports whole
 * tensors, each goes from its stage's TP rank 0 to every rank, which loads its slices */
static int bcast_path(ff_coll_comm *world, ff_model *src, ff_model *dst, ff_tensor_set *order, int tp_rank, int64_t *got) {
    ff_tensor_set *whole = ff_tensor_set_new();
    int rc = whole ? ff_model_export_weights(src, whole) : -1;
    const int me = ff_coll_comm_rank(world), n = ff_coll_comm_size(world);
    double *owner = ff_calloc(order->n, sizeof *owner);
    if (!owner) rc = -1;
    for (size_t i = 0; rc == 0 && i < order->n; i++) {
        ff_host_tensor *e = ff_tensor_set_find(whole, order->items[i].name);
        if (e && tp_rank == 0) {
            memcpy(order->items[i].data, e->data, (size_t)ff_host_tensor_numel(e) * sizeof(float));
            owner[i] = me + 1;
        }
    }
    ff_tensor_set_destroy(&whole);
    if (rc == 0) rc = ff_coll_all_reduce(owner, owner, order->n, FF_DTYPE_F64, FF_COLL_SUM, world, NULL);
    *got = 0;
    for (size_t i = 0; rc == 0 && i < order->n; i++) {
        const int root = (int)owner[i] - 1;
        if (root < 0 || root >= n) rc = ff_error_set("bench", NULL, "tensor %s has no sender", order->items[i].name);
        else rc = ff_coll_broadcast(order->items[i].data, order->items[i].data, (size_t)ff_host_tensor_numel(&order->items[i]),
                                    FF_DTYPE_F32, root, world, NULL);
        if (root != me) *got += ff_host_tensor_numel(&order->items[i]) * 4;
    }
    free(owner);
    return rc == 0 ? ff_model_load_weights(dst, order) : -1;
}

/* about frac of m's elements scaled by 1.01 (chosen by position and round) */
static int perturb(ff_model *m, double frac, int round, float *buf) {
    const uint64_t cut = (uint64_t)(frac * 1e6);
    for (int i = 0; i < ff_model_n_tensors(m); i++) {
        ff_model_tensor_info t;
        ff_model_tensor_info_of(m, i, &t);
        const int64_t n = t.axis < 0 ? t.full[0] * t.full[1] : t.axis == 0 ? t.len * t.full[1] : t.full[0] * t.len;
        if (ff_model_read_tensor(m, t.name, false, buf)) return -1;
        for (int64_t k = 0; k < n; k++) {
            const uint64_t h = ((uint64_t)k * FF_SPLITMIX64_GAMMA + (uint64_t)round * 0xff51afd7ed558ccdULL + (uint64_t)i) * 0xc4ceb9fe1a85ec53ULL;
            if ((h >> 20) % 1000000 < cut) buf[k] *= 1.01f;
        }
        if (ff_model_write_tensor(m, t.name, buf)) return -1;
    }
    return 0;
}

/* The delta section: TP 2 on ranks 0, 1 (src2) -> a whole copy on ranks 2, 3 (whole). */
static int delta_section(const opts *o, ff_coll_comm *world, ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *w,
                         ff_model *whole, float *buf, result *out) {
    const int rank = ff_coll_comm_rank(world);
    ff_coll_comm *tp = NULL;
    ff_model_comm mc;
    if (ff_coll_comm_split(world, rank < 2 ? 0 : FF_COLL_SPLIT_NOCOLOR, rank, &tp)) return -1;
    ff_model *src = rank < 2 ? shard(be, cfg, w, tp, &mc, 0, 1, NULL) : NULL, *dst = rank < 2 ? NULL : whole;
    if (rank < 2 && !src) return -1;
    for (int c = 0; c < NDELTA; c++) {
        const ff_reshard_opts od = {.bf16 = deltas[c].bf16, .delta = true}, on = {.bf16 = deltas[c].bf16};
        ff_reshard_plan *pd = ff_reshard_plan_new(world, src, dst, &od), *pn = pd ? ff_reshard_plan_new(world, src, dst, &on) : NULL;
        ff_reshard_stats st;
        if (!pn || ff_reshard_run(pd, src, dst, &st)) return -1; /* the base: a first (dense) run */
        double td[MAXREPS], tn[MAXREPS], ch = 0;
        int64_t bd = 0, bn = 0;
        for (int r = 0; r < o->reps; r++) {
            if (src && perturb(src, deltas[c].frac, c * MAXREPS + r, buf)) return -1;
            barrier(world);
            int64_t t0 = ff_now_ns();
            if (ff_reshard_run(pd, src, dst, &st)) return -1;
            td[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
            bd = most(world, st.received);
            double f[2] = {(double)st.delta_changed, (double)st.delta_elems};
            ff_coll_all_reduce(f, f, 2, FF_DTYPE_F64, FF_COLL_SUM, world, NULL);
            ch = f[1] > 0 ? f[0] / f[1] : 0;
            barrier(world);
            t0 = ff_now_ns();
            if (ff_reshard_run(pn, src, dst, &st)) return -1;
            tn[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
            bn = most(world, st.received);
        }
        out->d[c].delta_s = median(td, o->reps), out->d[c].dense_s = median(tn, o->reps), out->d[c].changed = ch;
        out->d[c].delta_bytes = bd, out->d[c].dense_bytes = bn, out->d[c].kept_bytes = most(world, ff_reshard_plan_kept_bytes(pd));
        ff_reshard_plan_destroy(&pd), ff_reshard_plan_destroy(&pn);
    }
    ff_model_destroy(&src);
    ff_coll_comm_destroy(&tp);
    return 0;
}

/* The colocated actor's moves for generation (roles.actor.offload) on a trainable training
 * shard: one untimed round first so that the state's pages are real (not calloc's zero pages),
 * then --reps rounds, all ranks at once. */
static int offload_section(const opts *o, ff_coll_comm *world, ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *w,
                           ff_coll_comm *tp, int s, result *out) {
    int32_t first = s * (cfg->num_hidden_layers / P), count = cfg->num_hidden_layers / P;
    ff_model_stage st = {.n_chunks = 1, .first_layer = &first, .n_layers = &count};
    ff_model_comm mc = {.rank = ff_coll_comm_rank(tp), .size = ff_coll_comm_size(tp), .ctx = tp, .all_reduce_sum = c_sum,
                        .all_reduce_max = c_max, .all_reduce_sum_f64 = c_sum64, .all_gather = c_gather};
    ff_model_opts mo = {.comm = &mc, .stage = &st};
    ff_model *m = ff_model_new_opts(be, cfg, w, &mo);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ff_optimizer *opt = m ? ff_optimizer_new(m, &ac) : NULL;
    if (!opt) return 1;
    ff_offload_stats os;
    if (ff_optimizer_offload(opt, &os) || ff_optimizer_reload(opt, &os)) return 1;
    double t_off[MAXREPS], t_back[MAXREPS];
    for (int r = 0; r < o->reps; r++) {
        barrier(world);
        int64_t t0 = ff_now_ns();
        if (ff_model_release_grads(m) || ff_optimizer_offload(opt, &os)) return 1;
        t_off[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
        barrier(world);
        t0 = ff_now_ns();
        if (ff_model_restore_grads(m) || ff_optimizer_reload(opt, &os)) return 1;
        t_back[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
    }
    out->off_s = median(t_off, o->reps), out->back_s = median(t_back, o->reps);
    if (ff_coll_comm_rank(world) == 0) out->off_bytes = os.bytes, out->grad_bytes = 4 * ff_model_param_count(m);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    return 0;
}

static int rank_main(const opts *o, int rank, const ff_coll_id *id, result *out) {
    ff_coll_options co = {.timeout_s = 600};
    ff_coll_comm *world = NULL;
    ff_backend *be = NULL;
    if (ff_coll_comm_init(&world, RANKS, id, rank, &co) || !(be = ff_backend_new("cpu:1"))) return 1;
    ff_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.model_type, sizeof cfg.model_type, "llama");
    cfg.vocab_size = 8192, cfg.hidden_size = o->hidden, cfg.intermediate_size = o->hidden * 11 / 4;
    cfg.num_hidden_layers = o->layers, cfg.num_attention_heads = o->hidden / 64, cfg.num_key_value_heads = o->hidden / 128;
    cfg.max_position_embeddings = 512, cfg.rope_theta = 10000.0, cfg.rms_norm_eps = 1e-5, cfg.bos_token_id = cfg.pad_token_id = -1;
    ff_tensor_set *w = ff_tensor_set_new();
    if (!w || ff_model_init_weights(&cfg, 1, 0.02, w)) return 1;
    const int i = rank % T, s = rank / T;
    ff_coll_comm *tp = NULL;
    ff_model_comm mc_src;
    if (ff_coll_comm_split(world, s, i, &tp)) return 1;
    ff_model *src = shard(be, &cfg, w, tp, &mc_src, s, P, NULL);
    ff_tensor_set *order = ff_tensor_set_new();
    if (!src || !order || ff_model_expected_tensors(&cfg, order)) return 1;
    ff_model_comm mc_whole;
    ff_model *whole = shard(be, &cfg, w, NULL, &mc_whole, 0, 1, NULL);
    if (!whole) return 1;
    out->params = ff_model_param_count(whole);
    int64_t maxn = 0;
    for (size_t k = 0; k < order->n; k++)
        if (ff_host_tensor_numel(&order->items[k]) > maxn) maxn = ff_host_tensor_numel(&order->items[k]);
    float *full = ff_malloc((size_t)maxn * 4), *part = ff_malloc((size_t)maxn * 4);
    if (!full || !part) return 1;
    for (int c = 0; c < NCASES; c++) {
        const int tg = cases[c].tg, pg = cases[c].pg, a = T / tg, b = P / pg;
        const int ig = i / a, sg = s / b, rep = i % a + a * (s % b);
        ff_coll_comm *gtp = NULL, *mdp = NULL;
        ff_model_comm mc_dst;
        if (ff_coll_comm_split(world, rep * pg + sg, ig, &gtp) || ff_coll_comm_split(world, sg * tg + ig, rep, &mdp)) return 1;
        ff_model_comm mc_view;
        ff_model *dst = shard(be, &cfg, w, gtp, &mc_dst, sg, pg, NULL), *view = dst ? shard(be, &cfg, w, gtp, &mc_view, sg, pg, src) : NULL;
        ff_reshard_plan *hy = view ? ff_reshard_plan_new(mdp, src, dst, NULL) : NULL;
        ff_reshard_plan *nv = hy ? ff_reshard_plan_new(world, src, whole, NULL) : NULL;
        ff_reshard_plan *ip = nv ? ff_reshard_plan_new(mdp, src, view, NULL) : NULL;
        ff_reshard_plan *dv = ip ? ff_reshard_plan_new(mdp, src, dst, &(ff_reshard_opts){.device = true}) : NULL;
        if (!dv) {
            fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
            return 1;
        }
        double th[MAXREPS], tn[MAXREPS], tb[MAXREPS], ti[MAXREPS], tv[MAXREPS];
        ff_reshard_stats st;
        int64_t got_b = 0, got_n = 0;
        for (int r = 0; r < o->reps; r++) {
            barrier(world);
            int64_t t0 = ff_now_ns();
            if (ff_reshard_run(hy, src, dst, &st)) return 1;
            th[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
            out->c[c].hybrid_bytes = most(world, st.received);
            barrier(world);
            t0 = ff_now_ns();
            if (ff_reshard_run(dv, src, dst, &st)) return 1;
            tv[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
            barrier(world);
            t0 = ff_now_ns();
            if (ff_reshard_run(nv, src, whole, &st) || slice_from(whole, dst, full, part)) return 1;
            tn[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
            got_n = st.received;
            barrier(world);
            t0 = ff_now_ns();
            if (bcast_path(world, src, dst, order, i, &got_b)) return 1;
            tb[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
            /* in place: gather the missing part into the view's own buffer (given back and
             * taken again first, as between syncs; the copy's is not, so neither is timed) */
            if (ff_model_release_params(view) || ff_model_restore_params(view)) return 1;
            barrier(world);
            t0 = ff_now_ns();
            if (ff_reshard_run(ip, src, view, &st)) return 1;
            ti[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
            out->c[c].inplace_bytes = most(world, st.received);
        }
        out->c[c].inplace_s = median(ti, o->reps);
        {
            ff_model_memory ms, md, mv;
            ff_model_memory_of(src, &ms), ff_model_memory_of(dst, &md), ff_model_memory_of(view, &mv);
            out->c[c].copy_weights = most(world, ms.params + md.params);
            out->c[c].inplace_weights = most(world, ms.params + mv.params);
            const int64_t d = mv.params - st.received;
            out->c[c].inplace_off = most(world, d < 0 ? -d : d);
        }
        out->c[c].device_s = median(tv, o->reps);
        out->c[c].hybrid_s = median(th, o->reps), out->c[c].naive_s = median(tn, o->reps), out->c[c].bcast_s = median(tb, o->reps);
        out->c[c].naive_bytes = most(world, got_n), out->c[c].bcast_bytes = most(world, got_b);
        out->c[c].gen_bytes = ff_model_param_count(dst) * 4, out->c[c].train_bytes = ff_model_param_count(src) * 4;
        /* bytes = formula on every rank: its generation shard minus its training shard */
        if (ff_reshard_run(hy, src, dst, &st)) return 1;
        int64_t off = st.received - 4 * (ff_model_param_count(dst) - ff_model_param_count(src));
        out->c[c].off_formula = most(world, off < 0 ? -off : off);
        /* the all-gather bandwidth in the micro-DP groups (all at once, as the transition):
         * a training shard each, every group's ranks with the same count */
        const int dg = ff_coll_comm_size(mdp);
        const size_t D = (size_t)most(world, ff_model_param_count(src));
        float *in = ff_malloc(D * 4), *ag = ff_malloc(D * 4 * (size_t)dg);
        size_t counts[RANKS];
        for (int k = 0; k < dg; k++) counts[k] = D;
        if (!in || !ag) return 1;
        memset(in, 0, D * 4);
        double tg_s[MAXREPS];
        for (int r = 0; r < o->reps; r++) {
            barrier(world);
            int64_t t0 = ff_now_ns();
            if (ff_coll_all_gather_v(in, ag, counts, FF_DTYPE_F32, mdp, NULL)) return 1;
            tg_s[r] = slowest(world, (double)(ff_now_ns() - t0) * 1e-9);
        }
        out->c[c].gather_bw = (double)((size_t)(dg - 1) * D * 4) / median(tg_s, o->reps);
        free(in), free(ag);
        ff_reshard_plan_destroy(&hy), ff_reshard_plan_destroy(&nv), ff_reshard_plan_destroy(&ip), ff_reshard_plan_destroy(&dv);
        ff_model_destroy(&view), ff_model_destroy(&dst);
        ff_coll_comm_destroy(&gtp), ff_coll_comm_destroy(&mdp);
    }
    ff_model_destroy(&src);
    if (delta_section(o, world, be, &cfg, w, whole, full, out)) {
        fprintf(stderr, "rank %d: delta: %s\n", rank, ff_error_message());
        return 1;
    }
    if (offload_section(o, world, be, &cfg, w, tp, s, out)) {
        fprintf(stderr, "rank %d: offload: %s\n", rank, ff_error_message());
        return 1;
    }
    free(full), free(part);
    ff_model_destroy(&whole);
    ff_tensor_set_destroy(&w), ff_tensor_set_destroy(&order);
    ff_coll_comm_destroy(&tp);
    ff_coll_comm_destroy(&world);
    ff_backend_destroy(&be);
    if (rank == 0) out->ok = 1;
    return 0;
}

int main(int argc, char **argv) {
    opts o = {.hidden = 1024, .layers = 8, .reps = 3};
    for (int k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "--hidden") && k + 1 < argc) o.hidden = atoi(argv[++k]);
        else if (!strcmp(argv[k], "--layers") && k + 1 < argc) o.layers = atoi(argv[++k]);
        else if (!strcmp(argv[k], "--reps") && k + 1 < argc) o.reps = atoi(argv[++k]);
        else {
            printf("usage: bench_reshard [--hidden 1024] [--layers 8] [--reps 3]\n");
            return strcmp(argv[k], "--help") && strcmp(argv[k], "-h") ? 2 : 0;
        }
    }
    if (o.hidden < 128 || o.hidden % 128 || o.layers < P || o.layers % P || o.reps < 1 || o.reps > MAXREPS) {
        fprintf(stderr, "bench_reshard: need --hidden a multiple of 128, --layers a multiple of %d, 1 <= --reps <= %d\n", P, MAXREPS);
        return 2;
    }
    result *res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) return 1;
    memset(res, 0, sizeof *res);
    fflush(stdout);
    int pfd[2];
    if (pipe(pfd)) return 1;
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            ff_coll_id id;
            if (r == 0) { /* rank 0 makes the id: this process makes none, it forks */
                if (ff_coll_get_unique_id(&id, "cpu", NULL)) exit(1);
                for (int k = 1; k < RANKS; k++)
                    if (write(pfd[1], &id, sizeof id) != (ssize_t)sizeof id) exit(1);
            } else if (read(pfd[0], &id, sizeof id) != (ssize_t)sizeof id) {
                exit(1);
            }
            close(pfd[0]), close(pfd[1]);
            int rc = rank_main(&o, r, &id, res);
            if (rc) fprintf(stderr, "rank %d: %s\n", r, ff_error_message());
            exit(rc);
        }
    }
    close(pfd[0]), close(pfd[1]);
    int bad = 0;
    for (int r = 0; r < RANKS; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
    }
    if (bad || !res->ok) {
        fprintf(stderr, "bench_reshard: a rank failed\n");
        return 1;
    }
    const double M = (double)res->params * 4, MB = 1e6;
    printf("%d ranks (processes, ff_coll cpu over shared memory, cpu:1 each), %.1f M parameters = %.0f MB fp32, trained at "
           "TP %d x PP %d, median of %d\n",
           RANKS, (double)res->params / 1e6, M / MB, T, P, o.reps);
    for (int c = 0; c < NCASES; c++) {
        const int tg = cases[c].tg, pg = cases[c].pg;
        const double f = M / (tg * pg) - M / (T * P), tf = f / res->c[c].gather_bw;
        printf("-> TP %d x PP %d (micro-DP %d): hybrid %.1f ms (%.1f MB/rank), naive gather + slice %.1f ms (%.1f MB, %.2fx), "
               "broadcast %.1f ms (%.1f MB, %.2fx); formula %.1f MB/rank, %.1f ms at the groups' all-gather's %.2f GB/s (hybrid %.2fx it)\n",
               tg, pg, T * P / (tg * pg), res->c[c].hybrid_s * 1e3, (double)res->c[c].hybrid_bytes / MB, res->c[c].naive_s * 1e3,
               (double)res->c[c].naive_bytes / MB, res->c[c].naive_s / res->c[c].hybrid_s, res->c[c].bcast_s * 1e3,
               (double)res->c[c].bcast_bytes / MB, res->c[c].bcast_s / res->c[c].hybrid_s, f / MB, tf * 1e3,
               res->c[c].gather_bw / 1e9, res->c[c].hybrid_s / tf);
        printf("   hybrid on the models' buffers (opts.device: packed, moved and unpacked there, no host copy of a shard): "
               "%.1f ms, %.2fx the host-staged hybrid's\n",
               res->c[c].device_s * 1e3, res->c[c].device_s / res->c[c].hybrid_s);
        printf("   exact: each rank received its generation shard minus its training shard (rank 0: %.2f MB - %.2f MB), "
               "off by %lld bytes at most\n",
               (double)res->c[c].gen_bytes / MB, (double)res->c[c].train_bytes / MB, (long long)res->c[c].off_formula);
        printf("   in place (a view of the training shard): %.1f ms (%.1f MB/rank, %.2fx the copy's time); weights while generating "
               "%.1f MB/rank (the generation shard: formula %.1f MB) against the separate copy's %.1f MB (+ the training shard "
               "%.1f MB); the view's own bytes = its received bytes, off by %lld\n",
               res->c[c].inplace_s * 1e3, (double)res->c[c].inplace_bytes / MB, res->c[c].inplace_s / res->c[c].hybrid_s,
               (double)res->c[c].inplace_weights / MB, M / (tg * pg) / MB, (double)res->c[c].copy_weights / MB, M / (T * P) / MB,
               (long long)res->c[c].inplace_off);
    }
    printf("delta syncs, TP 2 -> 2 x TP 1 on a pool of its own (a whole copy per generation rank), the sender keeping %.1f MB "
           "(bf16) of what it sent:\n", (double)res->d[0].kept_bytes / MB);
    for (int c = 0; c < NDELTA; c++)
        printf("   %s, %5.1f%% changed: delta %.1f ms (%.2f MB/rank), dense %.1f ms (%.2f MB/rank): %.2fx the time, %.1f%% of the bytes\n",
               deltas[c].bf16 ? "bf16" : "fp32", res->d[c].changed * 100, res->d[c].delta_s * 1e3, (double)res->d[c].delta_bytes / MB,
               res->d[c].dense_s * 1e3, (double)res->d[c].dense_bytes / MB, res->d[c].dense_s / res->d[c].delta_s,
               100.0 * (double)res->d[c].delta_bytes / (double)res->d[c].dense_bytes);
    printf("reshard delta: at %.1f%% of bf16 values changed %.2fx a dense sync's speed with %.1f%% of its bytes; all changed %.2fx "
           "(target: bytes ~ the changed share; faster where the wire, not host staging, is the bottleneck)\n",
           res->d[2].changed * 100, res->d[2].dense_s / res->d[2].delta_s, 100.0 * (double)res->d[2].delta_bytes / (double)res->d[2].dense_bytes,
           res->d[5].dense_s / res->d[5].delta_s);
    printf("offload (roles.actor.offload), every rank at once: its training shard's AdamW %.1f MB to host memory and its "
           "gradients (%.1f MB) released in %.1f ms (%.2f GB/s), back in %.1f ms (%.2f GB/s)\n",
           (double)res->off_bytes / MB, (double)res->grad_bytes / MB, res->off_s * 1e3, (double)res->off_bytes / res->off_s / 1e9,
           res->back_s * 1e3, (double)res->off_bytes / res->back_s / 1e9);
    const double f0 = M / (cases[0].tg * cases[0].pg) - M / (T * P);
    printf("reshard: %.2fx faster than the full gather, %.1f MB/rank (formula %.1f MB); on the models' buffers %.2fx the "
           "host-staged time (target: bytes = formula)\n",
           res->c[0].naive_s / res->c[0].hybrid_s, (double)res->c[0].hybrid_bytes / MB, f0 / MB, res->c[0].device_s / res->c[0].hybrid_s);
    return 0;
}

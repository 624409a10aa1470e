/* A TP x PP x DP grid of training ranks as threads of one process, each with its own cpu:1
 * backend and ff_coll CPU communicators (the world split into its TP, PP and DP groups), for
 * tests/pipe/test_traffic.c, tests/pipe/test_grid_parity.c and bench/bench_parallel.c. A rank
 * is a stage model (ff_model_stage, with the TP communicator as ff_model_opts.comm) under the
 * pipeline executor (1F1B, or interleaved 1F1B with vpp chunks per stage, over the PP group's
 * ff_coll transport). Data parallelism: at ZeRO-0 a before_step hook sums the gradients over DP
 * (one fp32 all-reduce of the flat gradient buffer); at ZeRO-1 the optimizer does it
 * (ff_optimizer_opts.dp over the DP group: reduce-scatter, its range's step, all-gather). Every
 * callback is wrapped so each rank counts what it sends per dimension, as ring algorithms send
 * it (all-reduce 2 (k-1)/k of the buffer, reduce-scatter and all-gather (k-1) x a part, a send
 * its bytes), and the TP calls by (operation, count).
 *
 * Rank order as the planner's default (tp, cp, pp, dp innermost first): rank = t + TP (s + PP d).
 * Every rank makes the same whole weights and the same global batch of micro x dp micro-batches,
 * their loss coefficients normalised by the global batch's tokens; replica d runs micro-batches
 * [d micro, (d + 1) micro), so the sum over the replicas is the single rank's step on the whole
 * global batch. With keep, each rank exports what a parity test compares (pg_out below).
 *
 * Also here, for the benches: the single-rank step on the same global batch, and a median.
 * Not here: checks (the callers assert), GPipe. */
#ifndef FF_TEST_PIPE_GRID_H
#define FF_TEST_PIPE_GRID_H

#include <pthread.h>
#include <time.h>

#include "fuseflow/coll.h"
#include "tests/pipe/pipe_test_util.h"

enum { PG_MAXR = 16, PG_MAX_STEPS = 32, PG_MAX_TALLY = 64 };
typedef enum { PG_SUM, PG_MAX, PG_SUM64, PG_GATHER, PG_NOPS } pg_op;
static const char *const pg_op_name[PG_NOPS] = {"all-reduce sum f32", "all-reduce max f32", "all-reduce sum f64",
                                                "all-gather f32"};
typedef enum { PG_TP = 0, PG_PP, PG_DP, PG_NDIMS } pg_dim;

/* What one rank sent in one step. */
typedef struct pg_bytes {
    double dim[PG_NDIMS]; /* TP collectives, PP sends, DP gradient all-reduce */
    double pp_sums;       /* the PP group's f64 sums (gradient norm, the executor's closing loss and timings) */
    int64_t pp_sends, dp_calls;
    int tp_n; /* TP calls by (operation, count) */
    int tp_op[PG_MAX_TALLY];
    size_t tp_count[PG_MAX_TALLY];
    int64_t tp_calls[PG_MAX_TALLY];
} pg_bytes;

typedef struct pg_out {
    pg_bytes bytes;                          /* the last step's */
    ff_pipe_exec_stats stats[PG_MAX_STEPS]; /* the measured steps' */
    double cpu[PG_MAX_STEPS];                /* rank 0: the process's CPU seconds over each measured step (every rank's) */
    double sim, formula;                     /* bubble: simulated on the measured stage times, (p-1)/(m+p-1) */
    double loss;                             /* the first step's */
    int64_t params;                          /* ff_model_param_count of the rank's stage */
    int ok;
    /* keep: whole tensors (gathered over TP) of the rank's stage; outputs [global tokens], at
     * the offsets of the replica's micro-batches, filled on the last stage's ranks */
    float *lp, *ent;              /* the first step's log-probs and entropy */
    ff_tensor_set *grads;         /* after the first step (ZeRO-1: the owned range alone is summed) */
    ff_tensor_set *after, *optim; /* weights and AdamW state after the last step */
    int64_t state_bytes, lo, hi;  /* the optimizer's state bytes and its range of the flat buffer */
} pg_out;

typedef struct pg_job {
    const ff_model_config *cfg;
    int tp, pp, dp;
    int vpp;            /* chunks per stage: 0 or 1 1F1B, more interleaved 1F1B */
    int zero;           /* 0: the DP hook; 1: the ZeRO-1 optimizer over DP */
    int32_t micro, len; /* micro-batches per replica of 2 sequences of len tokens */
    int32_t max_len;    /* > 0: instead 1 .. 3 sequences of 2 .. max_len tokens each */
    double init_std;    /* of the initial weights (0: 0.02) */
    float temperature;  /* of log-probs and entropy (0: 1) */
    int steps;          /* measured steps, after one warm-up step when warmup */
    bool warmup;
    bool keep;          /* export the pg_out tensors (pg_job_clear frees them) */
    bool host_coll;     /* TP's and DP's collectives and PP's transfers through host memory (FF_DEVICE_COLL=0's
                         * way), else on the models' buffers (ff_model_comm's dev_ calls, the hook's all-reduce in
                         * place, ff_pipe_transport_coll_dev) as workers run them */
    ff_coll_id id;
    pg_out out[PG_MAXR];
} pg_job;

typedef struct pg_rank {
    pg_job *j;
    int rank, t, s, d;
    const pt_batch *g; /* the global batch; this replica's micro-batches from m0 */
    int32_t m0;
    ff_coll_comm *world, *tpc, *ppc, *dpc;
    ff_pipe_transport inner; /* ff_pipe_transport_coll on ppc (host_coll), else its device form */
    ff_pipe_coll_dev dev;
    pg_bytes cur;
    float *grads; /* [params]: the DP hook's staging, allocated once */
} pg_rank;

static inline void pg_ring(double *acc, int k, size_t n, size_t esize, bool gather) {
    if (k > 1) *acc += gather ? (double)(k - 1) * (double)n * (double)esize : 2.0 * (k - 1) / k * (double)n * (double)esize;
}

static inline void pg_tally(pg_rank *r, int op, size_t n) {
    pg_bytes *b = &r->cur;
    int i = 0;
    while (i < b->tp_n && !(b->tp_op[i] == op && b->tp_count[i] == n)) i++;
    REQUIRE(i < PG_MAX_TALLY);
    if (i == b->tp_n) b->tp_op[i] = op, b->tp_count[i] = n, b->tp_calls[i] = 0, b->tp_n++;
    b->tp_calls[i]++;
    pg_ring(&b->dim[PG_TP], ff_coll_comm_size(r->tpc), n, op == PG_SUM64 ? 8 : 4, op == PG_GATHER);
}

static inline int pg_tp_sum(void *ctx, float *buf, size_t n) {
    pg_rank *r = ctx;
    pg_tally(r, PG_SUM, n);
    return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F32, FF_COLL_SUM, r->tpc, NULL);
}
static inline int pg_tp_max(void *ctx, float *buf, size_t n) {
    pg_rank *r = ctx;
    pg_tally(r, PG_MAX, n);
    return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F32, FF_COLL_MAX, r->tpc, NULL);
}
static inline int pg_tp_sum64(void *ctx, double *buf, size_t n) {
    pg_rank *r = ctx;
    pg_tally(r, PG_SUM64, n);
    return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F64, FF_COLL_SUM, r->tpc, NULL);
}
static inline int pg_tp_gather(void *ctx, const float *in, float *out, size_t n) {
    pg_rank *r = ctx;
    pg_tally(r, PG_GATHER, n);
    return ff_coll_all_gather(in, out, n, FF_DTYPE_F32, r->tpc, NULL);
}

/* the same on the model's buffers (the cpu backend's are host memory the cpu ff_coll reads) */
static inline int pg_tp_dev_sum(void *ctx, ff_stream *st, ff_dptr buf, size_t n) {
    (void)st;
    return pg_tp_sum(ctx, ff_dptr_addr(buf), n);
}
static inline int pg_tp_dev_gather_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st; /* sequence parallelism and generation only, which these grids do not run: not tallied */
    return ff_coll_all_gather_v(ff_dptr_addr(in), ff_dptr_addr(out), counts, FF_DTYPE_F32, ((pg_rank *)ctx)->tpc, NULL);
}
static inline int pg_tp_dev_rs_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return ff_coll_reduce_scatter_v(ff_dptr_addr(in), ff_dptr_addr(out), counts, FF_DTYPE_F32, FF_COLL_SUM, ((pg_rank *)ctx)->tpc, NULL);
}

static inline int pg_pp_call(void *ctx, const ff_pipe_xfer *x, int n) {
    pg_rank *r = ctx;
    for (int i = 0; i < n; i++)
        if (x[i].kind == FF_PIPE_XFER_SEND) r->cur.dim[PG_PP] += 4.0 * (double)x[i].count, r->cur.pp_sends++;
    return r->inner.call(r->inner.ctx, x, n);
}
static inline int pg_pp_post(void *ctx, const ff_pipe_xfer *x) {
    pg_rank *r = ctx;
    r->cur.dim[PG_PP] += 4.0 * (double)x->count, r->cur.pp_sends++;
    return r->inner.send_post(r->inner.ctx, x);
}
static inline int pg_pp_done(void *ctx, bool wait, uint64_t *done) {
    pg_rank *r = ctx;
    return r->inner.sends_done(r->inner.ctx, wait, done);
}
static inline int pg_pp_sum64(void *ctx, double *buf, size_t n) {
    pg_rank *r = ctx;
    pg_ring(&r->cur.pp_sums, r->inner.size, n, 8, false);
    return r->inner.all_reduce_sum_f64(r->inner.ctx, buf, n);
}

/* ZeRO-0's data parallelism: the flat gradients summed over the replicas (each normalised by
 * the global batch's tokens) */
static inline int pg_dp_step(void *ctx, ff_model *m) {
    pg_rank *r = ctx;
    const size_t n = (size_t)ff_model_param_count(m);
    pg_ring(&r->cur.dim[PG_DP], ff_coll_comm_size(r->dpc), n, 4, false);
    r->cur.dp_calls++;
    if (!r->j->host_coll) {
        void *g = ff_dptr_addr(ff_dptr_of(ff_model_grad_buffer(m), 0));
        return ff_coll_all_reduce(g, g, n, FF_DTYPE_F32, FF_COLL_SUM, r->dpc, NULL);
    }
    if (ff_model_read_grads(m, r->grads)) return -1;
    if (ff_coll_all_reduce(r->grads, r->grads, n, FF_DTYPE_F32, FF_COLL_SUM, r->dpc, NULL)) return -1;
    return ff_model_write_grads(m, r->grads);
}

/* ZeRO-1's DP group for the optimizer (counts [dp], as ff_model_comm says) */
static inline size_t pg_total(const pg_rank *r, const size_t *counts) {
    size_t N = 0;
    for (int q = 0; q < r->j->dp; q++) N += counts[q];
    return N;
}
static inline int pg_dp_sum64(void *ctx, double *buf, size_t n) {
    pg_rank *r = ctx;
    pg_ring(&r->cur.dim[PG_DP], r->j->dp, n, 8, false);
    return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F64, FF_COLL_SUM, r->dpc, NULL);
}
static inline int pg_dp_rs(void *ctx, const float *in, float *out, const size_t *counts) {
    pg_rank *r = ctx;
    r->cur.dim[PG_DP] += 4.0 * (double)(pg_total(r, counts) - counts[r->d]), r->cur.dp_calls++;
    return ff_coll_reduce_scatter_v(in, out, counts, FF_DTYPE_F32, FF_COLL_SUM, r->dpc, NULL);
}
static inline int pg_dp_ag(void *ctx, const float *in, float *out, const size_t *counts) {
    pg_rank *r = ctx;
    r->cur.dim[PG_DP] += 4.0 * (double)(pg_total(r, counts) - counts[r->d]), r->cur.dp_calls++;
    return ff_coll_all_gather_v(in, out, counts, FF_DTYPE_F32, r->dpc, NULL);
}
static inline int pg_dp_dev_sum(void *ctx, ff_stream *st, ff_dptr buf, size_t n) {
    (void)st, (void)ctx, (void)buf, (void)n;
    REQUIRE(!"ZeRO-1 sums no device buffer over DP");
    return -1;
}
static inline int pg_dp_dev_rs(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return pg_dp_rs(ctx, ff_dptr_addr(in), ff_dptr_addr(out), counts);
}
static inline int pg_dp_dev_ag(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return pg_dp_ag(ctx, ff_dptr_addr(in), ff_dptr_addr(out), counts);
}

/* the replica's micro-batch `micro` is the global batch's m0 + micro */
static inline int pg_loss(void *ctx, int32_t micro, const ff_batch *b, const ff_forward_out *out, ff_pipe_loss_out *d) {
    const pg_rank *r = ctx;
    (void)b;
    d->loss = pt_loss_of(r->g, r->m0 + micro, out, d->d_logprobs, d->d_entropy, d->d_values);
    return 0;
}

/* CPU seconds of the whole process: on a shared machine a step's wall time depends on how many
 * threads compete for the cores, its CPU time much less */
static inline double pg_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The whole weights and the global batch of n micro-batches (max_len > 0: of varied lengths) */
static inline void pg_inputs(const ff_model_config *cfg, int32_t n, int32_t len, int32_t max_len, double std,
                             ff_tensor_set **w, pt_batch *g) {
    *w = ff_tensor_set_new();
    REQUIRE(*w && ff_model_init_weights(cfg, 1, std > 0 ? std : 0.02, *w) == 0);
    pt_batch_make(g, n, cfg->vocab_size, max_len, max_len > 0 ? 0 : len, 7);
}

static inline void pg_job_clear(pg_job *j) {
    for (int q = 0; q < PG_MAXR; q++) {
        pg_out *o = &j->out[q];
        free(o->lp), free(o->ent);
        ff_tensor_set_destroy(&o->grads);
        ff_tensor_set_destroy(&o->after);
        ff_tensor_set_destroy(&o->optim);
        o->lp = o->ent = NULL;
    }
}

static inline void *pg_rank_main(void *arg) {
    pg_rank *r = arg;
    pg_job *j = r->j;
    pg_out *out = &j->out[r->rank];
    const int n = j->tp * j->pp * j->dp;
    ff_coll_options co = {.timeout_s = 600};
    if (ff_coll_comm_init(&r->world, n, &j->id, r->rank, &co) || ff_coll_comm_split(r->world, r->s + j->pp * r->d, r->t, &r->tpc) ||
        ff_coll_comm_split(r->world, r->t + j->tp * r->d, r->s, &r->ppc) ||
        ff_coll_comm_split(r->world, r->t + j->tp * r->s, r->d, &r->dpc)) {
        fprintf(stderr, "rank %d: communicators: %s\n", r->rank, ff_error_message());
        return NULL;
    }
    ff_tensor_set *w;
    pt_batch g;
    pg_inputs(j->cfg, j->micro * j->dp, j->len, j->max_len, j->init_std, &w, &g);
    r->g = &g, r->m0 = j->micro * r->d;
    ff_pipe_config pc = {.pp = j->pp, .vpp = j->vpp > 1 ? j->vpp : 0, .micro = j->micro,
                         .kind = j->vpp > 1 ? FF_PIPE_INTERLEAVED : FF_PIPE_1F1B, .layers = j->cfg->num_hidden_layers};
    ff_pipe_schedule s;
    REQUIRE(ff_pipe_generate(&pc, &s) == 0);
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    if (j->host_coll) ff_pipe_transport_coll(r->ppc, &r->inner);
    else REQUIRE(ff_pipe_transport_coll_dev(&r->dev, r->ppc, be, &r->inner) == 0);
    ff_pipe_transport t = {.rank = r->inner.rank, .size = r->inner.size, .ctx = r, .call = pg_pp_call, .all_reduce_sum_f64 = pg_pp_sum64,
                           .send_post = r->inner.send_post ? pg_pp_post : NULL, .sends_done = r->inner.sends_done ? pg_pp_done : NULL,
                           .device = r->inner.device};
    ff_model_comm nc, tc = {.rank = r->t, .size = j->tp, .ctx = r, .all_reduce_sum = pg_tp_sum, .all_reduce_max = pg_tp_max,
                            .all_reduce_sum_f64 = pg_tp_sum64, .all_gather = pg_tp_gather};
    if (!j->host_coll) tc.dev_all_reduce_sum = pg_tp_dev_sum, tc.dev_all_gather_v = pg_tp_dev_gather_v, tc.dev_reduce_scatter_sum_v = pg_tp_dev_rs_v;
    ff_pipe_model_comm(&t, &nc);
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_stage st;
    REQUIRE(ff_pipe_stage_layers(&s, 0, r->s, first, count, &st) == 0);
    st.comm = &nc;
    ff_model *m = ff_model_new_opts(be, j->cfg, w, &(ff_model_opts){.stage = &st, .comm = j->tp > 1 ? &tc : NULL});
    if (!m) fprintf(stderr, "rank %d: %s\n", r->rank, ff_error_message());
    REQUIRE(m);
    out->params = ff_model_param_count(m);
    REQUIRE((r->grads = malloc(sizeof(float) * (size_t)out->params)));
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_model_comm dc = {.rank = r->d, .size = j->dp, .ctx = r, .all_reduce_sum_f64 = pg_dp_sum64,
                        .reduce_scatter_sum_v = pg_dp_rs, .all_gather_v = pg_dp_ag};
    if (!j->host_coll) dc.dev_all_reduce_sum = pg_dp_dev_sum, dc.dev_reduce_scatter_sum_v = pg_dp_dev_rs, dc.dev_all_gather_v = pg_dp_dev_ag;
    ff_optimizer *opt = ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = j->zero, .dp = j->zero ? &dc : NULL});
    ff_pipe_exec_model em = {.model = m, .opt = opt, .temperature = j->temperature, .logprobs = true, .entropy = true,
                             .loss = pg_loss, .loss_ctx = r, .before_step = j->dp > 1 && !j->zero ? pg_dp_step : NULL,
                             .step_ctx = r};
    ff_pipe_exec *e = opt ? ff_pipe_exec_new(&s, r->s, &t, &em) : NULL;
    if (!e) fprintf(stderr, "rank %d: %s\n", r->rank, ff_error_message());
    REQUIRE(e);
    ff_forward_out o[PT_MAX_MICRO];
    if (j->keep) {
        REQUIRE((out->lp = calloc((size_t)g.off[g.n], sizeof(float))) && (out->ent = calloc((size_t)g.off[g.n], sizeof(float))));
        for (int32_t q = 0; q < j->micro; q++)
            o[q] = (ff_forward_out){.logprobs = out->lp + g.off[r->m0 + q], .entropy = out->ent + g.off[r->m0 + q]};
        out->state_bytes = ff_optimizer_state_bytes(opt);
        ff_optimizer_shard(opt, &out->lo, &out->hi);
    }
    ff_pipe_run run = {.micro = {g.b + r->m0}, .outs = {j->keep ? o : NULL}, .measure = true};
    bool ok = true;
    for (int k = 0; k < j->steps + (j->warmup ? 1 : 0) && ok; k++) {
        ff_pipe_exec_stats x;
        memset(&r->cur, 0, sizeof r->cur);
        const double c0 = pg_cpu_s(); /* the run starts with a barrier and ends with a sum: the ranks' steps lie between */
        if (ff_pipe_exec_run(e, &run, &x)) {
            fprintf(stderr, "rank %d: %s\n", r->rank, ff_error_message());
            ok = false; /* break the groups, so the other ranks fail now rather than at the timeout */
            ff_coll_comm_abort(r->tpc, "a rank failed"), ff_coll_comm_abort(r->ppc, "a rank failed");
            ff_coll_comm_abort(r->dpc, "a rank failed"), ff_coll_comm_abort(r->world, "a rank failed");
            break;
        }
        if (k == 0) out->loss = x.loss[0];
        if (!j->warmup || k > 0) out->stats[k - (j->warmup ? 1 : 0)] = x, out->cpu[k - (j->warmup ? 1 : 0)] = pg_cpu_s() - c0;
        out->bytes = r->cur;
        run.outs[0] = NULL; /* the first step's outputs are the ones kept */
        if (j->keep && k == 0) {
            REQUIRE((out->grads = ff_tensor_set_new()) && ff_model_export_grads(m, out->grads) == 0);
        }
    }
    if (ok && j->keep) { /* every rank exports: under TP the exports gather, at ZeRO-1 the state's too */
        REQUIRE((out->after = ff_tensor_set_new()) && ff_model_export_weights(m, out->after) == 0);
        REQUIRE((out->optim = ff_tensor_set_new()) && ff_optimizer_export_state(opt, out->optim) == 0);
    }
    ff_pipe_sim sim;
    memset(&sim, 0, sizeof sim);
    if (ok && ff_pipe_exec_simulate(e, &sim) == 0) out->sim = sim.bubble_fraction;
    ff_pipe_sim_clear(&sim);
    out->formula = ff_pipe_bubble_formula(&pc);
    out->ok = ok;
    ff_pipe_exec_destroy(&e);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    if (!j->host_coll) ff_pipe_coll_dev_fini(&r->dev);
    ff_backend_destroy(&be);
    ff_pipe_schedule_clear(&s);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
    free(r->grads);
    ff_coll_comm_destroy(&r->dpc);
    ff_coll_comm_destroy(&r->ppc);
    ff_coll_comm_destroy(&r->tpc);
    ff_coll_comm_destroy(&r->world);
    return NULL;
}

/* Run the grid; 0 when every rank ran every step. */
static inline int pg_run(pg_job *j) {
    const int n = j->tp * j->pp * j->dp;
    REQUIRE(n >= 1 && n <= PG_MAXR && j->steps >= 1 && j->steps <= PG_MAX_STEPS);
    pg_job_clear(j);
    memset(j->out, 0, sizeof j->out);
    ff_coll_options co = {.timeout_s = 600};
    REQUIRE(ff_coll_get_unique_id(&j->id, "cpu", &co) == 0);
    pg_rank r[PG_MAXR];
    pthread_t th[PG_MAXR];
    for (int q = 0; q < n; q++) {
        r[q] = (pg_rank){.j = j, .rank = q, .t = q % j->tp, .s = (q / j->tp) % j->pp, .d = q / (j->tp * j->pp)};
        REQUIRE(pthread_create(&th[q], NULL, pg_rank_main, &r[q]) == 0);
    }
    int failed = 0;
    for (int q = 0; q < n; q++) {
        pthread_join(th[q], NULL);
        failed += !j->out[q].ok;
    }
    return failed ? -1 : 0;
}

/* ---- for the benches ----------------------------------------------------------------------- */

static inline double pg_median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && v[k] < v[k - 1]; k--) {
            double x = v[k];
            v[k] = v[k - 1];
            v[k - 1] = x;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The single rank's training step on the same global batch (every micro-batch's forward and
 * backward, then AdamW) on `backend`: the median wall seconds of `steps` after one warm-up, the
 * first step's loss, and (cpu_s not NULL) the median CPU seconds of the process per step. */
static inline double pg_single(const ff_model_config *cfg, int32_t micro, int32_t len, int steps, const char *backend,
                               double *loss, double *cpu_s) {
    REQUIRE(steps >= 1 && steps <= PG_MAX_STEPS);
    ff_tensor_set *w;
    pt_batch g;
    pg_inputs(cfg, micro, len, 0, 0, &w, &g);
    ff_backend *be = ff_backend_new(backend);
    ff_model *m = be ? ff_model_new(be, cfg, w) : NULL;
    REQUIRE(m);
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    REQUIRE(opt && ff_model_reserve(m, (int32_t)(g.off[1] - g.off[0])) == 0);
    float *buf = malloc(sizeof(float) * 4 * (size_t)g.off[1]);
    REQUIRE(buf);
    double t[PG_MAX_STEPS], c[PG_MAX_STEPS];
    for (int k = 0; k <= steps; k++) {
        const int64_t t0 = ff_now_ns();
        const double c0 = pg_cpu_s();
        double l = 0;
        ff_model_zero_grad(m);
        for (int32_t q = 0; q < g.n; q++) {
            const int32_t T = g.b[q].n_tokens;
            ff_forward_out o = {.logprobs = buf, .entropy = buf + T};
            ff_forward_opts fo = {.train = true};
            REQUIRE(ff_model_forward(m, &g.b[q], &fo, &o) == 0);
            l += pt_loss_of(&g, q, &o, buf + 2 * T, buf + 3 * T, NULL);
            REQUIRE(ff_model_backward(m, buf + 2 * T, buf + 3 * T, NULL) == 0);
        }
        ff_optim_stats st;
        REQUIRE(ff_optimizer_step(opt, &st) == 0);
        if (k == 0) *loss = l;
        else t[k - 1] = (double)(ff_now_ns() - t0) * 1e-9, c[k - 1] = pg_cpu_s() - c0;
    }
    if (cpu_s) *cpu_s = pg_median(c, steps);
    free(buf);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
    return pg_median(t, steps);
}

#endif

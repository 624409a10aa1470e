/* ZeRO-1 inside the optimizer, in-process (and roles.actor.offload's moves between steps:
 * gradients released, AdamW to host memory and back, bit for bit; the backend's counters drop
 * by both and come back; a training forward and a step refused meanwhile): d = 1, 2 and 4 data-parallel ranks (threads, one
 * model and one cpu:1 backend each, tests/model/thread_comm.h) train a small model (2
 * layers, biases, untied, 164k parameters) for three AdamW steps with clipping, each rank on
 * its own batch, once at ZeRO-0 (the gradients all-reduced by the test, as the trainer's
 * hook does, then a full optimizer on every rank) and once at ZeRO-1 (ff_optimizer_new_opts:
 * the optimizer reduce-scatters, steps its range and all-gathers), with the default bucket
 * and with a bucket of 10007 floats whose edges fall anywhere. And TP 2 x DP 2: four
 * threads, the optimizer's range a slice of each rank's TP-local buffer.
 *
 * Checked, without TP: after every step every rank's parameters equal ZeRO-0's bit for bit
 * (the thread communicator sums in rank order for both the all-reduce and the
 * reduce-scatter, the ranges start on FF_ZERO_ALIGN boundaries so the norm's block sums are
 * ZeRO-0's, and AdamW is elementwise; only the norm's double sum is associated differently,
 * so norms agree to 1e-12 and the clipping coefficient, rounded to float, is the same);
 * clipping happened; the state per rank is 8 bytes per parameter of its range (the two
 * allocations' sizes), every range but the last ceil(n / d) rounded up to FF_ZERO_ALIGN, the
 * ranges tile [0, n), so each rank holds at most 1/d of ZeRO-0's 8 n bytes plus the
 * alignment; the exported state equals ZeRO-0's bit for bit on every rank; a ZeRO-1 run
 * resumed from ZeRO-0's weights and state after step 2 (and a ZeRO-0 run from ZeRO-1's)
 * makes the same step 3. The bytes each rank sends in one step are exactly the design's
 * (reduce-scatter of the other ranks' parts, all-gather of its own part to d - 1 ranks, one
 * double for the norm) and are compared with the planner's traffic.dp for ZeRO-1: the
 * ratio (about 4/3: fp32 weights gathered here, bf16 there) is printed and checked.
 * With TP 2 x DP 2: weights and state within fp32 tolerance of TP 2 at ZeRO-0 (the TP norm
 * sums per tensor, and a range edge inside a tensor splits its blocks differently; measured
 * on the development machine: bit for bit, the coefficient rounded the same). Bad
 * options (ZeRO-2, a communicator without the sharded collectives) get clear errors. */
#include "fuseflow/plan.h"
#include "tests/model/model_test_util.h"
#include "tests/model/thread_comm.h"

enum { NSTEPS = 3, NT = 24, MAXW = 8 };

static ff_model_config cfg;
static ff_tensor_set *w0;

/* the batch of data-parallel rank q at step s: two sequences of 12 random tokens, the loss
 * sum_t a[t] logprob[t] + c[t] entropy[t] */
typedef struct batch {
    int32_t tok[NT], tgt[NT], start[3];
    float a[NT], c[NT];
} batch;

static void make_batch(batch *b, int q, int s) {
    ff_rng r;
    ff_rng_seed(&r, 1000 + 17 * (uint64_t)q + (uint64_t)s);
    for (int t = 0; t < NT; t++) {
        b->tok[t] = (int32_t)ff_rng_below(&r, (uint64_t)cfg.vocab_size);
        b->a[t] = (float)(ff_rng_uniform(&r) - 0.5);
        b->c[t] = (float)(0.1 * (ff_rng_uniform(&r) - 0.5));
    }
    b->start[0] = 0, b->start[1] = 12, b->start[2] = NT;
    ff_batch_shift_targets(b->tok, b->start, 2, b->tgt);
}

typedef struct run run;

/* one thread's results */
typedef struct rank_out {
    float *params[NSTEPS]; /* [n] its (TP-local) flat parameters after each step */
    int64_t n, lo, hi, state_bytes;
    double norm[NSTEPS];
    bool clipped[NSTEPS];
    double sent;            /* dp bytes of step 2 */
    int64_t calls[TC_NOPS]; /* dp collectives of step 2 */
    ff_tensor_set *w2, *o2; /* weights and state after step 2 (whole tensors) */
    ff_tensor_set *o3;      /* state after step 3 */
} rank_out;

struct run {
    int tp, dp, zero;
    bool offload; /* between two steps, a colocated actor's generation phase (offload_mode) */
    bool dev;     /* the communicators' device-buffer calls too (dev_mode) */
    int64_t bucket;
    const run *resume; /* start at step 3 from its w2, o2 */
    tc_group tpg[MAXW], dpg[MAXW];
    rank_out out[MAXW]; /* [dp rank * tp + tp rank] */
};

typedef struct thread_arg {
    run *r;
    int tr, dr;
    tc_rank tpc, dpc;
} thread_arg;

static bool offload_mode; /* the next run_layout's runs[].offload */
static bool dev_mode;     /* the next run_layout's run.dev */

/* After a step: what a colocated actor does for generation (roles.actor.offload): gradients
 * given back, AdamW to host memory, a scoring forward meanwhile (a training forward
 * refused), then both back before the next step. */
static void generation_phase(ff_model *m, ff_optimizer *opt, const ff_batch *bt, int64_t state_bytes) {
    ff_backend_memory b0, b1;
    ff_backend_memory_of(ff_model_backend(m), &b0);
    REQUIRE(ff_model_zero_grad(m) == 0 && ff_model_release_grads(m) == 0 && ff_optimizer_offload(opt, NULL) == 0);
    ff_backend_memory_of(ff_model_backend(m), &b1);
    CHECK_EQ_INT(b0.in_use - b1.in_use, 4 * ff_model_param_count(m) + state_bytes);
    CHECK_EQ_INT(ff_optimizer_state_bytes(opt), 0);
    CHECK_EQ_INT(ff_optimizer_host_bytes(opt), state_bytes);
    CHECK(ff_model_zero_grad(m) == 0); /* nothing to zero: they come back zero */
    float lp[NT];
    ff_forward_out fo = {.logprobs = lp};
    CHECK(ff_model_forward(m, bt, NULL, &fo) == 0);
    CHECK(ff_model_forward(m, bt, &(ff_forward_opts){.train = true}, &fo) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "ff_model_restore_grads");
    CHECK(ff_optimizer_step(opt, NULL) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "ff_optimizer_reload");
    ff_error_clear();
    REQUIRE(ff_model_restore_grads(m) == 0 && ff_optimizer_reload(opt, NULL) == 0);
    ff_backend_memory_of(ff_model_backend(m), &b1);
    CHECK_EQ_INT(b1.in_use, b0.in_use);
}

static void *rank_main(void *p) {
    thread_arg *a = p;
    run *R = a->r;
    rank_out *o = &R->out[a->dr * R->tp + a->tr];
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_model_comm tpc = R->dev ? tc_comm_dev(&a->tpc) : tc_comm(&a->tpc), dpc = R->dev ? tc_comm_dev(&a->dpc) : tc_comm(&a->dpc);
    ff_model *m = R->tp > 1 ? ff_model_new_tp(be, &cfg, w0, &tpc) : ff_model_new(be, &cfg, w0);
    REQUIRE(m && ff_model_reserve(m, NT) == 0);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-2;
    ac.eps = 1e-4; /* as test_model_tp: the update depends on the gradient's scale */
    ac.beta2 = 0.95;
    ac.weight_decay = 0.1;
    ac.max_grad_norm = 0.05; /* below every step's norm here: each step clips */
    ac.warmup_steps = 1;
    ac.total_steps = 3;
    ff_optimizer_opts oo = {.zero = R->zero, .dp = &dpc, .bucket = R->bucket};
    ff_optimizer *opt = ff_optimizer_new_opts(m, &ac, &oo);
    DIE_IF(!opt);
    o->n = ff_model_param_count(m);
    ff_optimizer_shard(opt, &o->lo, &o->hi);
    o->state_bytes = ff_optimizer_state_bytes(opt);
    float *g = malloc((size_t)o->n * sizeof *g);
    REQUIRE(g);
    int s0 = 0;
    if (R->resume) {
        const rank_out *from = &R->resume->out[0];
        REQUIRE(ff_model_load_weights(m, from->w2) == 0 && ff_optimizer_import_state(opt, from->o2) == 0);
        CHECK_EQ_INT(ff_optimizer_steps_done(opt), 2);
        s0 = 2;
    }
    for (int s = s0; s < NSTEPS; s++) {
        batch b;
        make_batch(&b, a->dr, s);
        ff_batch bt = {.n_tokens = NT, .n_seqs = 2, .tokens = b.tok, .seq_start = b.start, .targets = b.tgt};
        float lp[NT], ent[NT];
        ff_forward_out fo = {.logprobs = lp, .entropy = ent};
        REQUIRE(ff_model_zero_grad(m) == 0);
        REQUIRE(ff_model_forward(m, &bt, &(ff_forward_opts){.train = true}, &fo) == 0);
        REQUIRE(ff_model_backward(m, b.a, b.c, NULL) == 0);
        a->dpc.counting = s == 1;
        if (R->zero == 0 && R->dp > 1) { /* the trainer's hook: SUM the whole gradient over dp */
            REQUIRE(ff_model_read_grads(m, g) == 0);
            REQUIRE(tc_sum(&a->dpc, g, (size_t)o->n) == 0);
            REQUIRE(ff_model_write_grads(m, g) == 0);
        }
        ff_optim_stats st;
        DIE_IF(ff_optimizer_step(opt, &st));
        a->dpc.counting = false;
        if (R->offload) generation_phase(m, opt, &bt, o->state_bytes);
        o->norm[s] = st.grad_norm;
        o->clipped[s] = st.clipped;
        o->params[s] = malloc((size_t)o->n * sizeof(float));
        REQUIRE(o->params[s]);
        ff_model_read_params(m, o->params[s]);
        if (s == 1) {
            o->sent = a->dpc.sent;
            memcpy(o->calls, a->dpc.calls, sizeof o->calls);
            o->w2 = ff_tensor_set_new();
            o->o2 = ff_tensor_set_new();
            REQUIRE(ff_model_export_weights(m, o->w2) == 0 && ff_optimizer_export_state(opt, o->o2) == 0);
        }
    }
    o->o3 = ff_tensor_set_new();
    REQUIRE(ff_optimizer_export_state(opt, o->o3) == 0);
    free(g);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    return NULL;
}

static void run_layout(run *R, int tp, int dp, int zero, int64_t bucket, const run *resume) {
    memset(R, 0, sizeof *R);
    *R = (run){.tp = tp, .dp = dp, .zero = zero, .bucket = bucket, .resume = resume, .offload = offload_mode, .dev = dev_mode};
    for (int i = 0; i < dp; i++) tc_group_init(&R->tpg[i], tp);
    for (int i = 0; i < tp; i++) tc_group_init(&R->dpg[i], dp);
    thread_arg args[MAXW];
    pthread_t th[MAXW];
    for (int dr = 0; dr < dp; dr++)
        for (int tr = 0; tr < tp; tr++) {
            thread_arg *a = &args[dr * tp + tr];
            *a = (thread_arg){.r = R, .tr = tr, .dr = dr, .tpc = {.g = &R->tpg[dr], .rank = tr}, .dpc = {.g = &R->dpg[tr], .rank = dr}};
            REQUIRE(pthread_create(&th[dr * tp + tr], NULL, rank_main, a) == 0);
        }
    for (int i = 0; i < tp * dp; i++) {
        pthread_join(th[i], NULL);
        tc_rank_free(&args[i].tpc);
        tc_rank_free(&args[i].dpc);
    }
    for (int i = 0; i < dp; i++) tc_group_destroy(&R->tpg[i]);
    for (int i = 0; i < tp; i++) tc_group_destroy(&R->dpg[i]);
}

static void free_run(run *R) {
    for (int i = 0; i < R->tp * R->dp; i++) {
        rank_out *o = &R->out[i];
        for (int s = 0; s < NSTEPS; s++) free(o->params[s]);
        ff_tensor_set_destroy(&o->w2);
        ff_tensor_set_destroy(&o->o2);
        ff_tensor_set_destroy(&o->o3);
    }
}

/* every tensor of want in got, bit for bit (rtol < 0) or within atol + rtol max|want| */
typedef struct tol {
    double atol, rtol;
} tol;
static void pair_close(void *ctx, const char *name, const float *got, const float *want, int64_t n) {
    const tol *t = ctx;
    if (t->rtol < 0) check_tensor_bits(name, got, want, n);
    else check_tensor_close(name, got, want, n, t->atol, t->rtol);
}
static void compare_sets(const char *what, const ff_tensor_set *got, const ff_tensor_set *want, double atol, double rtol) {
    compare_tensor_sets(what, got, want, pair_close, &(tol){atol, rtol});
}

/* the largest |a - b| over n floats */
static double max_diff(const float *a, const float *b, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - b[i]));
    return e;
}

/* step s0.. of `got` against `want`, every rank: parameters bit for bit, norms to 1e-12 */
static void same_steps(const char *what, const run *got, const run *want, int s0) {
    for (int i = 0; i < got->tp * got->dp; i++) {
        const rank_out *g = &got->out[i], *w = &want->out[i];
        REQUIRE(g->n == w->n);
        for (int s = s0; s < NSTEPS; s++) {
            if (memcmp(g->params[s], w->params[s], (size_t)g->n * 4)) {
                fprintf(stderr, "%s rank %d step %d: parameters differ (max %.3g)\n", what, i, s + 1,
                        max_diff(g->params[s], w->params[s], g->n));
                ff_test_failures++;
            }
            CHECK_CLOSE(g->norm[s], w->norm[s], 0, 1e-12);
            CHECK(g->clipped[s] && w->clipped[s]);
        }
    }
}

/* ZeRO-1 at d ranks (no TP) against ZeRO-0 */
static void test_dp(int d) {
    run z0, z1, z1b, r01, r10;
    run_layout(&z0, 1, d, 0, 0, NULL);
    run_layout(&z1, 1, d, 1, 0, NULL);
    run_layout(&z1b, 1, d, 1, 10007, NULL);
    char what[64];
    snprintf(what, sizeof what, "dp%d zero1", d);
    same_steps(what, &z1, &z0, 0);
    snprintf(what, sizeof what, "dp%d zero1 bucket 10007", d);
    same_steps(what, &z1b, &z0, 0);
    if (d > 1) { /* the reduce-scatter and all-gather in place on the model's buffers: the same bits, the same calls */
        run zd;
        dev_mode = true;
        run_layout(&zd, 1, d, 1, 10007, NULL);
        dev_mode = false;
        snprintf(what, sizeof what, "dp%d zero1 bucket 10007 on device buffers", d);
        same_steps(what, &zd, &z1b, 0);
        for (int r = 0; r < d; r++) {
            CHECK(zd.out[r].sent == z1b.out[r].sent);
            CHECK(!memcmp(zd.out[r].calls, z1b.out[r].calls, sizeof zd.out[r].calls));
            compare_sets(what, zd.out[r].o3, z1b.out[r].o3, 0, -1);
        }
        free_run(&zd);
    }
    const int64_t n = z0.out[0].n;
    int64_t S = (n + d - 1) / d;
    S = (S + FF_ZERO_ALIGN - 1) / FF_ZERO_ALIGN * FF_ZERO_ALIGN;
    int64_t next = 0, most = 0;
    for (int r = 0; r < d; r++) {
        const rank_out *o = &z1.out[r], *o0 = &z0.out[r];
        CHECK_EQ_INT(o0->lo, 0);
        CHECK_EQ_INT(o0->hi, n);
        CHECK_EQ_INT(o0->state_bytes, 8 * n);
        CHECK_EQ_INT(o->lo, next); /* the ranges tile [0, n) in rank order */
        CHECK_EQ_INT(o->hi - o->lo, r < d - 1 ? S : n - (d - 1) * S);
        CHECK_EQ_INT(o->state_bytes, 8 * (o->hi - o->lo));
        CHECK(o->state_bytes <= 8 * ((n + d - 1) / d + FF_ZERO_ALIGN - 1));
        next = o->hi;
        most = o->state_bytes > most ? o->state_bytes : most;
        for (int s = 0; s < NSTEPS; s++) /* every rank the same weights */
            CHECK(!memcmp(o->params[s], z1.out[0].params[s], (size_t)n * 4));
        snprintf(what, sizeof what, "dp%d rank %d exported state", d, r);
        compare_sets(what, o->o3, z0.out[0].o3, 0, -1);
    }
    CHECK_EQ_INT(next, n);
    printf("dp%d: n = %lld parameters; optimizer bytes per rank: ZeRO-0 %lld, ZeRO-1 at most %lld (ceil(n/d) x 8 = %lld)\n", d,
           (long long)n, (long long)(8 * n), (long long)most, (long long)(8 * ((n + d - 1) / d)));
    /* resume across stages: step 3 from the other stage's weights and state after step 2 */
    run_layout(&r01, 1, d, 1, 0, &z0);
    snprintf(what, sizeof what, "dp%d zero1 resumed from zero0", d);
    same_steps(what, &r01, &z0, 2);
    run_layout(&r10, 1, d, 0, 0, &z1);
    snprintf(what, sizeof what, "dp%d zero0 resumed from zero1", d);
    same_steps(what, &r10, &z0, 2);
    compare_sets("zero0 resumed: exported state", r10.out[0].o3, z0.out[0].o3, 0, -1);
    if (d > 1) { /* the traffic of one step */
        double mean = 0;
        for (int r = 0; r < d; r++) {
            const rank_out *o = &z1.out[r];
            const double own = (double)(o->hi - o->lo);
            const double want = 4 * ((double)n - own) + 4 * (d - 1) * own + 2.0 * (d - 1) / d * 8;
            CHECK_CLOSE(o->sent, want, 0, 1e-12);
            CHECK_EQ_INT(o->calls[TC_RS_V], 1); /* one bucket at the default size */
            CHECK_EQ_INT(o->calls[TC_AG_V], 1);
            CHECK_EQ_INT(o->calls[TC_SUM64], 1);
            CHECK_CLOSE(z0.out[r].sent, 2.0 * (d - 1) / d * 4 * (double)n, 0, 1e-12);
            mean += o->sent / d;
        }
        CHECK_EQ_INT(z1b.out[0].calls[TC_RS_V], (n + 10006) / 10007);
        CHECK_EQ_INT(z1b.out[0].calls[TC_AG_V], (n + 10006) / 10007);
        /* the planner: this model at DP d, ZeRO-1, one micro-batch, fp32 gradients on the wire */
        ff_plan_input in;
        ff_plan_input_defaults(&in);
        in.model = (ff_plan_model){.layers = cfg.num_hidden_layers, .hidden = cfg.hidden_size,
                                   .heads = cfg.num_attention_heads, .kv_heads = cfg.num_key_value_heads,
                                   .head_dim = cfg.hidden_size / cfg.num_attention_heads, .ffn = cfg.intermediate_size,
                                   .vocab = cfg.vocab_size, .tied_embeddings = cfg.tie_word_embeddings, .gated_mlp = true,
                                   .linear_bias = cfg.attention_bias};
        snprintf(in.model.name, sizeof in.model.name, "test");
        in.workload.seq = NT;
        in.workload.micro_batch = 1;
        in.workload.micro_batches = 1;
        in.workload.global_batch = 0;
        in.workload.grad_reduce_bytes = 4;
        in.layout.dp = d;
        in.layout.zero = 1;
        in.cluster.gpus = d;
        ff_plan_result pr;
        DIE_IF(ff_plan_evaluate(&in, &pr));
        const double plan = pr.traffic[FF_PLAN_DP].bytes, psi = pr.stages[0].params;
        CHECK_CLOSE(plan, ff_plan_dp_bytes(1, FF_PLAN_ZS_DEFAULT, d, psi, 1, 4), 0, 1e-12); /* its formula */
        const double ours = ff_plan_dp_bytes(1, FF_PLAN_ZS_DEFAULT, d, (double)n, 1, 4);
        printf("dp%d zero1: one step sends %.0f bytes per rank (mean; ZeRO-0 %.0f), the planner's traffic.dp %.0f "
               "(%.0f parameters; %.0f for ours): ratio %.4f = (4 + 4) / (4 + 2): weights gathered in fp32 here, bf16 there\n",
               d, mean, z0.out[0].sent, plan, psi, ours, mean / plan);
        CHECK_CLOSE(mean / ours, 8.0 / 6.0, 0, 1e-4); /* plus the norm's 8 bytes */
        ff_plan_result_clear(&pr);
    }
    free_run(&z0), free_run(&z1), free_run(&z1b), free_run(&r01), free_run(&r10);
}

/* TP 2 x DP 2: ZeRO-1 on TP-local buffers against ZeRO-0 at the same TP. Tolerances: the
 * norm's fp32 block sums differ (range edges inside tensors), so the clipping coefficient
 * may differ in its last float bit; Adam's update m / sqrt(v) hardly depends on it. */
static void test_tp_dp(void) {
    run z0, z1;
    run_layout(&z0, 2, 2, 0, 0, NULL);
    run_layout(&z1, 2, 2, 1, 10007, NULL);
    double worst = 0;
    for (int i = 0; i < 4; i++) {
        const rank_out *g = &z1.out[i], *w = &z0.out[i];
        REQUIRE(g->n == w->n);
        CHECK(g->state_bytes < w->state_bytes * 6 / 10); /* about half, plus alignment */
        for (int s = 0; s < NSTEPS; s++) {
            CHECK_CLOSE(g->norm[s], w->norm[s], 0, 1e-6);
            char what[64];
            snprintf(what, sizeof what, "tp2 x dp2 rank %d step %d parameters", i, s + 1);
            check_tensor_close(what, g->params[s], w->params[s], g->n, 1e-6, 0);
            worst = fmax(worst, max_diff(g->params[s], w->params[s], g->n));
        }
        compare_sets("tp2 x dp2 exported state", g->o3, w->o3, 1e-6, 1e-5);
    }
    printf("tp2 x dp2 zero1: parameters within %.3g of ZeRO-0 after 3 steps; optimizer bytes per rank %lld vs %lld\n", worst,
           (long long)z1.out[0].state_bytes, (long long)z0.out[0].state_bytes);
    run zd; /* TP's and ZeRO's collectives on the model's buffers: ZeRO-1's bits */
    dev_mode = true;
    run_layout(&zd, 2, 2, 1, 10007, NULL);
    dev_mode = false;
    same_steps("tp2 x dp2 zero1 on device buffers", &zd, &z1, 0);
    for (int i = 0; i < 4; i++) compare_sets("tp2 x dp2 zero1 on device buffers: exported state", zd.out[i].o3, z1.out[i].o3, 0, -1);
    free_run(&zd);
    free_run(&z0), free_run(&z1);
}

/* roles.actor.offload's moves between the steps change no bit: at ZeRO-0 and ZeRO-1 over 2
 * replicas (each rank moving its range's state), and at TP 2 x DP 2 ZeRO-1 */
static void test_offload(void) {
    const int lay[3][4] = {{1, 2, 0, 0}, {1, 2, 1, 10007}, {2, 2, 1, 10007}};
    for (int k = 0; k < 3; k++) {
        run plain, moved;
        offload_mode = false;
        run_layout(&plain, lay[k][0], lay[k][1], lay[k][2], lay[k][3], NULL);
        offload_mode = true;
        run_layout(&moved, lay[k][0], lay[k][1], lay[k][2], lay[k][3], NULL);
        offload_mode = false;
        char what[64];
        snprintf(what, sizeof what, "tp%d x dp%d zero%d offloaded between steps", lay[k][0], lay[k][1], lay[k][2]);
        same_steps(what, &moved, &plain, 0);
        for (int i = 0; i < lay[k][0] * lay[k][1]; i++) compare_sets(what, moved.out[i].o3, plain.out[i].o3, 0, -1);
        printf("%s: the same parameters and state bit for bit\n", what);
        free_run(&plain), free_run(&moved);
    }
}

static void test_errors(void) {
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model *m = ff_model_new(be, &cfg, w0);
    REQUIRE(m);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    CHECK(ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = 2}) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "ZeRO-2/3 are not built");
    CHECK(ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = 4}) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "ZeRO stage 4 does not exist");
    ff_model_comm half = {.rank = 0, .size = 2, .all_reduce_sum_f64 = tc_sum64}; /* no sharded collectives */
    CHECK(ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = 1, .dp = &half}) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "reduce_scatter_sum_v");
    ff_model_comm bad = {.rank = 2, .size = 2};
    CHECK(ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = 1, .dp = &bad}) == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "rank 2 of a group of 2");
    /* one rank: ZeRO-1 owns everything and needs no communicator */
    ff_optimizer *o = ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = 1});
    REQUIRE(o);
    CHECK_EQ_INT(ff_optimizer_state_bytes(o), 8 * ff_model_param_count(m));
    ff_optimizer_destroy(&o);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
}

int main(void) {
    cfg = tiny_config(512, 64, 192, 2, 4, 2, false, true, false);
    w0 = ff_tensor_set_new();
    REQUIRE(w0 && ff_model_init_weights(&cfg, 5, 0.05, w0) == 0);
    test_errors();
    test_dp(1);
    test_dp(2);
    test_dp(4);
    test_tp_dp();
    test_offload();
    ff_tensor_set_destroy(&w0);
    return ff_test_failures ? 1 : 0;
}

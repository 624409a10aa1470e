/* Model parallelism against the single rank: every layout of {TP 1, 2, 4} x {PP 1, 2, 4} x
 * {DP 1, 2} of up to 8 ranks but 1 x 1 x 1, as threads with real ff_coll CPU communicators
 * (tests/pipe/pipe_grid.h: TP inside each stage model, the pipeline executor over the PP group,
 * the DP gradient sum in the executor's before_step), trains a model of 8 layers, hidden 32, 8
 * query heads, 4 key/value heads, vocabulary 64, for three AdamW steps with clipping on one
 * global batch of 8 micro-batches (1 .. 3 sequences of 2 .. 12 tokens; replica d of DP 2 runs
 * micro-batches 4 d .. 4 d + 3, every loss coefficient normalised by the global batch's
 * tokens), and compares with the single-rank model on the same global batch
 * (tests/pipe/pipe_test_util.h's pt_reference). Schedules: 1F1B for every layout, interleaved
 * 1F1B (2 chunks per stage) for every layout with PP > 1; embeddings untied (with attention
 * biases) and tied, alternating over the layouts; ZeRO-1 (the optimizer over the DP group)
 * against ZeRO-0 (the hook) for every DP 2 layout.
 *
 * Checked against the single rank: the first step's log-probs and entropy (the last stage's
 * TP rank 0 of each replica, on that replica's micro-batches), the loss (every rank of a
 * replica the same bits, the replicas' sum the reference's), the gradient norm of each step,
 * every gradient after the first step and the weights and AdamW state after the third (whole
 * tensors gathered over TP, the union of replica 0's stages from their TP rank 0, each tensor
 * exported by exactly one stage). Within the grid: every TP rank and every DP replica holds
 * the same weights bit for bit, every rank the same norm. ZeRO-1: weights and state equal
 * ZeRO-0's of the same layout; each rank's optimizer state is its two allocations of 4 bytes
 * per float of its range, the DP ranks' ranges tile the stage's flat buffer (the state summed
 * over DP is ZeRO-0's), and each holds at most half the floats rounded up to FF_ZERO_ALIGN
 * (4096 floats: for these stages of 30k .. 122k floats at most 0.56 of ZeRO-0's, printed).
 *
 * Tolerances (fp32, relative to each tensor's or array's largest magnitude; the measured worst
 * printed at the end, on the development machine in brackets): outputs 2e-5 [7.3e-7] and
 * gradients 3e-5 [5.3e-6] (test_model_tp's: TP sums the heads' and vocabulary slices' partial
 * results in another order, DP adds two replicas' partial gradient sums where the single rank
 * runs one, the tied embedding's copies add their partial sums); the loss and the norms 1e-5
 * [4.3e-8, 2.3e-6]; the weights after three steps 3e-5 + 1e-5 absolute [6e-5 of a bias's
 * largest element, 0.10 of the tolerance] (pipe_test_util.h's: Adam divides by each element's
 * own gradient, so the gradients' rounding goes into near-zero elements undamped); the AdamW
 * state 3e-4 [9.7e-5, exp_avg_sq of the embedding], without an absolute part (its elements are
 * 1e-7 .. 1e-4). ZeRO-1 against ZeRO-0: bit for bit [so], the norms 1e-8 [9.3e-10: the double
 * sum of squares associated per range and, under TP, a range edge splitting a tensor's blocks;
 * the clip coefficient rounds to the same float]; but with the tied embedding on two stages
 * (ZeRO-0 adds its two copies' gradients after the DP sum, ZeRO-1 before it) 2e-5 [4.6e-6]
 * and the norms 1e-5 [4.2e-7].
 *
 * The grid runs TP's and DP's collectives on the models' buffers (ff_model_comm's dev_ calls,
 * the DP hook's all-reduce in place), as workers do; at TP 2 x PP 2 (DP 1 and 2, ZeRO-0 and 1)
 * the same layout through host memory gives every loss, norm, weight and AdamW state bit for bit.
 *
 * Not here: GPipe and uneven layer splits (test_pipe_exec), sequence parallelism, the bytes
 * sent (test_traffic), values (the grid's ranks ask for log-probs and entropy). */
#include "tests/pipe/pipe_grid.h"

enum { L = 8, H = 32, FFN = 120, NH = 8, NKV = 4, V = 64, M = 8, MAXLEN = 12 };

#define TOL_OUT 2e-5
#define TOL_GRAD 3e-5
#define TOL_LOSS 1e-5
#define TOL_NORM 1e-5
#define TOL_STATE 3e-4
#define TOL_ZERO_NORM 1e-8
#define TOL_ZERO_TIED 2e-5

static ff_model_config cfgs[2]; /* untied with biases, tied */
static pt_result refs[2];
static pt_batch gb; /* the grid's global batch (pg_inputs) */
static pt_err err_out, err_grad, err_after, err_state, err_zero, err_zero_tied;
static double err_loss, err_norm, err_zero_norm, err_zero_norm_tied, zero_ratio_max;
static int n_layouts;
static bool grid_host; /* the next grid's collectives through host memory (pg_job.host_coll) */

static pg_job *grid(int tp, int pp, int dp, int vpp, bool tied, int zero) {
    pg_job *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (pg_job){.cfg = &cfgs[tied], .tp = tp, .pp = pp, .dp = dp, .vpp = vpp, .zero = zero, .micro = M / dp, .max_len = MAXLEN,
                  .init_std = 0.2, .temperature = PT_TEMP, .steps = PT_STEPS, .keep = true, .host_coll = grid_host};
    if (pg_run(j)) {
        fprintf(stderr, "tp %d pp %d dp %d vpp %d zero %d: a rank failed\n", tp, pp, dp, vpp, zero);
        ff_test_failures++;
    }
    n_layouts++;
    return j;
}

/* the largest share of its tolerance (atol + rtol max|want| of the tensor) any element used */
static double used_after;
static void tolerance_used(const ff_tensor_set *got, const ff_tensor_set *want, double atol, double rtol) {
    for (size_t i = 0; i < want->n; i++) {
        const ff_host_tensor *w = &want->items[i], *g = ff_tensor_set_find(got, w->name);
        if (!g || ff_host_tensor_numel(g) != ff_host_tensor_numel(w)) continue; /* pt_compare_sets fails it */
        double mx = 0, err = 0;
        for (int64_t k = 0; k < ff_host_tensor_numel(w); k++)
            mx = fmax(mx, fabs(w->data[k])), err = fmax(err, fabs((double)g->data[k] - w->data[k]));
        used_after = fmax(used_after, err / (atol + rtol * mx));
    }
}

static int rank_of(const pg_job *j, int t, int s, int d) { return t + j->tp * (s + j->pp * d); }

/* the union of replica d's stages' sets (TP rank 0 of each); which: 0 grads, 1 after, 2 optim */
static ff_tensor_set *stages(const pg_job *j, int d, int which) {
    ff_tensor_set *sets[PG_MAXR];
    for (int s = 0; s < j->pp; s++) {
        const pg_out *o = &j->out[rank_of(j, 0, s, d)];
        sets[s] = which == 0 ? o->grads : which == 1 ? o->after : o->optim;
        REQUIRE(sets[s]);
    }
    return pt_merge(sets, j->pp, which == 2 ? "step" : NULL);
}

/* every rank's set `which` equal bit for bit to TP rank 0 of its stage in replica 0 */
static void same_everywhere(const char *name, const pg_job *j, int which) {
    char what[200];
    for (int q = 0; q < j->tp * j->pp * j->dp; q++) {
        const int t = q % j->tp, s = (q / j->tp) % j->pp, d = q / (j->tp * j->pp);
        if (q == rank_of(j, 0, s, 0)) continue;
        const pg_out *o = &j->out[q], *o0 = &j->out[rank_of(j, 0, s, 0)];
        pt_err e = {0};
        snprintf(what, sizeof what, "%s TP rank %d stage %d replica %d %s", name, t, s, d, which == 1 ? "weights" : "AdamW state");
        pt_compare_sets(&e, what, which == 1 ? o->after : o->optim, which == 1 ? o0->after : o0->optim, 0, 0);
        if (e.differs) {
            fprintf(stderr, "%s: not bit for bit\n", what);
            ff_test_failures++;
        }
    }
}

/* one ZeRO-0 layout against the single rank */
static void against_reference(const char *name, const pg_job *j, bool tied) {
    const pt_result *ref = &refs[tied];
    const int n = j->tp * j->pp * j->dp;
    char what[200];
    /* outputs: the last stage of each replica, on the replica's micro-batches */
    const pt_batch *g = &gb;
    const int64_t N = g->off[M];
    float *lp = calloc((size_t)N, sizeof(float)), *ent = calloc((size_t)N, sizeof(float));
    REQUIRE(lp && ent);
    for (int d = 0; d < j->dp; d++) {
        const pg_out *o = &j->out[rank_of(j, 0, j->pp - 1, d)];
        const int64_t a = g->off[d * j->micro], b = g->off[(d + 1) * j->micro];
        memcpy(lp + a, o->lp + a, sizeof(float) * (size_t)(b - a));
        memcpy(ent + a, o->ent + a, sizeof(float) * (size_t)(b - a));
    }
    snprintf(what, sizeof what, "%s log-probs", name);
    pt_close(&err_out, what, lp, ref->lp, N, 0, TOL_OUT);
    snprintf(what, sizeof what, "%s entropy", name);
    pt_close(&err_out, what, ent, ref->ent, N, 0, TOL_OUT);
    free(lp), free(ent);
    /* the loss: every rank of a replica the same; the replicas' partial losses sum to the reference's */
    double loss = 0;
    for (int d = 0; d < j->dp; d++) {
        const double l0 = j->out[rank_of(j, 0, 0, d)].stats[0].loss[0];
        for (int q = d * j->tp * j->pp; q < (d + 1) * j->tp * j->pp; q++) CHECK(j->out[q].stats[0].loss[0] == l0);
        loss += l0;
    }
    CHECK_CLOSE(loss, ref->loss[0], 0, TOL_LOSS);
    err_loss = fmax(err_loss, fabs(loss - ref->loss[0]) / fabs(ref->loss[0]));
    /* the norms: every rank the same bits, the reference's within the tolerance */
    for (int k = 0; k < PT_STEPS; k++) {
        const double nm = j->out[0].stats[k].optim[0].grad_norm;
        for (int q = 0; q < n; q++) CHECK(j->out[q].stats[k].optim[0].grad_norm == nm);
        CHECK_CLOSE(nm, ref->norm[k], 0, TOL_NORM);
        err_norm = fmax(err_norm, fabs(nm - ref->norm[k]) / ref->norm[k]);
    }
    CHECK(j->out[0].stats[0].optim[0].clipped);
    /* every gradient after the first step, the weights and state after the last */
    ff_tensor_set *grads = stages(j, 0, 0), *after = stages(j, 0, 1), *optim = stages(j, 0, 2);
    snprintf(what, sizeof what, "%s gradients", name);
    pt_compare_sets(&err_grad, what, grads, ref->grads, 0, TOL_GRAD);
    snprintf(what, sizeof what, "%s after %d steps", name, PT_STEPS);
    pt_compare_sets(&err_after, what, after, ref->after, PT_ATOL_AFTER, PT_TOL_AFTER);
    snprintf(what, sizeof what, "%s AdamW state", name);
    pt_compare_sets(&err_state, what, optim, ref->optim, 0, TOL_STATE);
    tolerance_used(after, ref->after, PT_ATOL_AFTER, PT_TOL_AFTER);
    ff_tensor_set_destroy(&grads);
    ff_tensor_set_destroy(&after);
    ff_tensor_set_destroy(&optim);
    same_everywhere(name, j, 1);
    same_everywhere(name, j, 2);
}

/* ZeRO-1 of the layout of z0 (ZeRO-0) against it */
static void against_zero0(const char *name, const pg_job *z1, const pg_job *z0) {
    char what[200];
    /* the tied embedding's copies on two stages: ZeRO-0 adds them after the DP sum, ZeRO-1 before */
    const bool exact = !(z1->cfg->tie_word_embeddings && z1->pp > 1);
    pt_err *e = exact ? &err_zero : &err_zero_tied;
    for (int k = 0; k < PT_STEPS; k++)
        for (int q = 0; q < z1->tp * z1->pp * z1->dp; q++) {
            if (k == 0) CHECK(z1->out[q].stats[0].loss[0] == z0->out[q].stats[0].loss[0]); /* the same forwards */
            const double a = z1->out[q].stats[k].optim[0].grad_norm, b = z0->out[q].stats[k].optim[0].grad_norm;
            CHECK_CLOSE(a, b, 0, exact ? TOL_ZERO_NORM : TOL_NORM);
            double *en = exact ? &err_zero_norm : &err_zero_norm_tied;
            *en = fmax(*en, fabs(a - b) / b);
        }
    ff_tensor_set *a1 = stages(z1, 0, 1), *a0 = stages(z0, 0, 1), *o1 = stages(z1, 0, 2), *o0 = stages(z0, 0, 2);
    snprintf(what, sizeof what, "%s weights against ZeRO-0", name);
    pt_compare_sets(e, what, a1, a0, 0, exact ? 0 : TOL_ZERO_TIED);
    snprintf(what, sizeof what, "%s AdamW state against ZeRO-0", name);
    pt_compare_sets(e, what, o1, o0, 0, exact ? 0 : TOL_ZERO_TIED);
    ff_tensor_set_destroy(&a1), ff_tensor_set_destroy(&a0), ff_tensor_set_destroy(&o1), ff_tensor_set_destroy(&o0);
    same_everywhere(name, z1, 1);
    same_everywhere(name, z1, 2);
    /* the state's bytes: 8 per float of the rank's range, the ranges tiling each stage's buffer */
    double ratio = 0;
    for (int s = 0; s < z1->pp; s++)
        for (int t = 0; t < z1->tp; t++) {
            const pg_out *full = &z0->out[rank_of(z0, t, s, 0)];
            const int64_t n = full->params;
            CHECK(full->state_bytes == 8 * n && full->lo == 0 && full->hi == n);
            int64_t half = (n + z1->dp - 1) / z1->dp, sum = 0, next = 0;
            half = (half + FF_ZERO_ALIGN - 1) / FF_ZERO_ALIGN * FF_ZERO_ALIGN;
            for (int d = 0; d < z1->dp; d++) {
                const pg_out *o = &z1->out[rank_of(z1, t, s, d)];
                CHECK(o->params == n && o->lo == next && o->hi >= o->lo && o->hi - o->lo <= half);
                CHECK_EQ_INT(o->state_bytes, 8 * (o->hi - o->lo));
                next = o->hi;
                sum += o->state_bytes;
                ratio = fmax(ratio, (double)o->state_bytes / (double)full->state_bytes);
            }
            CHECK(next == n && sum == full->state_bytes);
        }
    CHECK(ratio > 0);
    zero_ratio_max = fmax(zero_ratio_max, ratio);
    printf("%-34s optimizer state per rank at most %.3f of ZeRO-0's\n", name, ratio);
}

/* dev, run with TP's and DP's collectives on the models' buffers (as workers run them), against
 * the same layout through host memory: every loss, norm, weight and AdamW state bit for bit */
static void against_host(const char *name, const pg_job *dev) {
    grid_host = true;
    pg_job *h = grid(dev->tp, dev->pp, dev->dp, dev->vpp > 1 ? dev->vpp : 1, dev->cfg->tie_word_embeddings, dev->zero);
    grid_host = false;
    char what[200];
    for (int k = 0; k < PT_STEPS; k++)
        for (int q = 0; q < dev->tp * dev->pp * dev->dp; q++) {
            CHECK(dev->out[q].stats[k].loss[0] == h->out[q].stats[k].loss[0]);
            CHECK(dev->out[q].stats[k].optim[0].grad_norm == h->out[q].stats[k].optim[0].grad_norm);
        }
    pt_err e = {0};
    for (int which = 1; which <= 2; which++) {
        ff_tensor_set *a = stages(dev, 0, which), *b = stages(h, 0, which);
        snprintf(what, sizeof what, "%s %s on the buffers against through host memory", name, which == 1 ? "weights" : "AdamW state");
        pt_compare_sets(&e, what, a, b, 0, 0);
        ff_tensor_set_destroy(&a), ff_tensor_set_destroy(&b);
    }
    CHECK(!e.differs);
    printf("%-34s the same bits with the collectives through host memory\n", name);
    pg_job_clear(h);
    free(h);
}

int main(void) {
    cfgs[0] = tiny_config(V, H, FFN, L, NH, NKV, false, true, false);
    cfgs[1] = tiny_config(V, H, FFN, L, NH, NKV, true, false, false);
    for (int c = 0; c < 2; c++) { /* the grid's inputs */
        ff_tensor_set *w;
        if (c) pt_batch_free(&gb);
        pg_inputs(&cfgs[c], M, 0, MAXLEN, 0.2, &w, &gb);
        pt_reference(&cfgs[c], w, &gb, &refs[c]);
        ff_tensor_set_destroy(&w);
    }
    const int tps[] = {1, 2, 4}, pps[] = {1, 2, 4};
    int i = 0;
    for (int dp = 1; dp <= 2; dp++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int vpp = 1; vpp <= 2; vpp++) {
                    const int tp = tps[a], pp = pps[b];
                    if (tp * pp * dp > 8 || tp * pp * dp == 1 || (vpp > 1 && pp == 1)) continue;
                    const bool tied = i++ % 2;
                    char name[96];
                    snprintf(name, sizeof name, "tp%d pp%d dp%d %s%s", tp, pp, dp, vpp > 1 ? "interleaved v2" : "1f1b",
                             tied ? " tied" : "");
                    pg_job *z0 = grid(tp, pp, dp, vpp, tied, 0);
                    against_reference(name, z0, tied);
                    if (tp == 2 && pp == 2 && vpp == 1) against_host(name, z0); /* TP's all-reduces and DP's hook */
                    if (dp > 1 && vpp == 1) {
                        char zn[128];
                        snprintf(zn, sizeof zn, "%s zero1", name);
                        pg_job *z1 = grid(tp, pp, dp, vpp, tied, 1);
                        against_zero0(zn, z1, z0);
                        if (tp == 2 && pp == 2) against_host(zn, z1); /* ZeRO-1's reduce-scatter and all-gather */
                        pg_job_clear(z1);
                        free(z1);
                    }
                    pg_job_clear(z0);
                    free(z0);
                }
    printf("%d grid runs; the worst relative errors against the single rank: outputs %.3g, loss %.3g, norms %.3g, "
           "gradients %.3g; after %d AdamW steps weights %.3g (%.2f of the tolerance with its absolute part), AdamW state "
           "%.3g\n",
           n_layouts, err_out.rel, err_loss, err_norm, err_grad.rel, PT_STEPS, err_after.rel, used_after, err_state.rel);
    printf("ZeRO-1 against ZeRO-0: %.3g (bit for bit: %s), norms %.3g; with the tied embedding on two stages %.3g, norms "
           "%.3g; optimizer state per rank at most %.3f of ZeRO-0's\n",
           err_zero.rel, err_zero.differs ? "no" : "yes", err_zero_norm, err_zero_tied.rel, err_zero_norm_tied, zero_ratio_max);
    for (int c = 0; c < 2; c++) pt_result_free(&refs[c]);
    pt_batch_free(&gb);
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

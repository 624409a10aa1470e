/* The bytes a training step sends per rank and dimension against the planner's traffic
 * (ff_plan_evaluate's stages[s].traffic[TP, PP, DP]): ranks as threads over ff_coll CPU
 * communicators (tests/pipe/pipe_grid.h: TP inside each stage model, 1F1B over the PP group,
 * the DP gradient sum in the executor's before_step), a model of 4 layers, 8 query heads, 4
 * key/value heads, vocabulary 64, one step of 4 micro-batches of 2 x 8 tokens, at TP 2, PP 2,
 * DP 2 and TP 2 x PP 2 x DP 2 (8 ranks).
 *
 * Every rank's counted bytes must stand to the planner's, for the same dims, sequence length,
 * micro-batch, micro-batches and layout, in the exact relation the differences on purpose give
 * (each printed with its ratio):
 *   TP: the layers' all-reduces (4 per layer and micro-batch, of [T, H]; their calls counted
 *       exactly) are 2 x the planner's (fp32 here, bf16 there); what the planner does not model
 *       comes on top and is counted call by call: the embedding's sum (first stage), the LM
 *       head's input gradient and the vocabulary statistics (last stage), the gradient norm;
 *   PP: each send is the whole fp32 [T, H] on every TP rank, the planner's a bf16 1/t share
 *       (Megatron scatters it over TP): 2 t x the planner's, as many sends;
 *   DP: the fp32 all-reduce of the rank's flat gradients, the planner's FP32 gradients on the wire
 *       (grad_reduce_bytes 4) of its parameters: equal but for the norms, which every TP rank
 *       holds whole and the planner divides by t: the bytes are in the ratio of the parameter
 *       counts, and the counts differ by exactly (1 - 1/t) x the stage's norm weights.
 * The f64 sums of the PP group (gradient norm, the executor's closing loss and timings) are
 * not in the planner either; printed. */
#include <math.h>

#include "fuseflow/plan.h"
#include "tests/pipe/pipe_grid.h"

enum { L = 4, H = 64, NH = 8, NKV = 4, FFN = 96, V = 64, G = 4, LEN = 8 };

static void layout(int tp, int pp, int dp) {
    ff_model_config cfg = tiny_config(V, H, FFN, L, NH, NKV, false, false, false);
    pg_job *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (pg_job){.cfg = &cfg, .tp = tp, .pp = pp, .dp = dp, .micro = G, .len = LEN, .steps = 1, .warmup = false};
    CHECK(pg_run(j) == 0);

    ff_plan_input in;
    ff_plan_input_defaults(&in);
    in.model = (ff_plan_model){.layers = L, .hidden = H, .heads = NH, .kv_heads = NKV, .head_dim = H / NH, .ffn = FFN,
                               .vocab = V, .tied_embeddings = false, .gated_mlp = true};
    snprintf(in.model.name, sizeof in.model.name, "test");
    in.workload.seq = LEN;
    in.workload.micro_batch = 2;
    in.workload.micro_batches = G;
    in.workload.global_batch = 0;
    in.workload.grad_reduce_bytes = 4;
    in.layout.tp = tp, in.layout.pp = pp, in.layout.dp = dp;
    in.layout.zero = 0;
    in.layout.sequence_parallel = false; /* the engine all-reduces */
    in.layout.schedule = FF_PLAN_1F1B;
    in.cluster.gpus = tp * pp * dp;
    ff_plan_result pr;
    REQUIRE(ff_plan_evaluate(&in, &pr) == 0);

    const double T = 2.0 * LEN; /* tokens per micro-batch */
    char name[64];
    snprintf(name, sizeof name, "TP %d x PP %d x DP %d", tp, pp, dp);
    for (int q = 0; q < tp * pp * dp; q++) {
        const pg_out *o = &j->out[q];
        const pg_bytes *b = &o->bytes;
        const int s = (q / tp) % pp, t = q % tp;
        const bool first = s == 0, last = s == pp - 1;
        const int64_t Ls = pr.stages[s].layers;
        const ff_plan_stage *ps = &pr.stages[s];
        CHECK(o->ok);
        /* TP: the calls by kind, exactly */
        double layers = 0, extra = 0;
        int64_t th = 0, vmax = 0, vsum = 0, norm = 0, other = 0;
        for (int i = 0; i < b->tp_n; i++) {
            const size_t n = b->tp_count[i];
            const int64_t c = b->tp_calls[i];
            double one = 0;
            pg_ring(&one, tp, n, b->tp_op[i] == PG_SUM64 ? 8 : 4, b->tp_op[i] == PG_GATHER);
            if (b->tp_op[i] == PG_SUM && n == (size_t)T * H) th += c;
            else if (b->tp_op[i] == PG_MAX && n == (size_t)T) vmax += c, extra += (double)c * one;
            else if (b->tp_op[i] == PG_SUM && n == 3 * (size_t)T) vsum += c, extra += (double)c * one;
            else if (b->tp_op[i] == PG_SUM64 && n == 1) norm += c, extra += (double)c * one;
            else {
                fprintf(stderr, "%s rank %d: unexpected TP %s of %zu (%lld calls)\n", name, q, pg_op_name[b->tp_op[i]], n, (long long)c);
                other++;
            }
        }
        CHECK_EQ_INT(other, 0);
        if (tp > 1) {
            CHECK_EQ_INT(th, G * (4 * Ls + (first ? 1 : 0) + (last ? 1 : 0)));
            CHECK_EQ_INT(vmax, last ? G : 0);
            CHECK_EQ_INT(vsum, last ? G : 0);
            CHECK_EQ_INT(norm, 1);
            double one = 0;
            pg_ring(&one, tp, (size_t)T * H, 4, false);
            layers = (double)(G * 4 * Ls) * one;
            extra += (double)(G * ((first ? 1 : 0) + (last ? 1 : 0))) * one;
        } else {
            CHECK_EQ_INT(b->tp_n, 0);
        }
        CHECK_CLOSE(layers, 2.0 * ps->traffic[FF_PLAN_TP], 0, 1e-12);
        CHECK_CLOSE(b->dim[PG_TP], layers + extra, 0, 1e-12);
        /* PP: sends of the whole fp32 [T, H] */
        const int64_t sends = pp > 1 ? G * ((last ? 0 : 1) + (first ? 0 : 1)) : 0;
        CHECK_EQ_INT(b->pp_sends, sends);
        CHECK_CLOSE(b->dim[PG_PP], (double)sends * T * H * 4.0, 0, 0);
        CHECK_CLOSE(b->dim[PG_PP], 2.0 * tp * ps->traffic[FF_PLAN_PP], 0, 1e-12);
        /* DP: the flat gradients; the norms whole on every TP rank, divided by t in the planner */
        const double norms = 2.0 * (double)Ls * H + (last ? H : 0);
        CHECK_CLOSE((double)o->params, ps->params + (1.0 - 1.0 / tp) * norms, 0, 1e-12);
        CHECK_EQ_INT(b->dp_calls, dp > 1 ? 1 : 0);
        double dpb = 0;
        pg_ring(&dpb, dp, (size_t)o->params, 4, false);
        CHECK_CLOSE(b->dim[PG_DP], dpb, 0, 1e-12);
        CHECK_CLOSE(b->dim[PG_DP] * ps->params, ps->traffic[FF_PLAN_DP] * (double)o->params, 0, 1e-12);
        if (t == 0 && (q / (tp * pp)) == 0 && tp > 1) /* one line per stage and dimension in use */
            printf("%-20s stage %d: TP %7.0f B = %.3f x the planner's %.0f (2 x: fp32 here, bf16 there; + %.0f B of embedding, "
                   "LM head, vocabulary statistics, norm it does not model)\n",
                   name, s, b->dim[PG_TP], ps->traffic[FF_PLAN_TP] > 0 ? b->dim[PG_TP] / ps->traffic[FF_PLAN_TP] : 0.0,
                   ps->traffic[FF_PLAN_TP], extra);
        if (t == 0 && (q / (tp * pp)) == 0 && pp > 1)
            printf("%-20s stage %d: PP %7.0f B = %.3f x the planner's %.0f (2 t: fp32 and the whole [T, H] on every TP rank, "
                   "bf16 1/t there); f64 sums %.0f B not modelled\n",
                   name, s, b->dim[PG_PP], ps->traffic[FF_PLAN_PP] > 0 ? b->dim[PG_PP] / ps->traffic[FF_PLAN_PP] : 0.0,
                   ps->traffic[FF_PLAN_PP], b->pp_sums);
        if (t == 0 && (q / (tp * pp)) == 0 && dp > 1)
            printf("%-20s stage %d: DP %7.0f B = %.4f x the planner's %.0f (fp32 both; %lld parameters here, %.0f there: the "
                   "norms whole on each TP rank, the planner divides them by t)\n",
                   name, s, b->dim[PG_DP], ps->traffic[FF_PLAN_DP] > 0 ? b->dim[PG_DP] / ps->traffic[FF_PLAN_DP] : 0.0,
                   ps->traffic[FF_PLAN_DP], (long long)o->params, ps->params);
    }
    /* the planner's per-dimension figure is its busiest stage's */
    for (int d = 0; d < 3; d++) {
        const ff_plan_dim dim = d == 0 ? FF_PLAN_TP : d == 1 ? FF_PLAN_PP : FF_PLAN_DP;
        double mx = 0;
        for (int64_t s = 0; s < pr.n_stages; s++) mx = fmax(mx, pr.stages[s].traffic[dim]);
        CHECK(pr.traffic[dim].bytes == mx);
    }
    ff_plan_result_clear(&pr);
    free(j);
}

int main(void) {
    layout(2, 1, 1);
    layout(1, 2, 1);
    layout(1, 1, 2);
    layout(2, 2, 2);
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

/* bench_parallel: one training step of the small Llama-style model of bench_pipeline at TP 2,
 * PP 2 (1F1B, 8 micro-batches) and TP 2 x PP 2, beside the single-rank step on the same global
 * batch, in the same run. The ranks are threads of this process over ff_coll CPU communicators,
 * each with its own cpu:1 backend (tests/pipe/pipe_grid.h); the single rank runs on cpu:1 and on
 * as many threads as the layout has ranks (the same cores). Per layout it prints the step time
 * (median over the measured steps of the slowest rank's) and its ratio to both single-rank
 * times, the bubble measured (ff_pipe_exec_stats.bubble_fraction) beside the simulator's on the
 * measured stage times (ff_pipe_exec_simulate) and the formula (ff_pipe_bubble_formula), the
 * bytes each rank sent per dimension (counted on the communicators, ring algorithms) beside the
 * planner's (ff_plan_evaluate on the same dims, sequence, micro-batches and layout; why they
 * differ: tests/pipe/test_traffic.c), and the loss against the single rank's.
 *
 * On a machine with fewer cores than ranks, TP and PP cannot be faster than the single rank on
 * the same cores: what is measured is their overhead (collectives and transfers,
 * the bubble, threads sharing cores). Each layout runs twice: with its collectives
 * and pipeline transfers on the models' buffers (ff_model_comm's dev_ calls,
 * ff_pipe_transport_coll_dev, as workers run them) and through host memory (FF_DEVICE_COLL=0's
 * way); the ratios are printed. The target is the TP 2 x PP 2 step within
 * 1.5 x the single rank on 4 threads. On a machine shared with other jobs the wall times follow
 * the share of the cores each run's threads get (more threads, a larger share), so the CPU
 * seconds of the process per step are printed too: the work each layout adds.
 *
 * Usage: bench_parallel [--steps N] [--micro M] [--len T] [--layers L] [--hidden H] [--vocab V] [--quick]
 * (defaults: 3 measured steps after one warm-up, 8 micro-batches of 2 x 128 tokens, 8 layers,
 * hidden 256, vocabulary 1024: bench_pipeline's model). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/plan.h"
#include "tests/pipe/pipe_grid.h"

typedef struct result {
    int tp, pp;
    double step, bubble, sim, formula, loss, single_n, single_1; /* s */
    double step_host, loss_host; /* the same layout with its collectives and transfers through host memory */
    double cpu, cpu_n, cpu_1; /* CPU s per step: the grid's (all ranks), the single rank's */
    double bytes[PG_MAXR][PG_NDIMS]; /* per rank, the last step's */
    double plan[PG_MAXR][PG_NDIMS];  /* the planner's for the rank's stage */
} result;

static void run_layout(const ff_model_config *cfg, int tp, int pp, int32_t micro, int32_t len, int steps, bool host, result *res) {
    pg_job *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (pg_job){.cfg = cfg, .tp = tp, .pp = pp, .dp = 1, .micro = micro, .len = len, .steps = steps, .warmup = true,
                  .host_coll = host};
    if (pg_run(j)) {
        fprintf(stderr, "bench_parallel: a rank of TP %d x PP %d failed\n", tp, pp);
        exit(1);
    }
    const int n = tp * pp;
    double wall[PG_MAX_STEPS] = {0}, bub[PG_MAX_STEPS] = {0}, cpu[PG_MAX_STEPS] = {0};
    for (int k = 0; k < steps; k++) {
        cpu[k] = j->out[0].cpu[k];
        wall[k] = 0;
        for (int q = 0; q < n; q++) wall[k] = fmax(wall[k], j->out[q].stats[k].wall_s);
        bub[k] = j->out[0].stats[k].bubble_fraction;
    }
    memset(res, 0, sizeof *res);
    res->tp = tp, res->pp = pp;
    res->step = pg_median(wall, steps);
    res->bubble = pg_median(bub, steps);
    res->cpu = pg_median(cpu, steps);
    res->sim = j->out[0].sim, res->formula = j->out[0].formula, res->loss = j->out[0].loss;

    ff_plan_input in;
    ff_plan_input_defaults(&in);
    in.model = (ff_plan_model){.layers = cfg->num_hidden_layers, .hidden = cfg->hidden_size, .heads = cfg->num_attention_heads,
                               .kv_heads = cfg->num_key_value_heads, .head_dim = cfg->hidden_size / cfg->num_attention_heads,
                               .ffn = cfg->intermediate_size, .vocab = cfg->vocab_size, .tied_embeddings = cfg->tie_word_embeddings,
                               .gated_mlp = true, .vocab_unpadded = true};
    snprintf(in.model.name, sizeof in.model.name, "bench");
    in.workload.seq = len;
    in.workload.micro_batch = 2;
    in.workload.micro_batches = micro;
    in.workload.global_batch = 0;
    in.layout.tp = tp, in.layout.pp = pp, in.layout.dp = 1, in.layout.zero = 0;
    in.layout.sequence_parallel = false;
    in.cluster.gpus = n;
    ff_plan_result pr;
    if (ff_plan_evaluate(&in, &pr)) {
        fprintf(stderr, "bench_parallel: the planner: %s\n", ff_error_message());
        exit(1);
    }
    for (int q = 0; q < n; q++) {
        const int s = (q / tp) % pp;
        for (int d = 0; d < PG_NDIMS; d++) res->bytes[q][d] = j->out[q].bytes.dim[d];
        res->plan[q][PG_TP] = pr.stages[s].traffic[FF_PLAN_TP];
        res->plan[q][PG_PP] = pr.stages[s].traffic[FF_PLAN_PP];
        res->plan[q][PG_DP] = pr.stages[s].traffic[FF_PLAN_DP];
    }
    ff_plan_result_clear(&pr);
    free(j);
}

static const char *mb(double b, char *buf) {
    snprintf(buf, 24, "%.2f MB", b / 1e6);
    return buf;
}

int main(int argc, char **argv) {
    int32_t micro = 8, len = 128;
    int steps = 3, layers = 8, hidden = 256, vocab = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--micro") && i + 1 < argc) micro = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--len") && i + 1 < argc) len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) hidden = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) steps = 1, len = 32, layers = 4, hidden = 128;
        else {
            fprintf(stderr, "usage: bench_parallel [--steps N] [--micro M] [--len T] [--layers L] [--hidden H] [--vocab V] [--quick]\n");
            return 2;
        }
    }
    if (steps < 1 || steps > PG_MAX_STEPS || micro < 2 || micro > PT_MAX_MICRO || len < 2 || layers < 2 || hidden < 64 ||
        hidden % 64 || vocab < 2 || vocab % 2) {
        fprintf(stderr, "bench_parallel: --steps 1..%d, --micro 2..%d, --len >= 2, --layers >= 2, --hidden a multiple of 64, "
                        "--vocab even\n", PG_MAX_STEPS, PT_MAX_MICRO);
        return 2;
    }
    /* bench_pipeline's model; TP 2 needs the heads, key-value heads, FFN and vocabulary even */
    ff_model_config cfg = tiny_config(vocab, hidden, hidden * 8 / 3 / 32 * 32, layers, hidden / 32, hidden / 64, false, false, false);
    cfg.max_position_embeddings = 2 * len;
    printf("model: %d layers, hidden %d, intermediate %d, %d heads / %d KV heads, vocabulary %d; %d micro-batches of 2 x %d "
           "tokens; 1F1B; ranks are threads over ff_coll (cpu), each a cpu:1 backend\n",
           layers, hidden, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads, vocab, micro, len);

    double l1, ln;
    const int lay[3][2] = {{2, 1}, {1, 2}, {2, 2}};
    result res[3];
    for (int i = 0; i < 3; i++) {
        result *r = &res[i];
        /* the single rank measured right before each layout: the shared machine's load then is alike */
        const int n = lay[i][0] * lay[i][1];
        char spec[16], name[32], a[24], b[24];
        snprintf(spec, sizeof spec, "cpu:%d", n);
        double c1, cn;
        const double t1 = pg_single(&cfg, micro, len, steps, "cpu:1", &l1, &c1), tn = pg_single(&cfg, micro, len, steps, spec, &ln, &cn);
        /* first through host memory, then on the buffers (the result kept) */
        run_layout(&cfg, lay[i][0], lay[i][1], micro, len, steps, true, r);
        const double sh = r->step, lh = r->loss;
        run_layout(&cfg, lay[i][0], lay[i][1], micro, len, steps, false, r);
        r->step_host = sh, r->loss_host = lh;
        r->single_n = tn, r->single_1 = t1, r->cpu_n = cn, r->cpu_1 = c1;
        snprintf(name, sizeof name, "TP %d x PP %d", r->tp, r->pp);
        printf("%-12s step %.1f ms = %.2f x the single rank on %d threads (%.1f ms), %.2f x on 1 (%.1f ms); loss %.9g (single rank "
               "%.9g, rel. %.1e)\n",
               name, 1e3 * r->step, r->step / tn, n, 1e3 * tn, r->step / t1, 1e3 * t1, r->loss, l1, fabs(r->loss - l1) / fabs(l1));
        printf("%-12s CPU %.1f ms per step (all ranks) = %.2f x the single rank's on 1 thread (%.1f ms), %.2f x on %d (%.1f ms)\n", "",
               1e3 * r->cpu, r->cpu / c1, 1e3 * c1, r->cpu / cn, n, 1e3 * cn);
        printf("%-12s collectives and transfers on the models' buffers (as workers run them); through host memory the step "
               "is %.1f ms (%.2f x on the buffers), loss %s\n",
                   "", 1e3 * r->step_host, r->step / r->step_host, r->loss_host == r->loss ? "the same bits" : "DIFFERENT");
        if (r->pp > 1)
            printf("%-12s bubble %.3f measured, %.3f simulated on the measured stage times, %.3f formula (p-1)/(m+p-1)\n", "", r->bubble,
                   r->sim, r->formula);
        for (int s = 0; s < r->pp; s++) {
            const int q = s * r->tp; /* TP rank 0 of stage s; the others send alike */
            printf("%-12s stage %d bytes per rank:", "", s);
            if (r->tp > 1)
                printf(" TP %s (planner %s, %.2fx)", mb(r->bytes[q][PG_TP], a), mb(r->plan[q][PG_TP], b),
                       r->bytes[q][PG_TP] / r->plan[q][PG_TP]);
            if (r->pp > 1)
                printf(" PP %s (planner %s, %.2fx)", mb(r->bytes[q][PG_PP], a), mb(r->plan[q][PG_PP], b),
                       r->bytes[q][PG_PP] / r->plan[q][PG_PP]);
            printf("\n");
        }
    }
    printf("(the bytes differ from the planner's on purpose: fp32 here, bf16 there, so TP 2x plus the embedding, LM head and "
           "vocabulary statistics it does not model; PP sends the whole [T, H] from every TP rank, 2 t x: tests/pipe/test_traffic.c)\n");
    const result *g = &res[2];
    printf("bench_parallel: TP2xPP2 step %.1f ms = %.2f x the single rank on the same 4 threads (%.1f ms; %.2f x its 1-thread "
           "step), CPU per step %.2f x the 1-thread single rank's; TP2 %.2f x, PP2 %.2f x the 2-thread single rank; bubble %.3f "
           "measured, %.3f simulated, %.3f formula; on the buffers %.2f x (TP2), %.2f x (PP2), %.2f x (TP2xPP2) through host "
           "memory (target: TP2xPP2 <= 1.5 x the 4-thread single rank)\n",
           1e3 * g->step, g->step / g->single_n, 1e3 * g->single_n, g->step / g->single_1, g->cpu / g->cpu_1,
           res[0].step / res[0].single_n, res[1].step / res[1].single_n, g->bubble, g->sim, g->formula, res[0].step / res[0].step_host,
           res[1].step / res[1].step_host, g->step / g->step_host);
    return 0;
}

/* bench_pipeline: one training step of a small Llama-style model pipelined over 2 processes
 * (PP 2, 1F1B, 8 micro-batches, ff_coll between them, one backend thread each) beside the
 * single-rank step on the same global batch, in the same run: the single rank on as many
 * backend threads as the pipeline has processes (the same cores), and on one. It prints the
 * step times, the pipeline's overhead against the single rank on the same cores, the bubble
 * measured from the trace (every rank's instruction times) beside the simulator's on the
 * measured stage times and the planner's formula, the time spent in transfers, and checks that
 * both computed the same loss.
 *
 * On p cores PP p cannot beat the single rank using all p cores: its best is the single rank's
 * time x (m + p - 1) / m (the bubble) over the single rank's own threading efficiency. The
 * target is that bound plus 10%, and a measured bubble within 0.05 of the simulator's (which
 * knows the stages' real imbalance; the formula assumes none).
 *
 * Usage: bench_pipeline [--steps N] [--micro M] [--len T] [--layers L] [--hidden H] [--vocab V] [--quick]
 * (defaults: 3 measured steps after one warm-up, 8 micro-batches of 2 sequences of 128
 * tokens, 8 layers, hidden 256, vocabulary 1024: the LM head then weighs about a fifth of a
 * layer, and the stages are near the balance the formula assumes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/pipe_exec.h"
#include "tests/coll/coll_test.h"
#include "tests/pipe/pipe_grid.h"

enum { MAX_STEPS = PG_MAX_STEPS };

typedef struct bench {
    ff_model_config cfg;
    int32_t micro, len, steps;
} bench;

/* What each pipeline rank leaves in the shared page. */
typedef struct rank_out {
    double wall[MAX_STEPS], makespan[MAX_STEPS], bubble[MAX_STEPS], transfer[MAX_STEPS], compute[MAX_STEPS];
    double sim, formula, loss;
    int ok;
} rank_out;

static int pp_rank(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg) {
    (void)id;
    const bench *b = arg;
    rank_out *out = (rank_out *)g_shared + rank;
    ff_tensor_set *w;
    pt_batch g;
    pg_inputs(&b->cfg, b->micro, b->len, 0, 0, &w, &g);
    ff_pipe_config pc = {.pp = nranks, .micro = b->micro, .kind = FF_PIPE_1F1B, .layers = b->cfg.num_hidden_layers};
    ff_pipe_schedule s;
    REQUIRE(ff_pipe_generate(&pc, &s) == 0);
    ff_pipe_transport t;
    ff_pipe_transport_coll(comm, &t);
    ff_model_comm nc;
    ff_pipe_model_comm(&t, &nc);
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_stage st;
    REQUIRE(ff_pipe_stage_layers(&s, 0, rank, first, count, &st) == 0);
    st.comm = &nc;
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model *m = ff_model_new_opts(be, &b->cfg, w, &(ff_model_opts){.stage = &st});
    REQUIRE(m);
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = ff_optimizer_new(m, &ac);
    ff_pipe_exec_model em = {.model = m, .opt = opt, .logprobs = true, .entropy = true, .loss = pt_loss, .loss_ctx = &g};
    ff_pipe_exec *e = ff_pipe_exec_new(&s, rank, &t, &em);
    if (!e) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(e);
    ff_pipe_run run = {.micro = {g.b}, .measure = true};
    for (int k = 0; k <= b->steps; k++) { /* step 0 warms up */
        ff_pipe_exec_stats x;
        if (ff_pipe_exec_run(e, &run, &x)) {
            fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
            return 1;
        }
        if (k == 0) {
            out->loss = x.loss[0];
            continue;
        }
        out->wall[k - 1] = x.wall_s, out->makespan[k - 1] = x.makespan_s, out->bubble[k - 1] = x.bubble_fraction;
        out->transfer[k - 1] = x.transfer_s, out->compute[k - 1] = x.compute_s;
    }
    ff_pipe_sim sim;
    REQUIRE(ff_pipe_exec_simulate(e, &sim) == 0);
    out->sim = sim.bubble_fraction;
    out->formula = ff_pipe_bubble_formula(&pc);
    out->ok = 1;
    ff_pipe_sim_clear(&sim);
    ff_pipe_exec_destroy(&e);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_pipe_schedule_clear(&s);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
    return 0;
}

int main(int argc, char **argv) {
    bench b = {.micro = 8, .len = 128, .steps = 3};
    int layers = 8, hidden = 256, vocab = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) b.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--micro") && i + 1 < argc) b.micro = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--len") && i + 1 < argc) b.len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) hidden = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) b.steps = 1, b.len = 32, layers = 4, hidden = 128;
        else {
            fprintf(stderr, "usage: bench_pipeline [--steps N] [--micro M] [--len T] [--layers L] [--hidden H] [--vocab V] [--quick]\n");
            return 2;
        }
    }
    if (b.steps < 1 || b.steps > MAX_STEPS || b.micro < 2 || b.micro > PT_MAX_MICRO || b.len < 2 || layers < 2 ||
        hidden < 16 || hidden % 16 || vocab < 2) {
        fprintf(stderr, "bench_pipeline: --steps 1..%d, --micro 2..%d, --len >= 2, --layers >= 2, --hidden a multiple of 16, --vocab >= 2\n",
                MAX_STEPS, PT_MAX_MICRO);
        return 2;
    }
    const int p = 2;
    b.cfg = tiny_config(vocab, hidden, hidden * 8 / 3 / 16 * 16, layers, hidden / 32 > 0 ? hidden / 32 : 1,
                        hidden / 64 > 0 ? hidden / 64 : 1, false, false, false);
    b.cfg.max_position_embeddings = 2 * b.len;
    printf("model: %d layers, hidden %d, intermediate %d, vocabulary %d; %d micro-batches of 2 x %d tokens; PP %d 1F1B\n",
           layers, hidden, b.cfg.intermediate_size, b.cfg.vocab_size, b.micro, b.len, p);
    /* the pipeline first: this process starts no thread before its forks */
    run_opts ro = default_run();
    ro.watchdog_s = 600;
    if (run_ranks(p, &ro, pp_rank, &b)) {
        fprintf(stderr, "bench_pipeline: a pipeline rank failed\n");
        return 1;
    }
    rank_out out[2];
    memcpy(out, g_shared, sizeof out);
    double l1, l2, t1 = pg_single(&b.cfg, b.micro, b.len, b.steps, "cpu:1", &l1, NULL),
                  tp = pg_single(&b.cfg, b.micro, b.len, b.steps, "cpu:2", &l2, NULL);
    double wall[MAX_STEPS], bub[MAX_STEPS], xfer[MAX_STEPS];
    for (int k = 0; k < b.steps; k++) {
        wall[k] = fmax(out[0].wall[k], out[1].wall[k]);
        bub[k] = out[0].bubble[k];
        xfer[k] = 0.5 * (out[0].transfer[k] + out[1].transfer[k]);
    }
    const double tpp = pg_median(wall, b.steps), bubble = pg_median(bub, b.steps), tx = pg_median(xfer, b.steps);
    const double bound = (double)(b.micro + p - 1) / b.micro; /* the bubble's cost on the same cores */
    printf("single rank: %.1f ms on 1 thread, %.1f ms on %d threads (%.2fx)\n", 1e3 * t1, 1e3 * tp, p, t1 / tp);
    printf("PP %d:        %.1f ms, %.2f x the single rank on %d threads, %.2f x on 1; transfers (waits included) %.1f ms a rank\n",
           p, 1e3 * tpp, tpp / tp, p, tpp / t1, 1e3 * tx);
    printf("bubble:      %.3f measured, %.3f simulated on the measured stage times, formula (p-1)/(m+p-1) = %.3f\n", bubble,
           out[0].sim, out[0].formula);
    const bool same = out[0].loss == l1 && out[1].loss == l1 && l1 == l2;
    printf("loss:        pipeline %.9g, single rank %.9g (%s)\n", out[0].loss, l1, same ? "the same bits" : "DIFFER");
    printf("bench_pipeline: PP2 1F1B step %.1f ms = %.2f x the single-rank step on the same %d cores (%.1f ms), "
           "bubble %.3f measured, %.3f simulated, %.3f formula (target: <= %.2f x, the bubble's (m+p-1)/m plus 10%%; "
           "measured bubble within 0.05 of the simulated)\n",
           1e3 * tpp, tpp / tp, p, 1e3 * tp, bubble, out[0].sim, out[0].formula, 1.1 * bound);
    return same ? 0 : 1;
}

/* bench_fuse_step: RLHFuse's fused training step against the serial one, measured. An actor
 * (PP 4 over 4 ranks) and a critic (PP 2 x 2 replicas in the reverse direction, nodes [1, 0] and
 * [3, 2]; or --pp4: PP 4 reversed) train on 4 rank threads (one cpu:1 backend each, the mailbox
 * transport of tests/pipe) over the same stage models, a serial step (the actor's 1F1B, then the
 * critic's: the fused streams of the serial schedule) and a fused step in turn, several times.
 *
 * The fused problem is built from measurements (ff_pipe_fuse_instance on a warm-up of serial
 * steps: each model's mean stage forward and backward, its activation bytes); the fused
 * schedule is the solver's for it (ff_fuse_solve), the serial one ff_fuse_serial's, and the
 * fused simulator's serial/fused makespan ratio on that instance is the prediction, printed
 * beside the pipeline simulator's on the streams (whose transfers block) and the measured one.
 *
 * On a machine with fewer cores than ranks the measurement understates fusion: a rank idle in a
 * bubble gives its core to another rank, so the serial step's bubbles are partly not idle time
 * there, and fused steps, which keep more ranks busy at once, make each compute slower. The CPU
 * seconds per step (all threads) and the cores' lower bound (CPU / cores) are printed with it.
 *
 * The transport is the tests' mailbox with sends that do not block, as the executor makes them
 * over ff_coll (a posted send is done once received in its rendezvous mode, at once with
 * --buffered).
 *
 * Usage: bench_fuse_step [--reps N] [--pp4] [--buffered] [--micro M] [--len T] [--hidden H]
 *        [--layers L] [--critic-layers L] [--quick]
 * (defaults: 5 repetitions after a warm-up; 8 actor micro-batches and as many critic ones (4 per
 * replica) of 2 sequences of 64 tokens; hidden 256, vocabulary 512; an actor of 8 layers and a
 * critic of 4). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/pipe/fuse_exec_util.h"
#include "bench_util.h"

/* The pipeline simulator's makespan of the streams with the instance's times. */
static double streams_makespan(const ff_fuse_instance *in, const ff_pipe_schedule *p) {
    double f[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES], b[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES];
    ff_pipe_sim_opts o = {0};
    for (int i = 0; i < in->n_models; i++) {
        for (int32_t k = 0; k < in->models[i].n_stages; k++) f[i][k] = in->models[i].fwd, b[i][k] = in->models[i].bwd;
        o.fwd_stage_s[i] = f[i], o.bwd_stage_s[i] = b[i];
    }
    ff_pipe_sim sim;
    const int rc = ff_pipe_simulate(p, &o, &sim);
    const double mk = rc ? -1 : sim.makespan_s;
    ff_pipe_sim_clear(&sim);
    return mk;
}

/* The fused schedule for `in`: the solver's (ff_fuse_solve, 2 s on the machine's cores). */
static double solve(const ff_fuse_instance *in, ff_fuse_schedule *out) {
    ff_fuse_solve_opts o = {.seconds = 2, .seed = 1};
    ff_fuse_solve_stats st;
    if (ff_fuse_solve(in, &o, out, &st)) fprintf(stderr, "%s\n", ff_error_message()), exit(1);
    return fz_makespan(in, out);
}

int main(int argc, char **argv) {
    int reps = 5;
    bool pp4 = false, buffered = false;
    int32_t micro = 8, len = 64, hidden = 256, layers = 8, critic_layers = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pp4")) pp4 = true;
        else if (!strcmp(argv[i], "--buffered")) buffered = true;
        else if (!strcmp(argv[i], "--micro") && i + 1 < argc) micro = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--len") && i + 1 < argc) len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) hidden = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--critic-layers") && i + 1 < argc) critic_layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) reps = 2, len = 16, hidden = 64;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--pp4] [--buffered] [--micro M] [--len T] [--hidden H] [--layers L] [--critic-layers L] [--quick]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > FX_MAXREPS - 1 || micro < 2 || micro % 2 || micro > PT_MAX_MICRO || len < 2 || hidden < 16 ||
        hidden % 16 || layers < 4 || critic_layers < (pp4 ? 4 : 2)) {
        fprintf(stderr, "bench_fuse_step: reps 1 .. %d, an even micro >= 2, len >= 2, hidden a multiple of 16, layers >= 4, "
                        "critic layers >= its stages\n", FX_MAXREPS - 1);
        return 2;
    }
    const ff_model_config cfg[2] = {tiny_config(512, hidden, hidden * 8 / 3 / 16 * 16, layers, hidden / 16, hidden / 32, false, false, false),
                                    tiny_config(512, hidden, hidden * 8 / 3 / 16 * 16, critic_layers, hidden / 16, hidden / 32, false, false,
                                                true)};
    ff_tensor_set *w[2];
    pt_batch g[2];
    for (int f = 0; f < 2; f++) {
        REQUIRE((w[f] = ff_tensor_set_new()) && ff_model_init_weights(&cfg[f], 3 + (uint64_t)f, 0.02, w[f]) == 0);
        pt_batch_make(&g[f], micro, cfg[f].vocab_size, 0, len, 5 + (uint64_t)f);
    }
    const int64_t L[FF_FUSE_MAX_MODELS] = {layers, critic_layers, critic_layers};
    /* the layout, with placeholder times until measured */
    ff_fuse_instance layout = fz_layout(!pp4, micro, pp4 ? micro : micro / 2, 1, 1);
    ff_fuse_schedule serial;
    fz_serial(&layout, &serial);
    ff_pipe_schedule ps;
    if (ff_fuse_to_pipe(&layout, &serial, L, &ps)) fprintf(stderr, "%s\n", ff_error_message()), exit(1);
    /* warm-up serial steps: the measured instance */
    fx_job *j = calloc(1, sizeof *j);
    REQUIRE(j);
    *j = (fx_job){.in = &layout, .sched = {&ps}, .n_sched = 1, .reps = 2, .cfg = {&cfg[0], &cfg[1]}, .w = {w[0], w[1]},
                  .g = {&g[0], &g[1]}, .measure_from = 0, .rendezvous = !buffered};
    if (fx_run(j)) fprintf(stderr, "bench_fuse_step: the warm-up failed\n"), exit(1);
    const ff_fuse_instance in = j->measured;
    for (int i = 0; i < in.n_models; i++)
        printf("%-8s stages %d, %2d micro-batches: forward %.2f ms, backward %.2f ms per stage; activation %.0f KiB\n",
               in.models[i].name, in.models[i].n_stages, in.models[i].micro, 1e3 * in.models[i].fwd, 1e3 * in.models[i].bwd,
               in.models[i].act / 1024);
    /* the fused schedule for the measured instance, and the predictions */
    ff_fuse_schedule sm, fused;
    fz_serial(&in, &sm);
    const double t0 = (double)ff_now_ns();
    const double sim_fused = solve(&in, &fused), sim_serial = fz_makespan(&in, &sm);
    const double solve_s = ((double)ff_now_ns() - t0) * 1e-9;
    ff_pipe_schedule pf, pss;
    if (ff_fuse_to_pipe(&in, &fused, L, &pf) || ff_fuse_to_pipe(&in, &sm, L, &pss)) fprintf(stderr, "%s\n", ff_error_message()), exit(1);
    const double st_serial = streams_makespan(&in, &pss), st_fused = streams_makespan(&in, &pf);
    /* serial and fused in turn on the same stage models */
    *j = (fx_job){.in = &layout, .sched = {&ps, &pf}, .n_sched = 2, .reps = reps + 1, .cfg = {&cfg[0], &cfg[1]}, .w = {w[0], w[1]},
                  .g = {&g[0], &g[1]}, .measure_from = -1, .rendezvous = !buffered};
    if (fx_run(j)) fprintf(stderr, "bench_fuse_step: a step failed\n"), exit(1);
    double wall[2][FX_MAXREPS], cpu[2][FX_MAXREPS], mk[2][FX_MAXREPS];
    for (int q = 0; q < 2; q++)
        for (int k = 1; k <= reps; k++) { /* the first of each is a warm-up */
            double wmax = 0;
            for (int r = 0; r < FX_RANKS; r++) wmax = fmax(wmax, j->stats[q][k][r].wall_s);
            wall[q][k - 1] = wmax, cpu[q][k - 1] = j->cpu[q][k], mk[q][k - 1] = j->stats[q][k][0].makespan_s;
        }
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *names[2] = {"serial", "fused"};
    double med[2];
    for (int q = 0; q < 2; q++) {
        printf("%-6s step:", names[q]);
        for (int k = 0; k < reps; k++) printf(" %.1f", 1e3 * wall[q][k]);
        med[q] = median(wall[q], reps); /* sorts: wall[q][0] is the least */
        const double c = median(cpu[q], reps);
        printf(" ms; median %.1f ms, least %.1f ms (compute makespan %.1f ms), CPU %.1f ms = %.2f cores busy (the %ld cores' bound "
               "%.1f ms)\n",
               1e3 * med[q], 1e3 * wall[q][0], 1e3 * median(mk[q], reps), 1e3 * c, c / med[q], cores, 1e3 * c / (double)cores);
    }
    printf("fused simulator on the measured instance: serial %.1f ms, fused %.1f ms (%.3f x; schedule found in %.2f s); "
           "pipeline simulator on the streams (sends not blocking): %.1f ms, %.1f ms (%.3f x)\n",
           1e3 * sim_serial, 1e3 * sim_fused, sim_serial / sim_fused, solve_s, 1e3 * st_serial, 1e3 * st_fused, st_serial / st_fused);
    printf("note: %s transfers; %d rank threads on %ld cores (one backend thread each): ranks share cores, so the serial step's "
           "bubbles are partly busy elsewhere and the fused step's computes slow each other down%s\n",
           buffered ? "buffered" : "rendezvous", FX_RANKS, cores, cores >= FX_RANKS ? " (here each rank has a core)" : "");
    printf("fuse_step: %.2f x faster than serial (predicted %.2f) (target: the simulator's prediction)\n", med[0] / med[1],
           sim_serial / sim_fused);
    free(j);
    ff_pipe_schedule_clear(&ps), ff_pipe_schedule_clear(&pf), ff_pipe_schedule_clear(&pss);
    fz_free(&serial), fz_free(&sm), fz_free(&fused);
    for (int f = 0; f < 2; f++) ff_tensor_set_destroy(&w[f]), pt_batch_free(&g[f]);
    return 0;
}

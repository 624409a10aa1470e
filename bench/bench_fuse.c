/* bench_fuse: the fused actor+critic solver (fuseflow/fuse.h) on the family of
 * instances, after RLHFuse's evaluation: 8 and 16 nodes; the actor on every node in order;
 * the critic on every node in reverse, or as two replicas of nodes/2 stages each (each
 * reversed over its half, with half the micro-batches and twice the layers per stage, so
 * twice the time and activation per stage); 8 to 64 micro-batches; actor to critic forward
 * times 5:4, 5:2, 2:2, 2:1 per layer, backward twice the forward; actor to critic activation
 * per layer 1.6, 1.8 or 2.0. For each: the serial baseline's makespan (each model's 1F1B in
 * turn), the fused makespan, the makespan lower bound and the ratio, the peak activation over
 * its bound (at the fused makespan) and over the serial baseline's, the makespan of the
 * executor's streams for the fused schedule (ff_fuse_to_pipe, run by ff_pipe_simulate with the
 * same times and no latency, sends not blocking as the executor makes them) over the fused
 * simulator's, the speed-up over serial of what runs (the serial baseline's streams over the
 * fused schedule's), and the solve time on the given threads. Then the same instance solved
 * with a makespan slack (ff_fuse_solve_opts.makespan_slack, --slack, default 0.02): its makespan
 * over the bound, its peak over its bound (at its makespan) and over the serial baseline's, and
 * its time. The last two lines count the instances against each target, at slack 0 and at the
 * slack; the last, the headline, is slack 0's.
 *
 * Not a test: it measures, and says how far from the targets it is (at the lower bound where
 * it is reachable, within 1% elsewhere, at most 10 s per instance).
 *
 * With --cap R instead (what `fuse_peak: R` does in `fuseflow run`): each instance solved as
 * before and under a peak cap of R x the serial baseline's peak (ff_fuse_solve_capped: the least
 * peak within growing makespan slacks, the first that fits), side by side: the slack it took, its
 * makespan over the bound, its peak over serial's, and the speed-up over serial of what runs
 * (the streams), capped and not; the headline is the capped mean speed-up beside the uncapped.
 *
 * Usage: bench_fuse [--seconds S per solve (default 4)] [--threads N (default 2)] [--slack F]
 * [--cap R] [--quick] (--quick: 8 nodes and 8 and 32 micro-batches only; --slack 0: no second
 * solve). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/fuse.h"
#include "fuseflow/pipeline.h"
#include "fuseflow/util.h"

static void make(ff_fuse_instance *in, int nodes, int replicas, int micro, double fa, double fc, double act_ratio) {
    memset(in, 0, sizeof *in);
    in->nodes = nodes;
    in->n_models = 1 + replicas;
    ff_fuse_model *a = &in->models[0];
    snprintf(a->name, sizeof a->name, "actor");
    snprintf(a->family, sizeof a->family, "actor");
    a->n_stages = nodes;
    for (int s = 0; s < nodes; s++) a->stages[s] = s;
    a->micro = micro;
    a->fwd = fa, a->bwd = 2 * fa, a->act = act_ratio;
    int per = nodes / replicas;
    for (int r = 0; r < replicas; r++) {
        ff_fuse_model *c = &in->models[1 + r];
        snprintf(c->name, sizeof c->name, "critic%d", r);
        snprintf(c->family, sizeof c->family, "critic");
        c->n_stages = per;
        for (int s = 0; s < per; s++) c->stages[s] = r * per + per - 1 - s;
        c->micro = micro / replicas;
        c->fwd = fc * replicas, c->bwd = 2 * fc * replicas, c->act = 1.0 * replicas;
    }
}


static const double ratios[][2] = {{5, 4}, {5, 2}, {2, 2}, {2, 1}};
static const double acts[] = {1.6, 1.8, 2.0};
static const int node_counts[] = {8, 16}, micros[] = {8, 16, 32, 64};

/* The 64 instances, idx = node count (2) x critic layout (2) x micro-batches (4) x forward
 * ratio (4), in that order; --quick keeps 8 nodes at 8 and 32 micro-batches. */
enum { N_CASES = 64 };
typedef struct bench_case {
    ff_fuse_instance in;
    int nodes, replicas, micro;
    char layout[16], ratio[16];
} bench_case;

static bool case_at(int idx, bool quick, bench_case *c) {
    const int ni = idx / 32, replicas = 1 + idx / 16 % 2, mi = idx / 4 % 4, ri = idx % 4;
    c->nodes = node_counts[ni], c->replicas = replicas, c->micro = micros[mi];
    if (quick && (c->nodes != 8 || (c->micro != 8 && c->micro != 32))) return false;
    make(&c->in, c->nodes, replicas, c->micro, ratios[ri][0], ratios[ri][1], acts[idx % 3]);
    snprintf(c->layout, sizeof c->layout, replicas == 1 ? "pp%d" : "pp%dx2", c->nodes / replicas);
    snprintf(c->ratio, sizeof c->ratio, "%g:%g", ratios[ri][0], ratios[ri][1]);
    return true;
}

/* --cap R: the fastest schedule whose peak is at most R x serial's, beside the uncapped one. */
static int cap_mode(double seconds, int threads, double cap, bool quick) {
    printf("%-5s %-8s %5s %6s | %8s %8s %8s | %6s %8s %8s %8s\n", "nodes", "critic", "micro", "f a:c", "ratio", "/serial", "run gain",
           "slack", "ratio", "/serial", "run gain");
    int count = 0, fit = 0, fit_at_0 = 0, within = 0, slower = 0;
    double sum_plain = 0, sum_cap = 0, least_cap = INFINITY, max_s = 0;
    for (int idx = 0; idx < N_CASES; idx++) {
        bench_case c;
        if (!case_at(idx, quick, &c)) continue;
        const ff_fuse_instance in = c.in;
        ff_fuse_schedule ser, plain, capped;
        ff_fuse_sim ss, ps, cs;
        ff_fuse_solve_opts o = {.seconds = seconds, .seed = 1, .threads = threads};
        ff_fuse_solve_stats st;
        double slack = -1, lb, plb;
        int64_t t0 = ff_now_ns();
        if (ff_fuse_serial(&in, &ser) || ff_fuse_simulate(&in, &ser, &ss) || ff_fuse_solve(&in, &o, &plain, &st) ||
            ff_fuse_simulate(&in, &plain, &ps) || ff_fuse_solve_capped(&in, &o, cap * ss.peak_activation, &capped, &st, &slack) ||
            ff_fuse_simulate(&in, &capped, &cs)) {
            fprintf(stderr, "bench_fuse: %s\n", ff_error_message());
            return 1;
        }
        ff_fuse_lower_bounds(&in, &lb, &plb);
        double ser_smk = ff_fuse_streams_makespan(&in, &ser), p_smk = ff_fuse_streams_makespan(&in, &plain),
               c_smk = ff_fuse_streams_makespan(&in, &capped);
        if (ser_smk < 0 || p_smk < 0 || c_smk < 0) {
            fprintf(stderr, "bench_fuse: the streams: %s\n", ff_error_message());
            return 1;
        }
        printf("%-5d %-8s %5d %6s | %8.4f %8.3f %8.3f | %6g %8.4f %8.3f %8.3f\n", c.nodes, c.layout, c.micro, c.ratio, ps.makespan / lb,
               ps.peak_activation / ss.peak_activation, ser_smk / p_smk, slack, cs.makespan / lb,
               cs.peak_activation / ss.peak_activation, ser_smk / c_smk);
        fflush(stdout);
        count++;
        fit += slack >= 0;
        fit_at_0 += slack == 0;
        within += slack >= 0 && cs.makespan <= 1.01 * lb * (1 + 1e-12);
        sum_plain += ser_smk / p_smk;
        /* where nothing fits, `fuseflow run` trains serially: a gain of 1 */
        double g = slack >= 0 ? ser_smk / c_smk : 1;
        sum_cap += g;
        least_cap = fmin(least_cap, g);
        slower += g < 1;
        max_s = fmax(max_s, (double)(ff_now_ns() - t0) / 1e9);
        ff_fuse_schedule_free(&ser);
        ff_fuse_schedule_free(&plain);
        ff_fuse_schedule_free(&capped);
    }
    printf("%d instances under a peak of %g x the serial 1F1B's: %d fit (%d at slack 0, %d within 1%% of the makespan bound), %d slower than "
           "serial; %.1f s max per instance (both solves)\n",
           count, cap, fit, fit_at_0, within, slower, max_s);
    printf("fuse_cap: %.3fx mean speed-up over serial under a %g x serial peak cap (uncapped: %.3fx), %.3fx least (target: none set; "
           "the uncapped speed-up is the ceiling)\n",
           sum_cap / count, cap, sum_plain / count, least_cap);
    return 0;
}

int main(int argc, char **argv) {
    double seconds = 4;
    int threads = 2;
    bool quick = false;
    double slack = 0.02;
    double cap = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--slack") && i + 1 < argc) slack = atof(argv[++i]);
        else if (!strcmp(argv[i], "--cap") && i + 1 < argc) cap = atof(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else {
            fprintf(stderr, "usage: bench_fuse [--seconds S] [--threads N] [--slack F] [--cap R] [--quick]\n");
            return 2;
        }
    }
    if (cap > 0) return cap_mode(seconds, threads, cap, quick);
    printf("%-5s %-8s %5s %6s %10s %10s %10s %8s %8s %8s %8s %8s %8s %8s | slack %g: %8s %8s %8s %8s\n", "nodes", "critic", "micro", "f a:c", "serial",
           "fused", "bound", "ratio", "speedup", "peak/lb", "/serial", "streams", "run gain", "seconds", slack, "ratio", "peak/lb", "/serial", "seconds");
    int count = 0, at_lb = 0, within = 0, in_time = 0, peak_ok = 0, streams_same = 0;
    int s_peak_ok = 0, s_under_serial = 0, under_serial = 0, s_within = 0;
    double s_worst_peak = 0, s_worst_ratio = 0, s_max_s = 0;
    double sum_ratio = 0, worst = 0, max_s = 0, worst_peak = 0, sum_speed = 0, worst_streams = 0, sum_run = 0, least_run = INFINITY;
    for (int idx = 0; idx < N_CASES; idx++) {
        bench_case c;
        if (!case_at(idx, quick, &c)) continue;
        const ff_fuse_instance in = c.in;
        ff_fuse_schedule ser, fused;
        ff_fuse_sim ss, fs;
        ff_fuse_solve_opts o = {.seconds = seconds, .seed = 1, .threads = threads};
        ff_fuse_solve_stats st;
        if (ff_fuse_serial(&in, &ser) || ff_fuse_simulate(&in, &ser, &ss) || ff_fuse_solve(&in, &o, &fused, &st) ||
            ff_fuse_simulate(&in, &fused, &fs)) {
            fprintf(stderr, "bench_fuse: %s\n", ff_error_message());
            return 1;
        }
        double lb, plb_opt;
        ff_fuse_lower_bounds(&in, &lb, &plb_opt);
        double plb = ff_fuse_peak_bound(&in, fs.makespan), ratio = fs.makespan / lb, peak = fs.peak_activation / plb;
        double smk = ff_fuse_streams_makespan(&in, &fused), ser_smk = ff_fuse_streams_makespan(&in, &ser);
        if (smk < 0 || ser_smk < 0) {
            fprintf(stderr, "bench_fuse: the streams: %s\n", ff_error_message());
            return 1;
        }
        printf("%-5d %-8s %5d %6s %10.6g %10.6g %10.6g %8.4f %8.3f %8.3f %8.3f %8.4f %8.3f %8.3f", c.nodes, c.layout, c.micro, c.ratio, ss.makespan, fs.makespan, lb,
               ratio, ss.makespan / fs.makespan, peak, fs.peak_activation / ss.peak_activation, smk / fs.makespan, ser_smk / smk, st.seconds);
        under_serial += fs.peak_activation <= ss.peak_activation * (1 + 1e-9);
        if (slack > 0) { /* the trade: the least peak within (1 + slack) x the best makespan */
            ff_fuse_solve_opts os = o;
            os.makespan_slack = slack;
            ff_fuse_schedule traded;
            ff_fuse_sim ts;
            ff_fuse_solve_stats tst;
            if (ff_fuse_solve(&in, &os, &traded, &tst) || ff_fuse_simulate(&in, &traded, &ts)) {
                fprintf(stderr, "bench_fuse: slack %g: %s\n", slack, ff_error_message());
                return 1;
            }
            double tr = ts.makespan / lb, tp = ts.peak_activation / ff_fuse_peak_bound(&in, ts.makespan);
            printf(" |          %8.4f %8.3f %8.3f %8.3f", tr, tp, ts.peak_activation / ss.peak_activation, tst.seconds);
            s_peak_ok += tp <= 1.3 + 1e-12;
            s_under_serial += ts.peak_activation <= ss.peak_activation * (1 + 1e-9);
            s_within += ts.makespan <= fs.makespan * (1 + slack) * (1 + 1e-9);
            s_worst_peak = fmax(s_worst_peak, tp);
            s_worst_ratio = fmax(s_worst_ratio, tr);
            s_max_s = fmax(s_max_s, tst.seconds);
            ff_fuse_schedule_free(&traded);
        }
        putchar('\n');
        sum_run += ser_smk / smk;
        least_run = fmin(least_run, ser_smk / smk);
        fflush(stdout);
        count++;
        at_lb += st.optimal;
        sum_ratio += ratio;
        sum_speed += ss.makespan / fs.makespan;
        worst = fmax(worst, ratio);
        worst_peak = fmax(worst_peak, peak);
        max_s = fmax(max_s, st.seconds);
        within += ratio <= 1.01 + 1e-12;
        in_time += st.seconds <= 10;
        peak_ok += peak <= 1.3 + 1e-12;
        streams_same += smk <= fs.makespan * (1 + 1e-9);
        worst_streams = fmax(worst_streams, smk / fs.makespan);
        ff_fuse_schedule_free(&ser);
        ff_fuse_schedule_free(&fused);
    }
    printf("%d instances, %d at the lower bound; mean speed-up over serial %.3fx; worst peak activation %.3fx its bound; the executor's streams "
           "run the fused makespan on %d, worst %.3fx it; what runs, fused over serial: %.3fx mean, %.3fx least\n",
           count, at_lb, sum_speed / count, worst_peak, streams_same, worst_streams, sum_run / count, least_run);
    if (slack > 0)
        printf("slack %g: makespan <= (1 + slack) x slack 0's on %d/%d, worst %.4fx the bound; %.2f s max; peak <= 1.3x its bound on %d/%d, worst %.3fx; "
               "peak <= the serial 1F1B's on %d/%d (slack 0: %d/%d)\n",
               slack, s_within, count, s_worst_ratio, s_max_s, s_peak_ok, count, s_worst_peak, s_under_serial, count, under_serial, count);
    printf("fuse: makespan %.4f x lower bound mean, %.4f worst; %d/%d at the bound, %d/%d within 1%%; %.2f s max, %d/%d within 10 s; peak <= 1.3x its bound "
           "on %d/%d (target: at the bound where reachable, all within 1%%, all within 10 s, all peaks <= 1.3x)\n",
           sum_ratio / count, worst, at_lb, count, within, count, max_s, in_time, count, peak_ok, count);
    return 0;
}

/* `fuseflow schedule show`: a pipeline-parallel schedule's instruction streams, one per rank,
 * generated and simulated by fuseflow/pipeline.h; text, JSON, or an SVG timeline. Checks the
 * flags and names them in its errors; the schedules themselves are the library's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/error.h"
#include "fuseflow/pipeline.h"
#include "fuseflow/util.h"

static const char *CMD = "schedule show";

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow schedule show --pp P --micro M [--vpp V] [--kind gpipe|1f1b|interleaved] [options]\n\n"
            "Generates the instruction stream of every rank of a pipeline-parallel schedule (Megatron's\n"
            "orders: forwards, backwards, sends and receives of activations and gradients in grouped\n"
            "calls, the optimizer step), runs the streams against each other and prints them with the\n"
            "simulated makespan, the bubble beside its formula, and busy, idle and peak in-flight\n"
            "micro-batches per rank. docs/pipeline.md explains the schedules and the output.\n\n"
            "  --pp P             pipeline stages (one rank each), at least 1\n"
            "  --micro M          micro-batches per step, at least 1 (interleaved: a multiple of P)\n"
            "  --vpp V            model chunks per stage, interleaved only (default 1)\n"
            "  --kind K           gpipe, 1f1b or interleaved (default 1f1b; interleaved when --vpp > 1)\n"
            "  --forward-only     inference (log-probs, values): forwards only, no step\n"
            "  --layers L         place L layers over the stages by the planner's rule; a virtual\n"
            "                     stage's simulated time is then proportional to its layers\n"
            "  --layers-first N   layers of the first virtual stage (Megatron's uneven split; with --layers)\n"
            "  --layers-last N    layers of the last virtual stage\n"
            "  --fwd T            forward time of one micro-batch through one stage (default 1)\n"
            "  --bwd T            backward time (default 2)\n"
            "  --hop T            latency of one transfer (default 0)\n"
            "  --json             print the streams and the simulation as JSON\n"
            "  --svg FILE         also write the timeline (one row per rank) as an SVG picture\n");
}

int ff_cmd_schedule(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "show") != 0) {
        if (argc >= 2) fprintf(stderr, "fuseflow schedule: unknown subcommand '%s' (the one there is: show)\n", argv[1]);
        usage(stderr);
        return 2;
    }
    int64_t pp = 0, micro = 0, vpp = 0, layers = 0, first = 0, last = 0;
    double fwd = 1, bwd = 2, hop = 0;
    const char *kind_name = NULL, *svg = NULL;
    bool json = false, fwd_only = false;
    const ffio_opt opts[] = {
        {"pp", FFIO_INT, &pp, 1, INT32_MAX},          {"micro", FFIO_INT, &micro, 1, INT32_MAX},
        {"vpp", FFIO_INT, &vpp, 1, UINT16_MAX},       {"kind", FFIO_STR, &kind_name, 0, 0},
        {"forward-only", FFIO_FLAG, &fwd_only, 0, 0}, {"layers", FFIO_INT, &layers, 1, INT32_MAX},
        {"layers-first", FFIO_INT, &first, 1, INT32_MAX}, {"layers-last", FFIO_INT, &last, 1, INT32_MAX},
        {"fwd", FFIO_DOUBLE, &fwd, 0, 1e12},          {"bwd", FFIO_DOUBLE, &bwd, 0, 1e12},
        {"hop", FFIO_DOUBLE, &hop, 0, 1e12},          {"json", FFIO_FLAG, &json, 0, 0},
        {"svg", FFIO_STR, &svg, 0, 0},
    };
    char *pos[1];
    int n_pos;
    int rc = ffio_parse(CMD, argc - 1, argv + 1, opts, (int)(sizeof opts / sizeof *opts), pos, 0, &n_pos);
    if (rc == 1) {
        usage(stdout);
        return 0;
    }
    if (rc) return rc;
    if (!pp) return ffio_usage(CMD, "--pp is required (the number of pipeline stages)");
    if (!micro) return ffio_usage(CMD, "--micro is required (micro-batches per step)");
    ff_pipe_kind kind = vpp > 1 ? FF_PIPE_INTERLEAVED : FF_PIPE_1F1B;
    if (kind_name && ff_pipe_kind_parse(kind_name, &kind) != 0) return ffio_usage(CMD, "--kind: %s", ff_error_message());
    if (kind == FF_PIPE_INTERLEAVED && vpp < 2) return ffio_usage(CMD, "--kind interleaved needs --vpp of at least 2 (with one chunk it is 1f1b)");
    if (kind != FF_PIPE_INTERLEAVED && vpp > 1)
        return ffio_usage(CMD, "--vpp %lld needs --kind interleaved (%s runs one chunk per stage)", (long long)vpp, ff_pipe_kind_name(kind));
    if (kind == FF_PIPE_INTERLEAVED && micro % pp)
        return ffio_usage(CMD, "--micro %lld is not a multiple of --pp %lld: Megatron's interleaved schedule runs micro-batches in groups of pp",
                          (long long)micro, (long long)pp);
    if ((first || last) && !layers) return ffio_usage(CMD, "--layers-first and --layers-last need --layers");

    if (svg && ff_check_writable(svg) != 0) return ffio_fail(CMD); /* before anything is printed */

    ff_pipe_config c = {.pp = (int32_t)pp, .vpp = (int32_t)(vpp ? vpp : 1), .micro = (int32_t)micro, .kind = kind,
                        .forward_only = fwd_only, .layers = layers, .layers_first = first, .layers_last = last};
    ff_pipe_schedule s;
    if (ff_pipe_generate(&c, &s) != 0) return ffio_fail(CMD);
    ff_pipe_sim_opts o = {.fwd_s = fwd, .bwd_s = fwd_only ? 0 : bwd, .hop_s = hop};
    double *times = NULL;
    ff_pipe_sim sim;
    memset(&sim, 0, sizeof sim);
    int status = 1;
    if (layers) {
        int32_t S = s.models[0].n_stages;
        times = malloc(sizeof(double) * 2 * (size_t)S);
        if (!times) {
            ff_error_set(CMD, NULL, "out of memory");
            goto done;
        }
        if (ff_pipe_times_by_layers(&s, 0, o.fwd_s, o.bwd_s, times, times + S) != 0) goto done;
        o.fwd_stage_s[0] = times;
        o.bwd_stage_s[0] = times + S;
    }
    if (ff_pipe_simulate(&s, &o, &sim) != 0) goto done;
    if (json) {
        char *text = ff_pipe_json(&s, &sim);
        if (!text) goto done;
        puts(text);
        free(text);
    } else {
        printf("times: forward %g, backward %g per micro-batch through one stage%s, hop %g\n", o.fwd_s, o.bwd_s,
               layers ? " of the mean layer count (L/p)" : "", o.hop_s);
        ff_pipe_write_text(&s, &sim, stdout);
    }
    if (svg) {
        if (ff_pipe_write_svg(&s, &sim, svg) != 0) goto done;
        fprintf(json ? stderr : stdout, "wrote %s\n", svg);
    }
    status = 0;
done:
    if (status) ffio_fail(CMD);
    free(times);
    ff_pipe_sim_clear(&sim);
    ff_pipe_schedule_clear(&s);
    return status;
}

/* `fuseflow schedule show`: a pipeline-parallel schedule's instruction streams, one per rank,
 * generated and simulated by fuseflow/pipeline.h; text, JSON, or an SVG timeline.
 * `fuseflow schedule fuse | 1f1b | check`: RLHFuse's fused actor+critic schedule of an
 * instance file (fuseflow/fuse.h): solved, the serial baseline, or a given one scored. Checks
 * the flags and names them in its errors; the schedules themselves are the library's. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/error.h"
#include "fuseflow/fuse.h"
#include "fuseflow/pipeline.h"
#include "fuseflow/util.h"

static const char *CMD = "schedule show";

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow schedule show | fuse | 1f1b | check ...   (fuseflow schedule fuse --help: the fused ones)\n"
            "       fuseflow schedule show --pp P --micro M [--vpp V] [--kind gpipe|1f1b|interleaved] [options]\n\n"
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

static int cmd_fused(int argc, char **argv);

int ff_cmd_schedule(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && (!strcmp(argv[1], "fuse") || !strcmp(argv[1], "1f1b") || !strcmp(argv[1], "check"))) return cmd_fused(argc - 1, argv + 1);
    if (argc < 2 || strcmp(argv[1], "show") != 0) {
        if (argc >= 2) fprintf(stderr, "fuseflow schedule: unknown subcommand '%s' (they are: show, fuse, 1f1b, check)\n", argv[1]);
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

/* ---- the fused actor+critic schedule ---------------------------------------------------- */

static void usage_fused(FILE *out) {
    fprintf(out,
            "usage: fuseflow schedule fuse FILE.json [--seconds S] [--seed N] [--threads N] [--makespan-slack F | --peak-cap R] [--json]\n"
            "                                [--svg OUT.svg]\n"
            "       fuseflow schedule 1f1b FILE.json [--json] [--svg OUT.svg]\n"
            "       fuseflow schedule check FILE.json SCHEDULE.json [--json] [--svg OUT.svg]\n\n"
            "RLHFuse's intra-stage fusion: the actor and the critic (its replicas laid out in the\n"
            "opposite direction) train on the same nodes at once, each filling the other's pipeline\n"
            "bubbles. FILE.json is the instance: {\"nodes\": N, \"models\": [{\"name\", \"stages\": [node of\n"
            "each stage], \"micro_batches\", \"forward\", \"backward\", \"activation\", \"family\"}, ...],\n"
            "\"hop_latency\"} (docs/pipeline.md \"Fused actor and critic\"; examples/fuse_actor_critic.json).\n\n"
            "  fuse    solve: the shortest schedule found, then the least peak activation memory;\n"
            "          it stops early when both reach their lower bounds\n"
            "  1f1b    the serial baseline: each model's 1F1B one after the other (replicas of one\n"
            "          family side by side)\n"
            "  check   validate and score SCHEDULE.json ({\"schedule\": [[[model, \"F\"|\"B\"], ...] per\n"
            "          node]}, e.g. the --json output of fuse or 1f1b)\n\n"
            "Prints the makespan, the peak activation memory, their lower bounds (the peak's: the\n"
            "least any schedule as fast as this one can have) and ratios, and the schedule per node.\n\n"
            "  --seconds S   fuse: the time budget (default 10)\n"
            "  --seed N      fuse: the search's seed (default 0); same seed and threads, same answer\n"
            "                when it stops at the bounds\n"
            "  --threads N   fuse: search threads (default: the machine's cores)\n"
            "  --makespan-slack F\n"
            "                fuse: trade time for memory (0 to 1, default 0: makespan first): the\n"
            "                least peak it finds among schedules within (1 + F) x its best makespan,\n"
            "                e.g. 0.02 for up to 2%% longer (the peak bound printed is at the result's\n"
            "                makespan)\n"
            "  --peak-cap R  fuse: the fastest schedule whose peak activation is at most R x the\n"
            "                serial 1F1B's (0.1 to 100; fuseflow run's fuse_peak): where the fastest\n"
            "                holds more, the least peak within makespan slacks of 1%% to 100%%, the\n"
            "                first that fits (it says which, or that none did)\n"
            "  --json        one JSON object: makespan, peak_activation, lower_bound {makespan,\n"
            "                peak_activation}, schedule, and per node busy time and peak (with\n"
            "                --peak-cap also peak_cap and slack, -1 where nothing fits)\n"
            "  --svg FILE    also write the timeline (one row per node, one colour per family)\n");
}

static void print_schedule_text(const ff_fuse_instance *in, const ff_fuse_schedule *s) {
    printf("schedule (model:F or B, then the micro-batch):\n");
    for (int32_t n = 0; n < s->nodes; n++) {
        int32_t cnt[FF_FUSE_MAX_MODELS][2] = {{0}};
        printf("node %d:", (int)n);
        for (int64_t j = 0; j < s->n_tasks[n]; j++) {
            ff_fuse_task t = s->tasks[n][j];
            printf(" %d:%c%d", t.model, t.backward ? 'B' : 'F', (int)cnt[t.model][t.backward]++);
        }
        putchar('\n');
    }
    for (int i = 0; i < in->n_models; i++) printf("%s model %d: %s", i ? "," : "models:", i, in->models[i].name);
    putchar('\n');
}

static int print_json(const ff_fuse_instance *in, const ff_fuse_schedule *s, const ff_fuse_sim *sim, double lb_mk, double lb_pk, json_t *extra) {
    json_t *root = json_object(), *sched = json_array(), *busy = json_array(), *peak = json_array();
    json_object_set_new(root, "makespan", json_real(sim->makespan));
    json_object_set_new(root, "peak_activation", json_real(sim->peak_activation));
    json_object_set_new(root, "lower_bound", json_pack("{s:f, s:f}", "makespan", lb_mk, "peak_activation", lb_pk));
    for (int32_t n = 0; n < s->nodes; n++) {
        json_t *list = json_array();
        for (int64_t j = 0; j < s->n_tasks[n]; j++) json_array_append_new(list, json_pack("[i, s]", s->tasks[n][j].model, s->tasks[n][j].backward ? "B" : "F"));
        json_array_append_new(sched, list);
        json_array_append_new(busy, json_real(sim->node_busy[n]));
        json_array_append_new(peak, json_real(sim->node_peak[n]));
    }
    json_object_set_new(root, "node_busy", busy);
    json_object_set_new(root, "node_peak", peak);
    if (extra) json_object_update(root, extra);
    json_t *names = json_array();
    for (int i = 0; i < in->n_models; i++) json_array_append_new(names, json_string(in->models[i].name));
    json_object_set_new(root, "models", names);
    json_object_set_new(root, "schedule", sched);
    char *text = json_dumps(root, 0); /* one line */
    json_decref(root);
    if (!text) return ff_error_set("schedule", NULL, "cannot write the JSON (out of memory)");
    puts(text);
    free(text);
    return 0;
}

static int cmd_fused(int argc, char **argv) {
    const char *sub = argv[0];
    char cmd[32];
    snprintf(cmd, sizeof cmd, "schedule %s", sub);
    bool is_fuse = !strcmp(sub, "fuse"), is_check = !strcmp(sub, "check");
    double seconds = 10, slack = 0, cap = 0;
    int64_t seed = 0, threads = 0;
    bool json = false;
    const char *svg = NULL;
    const ffio_opt all[] = {
        {"json", FFIO_FLAG, &json, 0, 0},          {"svg", FFIO_STR, &svg, 0, 0},
        {"seconds", FFIO_DOUBLE, &seconds, 0.001, 86400}, {"seed", FFIO_INT, &seed, 0, 9007199254740992.0},
        {"threads", FFIO_INT, &threads, 1, 256},          {"makespan-slack", FFIO_DOUBLE, &slack, 0, 1},
        {"peak-cap", FFIO_DOUBLE, &cap, 0.1, 100},
    };
    char *pos[2];
    int n_pos;
    int rc = ffio_parse(cmd, argc, argv, all, is_fuse ? 7 : 2, pos, 2, &n_pos);
    if (rc == 1) {
        usage_fused(stdout);
        return 0;
    }
    if (rc) return rc;
    if (cap > 0 && slack > 0) return ffio_usage(cmd, "give --makespan-slack or --peak-cap, not both (the cap picks its own slack)");
    if (n_pos != (is_check ? 2 : 1))
        return ffio_usage(cmd, is_check ? "give the instance and the schedule: fuseflow schedule check FILE.json SCHEDULE.json"
                                        : "give one instance file: fuseflow %s FILE.json", cmd);
    ff_fuse_instance in;
    if (ff_fuse_instance_read(pos[0], &in)) return ffio_fail(cmd);
    if (svg && ff_check_writable(svg) != 0) return ffio_fail(cmd);
    ff_fuse_schedule s = {0};
    ff_fuse_solve_stats st = {0};
    ff_fuse_sim sim;
    int status = 1;
    double cap_slack = 0;
    if (is_fuse) {
        ff_fuse_solve_opts o = {.seconds = seconds, .seed = (uint64_t)seed, .threads = (int)threads, .makespan_slack = slack};
        if (cap > 0) {
            ff_fuse_schedule ser;
            ff_fuse_sim ss;
            if (ff_fuse_serial(&in, &ser)) goto done;
            rc = ff_fuse_simulate(&in, &ser, &ss);
            ff_fuse_schedule_free(&ser);
            if (rc || ff_fuse_solve_capped(&in, &o, cap * ss.peak_activation, &s, &st, &cap_slack)) goto done;
        } else if (ff_fuse_solve(&in, &o, &s, &st)) {
            goto done;
        }
    } else if (is_check) {
        size_t len;
        char *text = ff_read_file(pos[1], &len);
        if (!text) goto done;
        rc = ff_fuse_schedule_parse(&in, text, pos[1], &s);
        free(text);
        if (rc) goto done;
    } else if (ff_fuse_serial(&in, &s)) {
        goto done;
    }
    if (ff_fuse_simulate(&in, &s, &sim)) {
        if (is_check) ff_error_wrap("%s", pos[1]);
        goto done;
    }
    double lb_mk;
    ff_fuse_lower_bounds(&in, &lb_mk, NULL);
    double lb_pk = ff_fuse_peak_bound(&in, sim.makespan); /* the least of any schedule as fast as this one */
    double serial_mk = sim.makespan, serial_pk = sim.peak_activation;
    if (strcmp(sub, "1f1b") != 0) {
        ff_fuse_schedule ser;
        ff_fuse_sim ss;
        if (ff_fuse_serial(&in, &ser)) goto done;
        rc = ff_fuse_simulate(&in, &ser, &ss);
        ff_fuse_schedule_free(&ser);
        if (rc) goto done;
        serial_mk = ss.makespan;
        serial_pk = ss.peak_activation;
    }
    if (json) {
        json_t *extra = json_pack("{s:f, s:f}", "serial_makespan", serial_mk, "serial_peak_activation", serial_pk);
        if (is_fuse) {
            json_object_set_new(extra, "seconds", json_real(st.seconds));
            json_object_set_new(extra, "evaluations", json_integer(st.evaluations));
            json_object_set_new(extra, "optimal", json_boolean(st.optimal));
            if (cap > 0) {
                json_object_set_new(extra, "peak_cap", json_real(cap));
                json_object_set_new(extra, "slack", json_real(cap_slack));
            }
        }
        rc = print_json(&in, &s, &sim, lb_mk, lb_pk, extra);
        json_decref(extra);
        if (rc) goto done;
    } else {
        printf("instance %s: %d nodes, %d models\n", pos[0], (int)in.nodes, (int)in.n_models);
        printf("makespan %.6g, lower bound %.6g, ratio %.4f%s\n", sim.makespan, lb_mk, sim.makespan / lb_mk,
               sim.makespan <= lb_mk * (1 + 1e-9) ? " (optimal)" : "");
        printf("peak activation %.6g, lower bound at this makespan %.6g, ratio %.4f\n", sim.peak_activation, lb_pk, sim.peak_activation / lb_pk);
        printf("serial (1F1B one model after the other) makespan %.6g, peak activation %.6g: this schedule's speed-up %.4fx\n", serial_mk, serial_pk,
               serial_mk / sim.makespan);
        if (is_fuse && cap > 0 && cap_slack >= 0)
            printf("peak cap %g x serial (%.6g): met, the least peak within %g%% of the fastest schedule\n", cap, cap * serial_pk,
                   100 * cap_slack);
        else if (is_fuse && cap > 0)
            printf("peak cap %g x serial (%.6g): not met by any schedule found; this is the least peak within 100%% of the fastest\n", cap,
                   cap * serial_pk);
        if (is_fuse) printf("solve %.3f s, %lld schedules evaluated%s\n", st.seconds, (long long)st.evaluations,
                            cap > 0 ? " (the last solve)" : "");
        print_schedule_text(&in, &s);
    }
    if (svg) {
        if (ff_fuse_write_svg(&in, &s, svg)) goto done;
        fprintf(json ? stderr : stdout, "wrote %s\n", svg);
    }
    status = 0;
done:
    if (status) ffio_fail(cmd);
    ff_fuse_schedule_free(&s);
    return status;
}

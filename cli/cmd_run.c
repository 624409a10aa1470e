/* `fuseflow run CONFIG [key=value ...]`: run an RLHF algorithm graph on local workers, or on
 * workers from other hosts too (--listen) (include/fuseflow/executor.h does the work;
 * docs/run.md describes it). This file parses the
 * command line and turns Ctrl-C into "save a checkpoint and stop". */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/error.h"
#include "fuseflow/executor.h"
#include "fuseflow/util.h"

#define CMD "run"

static void help(void) {
    printf("usage: fuseflow run CONFIG.yaml [key.sub=value ...] [options]\n\n"
           "Runs the RLHF algorithm of a run config (examples/grpo.yaml, ppo.yaml, ...; docs/graphs.md has\n"
           "the schema): starts the controller and local worker processes, loads each role's model on its\n"
           "workers, and runs trainer.steps iterations of the graph (generation with continuous batching,\n"
           "scoring, rewards and advantages, training with data parallelism, weight sync). Each iteration\n"
           "prints a line of metrics (reward, accuracy, response length, KL, entropy, clip fraction, grad\n"
           "norm, time, tokens/s), also appended to OUT/metrics.jsonl (OUT = trainer.out_dir); with\n"
           "trainer.logger: [console, jsonl, tensorboard] also as TensorBoard event files in OUT (the\n"
           "default is [console, jsonl]); at the end OUT/curves.png shows the learning curves (fuseflow\n"
           "plot). A live line shows the stage in progress on a terminal. Held-out greedy exact match every trainer.test_freq\n"
           "iterations (and before the first); checkpoints every trainer.save_freq iterations, at the end,\n"
           "and on Ctrl-C (a second Ctrl-C stops at once, without one).\n\n"
           "  key.sub=value      override any config key (graph.rollout.n=16, roles.actor.optim.lr=2e-6)\n"
           "  --resume           continue from the newest checkpoint in OUT/checkpoints (same config and\n"
           "                     overrides: the metrics continue as in an uninterrupted run); refused when\n"
           "                     the config differs from the checkpoint's in a key other than\n"
           "                     trainer.test_freq, save_freq, out_dir, logger, schedule, acc_reward,\n"
           "                     data.val_files, val_batch_size, roles.*.workers, roles.*.colocate_with,\n"
           "                     roles.actor.rollout.workers (the differences are listed)\n"
           "  --resume-with-changes  resume anyway (e.g. a longer trainer.steps): the changes go to\n"
           "                     OUT/config_changes.jsonl; OUT/config.yaml stays the original\n"
           "  --workers N        data-parallel width of the actor (and of roles colocated with it)\n"
           "  --threads N        CPU threads per worker (default: cores / workers)\n"
           "  --trace FILE       write the run's timeline (Chrome JSON: open in ui.perfetto.dev): every\n"
            "                     subtask by node and sample, controller-side work, stages, and each\n"
            "                     job's dependencies along the samples' paths (fuseflow trace summary);\n"
            "                     checked before the run starts, and a failed write is an error\n"
           "  --val-limit N      held-out prompts per evaluation (default: all of data.val_files)\n"
           "  --stop-after N     stop after iteration N with a checkpoint (then --resume)\n"
           "  --dump-samples     write every sample (prompt, response, score) to OUT/samples.jsonl\n"
           "  --no-progress      no live progress line\n"
           "  --listen EP        bind the controller here (tcp://HOST:PORT) and take workers from other\n"
           "                     hosts: each runs `fuseflow worker --connect EP --curve worker.key`; the\n"
           "                     ranks are placed by host, a TP group on one host (docs/run.md \"Across hosts\")\n"
           "  --curve FILE       controller.key from `fuseflow keygen`: CURVE on the endpoint (the local\n"
           "                     workers use worker.key beside it, or --worker-key FILE)\n"
           "  --local K          start K of the run's workers here (default: all; 0 with --listen)\n"
           "  --expect-timeout S wait S seconds for the workers to join (default 60; 600 with --listen)\n\n"
           "Everything the run writes (OUT and its files, --trace) is checked before it starts; leftovers\n"
           "of killed runs there (staging folders, sockets of dead processes) are removed.\n\n"
           "Exit status: 0 done, 1 error (the message names the problem and, once the run began, the\n"
           "checkpoint to resume from), 2 bad usage, 130 interrupted (checkpoint saved).\n");
}

static volatile sig_atomic_t g_interrupt = 0;

static void on_signal(int sig) {
    (void)sig;
    if (g_interrupt < 2) g_interrupt++;
    static const char first[] = "\nrun: stopping: saving a checkpoint (Ctrl-C again to stop at once)\n";
    static const char second[] = "\nrun: stopping now, without a checkpoint\n";
    ssize_t rc = g_interrupt == 1 ? write(2, first, sizeof first - 1) : write(2, second, sizeof second - 1);
    (void)rc;
}

int ff_cmd_run(int argc, char **argv) {
    const char *trace = NULL, *listen = NULL, *curve = NULL, *worker_key = NULL;
    double expect_timeout = 0;
    int64_t local = -1;
    bool resume = false, with_changes = false, dump = false, no_progress = false;
    int64_t workers = 0, threads = 0, val_limit = 0, stop_after = 0;
    const ffio_opt opts[] = {
        {"trace", FFIO_STR, &trace, 0, 0},          {"resume", FFIO_FLAG, &resume, 0, 0},
        {"workers", FFIO_INT, &workers, 1, 256},    {"threads", FFIO_INT, &threads, 1, 1024},
        {"val-limit", FFIO_INT, &val_limit, 1, 1e12}, {"stop-after", FFIO_INT, &stop_after, 1, 1e12},
        {"dump-samples", FFIO_FLAG, &dump, 0, 0},   {"no-progress", FFIO_FLAG, &no_progress, 0, 0},
        {"resume-with-changes", FFIO_FLAG, &with_changes, 0, 0},
        {"listen", FFIO_STR, &listen, 0, 0},        {"curve", FFIO_STR, &curve, 0, 0},
        {"worker-key", FFIO_STR, &worker_key, 0, 0}, {"local", FFIO_INT, &local, 0, 256},
        {"expect-timeout", FFIO_DOUBLE, &expect_timeout, 0.1, 1e7},
    };
    char *pos[257];
    int n_pos;
    int pr = ffio_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof *opts), pos, 257, &n_pos);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (n_pos < 1) return ffio_usage(CMD, "no run config given");
    for (int i = 1; i < n_pos; i++)
        if (!strchr(pos[i], '=')) return ffio_usage(CMD, "'%s' is neither an option nor a key=value override", pos[i]);
    ff_exec_opts o;
    ff_exec_opts_default(&o);
    o.config = pos[0];
    o.overrides = pos + 1;
    o.n_overrides = n_pos - 1;
    o.trace_path = trace;
    o.resume = resume || with_changes;
    o.resume_with_changes = with_changes;
    o.workers = (int)workers;
    o.threads = (int)threads;
    o.val_limit = val_limit;
    o.stop_after = stop_after;
    o.dump_samples = dump;
    o.progress = no_progress ? 0 : -1;
    o.interrupt = &g_interrupt;
    if (curve && !listen) return ffio_usage(CMD, "--curve needs --listen tcp://HOST:PORT (local workers need no keys)");
    if (local >= 0 && !listen) return ffio_usage(CMD, "--local K needs --listen (without it every worker is local)");
    o.listen = listen;
    o.curve_key_file = curve;
    o.worker_key_file = worker_key;
    o.local_workers = (int)local;
    o.expect_timeout_s = expect_timeout;
    char out_dir[FF_PATH_MAX] = "";
    o.out_dir = out_dir;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = ff_exec_run(&o);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (rc < 0) return ffio_fail(CMD);
    ffplot_after_run(CMD, out_dir);
    return rc == FF_EXEC_INTERRUPTED ? 130 : 0;
}

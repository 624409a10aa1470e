/* The subcommands of `fuseflow`. Each lives in cli/cmd_<name>.c, parses its own arguments,
 * prints its own --help, and returns the process exit status (0 ok, 1 failed, 2 bad usage).
 * Add a command: write the file, declare it here, add a row to the table in cli/main.c. */
#ifndef FF_CLI_COMMANDS_H
#define FF_CLI_COMMANDS_H

typedef struct ff_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
    const char *summary;
} ff_command;

/* model files and the bundled task (cli/cmd_dataset.c, cmd_init.c, cmd_logprobs.c,
 * cmd_generate.c, cmd_sft.c, cmd_tokenize.c) */
int ff_cmd_dataset(int argc, char **argv);
int ff_cmd_init(int argc, char **argv);
int ff_cmd_logprobs(int argc, char **argv);
int ff_cmd_tokenize(int argc, char **argv);
int ff_cmd_generate(int argc, char **argv);
int ff_cmd_sft(int argc, char **argv);

/* the planner: memory, traffic, bubbles, iteration time; layout search (cli/cmd_plan.c) */
int ff_cmd_plan(int argc, char **argv);

/* pipeline schedules: per-rank instruction streams, simulated; the fused actor+critic schedule (cli/cmd_schedule.c) */
int ff_cmd_schedule(int argc, char **argv);

/* algorithm graphs and run configs: check, print, simulate the schedule (cli/cmd_graph.c) */
int ff_cmd_graph(int argc, char **argv);

/* RLHF runs: a run config's graph on local workers (cli/cmd_run.c) */
int ff_cmd_run(int argc, char **argv);

/* learning curves of a run folder as a PNG drawn with cairo (cli/cmd_plot.c) */
int ff_cmd_plot(int argc, char **argv);
/* The picture's layout (pixels): panels FFPLOT_COLS to a row under a title band; inside a
 * panel, the plot area is inset by the margins (title above, tick labels left and below). */
enum {
    FFPLOT_COLS = 3,
    FFPLOT_PANEL_W = 420,
    FFPLOT_PANEL_H = 290,
    FFPLOT_HEADER_H = 40,
    FFPLOT_MARGIN_L = 64,
    FFPLOT_MARGIN_R = 16,
    FFPLOT_MARGIN_T = 34,
    FFPLOT_MARGIN_B = 46,
};
#include <stddef.h>
/* OUT_DIR/metrics.jsonl drawn into png; info gets "WxH, N panels: titles". 0, or -1 + error
 * (no metrics, nothing to draw, a failed write, built without cairo). */
int ffplot_curves(const char *out_dir, const char *png, char *info, size_t cap);
/* After a training command: OUT_DIR/curves.png, and one line on stderr saying where it is or
 * why there is none (a missing picture does not fail the command). */
void ffplot_after_run(const char *cmd, const char *out_dir);

/* the runtime: this machine's devices, workers, CURVE keys, timelines, a driver
 * (cli/cmd_devices.c, cmd_worker.c, cmd_keygen.c, cmd_trace.c, cmd_runtime_demo.c) */
int ff_cmd_devices(int argc, char **argv);
int ff_cmd_worker(int argc, char **argv);
int ff_cmd_keygen(int argc, char **argv);
int ff_cmd_trace(int argc, char **argv);
int ff_cmd_runtime_demo(int argc, char **argv);

#endif

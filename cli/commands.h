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
 * cmd_generate.c, cmd_sft.c) */
int ff_cmd_dataset(int argc, char **argv);
int ff_cmd_init(int argc, char **argv);
int ff_cmd_logprobs(int argc, char **argv);
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

/* the runtime: workers, CURVE keys, timelines, a driver (cli/cmd_worker.c, cmd_keygen.c,
 * cmd_trace.c, cmd_runtime_demo.c) */
int ff_cmd_worker(int argc, char **argv);
int ff_cmd_keygen(int argc, char **argv);
int ff_cmd_trace(int argc, char **argv);
int ff_cmd_runtime_demo(int argc, char **argv);

#endif

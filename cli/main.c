/* `fuseflow`: dispatches to the subcommands of cli/commands.h. No command logic here. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "fuseflow/fuseflow.h"

static const ff_command commands[] = {
    {"init", ff_cmd_init, "write a randomly initialised model folder (presets tiny, small)"},
    {"tokenize", ff_cmd_tokenize, "encode text or JSONL to token ids (and pieces) with a model's tokenizer, or --decode ids"},
    {"logprobs", ff_cmd_logprobs, "per-token log-probabilities of sequences (JSONL in, JSONL out)"},
    {"generate", ff_cmd_generate, "sample text from a model folder (temperature, top-k, top-p, stop)"},
    {"sft", ff_cmd_sft, "supervised fine-tuning from JSONL prompt/response pairs (checkpoints, resume)"},
    {"dataset", ff_cmd_dataset, "generate the bundled arithmetic task (train/test JSONL)"},
    {"plan", ff_cmd_plan, "plan a parallel layout: memory, traffic, bubbles, iteration time; search layouts"},
    {"schedule", ff_cmd_schedule, "a pipeline schedule's instruction streams per rank, simulated (GPipe, 1F1B, interleaved); the fused actor+critic schedule (fuse, 1f1b, check)"},
    {"run", ff_cmd_run, "run an RLHF algorithm graph on local workers (PPO, GRPO, ...; checkpoints, --resume)"},
    {"plot", ff_cmd_plot, "draw a run folder's learning curves (metrics.jsonl) as a PNG (cairo)"},
    {"graph", ff_cmd_graph, "check a run config and print its algorithm graph; --simulate its schedule; --list"},
    {"devices", ff_cmd_devices, "what a worker here would see: cores, GPUs (memory, free), NCCL"},
    {"worker", ff_cmd_worker, "join a controller and run its subtasks (--connect ENDPOINT)"},
    {"keygen", ff_cmd_keygen, "write CURVE keys for a controller and its remote workers"},
    {"trace", ff_cmd_trace, "summarise a timeline: busy/idle per worker and group, longest chain"},
    {"runtime-demo", ff_cmd_runtime_demo, "run generic subtasks on local/remote workers (throughput, latency, --trace)"},
    {NULL, NULL, NULL},
};

static void usage(FILE *out) {
    fprintf(out,
            "fuseflow %s: an RLHF training runtime\n\n"
            "usage: fuseflow COMMAND [options]   (fuseflow COMMAND --help for its options)\n\n"
            "commands:\n",
            FF_VERSION_STRING);
    for (const ff_command *c = commands; c->name; c++) fprintf(out, "  %-10s %s\n", c->name, c->summary);
    fprintf(out, "\n  --help     this text\n  --version  print the version\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("fuseflow %s\n", ff_version());
        return 0;
    }
    for (const ff_command *c = commands; c->name; c++)
        if (!strcmp(c->name, argv[1])) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "fuseflow: unknown command '%s' (run 'fuseflow --help' for the list)\n", argv[1]);
    return 2;
}

/* A program that embeds fuseflow through its installed library: it checks a GRPO run config
 * (the algorithm graph, every key) with the public API, optionally with a plugin's
 * advantage estimator, and prints the graph in execution order. The config is in the text
 * below, so the program needs no files but the plugin.
 *
 * Build against an install (`cmake --install build --prefix P`):
 *     cc examples/embed.c $(PKG_CONFIG_PATH=P/lib/pkgconfig pkg-config --cflags --libs fuseflow) \
 *        -Wl,-rpath,P/lib -o embed
 * or with CMake: find_package(fuseflow) and target_link_libraries(embed fuseflow::fuseflow)
 * (tests/scripts/test_install.sh does both). Run:
 *     ./embed                          # the built-in grpo estimator
 *     ./embed path/to/example_plugin.so  # the plugin's group_median (examples/plugins/)
 *
 * Not here: training (ff_exec_run in fuseflow/executor.h runs a config like this one). */
#include <stdio.h>
#include <string.h>

#include "fuseflow/fuseflow.h"

static const char *config_fmt =
    "trainer: {steps: 10, plugins: [%s]}\n"
    "data: {train_files: train.jsonl, train_batch_size: 8}\n"
    "roles: {actor: {model: model}, ref: {model: model}}\n"
    "graph:\n"
    "  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4}\n"
    "  ref: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob]}\n"
    "  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: arith_exact_match}\n"
    "  advantage: {op: advantage, in: [score], out: [advantages], estimator: %s}\n"
    "  train: {op: train, role: actor, in: [prompt, response, old_logprob, ref_logprob, advantages], loss: vanilla,\n"
    "          kl_loss: {type: low_var_kl, coef: 0.001}}\n"
    "  sync: {op: sync_weights, role: actor, after: [train]}\n";

int main(int argc, char **argv) {
    const char *plugin = argc > 1 ? argv[1] : "";
    printf("fuseflow %s\n", ff_version());
    char text[4096];
    snprintf(text, sizeof text, config_fmt, plugin, *plugin ? "group_median" : "grpo");
    ff_registry *reg = ff_registry_new();
    if (!reg) {
        fprintf(stderr, "embed: %s\n", ff_error_message());
        return 1;
    }
    ff_run_config *run = ff_run_config_parse(text, "embed.yaml", 0, NULL, reg);
    if (!run) {
        fprintf(stderr, "embed: %s\n", ff_error_message());
        ff_registry_destroy(&reg);
        return 1;
    }
    const ff_graph *g = run->graph;
    const int *order = ff_graph_order(g);
    printf("graph ok: %zu nodes, groups of %lld samples\n", ff_graph_n_nodes(g), (long long)ff_graph_group_size(g));
    for (size_t i = 0; i < ff_graph_n_nodes(g); i++) printf("  %zu. %s\n", i + 1, ff_graph_node(g, (size_t)order[i])->name);
    const char *est = *plugin ? "group_median" : "grpo";
    const char *origin = ff_registry_origin(reg, FF_REG_ADVANTAGE, est);
    printf("advantage estimator %s: %s (%s)\n", est, ff_registry_summary(reg, FF_REG_ADVANTAGE, est), origin ? origin : "built in");
    ff_run_config_destroy(&run);
    ff_registry_destroy(&reg);
    return 0;
}

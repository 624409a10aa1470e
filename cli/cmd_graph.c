/* `fuseflow graph`: load a run config, check it, print its graph; list the registries; and
 * simulate one iteration's schedule with a fake executor (no workers) to show which subtasks
 * become ready when, fused against serial. The executor of `fuseflow run` drives the same
 * scheduler. */
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/registry.h"
#include "fuseflow/reward_client.h"
#include "fuseflow/util.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow graph CONFIG [key.sub=value ...] [options]\n"
            "       fuseflow graph --list [--plugin PATH ...]\n\n"
            "Loads a run config (examples/*.yaml; docs/graphs.md has the schema), applies the dotted\n"
            "overrides, loads its plugins, checks everything (errors name the file and line), and\n"
            "prints the graph: nodes in order with their stage, role, granularity and columns.\n\n"
            "  --check-files     also check that the data files and model folders exist\n"
            "  --simulate        run one iteration's schedule with a fake executor (no workers):\n"
            "                    generation takes a random number of steps per response, every other\n"
            "                    subtask one step; prints when each node ran, fused and serial\n"
            "  --seed N          seed of --simulate (default 1)\n"
            "  --list            list the advantage estimators, policy losses, KL estimators and\n"
            "                    reward functions (with the config's plugins, or --plugin)\n"
            "  --plugin PATH     load a plugin (repeatable)\n");
}

static void list(const ff_registry *r) {
    for (int k = 0; k < FF_REG_KIND_COUNT; k++) {
        const char *names[128];
        size_t n = ff_registry_names(r, (ff_registry_kind)k, names, 128);
        const char *kind = ff_registry_kind_name((ff_registry_kind)k);
        size_t len = strlen(kind);
        printf("%s%s:\n", kind, len && kind[len - 1] == 's' ? "es" : "s"); /* policy loss -> losses */
        for (size_t i = 0; i < n && i < 128; i++) {
            const char *origin = ff_registry_origin(r, (ff_registry_kind)k, names[i]);
            printf("  %-20s %s", names[i], ff_registry_summary(r, (ff_registry_kind)k, names[i]));
            if (origin) printf("  [plugin %s]", origin);
            printf("\n");
        }
    }
}

typedef struct running {
    const ff_sched_task *t;
    double end;
} running;

/* One iteration with simulated durations. Returns the makespan, or -1. */
static double simulate(const ff_run_config *run, ff_schedule mode, uint64_t seed, bool print) {
    const ff_graph *g = run->graph;
    int64_t groups = run->data.train_batch_size, gs = ff_graph_group_size(g);
    ff_sched *s = ff_sched_new(g, groups, gs, mode);
    if (!s) return -1;
    ff_rng rng;
    ff_rng_seed(&rng, seed);
    size_t N = ff_graph_n_nodes(g);
    double first[64], last[64];
    int64_t ntask[64] = {0};
    for (size_t m = 0; m < N; m++) first[m] = -1, last[m] = 0;
    running *fl = NULL;
    size_t nfl = 0, cap = 0;
    double now = 0;
    int rc = 0;
    for (;;) {
        if (ff_sched_groups_wanted(s) > 0) ff_sched_source_exhausted(s); /* no real scores: nothing is filtered */
        const ff_sched_task *t;
        while ((rc = ff_sched_next(s, &t)) == 1) {
            const ff_node *n = ff_graph_node(g, (size_t)t->node);
            double d = 1;
            if (n->op == FF_OP_GENERATE) {
                int64_t L = n->gen.max_tokens ? n->gen.max_tokens : run->data.max_response_length;
                d = n->gen.greedy ? (double)L : (double)(1 + ff_rng_below(&rng, (uint64_t)L));
            }
            if (nfl == cap) {
                cap = cap ? cap * 2 : 256;
                running *p = realloc(fl, cap * sizeof *p);
                if (!p) {
                    rc = -1;
                    break;
                }
                fl = p;
            }
            fl[nfl++] = (running){t, now + d};
            if (first[t->node] < 0) first[t->node] = now;
            ntask[t->node]++;
        }
        if (rc < 0 || ff_sched_finished(s) || !nfl) break;
        size_t k = 0;
        for (size_t i = 1; i < nfl; i++)
            if (fl[i].end < fl[k].end) k = i;
        running r = fl[k];
        fl[k] = fl[--nfl];
        now = r.end;
        if (now > last[r.t->node]) last[r.t->node] = now;
        const ff_node *n = ff_graph_node(g, (size_t)r.t->node);
        rc = n->op == FF_OP_FILTER ? ff_sched_complete_filter(s, r.t->id, true) : ff_sched_complete(s, r.t->id);
        if (rc) break;
    }
    free(fl);
    ff_sched_destroy(&s);
    if (rc < 0) return -1;
    if (print) {
        printf("%s schedule, %lld groups x %lld responses:\n", mode == FF_SCHED_SERIAL ? "serial" : "fused", (long long)groups,
               (long long)gs);
        printf("  %-16s %-12s %6s %9s %9s\n", "node", "unit", "tasks", "start", "end");
        const int *order = ff_graph_order(g);
        for (size_t k = 0; k < N; k++) {
            const ff_node *n = ff_graph_node(g, (size_t)order[k]);
            printf("  %-16s %-12s %6lld %9.1f %9.1f\n", n->name, ff_granularity_name(n->op == FF_OP_TRAIN ? FF_GRAN_BATCH : n->gran),
                   (long long)ntask[order[k]], first[order[k]], last[order[k]]);
        }
    }
    return now;
}

int ff_cmd_graph(int argc, char **argv) {
    const char *config = NULL;
    bool check_files = false, sim = false, do_list = false;
    uint64_t seed = 1;
    char **over = calloc((size_t)argc + 1, sizeof *over);
    const char **plugins = calloc((size_t)argc + 1, sizeof *plugins);
    int n_over = 0, n_plugins = 0, status = 1;
    if (!over || !plugins) goto out;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            status = 0;
            goto out;
        } else if (!strcmp(a, "--check-files")) {
            check_files = true;
        } else if (!strcmp(a, "--simulate")) {
            sim = true;
        } else if (!strcmp(a, "--list")) {
            do_list = true;
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--plugin") && i + 1 < argc) {
            plugins[n_plugins++] = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "fuseflow graph: unknown option '%s' (see --help)\n", a);
            status = 2;
            goto out;
        } else if (strchr(a, '=')) {
            over[n_over++] = argv[i];
        } else if (!config) {
            config = a;
        } else {
            fprintf(stderr, "fuseflow graph: one config at a time ('%s' and '%s')\n", config, a);
            status = 2;
            goto out;
        }
    }
    if (!config && !do_list) {
        usage(stderr);
        status = 2;
        goto out;
    }
    ff_registry *reg = ff_registry_new();
    if (reg && ff_reward_remote_register(reg) != 0) ff_registry_destroy(&reg);
    if (!reg) {
        fprintf(stderr, "fuseflow graph: %s\n", ff_error_message());
        goto out;
    }
    for (int i = 0; i < n_plugins; i++)
        if (ff_registry_load_plugin(reg, plugins[i]) != 0) {
            fprintf(stderr, "fuseflow graph: %s\n", ff_error_message());
            ff_registry_destroy(&reg);
            goto out;
        }
    ff_run_config *run = NULL;
    if (config) {
        run = ff_run_config_load(config, n_over, over, reg);
        if (!run || (check_files && ff_run_config_check_files(run) != 0)) {
            fprintf(stderr, "fuseflow graph: %s\n", ff_error_message());
            ff_run_config_destroy(&run);
            ff_registry_destroy(&reg);
            goto out;
        }
        printf("%s: ok (%s schedule)\n", config, run->trainer.schedule == FF_SCHED_SERIAL ? "serial" : "fused");
        ff_graph_print(run->graph, stdout);
    }
    if (do_list) list(reg);
    status = 0;
    if (run && sim) {
        double fused = simulate(run, FF_SCHED_FUSED, seed, true);
        double serial = simulate(run, FF_SCHED_SERIAL, seed, true);
        if (fused < 0 || serial < 0) {
            fprintf(stderr, "fuseflow graph: simulation failed: %s\n", ff_error_message());
            status = 1;
        } else {
            printf("simulated iteration: fused %.1f steps, serial %.1f steps (%.2fx)\n", fused, serial, serial / fused);
        }
    }
    ff_run_config_destroy(&run);
    ff_registry_destroy(&reg);
out:
    free(over);
    free(plugins);
    return status;
}

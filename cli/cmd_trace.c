/* `fuseflow trace summary FILE`: the command around ff_trace_summary (fuseflow/trace_summary.h). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "fuseflow/error.h"
#include "fuseflow/trace_summary.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow trace summary FILE.json [--json]\n\n"
            "Summarise a timeline written with --trace (Chrome Trace Event JSON; open the same file in\n"
            "https://ui.perfetto.dev to see it): subtasks, busy and idle time per worker and per group\n"
            "over the span of the trace, the controller-side work, and the longest chain of dependent\n"
            "jobs (on a `fuseflow run` trace, the run's critical path), link by link and by kind.\n\n"
            "  --json   print the numbers as JSON\n");
}

int ff_cmd_trace(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 3 || strcmp(argv[1], "summary") != 0) {
        usage(stderr);
        return 2;
    }
    const char *path = NULL;
    bool json = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "fuseflow trace: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (ff_trace_summary(path, stdout, json) != 0) {
        fprintf(stderr, "fuseflow trace: %s\n", ff_error_message());
        return 1;
    }
    return 0;
}

/* The worker side of the programs that are their own workers (the runtime and exec tests,
 * bench_runtime): started as `PROG worker --connect E [--rank N] [--connect-timeout S]
 * [--orphan-timeout S] [--curve FILE] [--max-frame B] [--log LEVEL]` (what
 * ff_controller_spawn passes, and what the tests that start workers themselves pass), such a
 * program builds its ff_worker_opts here and calls ff_worker_serve. The library parses no
 * command line; `fuseflow worker`'s own parser, with usage and checks, is cli/cmd_worker.c. */
#ifndef FF_RT_WORKER_H
#define FF_RT_WORKER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"

/* argv[0] is "worker". Exit status: 0 clean, 1 error, 2 an option these programs do not know. */
static inline int rt_worker_main(int argc, char **argv, ff_worker_setup_fn setup, void *ud) {
    static const char *levels[] = {"debug", "info", "warn", "error", "off"};
    ff_worker_opts o;
    ff_worker_opts_default(&o);
    ff_log_set_level(FF_LOG_ERROR);
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--connect")) o.connect = v;
        else if (!strcmp(a, "--rank")) o.rank = atoi(v);
        else if (!strcmp(a, "--connect-timeout")) o.connect_timeout_s = atof(v);
        else if (!strcmp(a, "--orphan-timeout")) o.orphan_timeout_s = atof(v);
        else if (!strcmp(a, "--curve")) o.curve_key_file = v;
        else if (!strcmp(a, "--max-frame")) o.max_frame_bytes = (size_t)atof(v);
        else if (!strcmp(a, "--log")) {
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, levels[k])) ff_log_set_level((ff_log_level)k);
        } else {
            fprintf(stderr, "test worker: unknown option %s\n", a);
            return 2;
        }
    }
    if (argc % 2 == 0 || !o.connect) {
        fprintf(stderr, "test worker: usage: worker --connect ENDPOINT [--option value ...]\n");
        return 2;
    }
    if (ff_worker_serve(&o, setup, ud) != 0) {
        fprintf(stderr, "fuseflow worker: %s\n", ff_error_message());
        return 1;
    }
    return 0;
}

#endif

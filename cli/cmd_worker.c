/* `fuseflow worker`: join a controller and run its subtasks, including the RL kinds `fuseflow
 * run` sends (workers/rl/, include/fuseflow/rl_worker.h). This file parses the command line
 * (the one ff_controller_spawn passes, include/fuseflow/controller.h) into ff_worker_opts;
 * ff_worker_serve (workers/worker.c) does the rest. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/rl_worker.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow worker --connect ENDPOINT [options]\n\n"
            "Join a fuseflow controller and run the subtasks it sends until it says shutdown, goes\n"
            "silent (then exit on our own), or SIGTERM/SIGINT arrives.\n\n"
            "  --connect ENDPOINT   the controller: ipc:///path (one host) or tcp://HOST:PORT\n"
            "  --rank N             ask for rank N (default: the controller picks)\n"
            "  --device NAME        device this worker drives, reported to the controller (default cpu)\n"
            "  --host NAME          host name reported to the controller, which places ranks by it\n"
            "                       (default: this machine's host name)\n"
            "  --local-index N      this worker's place among its host's workers: its rail (GPU and\n"
            "                       NIC) where the hosts have rails; the controller gives the same\n"
            "                       position in every host's ranks to the same N (Slurm: SLURM_LOCALID)\n"
            "  --curve FILE         worker.key from `fuseflow keygen` (needed when the controller uses CURVE)\n"
            "  --connect-timeout S  exit if no controller answers within S seconds (default 30)\n"
            "  --orphan-timeout S   exit after S seconds without a word from the controller\n"
            "                       (default: the timeout the controller announces)\n"
            "  --max-frame BYTES    largest tensor frame accepted (default 1 GiB)\n"
            "  --log LEVEL          debug, info, warn or error (default: FF_LOG or info)\n\n"
            "Exit status: 0 after a shutdown request or signal, 1 on error (controller gone, refused,\n"
            "unreachable), 2 on bad usage.\n");
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v < 0) return -1;
    *out = v;
    return 0;
}

/* argv (argv[0] is "worker") into o. 0, 1 after --help, or 2 after a usage error. */
static int parse(int argc, char **argv, ff_worker_opts *o) {
    ff_worker_opts_default(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!v) {
            fprintf(stderr, "fuseflow worker: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--connect")) {
            o->connect = v;
        } else if (!strcmp(a, "--rank")) {
            char *end;
            long r = strtol(v, &end, 10);
            if (*end || r < -1 || r > INT32_MAX) {
                fprintf(stderr, "fuseflow worker: --rank wants a non-negative integer, got '%s'\n", v);
                return 2;
            }
            o->rank = (int)r;
        } else if (!strcmp(a, "--local-index")) {
            char *end;
            long r = strtol(v, &end, 10);
            if (!v[0] || *end || r < 0 || r > INT32_MAX) {
                fprintf(stderr, "fuseflow worker: --local-index wants a non-negative integer, got '%s'\n", v);
                return 2;
            }
            o->local_index = (int)r;
        } else if (!strcmp(a, "--device")) {
            o->device = v;
        } else if (!strcmp(a, "--host")) {
            if (!v[0] || strlen(v) >= FF_MSG_NAME_MAX) {
                fprintf(stderr, "fuseflow worker: --host wants a name of 1 to %d bytes, got '%s'\n", FF_MSG_NAME_MAX - 1, v);
                return 2;
            }
            o->host = v;
        } else if (!strcmp(a, "--curve")) {
            o->curve_key_file = v;
        } else if (!strcmp(a, "--connect-timeout") || !strcmp(a, "--orphan-timeout")) {
            double d;
            if (parse_double(v, &d) != 0) {
                fprintf(stderr, "fuseflow worker: %s wants seconds, got '%s'\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--connect-timeout")) o->connect_timeout_s = d;
            else o->orphan_timeout_s = d;
        } else if (!strcmp(a, "--max-frame")) {
            double d;
            if (parse_double(v, &d) != 0 || d < 1) {
                fprintf(stderr, "fuseflow worker: --max-frame wants bytes, got '%s'\n", v);
                return 2;
            }
            o->max_frame_bytes = (size_t)d;
        } else if (!strcmp(a, "--log")) {
            static const char *levels[] = {"debug", "info", "warn", "error", "off"};
            int found = -1;
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, levels[k])) found = k;
            if (found < 0) {
                fprintf(stderr, "fuseflow worker: --log wants debug, info, warn, error or off, got '%s'\n", v);
                return 2;
            }
            ff_log_set_level((ff_log_level)found);
        } else {
            fprintf(stderr, "fuseflow worker: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o->connect) {
        fprintf(stderr, "fuseflow worker: --connect ENDPOINT is required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

int ff_cmd_worker(int argc, char **argv) {
    ff_worker_opts o;
    int pr = parse(argc, argv, &o);
    if (pr) return pr == 1 ? 0 : pr;
    /* before any thread: NCCL's bootstrap on the interface the cpu collectives use */
    const char *nccl_if = ff_coll_nccl_env();
    if (nccl_if) ff_debug("worker: NCCL_SOCKET_IFNAME=%s (from FF_COLL_IFNAME)", nccl_if);
    ff_rlworker *r = ff_rlworker_new();
    if (!r) {
        fprintf(stderr, "fuseflow worker: %s\n", ff_error_message());
        return 1;
    }
    int rc = ff_worker_serve(&o, ff_rlworker_setup, r);
    if (rc != 0) fprintf(stderr, "fuseflow worker: %s\n", ff_error_message());
    ff_rlworker_destroy(&r);
    return rc == 0 ? 0 : 1;
}

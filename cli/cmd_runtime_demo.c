/* `fuseflow runtime-demo`: drive the runtime from the command line with generic subtasks:
 * start local workers (or wait for remote ones), run many subtasks of one kind, check the
 * results, print throughput and latency, optionally write a timeline (--trace). Used by the
 * runtime's shell tests (including the multi-host one) and by people trying it out. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "fuseflow/controller.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

typedef struct demo demo;
typedef struct task_ctx {
    demo *d;
    int index;
} task_ctx;

struct demo {
    ff_controller *c;
    const char *kind, *mode, *group, *op;
    int tasks, submitted, done, failed, wrong, window;
    int nfloats;
    double sleep_ms;
    bool chain, verify;
    uint64_t last_job;
    int64_t *submit_ns, *latency_ns;
    task_ctx *ctx;
    int group_size;
    char first_error[FF_MSG_TEXT_MAX + 128];
};

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow runtime-demo [options]\n\n"
            "Start a controller, start local workers and/or wait for remote ones, run generic subtasks,\n"
            "check their results and print throughput and latency.\n\n"
            "  --workers N        local worker processes to start (default 4; at most 16 per core, fewer when\n"
            "                     ulimit -n, ulimit -u or memory allow less)\n"
            "  --remote N         also wait for N workers started elsewhere (fuseflow worker --connect ...)\n"
            "  --tasks M          subtasks to run (default 10000)\n"
            "  --kind K           echo, sum, axpy, sleep, fail or collective (default echo)\n"
            "  --floats F         floats per row of each subtask's input tensor (default 4)\n"
            "  --sleep-ms X       duration of each sleep subtask (default 1)\n"
            "  --mode M           any (least loaded worker, default), rank (round robin over ranks),\n"
            "                     group (every worker; collective uses this), split (every worker, the\n"
            "                     input's rows split across them)\n"
            "  --op OP            collective op: all_reduce (default), broadcast, all_gather, reduce_scatter\n"
            "  --backend B        collectives backend of the group: none, cpu (default for collective), nccl\n"
            "  --chain            each subtask depends on the previous one (a serial chain)\n"
            "  --inflight K       subtasks in flight per worker (default 64)\n"
            "  --trace FILE       write the timeline as Chrome Trace Event JSON (open in Perfetto)\n"
            "  --listen EP        bind here (default: a fresh ipc:// socket); e.g. tcp://0.0.0.0:5555\n"
            "  --curve FILE       controller.key from `fuseflow keygen` (encrypts and authenticates)\n"
            "  --worker-key FILE  worker.key for the local workers when --curve is on\n"
            "  --heartbeat S      ping period (default 0.5)\n"
            "  --timeout S        a worker silent this long is dead (default 5)\n"
            "  --wait S           how long to wait for workers to join (default 30)\n"
            "  --no-verify        do not check results\n\n"
            "Each subtask's input x holds its index i in every element; results are checked: echo\n"
            "returns x, sum returns i * elements, axpy (alpha 2, y = 1) returns 2i + 1, a sum all-reduce\n"
            "returns i * workers. Exit status 0 when every subtask succeeded with the right result.\n");
}

static void free_data(void *data, void *hint) {
    (void)hint;
    free(data);
}

static int submit_one(demo *d);

/* Is every element of o equal to want? */
static bool all_equal(const ff_tensor *o, int64_t numel, float want) {
    if (!o || o->dtype != FF_DTYPE_F32 || ff_tensor_numel(o) != numel) return false;
    for (int64_t k = 0; k < numel; k++)
        if (((const float *)o->data)[k] != want) return false;
    return true;
}

static bool check(const demo *d, int index, const ff_result *r, int n) {
    int rows = !strcmp(d->mode, "split") ? d->group_size * 2 : 1;
    for (int m = 0; m < n; m++) {
        const ff_tensor *o = r[m].noutputs ? &r[m].outputs[0] : NULL;
        int64_t my_rows = !strcmp(d->mode, "split") ? 2 : rows, numel = my_rows * d->nfloats;
        float i = (float)index;
        if (!strcmp(d->kind, "echo") && !all_equal(o, numel, i)) return false;
        if (!strcmp(d->kind, "axpy") && !all_equal(o, numel, 2 * i + 1)) return false;
        if (!strcmp(d->kind, "sum") && !all_equal(o, 1, i * (float)numel)) return false;
        if (!strcmp(d->kind, "collective") && !strcmp(d->op, "all_reduce") && !all_equal(o, numel, i * (float)n))
            return false;
    }
    return true;
}

static void on_done(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    task_ctx *t = ud;
    demo *d = t->d;
    d->done++;
    d->latency_ns[t->index] = ff_now_ns() - d->submit_ns[t->index];
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (r[i].status != FF_STATUS_OK) {
            ok = false;
            if (!d->first_error[0])
                snprintf(d->first_error, sizeof d->first_error, "subtask %llu on rank %d: %s: %s",
                         (unsigned long long)r[i].id, r[i].rank, ff_status_name(r[i].status), r[i].error);
        }
    }
    if (!ok) d->failed++;
    else if (d->verify && !check(d, t->index, r, n)) d->wrong++;
    if (d->submitted < d->tasks && submit_one(d) != 0 && !d->first_error[0])
        snprintf(d->first_error, sizeof d->first_error, "submit: %s", ff_error_message());
}

static int submit_one(demo *d) {
    int i = d->submitted;
    int rows = !strcmp(d->mode, "split") ? d->group_size * 2 : 1;
    int64_t shape[2] = {rows, d->nfloats};
    size_t n = (size_t)rows * (size_t)d->nfloats;
    float *x = malloc(sizeof *x * (n ? n : 1));
    float *y = NULL;
    if (!x) return ff_error_set("runtime-demo", NULL, "out of memory");
    for (size_t k = 0; k < n; k++) x[k] = (float)i;
    ff_input in[2] = {{.name = "x", .dtype = FF_DTYPE_F32, .ndim = 2, .shape = shape, .data = x, .free_fn = free_data,
                       .split = true}};
    int nin = 1;
    ff_arg args[4];
    int nargs = 0;
    if (!strcmp(d->kind, "axpy")) {
        y = malloc(sizeof *y * (n ? n : 1));
        if (!y) {
            free(x);
            return ff_error_set("runtime-demo", NULL, "out of memory");
        }
        for (size_t k = 0; k < n; k++) y[k] = 1.0f;
        in[1] = (ff_input){.name = "y", .dtype = FF_DTYPE_F32, .ndim = 2, .shape = shape, .data = y,
                           .free_fn = free_data, .split = true};
        nin = 2;
        args[nargs++] = ff_arg_float("alpha", 2.0);
    } else if (!strcmp(d->kind, "sleep")) {
        args[nargs++] = ff_arg_float("ms", d->sleep_ms);
    } else if (!strcmp(d->kind, "collective")) {
        args[nargs++] = ff_arg_str("op", d->op);
    }
    ff_subtask_spec spec = {.kind = d->kind, .group = d->group, .args = args, .nargs = nargs, .inputs = in,
                            .ninputs = nin, .idempotent = true};
    if (!strcmp(d->mode, "rank")) {
        spec.target = FF_TARGET_RANK;
        int nr = ff_controller_nranks(d->c);
        spec.rank = nr ? i % nr : 0;
    } else if (!strcmp(d->mode, "group")) {
        spec.target = FF_TARGET_GROUP;
    } else if (!strcmp(d->mode, "split")) {
        spec.target = FF_TARGET_GROUP_SPLIT;
    } else {
        spec.target = FF_TARGET_ANY;
    }
    if (d->chain && d->last_job) {
        spec.after = &d->last_job;
        spec.nafter = 1;
    }
    d->ctx[i] = (task_ctx){d, i};
    d->submit_ns[i] = ff_now_ns();
    uint64_t job = ff_controller_submit(d->c, &spec, on_done, &d->ctx[i]);
    if (!job) return -1;
    d->last_job = job;
    d->submitted++;
    return 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int want_num(const char *opt, const char *v, double lo, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || x < lo) {
        fprintf(stderr, "fuseflow runtime-demo: %s wants a number >= %g, got '%s'\n", opt, lo, v);
        return -1;
    }
    *out = x;
    return 0;
}

int ff_cmd_runtime_demo(int argc, char **argv) {
    ff_controller_opts o;
    ff_controller_opts_default(&o);
    demo d = {.kind = "echo", .mode = "any", .group = "all", .op = "all_reduce", .tasks = 10000, .nfloats = 4,
              .sleep_ms = 1, .verify = true};
    int workers = 4, remote = 0;
    double wait_s = 30;
    const char *backend = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--chain")) {
            d.chain = true;
            continue;
        }
        if (!strcmp(a, "--no-verify")) {
            d.verify = false;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "fuseflow runtime-demo: unknown option or missing value: %s\n", a);
            return 2;
        }
        const char *v = argv[++i];
        double x;
        if (!strcmp(a, "--workers") || !strcmp(a, "--remote") || !strcmp(a, "--tasks") || !strcmp(a, "--floats") ||
            !strcmp(a, "--inflight")) {
            if (want_num(a, v, 0, &x) != 0) return 2;
            if (x > INT32_MAX || x != (double)(int)x) { /* (int) of 1e12 would be undefined */
                fprintf(stderr, "fuseflow runtime-demo: %s wants a whole number in [0, %d], got '%s'\n", a, INT32_MAX, v);
                return 2;
            }
            if (!strcmp(a, "--workers")) workers = (int)x;
            else if (!strcmp(a, "--remote")) remote = (int)x;
            else if (!strcmp(a, "--tasks")) d.tasks = (int)x;
            else if (!strcmp(a, "--floats")) d.nfloats = (int)x;
            else o.max_inflight = (int)x;
        } else if (!strcmp(a, "--sleep-ms") || !strcmp(a, "--heartbeat") || !strcmp(a, "--timeout") ||
                   !strcmp(a, "--wait")) {
            if (want_num(a, v, 0, &x) != 0) return 2;
            if (!strcmp(a, "--sleep-ms")) d.sleep_ms = x;
            else if (!strcmp(a, "--heartbeat")) o.heartbeat_s = x;
            else if (!strcmp(a, "--timeout")) o.timeout_s = x;
            else wait_s = x;
        } else if (!strcmp(a, "--kind")) {
            d.kind = v;
        } else if (!strcmp(a, "--mode")) {
            if (strcmp(v, "any") && strcmp(v, "rank") && strcmp(v, "group") && strcmp(v, "split")) {
                fprintf(stderr, "fuseflow runtime-demo: --mode wants any, rank, group or split, got '%s'\n", v);
                return 2;
            }
            d.mode = v;
        } else if (!strcmp(a, "--op")) {
            d.op = v;
        } else if (!strcmp(a, "--backend")) {
            backend = v;
        } else if (!strcmp(a, "--trace")) {
            o.trace_path = v;
        } else if (!strcmp(a, "--listen")) {
            o.endpoint = v;
        } else if (!strcmp(a, "--curve")) {
            o.curve_key_file = v;
        } else if (!strcmp(a, "--worker-key")) {
            o.worker_key_file = v;
        } else {
            fprintf(stderr, "fuseflow runtime-demo: unknown option %s (see --help)\n", a);
            return 2;
        }
    }
    if (workers + remote < 1) {
        fprintf(stderr, "fuseflow runtime-demo: no workers (--workers N and/or --remote N)\n");
        return 2;
    }
    char why[200];
    int most = ff_controller_local_worker_limit(NULL, why, sizeof why);
    if (workers > most) {
        fprintf(stderr, "fuseflow runtime-demo: --workers %d: this machine runs at most %d local workers next to the controller (%s) "
                        "(hint: start fewer, or run more on other hosts with --remote N and `fuseflow worker --connect`)\n",
                workers, most, why);
        return 2;
    }
    if (!strcmp(d.kind, "collective")) {
        if (!backend) backend = "cpu";
        if (!strcmp(d.mode, "any")) d.mode = "group";
    }
    d.submit_ns = calloc((size_t)d.tasks + 1, sizeof *d.submit_ns);
    d.latency_ns = calloc((size_t)d.tasks + 1, sizeof *d.latency_ns);
    d.ctx = calloc((size_t)d.tasks + 1, sizeof *d.ctx);
    if (!d.submit_ns || !d.latency_ns || !d.ctx) {
        fprintf(stderr, "fuseflow runtime-demo: out of memory\n");
        return 1;
    }
    int rc = 1;
    d.c = ff_controller_new(&o);
    if (!d.c) {
        fprintf(stderr, "fuseflow runtime-demo: %s\n", ff_error_message());
        goto out;
    }
    printf("runtime-demo: controller at %s\n", ff_controller_endpoint(d.c));
    fflush(stdout);
    if (workers > 0 && ff_controller_spawn(d.c, workers) < 0) {
        fprintf(stderr, "fuseflow runtime-demo: %s\n", ff_error_message());
        goto out;
    }
    if (ff_controller_wait_workers(d.c, workers + remote, wait_s) != 0) {
        fprintf(stderr, "fuseflow runtime-demo: %s\n", ff_error_message());
        goto out;
    }
    int nr = ff_controller_nranks(d.c), *ranks = malloc(sizeof *ranks * (size_t)nr), nlive = 0;
    for (int r = 0; r < nr; r++) {
        ff_worker_info info;
        if (ff_controller_worker_info(d.c, r, &info) == 0 && info.state == FF_WORKER_LIVE) {
            ranks[nlive++] = r;
            printf("runtime-demo: worker %d: %s, pid %lld, %s%s, clock offset %.1f us (rtt %.1f us)\n", r, info.host,
                   (long long)info.pid, info.device, info.local ? "" : ", remote", info.clock_offset_us, info.rtt_us);
        }
    }
    ff_group_opts go = {.backend = backend};
    int grc = ff_controller_group_create(d.c, "all", ranks, nlive, &go);
    free(ranks);
    if (grc != 0) {
        fprintf(stderr, "fuseflow runtime-demo: %s\n", ff_error_message());
        goto out;
    }
    d.group_size = nlive;
    d.window = d.chain ? 1 : (o.max_inflight > 0 ? o.max_inflight : 64) * nlive * 2;
    int64_t t0 = ff_now_ns();
    while (d.submitted < d.tasks && d.submitted < d.window) {
        if (submit_one(&d) != 0) {
            fprintf(stderr, "fuseflow runtime-demo: %s\n", ff_error_message());
            goto out;
        }
    }
    double budget = 60 + d.tasks * (d.sleep_ms / 1e3) * (d.chain ? 1.0 : 1.0 / nlive) * 2;
    if (ff_controller_run(d.c, budget) != 0) {
        fprintf(stderr, "fuseflow runtime-demo: %s\n", ff_error_message());
        goto out;
    }
    double secs = (ff_now_ns() - t0) / 1e9;
    ff_controller_stats st;
    ff_controller_stats_get(d.c, &st);
    printf("runtime-demo: %d %s subtasks (%s, %d floats) on %d workers in %.3f s: %.0f subtasks/s; %d failed, %llu "
           "redispatched, %llu workers died\n",
           d.done, d.kind, d.mode, d.nfloats, nlive, secs, d.done / secs, d.failed,
           (unsigned long long)st.redispatched, (unsigned long long)st.workers_died);
    if (d.done) {
        qsort(d.latency_ns, (size_t)d.done, sizeof *d.latency_ns, cmp_i64);
        printf("runtime-demo: latency from submit to result: p50 %.1f us, p99 %.1f us, max %.1f us\n",
               d.latency_ns[d.done / 2] / 1e3, d.latency_ns[(size_t)(d.done * 0.99)] / 1e3,
               d.latency_ns[d.done - 1] / 1e3);
    }
    if (d.failed) printf("runtime-demo: first failure: %s\n", d.first_error);
    if (d.wrong) printf("runtime-demo: %d results were wrong\n", d.wrong);
    rc = d.failed || d.wrong || d.done != d.tasks ? 1 : 0;
out:
    if (d.c) {
        if (ff_controller_shutdown(d.c, 5) != 0) fprintf(stderr, "fuseflow runtime-demo: %s\n", ff_error_message());
        if (o.trace_path) printf("runtime-demo: timeline in %s (fuseflow trace summary %s)\n", o.trace_path, o.trace_path);
        ff_controller_destroy(&d.c);
    }
    free(d.submit_ns);
    free(d.latency_ns);
    free(d.ctx);
    return rc;
}

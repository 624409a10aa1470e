/* bench_runtime: the runtime's subtask round trip and throughput, beside plain ZeroMQ.
 *
 *   round trip  one small subtask at a time (a 16-byte tensor in, the same back) from submit
 *               to its callback, p50 and p99; beside it, in alternating rounds, a plain
 *               ZeroMQ ROUTER/DEALER ping-pong over the same transport (ipc) with the same
 *               two frames, echoed by a bare process. Subtasks of kind "echo" run on the
 *               worker's loop thread; "sum" goes through its compute thread (one more hop
 *               each way), shown too.
 *   throughput  many small subtasks streamed to 1, 4 and 16 workers (any member of a group,
 *               at most 64 in flight per worker), completions per second.
 * Targets: median round trip within 1.5x plain ZeroMQ; >= 100,000 subtasks/s with 16 workers.
 * The headline is the last line. Usage: bench_runtime [--quick].
 *
 * Across hosts (bench/bench_runtime_netns.sh runs it between two network namespaces):
 *   bench_runtime [--quick] --listen tcp://IP:PORT --plain tcp://IP:PORT2 --remote N [--curve controller.key]
 * binds the controller and the plain ZeroMQ router there and waits for what the other host
 * starts: `bench_runtime zmq-echo tcp://IP:PORT2` and N `bench_runtime worker --connect
 * tcp://IP:PORT [--curve worker.key]`; the round trips go to rank 0, the throughput to all N
 * (one controller: remote workers do not follow a controller that is gone). */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "fuseflow/controller.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"
#include "tests/runtime/rt_worker.h"

extern char **environ;

static char self[FF_PATH_MAX];

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double pct(int64_t *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i] / 1e3;
}

/* ---- plain ZeroMQ: an echo process and the ping-pong ------------------------------------- */
static int zmq_echo_main(const char *endpoint) {
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(s, endpoint) != 0) return 1;
    zmq_send(s, "hi", 2, 0);
    for (;;) {
        zmq_msg_t parts[8];
        int n = 0, more = 1;
        while (more && n < 8) {
            zmq_msg_init(&parts[n]);
            if (zmq_msg_recv(&parts[n], s, 0) < 0) return 1;
            more = zmq_msg_more(&parts[n]);
            n++;
        }
        if (n == 1 && zmq_msg_size(&parts[0]) == 4 && !memcmp(zmq_msg_data(&parts[0]), "stop", 4)) break;
        for (int i = 0; i < n; i++) zmq_msg_send(&parts[i], s, i + 1 < n ? ZMQ_SNDMORE : 0);
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
    return 0;
}

typedef struct plain {
    void *ctx, *router;
    uint8_t peer[256];
    size_t peer_len;
    pid_t pid;
    char ep[256];
} plain;

/* bind (remote: tcp, the echo started on the other host; else a local ipc echo process) */
static void plain_start(plain *p, const char *remote) {
    p->ctx = zmq_ctx_new();
    p->router = zmq_socket(p->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(p->router, ZMQ_LINGER, &zero, sizeof zero);
    if (remote) snprintf(p->ep, sizeof p->ep, "%s", remote);
    else snprintf(p->ep, sizeof p->ep, "ipc:///tmp/ff-bench-plain-%d.sock", (int)getpid());
    if (zmq_bind(p->router, p->ep) != 0) {
        fprintf(stderr, "bind %s: %s\n", p->ep, zmq_strerror(zmq_errno()));
        exit(1);
    }
    p->pid = 0;
    char *argv[] = {self, "zmq-echo", p->ep, NULL};
    if (!remote && posix_spawn(&p->pid, self, NULL, NULL, argv, environ) != 0) exit(1);
    int n = zmq_recv(p->router, p->peer, sizeof p->peer, 0);
    p->peer_len = (size_t)n;
    char hi[8];
    zmq_recv(p->router, hi, sizeof hi, 0);
}

/* One round trip with a 40-byte header frame and a 16-byte payload frame (about what a small
 * subtask puts on the wire). */
static int64_t plain_rtt(plain *p) {
    static const char hdr[40] = "header-of-a-subtask.....................";
    float payload[4] = {1, 2, 3, 4};
    int64_t t0 = ff_now_ns();
    zmq_send(p->router, p->peer, p->peer_len, ZMQ_SNDMORE);
    zmq_send(p->router, hdr, sizeof hdr, ZMQ_SNDMORE);
    zmq_send(p->router, payload, sizeof payload, 0);
    char buf[256];
    int more = 1;
    while (more) {
        zmq_recv(p->router, buf, sizeof buf, 0);
        size_t len = sizeof more;
        zmq_getsockopt(p->router, ZMQ_RCVMORE, &more, &len);
    }
    return ff_now_ns() - t0;
}

static void plain_stop(plain *p) {
    zmq_send(p->router, p->peer, p->peer_len, ZMQ_SNDMORE);
    zmq_send(p->router, "stop", 4, 0);
    int st;
    if (p->pid > 0) waitpid(p->pid, &st, 0);
    zmq_close(p->router);
    zmq_ctx_term(p->ctx);
}

/* ---- the runtime ------------------------------------------------------------------------------ */
static void free_buf(void *d, void *h) {
    (void)h;
    free(d);
}

typedef struct one {
    bool done;
    int status;
} one;

static void on_one(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    (void)n;
    one *o = ud;
    o->done = true;
    o->status = r[0].status;
}

static bool one_done(void *ud) { return ((one *)ud)->done; }

static int64_t runtime_rtt(ff_controller *c, const char *kind) {
    float *x = malloc(4 * sizeof *x);
    for (int i = 0; i < 4; i++) x[i] = (float)i;
    int64_t four = 4;
    ff_input in = {.name = "x", .dtype = FF_DTYPE_F32, .ndim = 1, .shape = &four, .data = x, .free_fn = free_buf};
    ff_subtask_spec s = {.kind = kind, .target = FF_TARGET_RANK, .rank = 0, .inputs = &in, .ninputs = 1};
    one o = {0};
    int64_t t0 = ff_now_ns();
    if (!ff_controller_submit(c, &s, on_one, &o) || ff_controller_run_until(c, one_done, &o, 10) != 0 ||
        o.status != FF_STATUS_OK) {
        fprintf(stderr, "bench: %s subtask failed: %s\n", kind, ff_error_message());
        exit(1);
    }
    return ff_now_ns() - t0;
}

typedef struct stream {
    ff_controller *c;
    const char *kind;
    int total, submitted, done, failed;
} stream;

static void on_stream(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud);

static void stream_submit(stream *s) {
    float *x = malloc(4 * sizeof *x);
    for (int i = 0; i < 4; i++) x[i] = (float)s->submitted;
    int64_t four = 4;
    ff_input in = {.name = "x", .dtype = FF_DTYPE_F32, .ndim = 1, .shape = &four, .data = x, .free_fn = free_buf};
    ff_subtask_spec sp = {.kind = s->kind, .target = FF_TARGET_ANY, .group = "all", .inputs = &in, .ninputs = 1};
    if (!ff_controller_submit(s->c, &sp, on_stream, s)) {
        fprintf(stderr, "bench: submit: %s\n", ff_error_message());
        exit(1);
    }
    s->submitted++;
}

static void on_stream(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)job;
    (void)n;
    stream *s = ud;
    s->done++;
    if (r[0].status != FF_STATUS_OK) s->failed++;
    if (s->submitted < s->total) stream_submit(s);
}

static const char *listen_ep, *curve_key; /* across hosts: where, and CURVE's key */

/* workers spawned here, or (listen_ep) the ones the other host starts */
static ff_controller *start(int workers) {
    ff_controller_opts o;
    ff_controller_opts_default(&o);
    o.worker_bin = self;
    o.max_inflight = 64;
    o.endpoint = listen_ep;
    o.curve_key_file = curve_key;
    ff_controller *c = ff_controller_new(&o);
    if (!c || (!listen_ep && ff_controller_spawn(c, workers) < 0) || ff_controller_wait_workers(c, workers, 60) != 0) {
        fprintf(stderr, "bench: %s\n", ff_error_message());
        exit(1);
    }
    int ranks[64];
    for (int i = 0; i < workers; i++) ranks[i] = i;
    if (ff_controller_group_create(c, "all", ranks, workers, NULL) != 0) {
        fprintf(stderr, "bench: %s\n", ff_error_message());
        exit(1);
    }
    return c;
}

static double throughput_on(ff_controller *c, int workers, const char *kind, int total) {
    stream s = {c, kind, total, 0, 0, 0};
    int64_t t0 = ff_now_ns();
    /* fill the pipeline: 64 per worker; each completion submits the next */
    for (int i = 0; i < workers * 64 && s.submitted < total; i++) stream_submit(&s);
    if (ff_controller_run(c, 300) != 0) {
        fprintf(stderr, "bench: %s\n", ff_error_message());
        exit(1);
    }
    double secs = (ff_now_ns() - t0) / 1e9;
    if (s.failed) {
        fprintf(stderr, "bench: %d subtasks failed\n", s.failed);
        exit(1);
    }
    return s.done / secs;
}

static double throughput(int workers, const char *kind, int total) {
    ff_controller *c = start(workers);
    double t = throughput_on(c, workers, kind, total);
    ff_controller_destroy(&c);
    return t;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "worker")) return rt_worker_main(argc - 1, argv + 1, NULL, NULL);
    if (argc > 2 && !strcmp(argv[1], "zmq-echo")) return zmq_echo_main(argv[2]);
    bool quick = false;
    const char *plain_ep = NULL;
    int remote = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (v && !strcmp(argv[i], "--listen")) listen_ep = v, i++;
        else if (v && !strcmp(argv[i], "--plain")) plain_ep = v, i++;
        else if (v && !strcmp(argv[i], "--remote")) remote = atoi(v), i++;
        else if (v && !strcmp(argv[i], "--curve")) curve_key = v, i++;
        else {
            fprintf(stderr, "usage: bench_runtime [--quick] [--listen tcp://IP:PORT --plain tcp://IP:PORT2 --remote N "
                            "[--curve controller.key]]\n");
            return 2;
        }
    }
    if (listen_ep && (!plain_ep || remote < 1 || remote > 64)) {
        fprintf(stderr, "bench_runtime: --listen needs --plain tcp://IP:PORT2 and --remote N (1 to 64 workers)\n");
        return 2;
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = 0;
    signal(SIGPIPE, SIG_IGN);

    /* round trips, alternating rounds so both see the same machine */
    int rounds = quick ? 3 : 10, per = quick ? 300 : 1000, total = rounds * per;
    int64_t *rt_plain = malloc(sizeof(int64_t) * (size_t)total), *rt_echo = malloc(sizeof(int64_t) * (size_t)total),
            *rt_sum = malloc(sizeof(int64_t) * (size_t)total);
    plain p;
    plain_start(&p, listen_ep ? plain_ep : NULL);
    ff_controller *c = start(listen_ep ? remote : 1);
    for (int i = 0; i < 200; i++) { /* warm up */
        plain_rtt(&p);
        runtime_rtt(c, "echo");
        runtime_rtt(c, "sum");
    }
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < per; i++) {
            rt_plain[r * per + i] = plain_rtt(&p);
            rt_echo[r * per + i] = runtime_rtt(c, "echo");
            rt_sum[r * per + i] = runtime_rtt(c, "sum");
        }
    if (!listen_ep) ff_controller_destroy(&c);
    plain_stop(&p);
    double p50_plain = pct(rt_plain, total, 0.5), p99_plain = pct(rt_plain, total, 0.99);
    double p50_echo = pct(rt_echo, total, 0.5), p99_echo = pct(rt_echo, total, 0.99);
    double p50_sum = pct(rt_sum, total, 0.5), p99_sum = pct(rt_sum, total, 0.99);
    const char *over = !listen_ep ? "ipc" : curve_key ? "tcp with CURVE, between hosts" : "tcp, between hosts";
    printf("round trip over %s, one at a time (%d each, alternating):\n", over, total);
    printf("  %-44s p50 %7.1f us   p99 %7.1f us\n", "plain ZeroMQ ROUTER/DEALER ping-pong", p50_plain, p99_plain);
    printf("  %-44s p50 %7.1f us   p99 %7.1f us   (%.2fx plain)\n", "subtask echo (worker loop thread)", p50_echo,
           p99_echo, p50_echo / p50_plain);
    printf("  %-44s p50 %7.1f us   p99 %7.1f us   (%.2fx plain)\n", "subtask sum (worker compute thread)", p50_sum,
           p99_sum, p50_sum / p50_plain);
    fflush(stdout);

    if (listen_ep) { /* the remote workers, one controller */
        int m = quick ? 20000 * remote : 50000 * remote;
        double t = throughput_on(c, remote, "echo", m), ts = throughput_on(c, remote, "sum", m);
        ff_controller_destroy(&c);
        printf("throughput, small subtasks streamed to any of %d remote workers (64 in flight per worker):\n", remote);
        printf("  %2d workers  echo: %9.0f subtasks/s  (%d subtasks)\n", remote, t, m);
        printf("  %2d workers  sum:  %9.0f subtasks/s  (through the compute threads)\n", remote, ts);
        printf("runtime over %s: %.0f subtasks/s with %d workers; median round trip %.1f us vs %.1f us plain ZeroMQ = %.2fx\n",
               over, t, remote, p50_echo, p50_plain, p50_echo / p50_plain);
        free(rt_plain);
        free(rt_echo);
        free(rt_sum);
        return 0;
    }
    int counts[3] = {1, 4, 16};
    double tput[3], tput_sum16 = 0;
    printf("throughput, small subtasks streamed to any member (64 in flight per worker):\n");
    for (int k = 0; k < 3; k++) {
        int m = quick ? 20000 * (k + 1) : 50000 * (k + 2);
        tput[k] = throughput(counts[k], "echo", m);
        printf("  %2d workers  echo: %9.0f subtasks/s  (%d subtasks)\n", counts[k], tput[k], m);
        fflush(stdout);
    }
    tput_sum16 = throughput(16, "sum", quick ? 40000 : 100000);
    printf("  16 workers  sum:  %9.0f subtasks/s  (through the compute threads)\n", tput_sum16);
    printf("runtime: %.0f subtasks/s with 16 workers (target: >= 100000); median round trip %.1f us vs %.1f us plain "
           "ZeroMQ = %.2fx (target: <= 1.5x)\n",
           tput[2], p50_echo, p50_plain, p50_echo / p50_plain);
    free(rt_plain);
    free(rt_echo);
    free(rt_sum);
    return 0;
}

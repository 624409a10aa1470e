/* The controller: its ROUTER socket in a libev loop, the worker registry, liveness
 * (heartbeats, process exits, disconnects), local worker processes, clock offsets, and the
 * public entry points that run the loop. Jobs and dispatch are in sched.c.
 *
 * Liveness rules (docs/runtime.md): every heartbeat_s the controller pings each live
 * worker; the pong carries the worker's clock, which gives one clock-offset sample. Any
 * message from a worker counts as a sign of life. A worker is declared dead when it has been
 * silent for timeout_s, when its local process exits, or when the ROUTER no longer knows
 * its connection (a send fails with EHOSTUNREACH). A dead local worker that is still
 * running (hung) is killed, so it cannot come back with stale results. */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "controller/ctl_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

extern char **environ;

/* ---- u64map ------------------------------------------------------------------------------ */
#define MAP_EMPTY 0
#define MAP_DEAD UINT64_MAX

static size_t map_slot(uint64_t key, size_t cap) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

void *u64map_get(const u64map *m, uint64_t key) {
    if (!m->cap) return NULL;
    for (size_t i = map_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) return m->vals[i];
        if (m->keys[i] == MAP_EMPTY) return NULL;
    }
}

static int map_grow(u64map *m) {
    size_t cap = m->cap ? m->cap : 64;
    while (m->live * 3 >= cap) cap *= 2; /* live load at most 1/3 after the rehash */
    uint64_t *keys = ff_calloc(cap, sizeof *keys);
    void **vals = ff_calloc(cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == MAP_EMPTY || m->keys[i] == MAP_DEAD) continue;
        size_t j = map_slot(m->keys[i], cap);
        while (keys[j] != MAP_EMPTY) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    m->used = m->live;
    return 0;
}

int u64map_put(u64map *m, uint64_t key, void *val) {
    assert(key != MAP_EMPTY && key != MAP_DEAD);
    if ((m->used + 1) * 2 > m->cap && map_grow(m) != 0) return -1;
    size_t i = map_slot(key, m->cap), dead = SIZE_MAX;
    for (;; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) {
            m->vals[i] = val;
            return 0;
        }
        if (m->keys[i] == MAP_DEAD && dead == SIZE_MAX) dead = i;
        if (m->keys[i] == MAP_EMPTY) break;
    }
    if (dead != SIZE_MAX) i = dead;
    else m->used++;
    m->keys[i] = key;
    m->vals[i] = val;
    m->live++;
    return 0;
}

void u64map_del(u64map *m, uint64_t key) {
    if (!m->cap) return;
    for (size_t i = map_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) {
            m->keys[i] = MAP_DEAD;
            m->vals[i] = NULL;
            m->live--;
            return;
        }
        if (m->keys[i] == MAP_EMPTY) return;
    }
}

void u64map_free(u64map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static uint64_t peer_hash(const uint8_t *p, size_t n) {
    uint64_t h = ff_hash_fnv1a(p, n, FF_HASH_FNV1A_INIT);
    if (h == MAP_EMPTY || h == MAP_DEAD) h = 1;
    return h;
}

/* ---- message buffers ------------------------------------------------------------------------ */
ff_msg *ctl_msg_get(ff_controller *c) {
    if (c->nmsg_pool) return c->msg_pool[--c->nmsg_pool];
    ff_msg *m = ff_malloc(sizeof *m);
    if (m) ff_msg_init(m);
    return m;
}

void ctl_msg_put(ff_controller *c, ff_msg *m) {
    if (!m) return;
    if (c->nmsg_pool < (int)(sizeof c->msg_pool / sizeof c->msg_pool[0])) {
        ff_msg_reset(m);
        c->msg_pool[c->nmsg_pool++] = m;
    } else {
        ff_msg_free(m);
        free(m);
    }
}

/* ---- options ------------------------------------------------------------------------------ */
void ff_controller_opts_default(ff_controller_opts *o) {
    memset(o, 0, sizeof *o);
    o->heartbeat_s = 0.5;
    o->timeout_s = 5;
    o->max_inflight = 64;
    o->max_attempts = 3;
}

const char *ff_worker_state_name(ff_worker_state s) {
    switch (s) {
    case FF_WORKER_SPAWNED: return "spawned";
    case FF_WORKER_LIVE: return "live";
    case FF_WORKER_DEAD: return "dead";
    case FF_WORKER_STOPPED: return "stopped";
    }
    return "unknown";
}

/* ---- workers ------------------------------------------------------------------------------ */
ctl_worker *ctl_worker_get(ff_controller *c, int rank) {
    if (rank < 0 || rank >= c->nworkers) return NULL;
    return c->workers[rank];
}

static ctl_worker *worker_slot(ff_controller *c, int rank) {
    if (rank >= c->workers_cap) {
        int cap = c->workers_cap ? c->workers_cap : 16;
        while (cap <= rank) cap *= 2;
        ctl_worker **a = ff_realloc(c->workers, sizeof *a * (size_t)cap);
        if (!a) return NULL;
        for (int i = c->workers_cap; i < cap; i++) a[i] = NULL;
        c->workers = a;
        c->workers_cap = cap;
    }
    if (!c->workers[rank]) {
        ctl_worker *w = ff_calloc(1, sizeof *w);
        if (!w) return NULL;
        w->rank = rank;
        w->state = FF_WORKER_DEAD;
        w->pidfd = -1;
        w->c = c;
        snprintf(w->dead_reason, sizeof w->dead_reason, "never joined");
        c->workers[rank] = w;
    }
    if (rank >= c->nworkers) c->nworkers = rank + 1;
    return c->workers[rank];
}


/* The offset estimate can be off by up to half a round trip, more than a short subtask
 * lasts: clamping each end on its own into [dispatch, done] then squashed it to nothing.
 * The worker measured the duration on one clock, so it is exact: the span is moved, whole,
 * into the window and cut only where it is longer than the window. */
void ctl_map_span(const ctl_worker *w, int64_t worker_start, int64_t worker_end, int64_t dispatch_ns, int64_t done_ns,
                  int64_t *start_ns, int64_t *end_ns) {
    int64_t d = worker_end > worker_start ? worker_end - worker_start : 0;
    int64_t st = worker_start - w->offset_ns;
    if (st > done_ns - d) st = done_ns - d;
    if (st < dispatch_ns) st = dispatch_ns;
    if (st > done_ns) st = done_ns;
    int64_t en = st + d;
    if (en > done_ns) en = done_ns;
    *start_ns = st;
    *end_ns = en;
}

static int cmp_span(const void *a, const void *b) {
    const ctl_span *x = a, *y = b;
    return x->wstart < y->wstart ? -1 : x->wstart > y->wstart ? 1 : (x->id > y->id) - (x->id < y->id);
}

void ctl_keep_worker_order(ctl_span *s, size_t n) {
    qsort(s, n, sizeof *s, cmp_span);
    size_t prev = SIZE_MAX; /* of the spans before, the one whose run ended last on the worker */
    for (size_t k = 0; k < n; k++) {
        if (prev != SIZE_MAX && s[k].wstart >= s[prev].wend && s[k].st < s[prev].en) {
            const int64_t d = s[k].en - s[k].st;
            s[k].st = s[prev].en;
            s[k].en = s[k].st + d > s[k].done && s[k].st <= s[k].done ? s[k].done : s[k].st + d;
        }
        if (prev == SIZE_MAX || s[k].wend > s[prev].wend) prev = k;
    }
}

static void forget_peer(ff_controller *c, ctl_worker *w) {
    if (w->peer_len) {
        if (u64map_get(&c->peers, w->peer_key) == w) u64map_del(&c->peers, w->peer_key);
        w->peer_len = 0;
    }
}

static void stop_pid_watch(ff_controller *c, ctl_worker *w) {
    if (w->pidfd >= 0) {
        ev_io_stop(c->loop, &w->pid_io);
        close(w->pidfd);
        w->pidfd = -1;
    }
}

/* Reap a local worker if it exited; true when it is gone. */
static bool reap(ff_controller *c, ctl_worker *w, bool block) {
    if (!w->local || w->reaped) return true;
    int status;
    pid_t r = waitpid(w->pid, &status, block ? 0 : WNOHANG);
    if (r == 0) return false;
    w->reaped = true;
    w->exit_status = r == w->pid ? status : 0;
    stop_pid_watch(c, w);
    return true;
}

static void describe_exit(const ctl_worker *w, char *buf, size_t cap) {
    if (WIFSIGNALED(w->exit_status))
        snprintf(buf, cap, "process %d was killed by signal %d", (int)w->pid, WTERMSIG(w->exit_status));
    else
        snprintf(buf, cap, "process %d exited with status %d", (int)w->pid, WEXITSTATUS(w->exit_status));
}

void ctl_worker_died(ff_controller *c, ctl_worker *w, const char *fmt, ...) {
    if (w->state == FF_WORKER_DEAD || w->state == FF_WORKER_STOPPED) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->dead_reason, sizeof w->dead_reason, fmt, ap);
    va_end(ap);
    w->state = c->shutting_down ? FF_WORKER_STOPPED : FF_WORKER_DEAD;
    if (!c->shutting_down) {
        c->stats.workers_died++;
        ff_warn("controller: worker %d is dead: %s", w->rank, w->dead_reason);
    }
    forget_peer(c, w);
    /* a hung local process must not come back with stale results */
    if (w->local && !reap(c, w, false)) kill(w->pid, SIGKILL);
    sched_worker_lost(c, w);
}

static void settle_workers(ff_controller *c);

static void on_pidfd(struct ev_loop *loop, ev_io *io, int revents) {
    (void)loop;
    (void)revents;
    ctl_worker *w = io->data;
    ff_controller *c = w->c;
    if (!reap(c, w, false)) return;
    w->exited_ns = ff_now_ns();
    settle_workers(c);
}

static int pidfd_open_compat(pid_t pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* What one local worker costs, measured (docs/runtime.md, "Local workers"): the controller
 * holds 2 descriptors for it (its connection and its pidfd), it runs about 6 threads (8
 * counted: RLIMIT_NPROC counts threads), and it is about 12 MiB resident before it loads a
 * model (32 MiB counted). Past 16 workers per core they only time-share the cores. */
enum { FD_PER_WORKER = 2, FD_RESERVE = 64, THREADS_PER_WORKER = 8, WORKERS_PER_CORE = 16 };
#define WORKER_MIN_BYTES (32ull << 20)

int ff_controller_local_worker_limit(const ff_controller *c, char *why, size_t cap) {
    int64_t lim = INT32_MAX;
    char w[160] = "";
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && cores * WORKERS_PER_CORE < lim) {
        lim = cores * WORKERS_PER_CORE;
        snprintf(w, sizeof w, "%d per core on %ld cores", WORKERS_PER_CORE, cores);
    }
    struct rlimit r;
    int known = c ? c->nworkers : 0; /* each already holds its connection */
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
        int64_t by_fd = ((int64_t)r.rlim_cur - FD_RESERVE) / FD_PER_WORKER - known;
        if (by_fd < lim) {
            lim = by_fd;
            snprintf(w, sizeof w, "RLIMIT_NOFILE (ulimit -n) %lld: the controller holds %d descriptors per worker", (long long)r.rlim_cur,
                     FD_PER_WORKER);
        }
    }
    if (getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY && (int64_t)(r.rlim_cur / THREADS_PER_WORKER) < lim) {
        lim = (int64_t)(r.rlim_cur / THREADS_PER_WORKER);
        snprintf(w, sizeof w, "RLIMIT_NPROC (ulimit -u) %lld: about %d threads per worker", (long long)r.rlim_cur, THREADS_PER_WORKER);
    }
    char what[64];
    uint64_t mem = ff_memory_limit(what, sizeof what);
    if (mem / WORKER_MIN_BYTES < (uint64_t)lim) {
        lim = (int64_t)(mem / WORKER_MIN_BYTES);
        char b[32];
        snprintf(w, sizeof w, "%s %s: at least 32 MiB per worker", what, ff_fmt_bytes(mem, b, sizeof b));
    }
    if (lim < 0) lim = 0;
    if (why && cap) snprintf(why, cap, "%s", w);
    return (int)lim;
}

int ff_controller_spawn(ff_controller *c, int n) {
    if (n <= 0) return ff_error_set("spawn", NULL, "asked for %d workers", n);
    char why[200];
    int lim = ff_controller_local_worker_limit(c, why, sizeof why);
    if (n > lim)
        return ff_error_set("spawn", "start fewer local workers, or run workers on other hosts (fuseflow worker --connect)",
                            "cannot start %d local workers: this machine runs at most %d next to the controller (%s)", n, lim, why);
    if (c->curve && !c->worker_key[0])
        return ff_error_set("spawn", "set opts.worker_key_file to worker.key", "the controller uses CURVE, so local "
                            "workers need the worker key file");
    int first = c->nworkers;
    for (int i = 0; i < n; i++) {
        int rank = c->nworkers;
        ctl_worker *w = worker_slot(c, rank);
        if (!w) return -1;
        char rank_s[16], timeout_s[32];
        snprintf(rank_s, sizeof rank_s, "%d", rank);
        snprintf(timeout_s, sizeof timeout_s, "%g", c->o.timeout_s > 10 ? c->o.timeout_s : 10.0);
        char *argv[16];
        int k = 0;
        argv[k++] = c->worker_bin;
        argv[k++] = "worker";
        argv[k++] = "--connect";
        argv[k++] = c->bound;
        argv[k++] = "--rank";
        argv[k++] = rank_s;
        argv[k++] = "--connect-timeout";
        argv[k++] = timeout_s;
        if (c->curve) {
            argv[k++] = "--curve";
            argv[k++] = c->worker_key;
        }
        if (c->worker_log[0]) {
            argv[k++] = "--log";
            argv[k++] = c->worker_log;
        }
        argv[k] = NULL;
        /* started with SIGTERM/SIGINT blocked: the worker unblocks them once it handles them,
         * so a Ctrl-C or a stop during its start-up is not lost (nor fatal) */
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        posix_spawnattr_setsigmask(&attr, &mask);
        short flags = POSIX_SPAWN_SETSIGMASK;
        if (c->o.worker_pgroup) { /* a terminal's Ctrl-C reaches the controller only */
            posix_spawnattr_setpgroup(&attr, 0);
            flags |= POSIX_SPAWN_SETPGROUP;
        }
        posix_spawnattr_setflags(&attr, flags);
        pid_t pid;
        int rc = posix_spawn(&pid, c->worker_bin, NULL, &attr, argv, environ);
        posix_spawnattr_destroy(&attr);
        if (rc != 0)
            return ff_error_set(c->worker_bin, "set opts.worker_bin or FF_BIN to the fuseflow binary",
                                "cannot start a worker: %s", strerror(rc));
        w->local = true;
        w->pid = pid;
        w->reaped = false;
        w->disconnected = false;
        w->disconnected_ns = 0;
        w->state = FF_WORKER_SPAWNED;
        w->joined_ns = ff_now_ns();
        w->dead_reason[0] = 0;
        w->pidfd = pidfd_open_compat(pid);
        if (w->pidfd >= 0) {
            fcntl(w->pidfd, F_SETFD, FD_CLOEXEC);
            ev_io_init(&w->pid_io, on_pidfd, w->pidfd, EV_READ);
            w->pid_io.data = w;
            ev_io_start(c->loop, &w->pid_io);
        }
    }
    return first;
}

/* ---- messages from workers ------------------------------------------------------------------ */
static void send_ping(ff_controller *c, ctl_worker *w) {
    ff_msg *m = &c->scratch;
    ff_msg_begin(m, FF_MSG_HEARTBEAT);
    m->u.heartbeat.seq = ++w->ping_seq;
    m->u.heartbeat.t0 = ff_now_ns();
    if (ff_msg_send(c->sock, w->peer, w->peer_len, m) != 0 && errno == EHOSTUNREACH) w->disconnected = true;
}

static void on_hello(ff_controller *c, ff_msg *m) {
    const ff_msg_hello *h = &m->u.hello;
    uint64_t key = peer_hash(m->peer, m->peer_len);
    ctl_worker *known = u64map_get(&c->peers, key);
    char text[FF_MSG_TEXT_MAX];
    if (known && known->peer_len == m->peer_len && !memcmp(known->peer, m->peer, m->peer_len)) {
        /* a repeated hello (our welcome crossed its retry): welcome again */
    } else {
        if (c->shutting_down) {
            ff_msg_send_error(c->sock, m->peer, m->peer_len, FF_ERR_REJECTED, 0, "the controller is shutting down");
            return;
        }
        int rank = h->rank;
        if (rank >= 0) {
            ctl_worker *w = ctl_worker_get(c, rank);
            if (w && w->state == FF_WORKER_LIVE) {
                snprintf(text, sizeof text, "rank %d is taken by a live worker (%s, pid %lld)", rank, w->host,
                         (long long)w->pid);
                ff_warn("controller: refused a worker from %s: %s", h->host, text);
                ff_msg_send_error(c->sock, m->peer, m->peer_len, FF_ERR_REJECTED, 0, text);
                return;
            }
            if (rank > 1 << 20) {
                ff_msg_send_error(c->sock, m->peer, m->peer_len, FF_ERR_REJECTED, 0, "rank too large");
                return;
            }
        } else {
            rank = c->nworkers;
        }
        known = worker_slot(c, rank);
        if (!known) return;
        if (known->local && known->state == FF_WORKER_SPAWNED && known->pid != h->pid)
            ff_warn("controller: rank %d was started here as pid %d but pid %lld says hello", rank, (int)known->pid,
                    (long long)h->pid);
        if (known->local && known->state != FF_WORKER_SPAWNED) {
            /* a rank whose local process died, taken over by a process we did not start */
            if (!reap(c, known, false)) {
                kill(known->pid, SIGKILL);
                reap(c, known, true);
            }
            stop_pid_watch(c, known);
            known->local = false;
        }
        if (!known->local) known->pid = (pid_t)h->pid;
        memcpy(known->peer, m->peer, m->peer_len);
        known->peer_len = m->peer_len;
        known->peer_key = key;
        u64map_put(&c->peers, key, known);
        snprintf(known->host, sizeof known->host, "%s", h->host);
        known->max_frame = h->max_frame ? (size_t)h->max_frame : (size_t)1 << 30;
        snprintf(known->device, sizeof known->device, "%s", h->device);
        known->devices = h->devices;
        free(known->caps);
        known->caps = NULL;
        known->ncaps = 0;
        if (h->ncaps) {
            known->caps = ff_malloc(sizeof *known->caps * (size_t)h->ncaps);
            if (known->caps) {
                memcpy(known->caps, h->caps, sizeof *known->caps * (size_t)h->ncaps);
                known->ncaps = h->ncaps;
            }
        }
        known->state = FF_WORKER_LIVE;
        known->joined_live = true;
        known->exited_ns = 0;
        known->disconnected = false;
        known->disconnected_ns = 0;
        known->dead_reason[0] = 0;
        known->nsamples = known->next_sample = 0;
        known->offset_ns = 0;
        known->best_rtt_ns = INT64_MAX;
        known->joined_ns = ff_now_ns();
        c->stats.workers_joined++;
        ff_debug("controller: worker %d joined from %s (pid %lld, %s)", rank, h->host, (long long)h->pid, h->device);
    }
    known->last_rx_ns = ff_now_ns();
    ff_msg *out = &c->scratch;
    ff_msg_begin(out, FF_MSG_WELCOME);
    out->u.welcome.rank = known->rank;
    out->u.welcome.heartbeat_ms = (uint32_t)(c->o.heartbeat_s * 1000 + 0.5);
    out->u.welcome.timeout_ms = (uint32_t)(c->o.timeout_s * 1000 + 0.5);
    out->u.welcome.max_inflight = (uint32_t)c->o.max_inflight;
    out->u.welcome.max_frame = c->o.max_frame_bytes ? c->o.max_frame_bytes : (uint64_t)1 << 30;
    ff_msg_send(c->sock, known->peer, known->peer_len, out);
    send_ping(c, known); /* a first clock sample right away */
    sched_pump(c, known);
}

static void on_pong(ff_controller *c, ctl_worker *w, const ff_msg_heartbeat *h, int64_t t3) {
    if (!h->reply || h->t0 <= 0) {
        c->stats.unexpected++;
        return;
    }
    w->busy = h->busy;
    w->errors = h->errors;
    if (h->seq > w->pong_seq) w->pong_seq = h->seq;
    int64_t rtt = (t3 - h->t0) - (h->t2 - h->t1);
    if (rtt < 0) rtt = 0;
    /* offset = worker clock - controller clock, at the middle of the exchange */
    int64_t off = ((h->t1 - h->t0) + (h->t2 - t3)) / 2;
    w->sample_off[w->next_sample] = off;
    w->sample_rtt[w->next_sample] = rtt;
    w->next_sample = (w->next_sample + 1) % CTL_CLOCK_SAMPLES;
    if (w->nsamples < CTL_CLOCK_SAMPLES) w->nsamples++;
    int best = 0;
    for (int i = 1; i < w->nsamples; i++)
        if (w->sample_rtt[i] < w->sample_rtt[best]) best = i;
    w->offset_ns = w->sample_off[best];
    w->best_rtt_ns = w->sample_rtt[best]; /* the offset is within +-rtt/2 of the truth */
    /* a few quick samples right after the join, so the first subtasks map well */
    if (w->nsamples < 4) send_ping(c, w);
}

static void note_rejected(ff_controller *c, const ff_msg *m, ff_reject why) {
    c->rejected_logged++;
    if (c->rejected_logged <= 10 || c->rejected_logged % 1000 == 0)
        ff_warn("controller: rejected a message (%s, %llu so far): %s", ff_reject_name(why),
                (unsigned long long)c->rejected_logged, ff_error_message());
    ff_msg_send_error(c->sock, m->peer, m->peer_len, FF_ERR_MALFORMED, 0, ff_error_message());
}

/* Handle up to RT_RECV_BATCH messages; returns how many arrived. */
static int read_batch(ff_controller *c) {
    int n = 0;
    for (; n < RT_RECV_BATCH; n++) {
        ff_msg *m = c->rx;
        ff_reject why;
        int rc = ff_msg_recv(c->dec, c->sock, true, m, &why);
        if (rc == 0 || rc == -2) break;
        if (rc == -1) {
            note_rejected(c, m, why);
            ctl_worker *w = u64map_get(&c->peers, peer_hash(m->peer, m->peer_len));
            if (w && w->peer_len == m->peer_len && !memcmp(w->peer, m->peer, m->peer_len)) {
                w->last_rx_ns = ff_now_ns();
                if (m->rejected_type == FF_MSG_RESULT && m->rejected_id) {
                    char text[2 * FF_MSG_TEXT_MAX]; /* sched_rejected cuts it to fit */
                    snprintf(text, sizeof text, "the controller rejected the result of worker %d: %s", w->rank,
                             ff_error_message());
                    sched_rejected(c, w, m->rejected_id, text);
                }
            }
            continue;
        }
        if (m->type == FF_MSG_HELLO) {
            on_hello(c, m);
            continue;
        }
        ctl_worker *w = u64map_get(&c->peers, peer_hash(m->peer, m->peer_len));
        if (!w || w->peer_len != m->peer_len || memcmp(w->peer, m->peer, m->peer_len) != 0) {
            c->stats.unknown_peer++;
            ff_msg_send_error(c->sock, m->peer, m->peer_len, FF_ERR_UNKNOWN_PEER, 0,
                              "unknown worker: say hello first (or you were declared dead)");
            continue;
        }
        int64_t now = ff_now_ns();
        w->last_rx_ns = now;
        switch (m->type) {
        case FF_MSG_RESULT: sched_on_result(c, w, m); break;
        case FF_MSG_HEARTBEAT: on_pong(c, w, &m->u.heartbeat, now); break;
        case FF_MSG_ERROR:
            /* a refused subtask (or group setup) fails now instead of waiting forever */
            if (m->u.error.code != FF_ERR_MALFORMED || !m->u.error.ref ||
                !sched_rejected(c, w, m->u.error.ref, m->u.error.text))
                ff_warn("controller: worker %d reports: %s", w->rank, m->u.error.text);
            break;
        default:
            c->stats.unexpected++;
            ff_msg_send_error(c->sock, m->peer, m->peer_len, FF_ERR_UNEXPECTED, 0,
                              "the controller does not take this message type");
            break;
        }
    }
    return n;
}

static void on_readable(rt_zwatch *zw) {
    ff_controller *c = zw->ud;
    read_batch(c);
    settle_workers(c);
}

/* Deaths are declared only once everything the worker sent has been read: when the ROUTER
 * has dropped its connection (a send to it fails), every message that came over it is
 * already queued in our socket, so draining the socket first means no result in transit is
 * mistaken for lost. A local process that exited is probed with a ping until its
 * connection is gone (or timeout_s passed). */
static void settle_workers(ff_controller *c) {
    int64_t now = ff_now_ns();
    bool waiting = false;
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w || (w->state != FF_WORKER_LIVE && w->state != FF_WORKER_SPAWNED)) continue;
        bool exited = w->local && w->reaped;
        if (exited && w->state == FF_WORKER_SPAWNED) { /* never connected: nothing to read */
            char why[128];
            describe_exit(w, why, sizeof why);
            ctl_worker_died(c, w, "%s before saying hello", why);
            continue;
        }
        if (w->state != FF_WORKER_LIVE || (!exited && !w->disconnected)) continue;
        if (exited && !w->disconnected) send_ping(c, w); /* fails once the connection is gone */
        if (!w->disconnected && (now - w->exited_ns) / 1e9 < c->o.timeout_s) {
            waiting = true;
            continue;
        }
        if (!exited && w->local) {
            /* a local process whose connection went is most often exiting (killed, crashed):
             * a moment for it to end, so its death says how */
            if (!w->disconnected_ns) w->disconnected_ns = now;
            exited = reap(c, w, false);
            if (!exited && now - w->disconnected_ns < 200000000) {
                waiting = true;
                continue;
            }
        }
        for (int k = 0; k < 1000 && rt_zsock_readable(c->sock) && read_batch(c) > 0; k++) {}
        if (w->state != FF_WORKER_LIVE) continue; /* (a callback may have changed things) */
        if (exited) {
            char why[128];
            describe_exit(w, why, sizeof why);
            ctl_worker_died(c, w, "%s", why);
        } else {
            ctl_worker_died(c, w, "its connection is gone (peer unreachable)");
        }
    }
    if (waiting && !ev_is_active(&c->settle_timer)) {
        ev_timer_set(&c->settle_timer, 0.002, 0);
        ev_timer_start(c->loop, &c->settle_timer);
    }
}

static void on_settle_timer(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    settle_workers(t->data);
}

/* ---- heartbeats and timeouts ------------------------------------------------------------- */
static void on_heartbeat(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    ff_controller *c = t->data;
    int64_t now = ff_now_ns();
    /* Silence is only evidence when we were listening: after a stall of our own (the loop
     * blocked, the process descheduled) every worker looks silent, so forgive the gap; and
     * messages still waiting in our socket are not silence either. */
    int64_t gap = c->last_tick_ns ? now - c->last_tick_ns : 0;
    c->last_tick_ns = now;
    bool stalled = gap > (int64_t)(c->o.timeout_s * 0.5e9);
    bool backlog = rt_zsock_readable(c->sock);
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w) continue;
        if (stalled && w->state == FF_WORKER_LIVE && w->last_rx_ns < now - gap) w->last_rx_ns = now - gap;
        if (w->local && w->pidfd < 0 && !w->reaped && reap(c, w, false)) w->exited_ns = now;
        /* (while shutting down, workers told to stop go quiet: the shutdown's timeout rules) */
        if (w->state != FF_WORKER_LIVE || w->disconnected || (w->local && w->reaped) || c->shutting_down) continue;
        double silent = (now - w->last_rx_ns) / 1e9;
        if (silent > c->o.timeout_s && !backlog) {
            ctl_worker_died(c, w, "silent for %.2f s (timeout %.2f s)", silent, c->o.timeout_s);
        } else {
            send_ping(c, w);
        }
    }
    settle_workers(c);
}

void ctl_start_deferred(ff_controller *c) {
    if (!ev_is_active(&c->deferred_idle)) ev_idle_start(c->loop, &c->deferred_idle);
}

static void on_deferred(struct ev_loop *loop, ev_idle *w, int revents) {
    (void)revents;
    ff_controller *c = w->data;
    ev_idle_stop(loop, w);
    sched_run_deferred(c);
    settle_workers(c);
}

/* ---- life cycle --------------------------------------------------------------------------- */

/* The default sockets (DIR/fuseflow-PID-N.sock) of controllers that were killed and could not
 * remove theirs: unlinked at the next start, and logged. A socket counts as stale only when
 * its process is gone and nobody accepts on it (a live process in another PID namespace
 * sharing the folder keeps its own). */
static void remove_stale_sockets(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid, n, len = 0;
        if (sscanf(e->d_name, "fuseflow-%d-%d.sock%n", &pid, &n, &len) != 2 || e->d_name[len] || pid <= 0 || pid == (int)getpid()) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue;
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if ((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir, e->d_name) >= sizeof a.sun_path) continue;
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        bool refused = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == ECONNREFUSED;
        close(fd);
        if (refused && unlink(a.sun_path) == 0) ff_info("controller: removed %s, the socket of process %d, which is gone", a.sun_path, pid);
    }
    closedir(d);
}

static int setup_socket(ff_controller *c) {
    c->ctx = zmq_ctx_new();
    if (!c->ctx) return ff_error_set("controller", NULL, "zmq_ctx_new: %s", zmq_strerror(errno));
    c->sock = zmq_socket(c->ctx, ZMQ_ROUTER);
    if (!c->sock) return ff_error_set("controller", NULL, "zmq_socket: %s", zmq_strerror(errno));
    size_t frame_cap = c->o.max_frame_bytes ? c->o.max_frame_bytes : (size_t)1 << 30;
    if (rt_socket_setup(c->sock, 2 * frame_cap + FF_MSG_MAX_HEADER) != 0) return -1;
    int one = 1;
    if (zmq_setsockopt(c->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0)
        return ff_error_set("controller", NULL, "ZMQ_ROUTER_MANDATORY: %s", zmq_strerror(errno));
    if (c->o.curve_key_file) {
        rt_curve_keys k;
        if (rt_curve_load(c->o.curve_key_file, true, &k) != 0) return -1;
        zmq_z85_decode(c->client_key, k.client_public);
        if (zap_start(c) != 0) return -1;
        if (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVER, &one, sizeof one) ||
            zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, k.server_secret, 40))
            return ff_error_set(c->o.curve_key_file, "libzmq must be built with libsodium", "CURVE: %s",
                                zmq_strerror(errno));
        memset(&k, 0, sizeof k);
        c->curve = true;
    }
    if (c->o.endpoint) {
        /* copied into c->endpoint by ff_controller_new */
    } else {
        static atomic_int counter;
        const char *tmp = getenv("TMPDIR");
        static atomic_flag swept = ATOMIC_FLAG_INIT;
        if (!atomic_flag_test_and_set(&swept)) {
            remove_stale_sockets(tmp && *tmp ? tmp : "/tmp");
            if (tmp && *tmp && strcmp(tmp, "/tmp")) remove_stale_sockets("/tmp"); /* the fallback for long paths */
        }
        snprintf(c->ipc_path, sizeof c->ipc_path, "%s/fuseflow-%d-%d.sock", tmp && *tmp ? tmp : "/tmp", (int)getpid(),
                 atomic_fetch_add(&counter, 1));
        if (strlen(c->ipc_path) > 100)
            snprintf(c->ipc_path, sizeof c->ipc_path, "/tmp/fuseflow-%d-%d.sock", (int)getpid(),
                     atomic_fetch_add(&counter, 1));
        snprintf(c->endpoint, sizeof c->endpoint, "ipc://%s", c->ipc_path);
    }
    if (zmq_bind(c->sock, c->endpoint) != 0)
        return ff_error_set(c->endpoint, "use ipc:///path or tcp://HOST:PORT with a free port",
                            "cannot bind: %s", zmq_strerror(errno));
    size_t len = sizeof c->bound;
    if (zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, c->bound, &len) != 0)
        snprintf(c->bound, sizeof c->bound, "%s", c->endpoint);
    if (!strncmp(c->bound, "ipc://", 6) && !c->ipc_path[0]) snprintf(c->ipc_path, sizeof c->ipc_path, "%s", c->bound + 6);
    return 0;
}

ff_controller *ff_controller_new(const ff_controller_opts *o) {
    ff_controller *c = ff_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->o = *o;
    ff_controller_opts d;
    ff_controller_opts_default(&d);
    if (c->o.heartbeat_s <= 0) c->o.heartbeat_s = d.heartbeat_s;
    if (c->o.timeout_s <= 0) c->o.timeout_s = d.timeout_s;
    if (c->o.max_inflight <= 0) c->o.max_inflight = d.max_inflight;
    if (c->o.max_attempts <= 0) c->o.max_attempts = d.max_attempts;
    if (c->o.timeout_s < 2 * c->o.heartbeat_s) c->o.timeout_s = 2 * c->o.heartbeat_s;
    const char *bin = o->worker_bin ? o->worker_bin : getenv("FF_BIN");
    if (bin && *bin) {
        snprintf(c->worker_bin, sizeof c->worker_bin, "%s", bin);
    } else {
        ssize_t n = readlink("/proc/self/exe", c->worker_bin, sizeof c->worker_bin - 1);
        if (n > 0) c->worker_bin[n] = 0;
    }
    if (o->worker_key_file) snprintf(c->worker_key, sizeof c->worker_key, "%s", o->worker_key_file);
    if (o->worker_log) snprintf(c->worker_log, sizeof c->worker_log, "%s", o->worker_log);
    if (o->trace_path) snprintf(c->trace_path, sizeof c->trace_path, "%s", o->trace_path);
    c->o.endpoint = NULL;
    if (o->endpoint) snprintf(c->endpoint, sizeof c->endpoint, "%s", o->endpoint), c->o.endpoint = c->endpoint;
    c->o.worker_bin = c->o.worker_key_file = c->o.worker_log = c->o.trace_path = NULL;
    c->trace.on = o->trace || o->trace_path;
    c->trace.origin_ns = ff_now_ns();
    c->next_id = 1;
    ff_msg_init(&c->scratch);
    c->packbuf = ff_malloc(FF_MSG_MAX_HEADER);
    c->dec = ff_msg_decoder_new(o->max_frame_bytes);
    c->rx = ctl_msg_get(c);
    if (!c->packbuf || !c->dec || !c->rx) goto fail;
    if (setup_socket(c) != 0) goto fail;
    c->o.curve_key_file = NULL;
    if (o->loop) {
        c->loop = o->loop;
    } else {
        c->loop = ev_loop_new(EVFLAG_AUTO);
        c->own_loop = true;
        if (!c->loop) {
            ff_error_set("controller", NULL, "ev_loop_new failed");
            goto fail;
        }
    }
    if (rt_zwatch_start(&c->zw, c->loop, c->sock, on_readable, c) != 0) goto fail;
    ev_timer_init(&c->hb_timer, on_heartbeat, c->o.heartbeat_s, c->o.heartbeat_s);
    c->hb_timer.data = c;
    ev_timer_start(c->loop, &c->hb_timer);
    ev_idle_init(&c->deferred_idle, on_deferred);
    c->deferred_idle.data = c;
    ev_timer_init(&c->settle_timer, on_settle_timer, 0.002, 0);
    c->settle_timer.data = c;
    return c;
fail:
    ff_controller_destroy(&c);
    return NULL;
}

const char *ff_controller_endpoint(const ff_controller *c) { return c->bound; }
struct ev_loop *ff_controller_loop(const ff_controller *c) { return c->loop; }

/* ---- running ------------------------------------------------------------------------------ */
static void on_wake_timer(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)t;
    (void)revents;
}

void ff_controller_poll(ff_controller *c, bool block) { ev_run(c->loop, block ? EVRUN_ONCE : EVRUN_NOWAIT); }

int ff_controller_run_until(ff_controller *c, bool (*done)(void *), void *ud, double timeout_s) {
    if (c->in_callback)
        return ff_error_set("controller", "submit from the callback and wait outside it",
                            "the loop cannot run inside a job callback");
    int64_t deadline = timeout_s > 0 ? ff_now_ns() + (int64_t)(timeout_s * 1e9) : INT64_MAX;
    ev_timer_init(&c->wake_timer, on_wake_timer, 0, 0);
    while (!done(ud)) {
        int64_t now = ff_now_ns();
        if (now >= deadline) return ff_error_set("controller", NULL, "timed out after %.2f s", timeout_s);
        double left = deadline == INT64_MAX ? 1.0 : (deadline - now) / 1e9;
        ev_timer_stop(c->loop, &c->wake_timer);
        ev_timer_set(&c->wake_timer, left > 1.0 ? 1.0 : left, 0);
        ev_now_update(c->loop);
        ev_timer_start(c->loop, &c->wake_timer);
        ev_run(c->loop, EVRUN_ONCE);
    }
    ev_timer_stop(c->loop, &c->wake_timer);
    return 0;
}

static bool no_jobs(void *ud) {
    ff_controller *c = ud;
    return c->njobs == 0;
}

int ff_controller_run(ff_controller *c, double timeout_s) {
    if (ff_controller_run_until(c, no_jobs, c, timeout_s) != 0)
        return ff_error_set("controller", NULL, "timed out after %.2f s with %d jobs outstanding (%d subtasks in "
                            "flight, %d waiting)", timeout_s, c->njobs, c->ninflight, c->npending);
    return 0;
}

typedef struct wait_workers_arg {
    ff_controller *c;
    int n;
} wait_workers_arg;

static bool enough_workers(void *ud) {
    wait_workers_arg *a = ud;
    if (ff_controller_count_workers(a->c, FF_WORKER_LIVE) >= a->n) return true;
    /* a local worker that died before its hello will not come: stop waiting (a wrong
     * worker_bin, a crash at start-up) */
    for (int r = 0; r < a->c->nworkers; r++) {
        ctl_worker *w = a->c->workers[r];
        if (w && w->local && w->state == FF_WORKER_DEAD && !w->joined_live) return true;
    }
    return false;
}

int ff_controller_wait_workers(ff_controller *c, int n, double timeout_s) {
    wait_workers_arg a = {c, n};
    if (ff_controller_run_until(c, enough_workers, &a, timeout_s) == 0 &&
        ff_controller_count_workers(c, FF_WORKER_LIVE) >= n)
        return 0;
    char missing[512] = "";
    size_t off = 0;
    for (int r = 0; r < c->nworkers && off < sizeof missing - 64; r++) {
        ctl_worker *w = c->workers[r];
        if (!w || w->state == FF_WORKER_LIVE) continue;
        off += (size_t)snprintf(missing + off, sizeof missing - off, "%s rank %d %s%s%s", off ? ";" : "", r,
                                ff_worker_state_name(w->state), w->dead_reason[0] ? ": " : "", w->dead_reason);
    }
    return ff_error_set("controller", "check the workers' stderr, the endpoint, worker_bin and CURVE keys",
                        "%d of %d workers live at %s%s%s", ff_controller_count_workers(c, FF_WORKER_LIVE), n, c->bound,
                        missing[0] ? ";" : "", missing);
}

typedef struct confirm_arg {
    ff_controller *c;
    const int *ranks;
    const uint64_t *want;
    int n;
} confirm_arg;

static bool confirmed(void *ud) {
    confirm_arg *a = ud;
    for (int i = 0; i < a->n; i++) {
        ctl_worker *w = ctl_worker_get(a->c, a->ranks[i]);
        if (w && w->state == FF_WORKER_LIVE && w->pong_seq < a->want[i]) return false;
    }
    return true;
}

int ff_controller_confirm_live(ff_controller *c, const int *ranks, int n, double timeout_s) {
    uint64_t want[FF_MSG_MAX_MEMBERS];
    if (n < 0 || n > FF_MSG_MAX_MEMBERS) return ff_error_set("controller", NULL, "%d ranks to confirm", n);
    for (int i = 0; i < n; i++) {
        ctl_worker *w = ctl_worker_get(c, ranks[i]);
        want[i] = 0;
        if (!w || w->state != FF_WORKER_LIVE) continue;
        send_ping(c, w);
        want[i] = w->ping_seq;
    }
    settle_workers(c); /* a send that failed above marked its worker disconnected */
    confirm_arg a = {c, ranks, want, n};
    if (ff_controller_run_until(c, confirmed, &a, timeout_s) != 0) return -1;
    int dead = 0;
    for (int i = 0; i < n; i++) {
        ctl_worker *w = ctl_worker_get(c, ranks[i]);
        dead += !w || w->state == FF_WORKER_DEAD || w->state == FF_WORKER_STOPPED;
    }
    return dead;
}

/* ---- information -------------------------------------------------------------------------- */
int ff_controller_nranks(const ff_controller *c) { return c->nworkers; }

int ff_controller_count_workers(const ff_controller *c, int state) {
    int n = 0;
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w) continue;
        if (state < 0 || (int)w->state == state) {
            n++;
        }
    }
    return n;
}

int ff_controller_set_worker_device(ff_controller *c, int rank, const char *device) {
    assert(device);
    ctl_worker *w = ctl_worker_get(c, rank);
    if (!w) return ff_error_set("controller", NULL, "no worker with rank %d (%d ranks)", rank, c->nworkers);
    snprintf(w->device, sizeof w->device, "%s", device);
    return 0;
}

int ff_controller_worker_info(const ff_controller *c, int rank, ff_worker_info *out) {
    ctl_worker *w = ctl_worker_get((ff_controller *)c, rank);
    if (!w) return ff_error_set("controller", NULL, "no worker with rank %d (%d ranks)", rank, c->nworkers);
    memset(out, 0, sizeof *out);
    out->rank = rank;
    out->state = w->state;
    out->local = w->local;
    out->pid = w->pid;
    snprintf(out->host, sizeof out->host, "%s", w->host);
    snprintf(out->device, sizeof out->device, "%s", w->device);
    out->devices = w->devices;
    out->ncaps = w->ncaps;
    for (int i = 0; i < w->ncaps; i++) snprintf(out->caps[i], sizeof out->caps[i], "%s", w->caps[i]);
    out->inflight = w->inflight;
    out->completed = w->completed;
    out->clock_offset_us = w->offset_ns / 1e3;
    out->rtt_us = w->best_rtt_ns == INT64_MAX ? -1 : w->best_rtt_ns / 1e3;
    out->busy = w->busy;
    out->errors = w->errors;
    snprintf(out->dead_reason, sizeof out->dead_reason, "%s", w->dead_reason);
    out->exit_code = -1;
    if (w->local && w->reaped)
        out->exit_code = WIFSIGNALED(w->exit_status) ? 128 + WTERMSIG(w->exit_status) : WEXITSTATUS(w->exit_status);
    return 0;
}

void ff_controller_stats_get(const ff_controller *c, ff_controller_stats *out) {
    *out = c->stats;
    out->auth_rejected = atomic_load(&((ff_controller *)c)->auth_rejected);
    out->wire = *ff_msg_decoder_stats(c->dec);
}

int ff_controller_jobs_outstanding(const ff_controller *c) { return c->njobs; }
int ff_controller_pending(const ff_controller *c) { return c->npending; }
int ff_controller_inflight(const ff_controller *c) { return c->ninflight; }

/* ---- shutdown ----------------------------------------------------------------------------- */
static bool all_stopped(void *ud) {
    ff_controller *c = ud;
    if (c->ninflight) return false;
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (w && w->local && !w->reaped && !reap(c, w, false)) return false;
    }
    return true;
}

int ff_controller_shutdown(ff_controller *c, double timeout_s) {
    if (c->shut_down) return 0;
    c->shutting_down = true;
    sched_shutdown_pending(c);
    ff_msg *m = &c->scratch;
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w || w->state != FF_WORKER_LIVE) continue;
        ff_msg_begin(m, FF_MSG_SHUTDOWN);
        snprintf(m->u.shutdown.reason, sizeof m->u.shutdown.reason, "the controller is shutting down");
        ff_msg_send(c->sock, w->peer, w->peer_len, m);
    }
    if (timeout_s <= 0) timeout_s = 5;
    int rc = 0;
    if (ff_controller_run_until(c, all_stopped, c, timeout_s) != 0) {
        for (int r = 0; r < c->nworkers; r++) {
            ctl_worker *w = c->workers[r];
            if (w && w->local && !reap(c, w, false)) {
                ff_warn("controller: worker %d (pid %d) did not stop within %.1f s: killing it", r, (int)w->pid,
                        timeout_s);
                kill(w->pid, SIGKILL);
                reap(c, w, true);
                rc = -1;
            }
        }
    }
    sched_shutdown_inflight(c);
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w) continue;
        if (w->state == FF_WORKER_LIVE || w->state == FF_WORKER_SPAWNED) {
            w->state = FF_WORKER_STOPPED;
            forget_peer(c, w);
        }
        stop_pid_watch(c, w);
    }
    sched_run_deferred(c);
    c->shut_down = true;
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (w && w->local && w->reaped && w->state == FF_WORKER_STOPPED && w->exit_status != 0) {
            char why[128];
            describe_exit(w, why, sizeof why);
            ff_warn("controller: worker %d stopped uncleanly: %s", r, why);
        }
    }
    return rc ? ff_error_set("controller", NULL, "some local workers had to be killed") : 0;
}

void ff_controller_destroy(ff_controller **pc) {
    ff_controller *c = *pc;
    if (!c) return;
    if (c->loop && c->sock && !c->shut_down) ff_controller_shutdown(c, 5);
    if (c->trace.on && c->trace_path[0] && ff_controller_trace_write(c, c->trace_path) != 0)
        ff_warn("controller: trace not written: %s", ff_error_message());
    if (c->loop) {
        rt_zwatch_stop(&c->zw);
        ev_timer_stop(c->loop, &c->hb_timer);
        ev_idle_stop(c->loop, &c->deferred_idle);
        ev_timer_stop(c->loop, &c->wake_timer);
        ev_timer_stop(c->loop, &c->settle_timer);
    }
    sched_free(c);
    for (int r = 0; r < c->nworkers; r++) {
        ctl_worker *w = c->workers[r];
        if (!w) continue;
        if (c->loop) stop_pid_watch(c, w);
        free(w->caps);
        free(w->groups);
        free(w);
    }
    free(c->workers);
    u64map_free(&c->peers);
    if (c->sock) zmq_close(c->sock);
    zap_stop(c);
    if (c->ctx) zmq_ctx_term(c->ctx);
    if (c->ipc_path[0]) unlink(c->ipc_path);
    if (c->own_loop && c->loop) ev_loop_destroy(c->loop);
    ff_msg_decoder_destroy(&c->dec);
    if (c->rx) {
        ff_msg_free(c->rx);
        free(c->rx);
    }
    for (int i = 0; i < c->nmsg_pool; i++) {
        ff_msg_free(c->msg_pool[i]);
        free(c->msg_pool[i]);
    }
    ff_msg_free(&c->scratch);
    free(c->packbuf);
    trace_free(&c->trace);
    free(c);
    *pc = NULL;
}

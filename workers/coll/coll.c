/* ff_coll's public entry points (include/fuseflow/coll.h): argument checks, the unique
 * id's outer format, communicator life, grouped calls, and dispatch to the cpu backend
 * (cpu_*.c) or the nccl backend (nccl/). Not here: sockets, algorithms, CUDA. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/coll/coll_internal.h"

/* ---- helpers --------------------------------------------------------------------------- */

const char *ff_coll_redop_name(ff_coll_redop op) {
    static const char *names[FF_COLL_REDOP_COUNT] = {"sum", "prod", "max", "min", "avg"};
    return (unsigned)op < FF_COLL_REDOP_COUNT ? names[op] : "?";
}

double coll_resolve_timeout(const ff_coll_options *opt) {
    if (opt && opt->timeout_s > 0) return opt->timeout_s;
    const char *e = getenv("FF_COLL_TIMEOUT_S");
    double v = e ? strtod(e, NULL) : 0;
    return v > 0 ? v : COLL_DEFAULT_TIMEOUT_S;
}

ff_coll_comm *coll_comm_alloc(int backend, int nranks, int rank, const ff_coll_options *opt) {
    ff_coll_comm *c = ff_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->backend = backend;
    c->nranks = nranks;
    c->rank = rank;
    c->timeout_s = coll_resolve_timeout(opt);
    c->algo = opt ? opt->algo : FF_COLL_ALGO_AUTO;
    return c;
}

void coll_comm_free_shell(ff_coll_comm *c) {
    free(c->error);
    free(c);
}

void *coll_scratch(ff_coll_comm *c, size_t n) {
    if (n <= c->cpu.scratch_cap) return c->cpu.scratch;
    size_t cap = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, cap);
    if (!p) {
        ff_error_set("ff_coll", "use smaller buffers", "out of memory for a %zu-byte scratch buffer", cap);
        return NULL;
    }
    free(c->cpu.scratch);
    c->cpu.scratch = p;
    c->cpu.scratch_cap = cap;
    return p;
}

int coll_break(ff_coll_comm *c) { return coll_break_with(c, NULL); }

int coll_break_with(ff_coll_comm *c, const char *why) {
    if (!c->error) {
        c->error = strdup(ff_error_message());
        c->cpu.n_pend = 0; /* the posted sends will not move again: their buffers are the caller's */
        if (c->backend == COLL_BACKEND_CPU) {
            char reason[COLL_ABORT_MAX];
            const char *fwd = coll_take_forward_reason();
            if (why)
                snprintf(reason, sizeof reason, "%s", why);
            else if (fwd) /* pass the root cause on rather than wrapping it once per hop */
                snprintf(reason, sizeof reason, "%s", fwd);
            else
                snprintf(reason, sizeof reason, "rank %d failed: %s", c->rank, ff_error_message());
            coll_cpu_notify_abort(c, reason);
        }
        if (c->backend == COLL_BACKEND_NCCL && coll_nccl) coll_nccl->abort(c);
    }
    return -1;
}

int coll_check_usable(const ff_coll_comm *c, const char *call) {
    if (!c->error) return 0;
    return ff_error_set(call, "destroy the communicator and build a new one (a new unique id)",
                        "the communicator (rank %d of %d) is broken by an earlier error: %s", c->rank, c->nranks,
                        c->error);
}

#ifdef FF_COLL_HAVE_NCCL
const coll_nccl_ops *coll_nccl = &coll_nccl_real;
#else
const coll_nccl_ops *coll_nccl = NULL;
#endif

/* ---- ids ------------------------------------------------------------------------------- */

static int backend_of_text(const char *text) {
    if (strncmp(text, COLL_ID_PREFIX "cpu/", strlen(COLL_ID_PREFIX "cpu/")) == 0) return COLL_BACKEND_CPU;
    if (strncmp(text, COLL_ID_PREFIX "nccl/", strlen(COLL_ID_PREFIX "nccl/")) == 0) return COLL_BACKEND_NCCL;
    return 0;
}

bool ff_coll_backend_available(const char *backend, const char **why) {
    if (backend && strcmp(backend, "cpu") == 0) return true;
    if (backend && strcmp(backend, "nccl") == 0) {
        if (coll_nccl) return coll_nccl->available(why);
        if (why) *why = "fuseflow was built without NCCL (no CUDA toolkit or NCCL found at configure time)";
        return false;
    }
    if (why) *why = "unknown backend (use \"cpu\" or \"nccl\")";
    return false;
}

const char *ff_coll_nccl_env(void) {
    const char *ifname = getenv("FF_COLL_IFNAME"), *set = getenv("NCCL_SOCKET_IFNAME");
    if (!ifname || !ifname[0] || (set && set[0])) return NULL;
    if (setenv("NCCL_SOCKET_IFNAME", ifname, 1) != 0) return NULL;
    return getenv("NCCL_SOCKET_IFNAME");
}

int ff_coll_get_unique_id(ff_coll_id *id, const char *backend, const ff_coll_options *opt) {
    memset(id, 0, sizeof *id);
    if (!backend || strcmp(backend, "cpu") == 0) return coll_cpu_make_id(id, opt);
    if (strcmp(backend, "nccl") == 0) {
        if (coll_nccl) return coll_nccl->make_id(id);
        return ff_error_set("ff_coll_get_unique_id", "use the \"cpu\" backend, or rebuild with CUDA and NCCL",
                            "backend \"nccl\" is not available: fuseflow was built without NCCL");
    }
    return ff_error_set("ff_coll_get_unique_id", "use \"cpu\" or \"nccl\"", "unknown backend \"%s\"", backend);
}

int ff_coll_id_from_string(ff_coll_id *id, const char *text, size_t len) {
    if (len && text[len - 1] == '\0') len--;
    if (len == 0 || len >= FF_COLL_ID_LEN)
        return ff_error_set("unique id", "pass the text that ff_coll_get_unique_id made",
                            "length %zu is outside 1..%d", len, FF_COLL_ID_LEN - 1);
    for (size_t i = 0; i < len; i++)
        if (text[i] <= ' ' || text[i] > '~')
            return ff_error_set("unique id", "pass the text that ff_coll_get_unique_id made",
                                "unprintable or space character at byte %zu", i);
    memset(id, 0, sizeof *id);
    memcpy(id->text, text, len);
    int b = backend_of_text(id->text);
    if (b == COLL_BACKEND_CPU) {
        char host[COLL_HOST_MAX];
        int port;
        uint8_t tok[COLL_TOKEN_BYTES];
        return coll_cpu_parse_id(id->text, host, &port, tok);
    }
    if (b == COLL_BACKEND_NCCL) {
        const char *hex = id->text + strlen(COLL_ID_PREFIX "nccl/");
        uint8_t raw[128];
        if (strlen(hex) != 256 || coll_hex_decode(hex, 256, raw))
            return ff_error_set("unique id", NULL, "malformed nccl id (expected 256 hex digits after ffcoll1/nccl/)");
        return 0;
    }
    return ff_error_set("unique id", "ids start with ffcoll1/cpu/ or ffcoll1/nccl/", "unknown id '%.40s'", id->text);
}

const char *ff_coll_id_backend(const ff_coll_id *id) {
    if (!memchr(id->text, '\0', sizeof id->text)) return NULL;
    int b = backend_of_text(id->text);
    return b == COLL_BACKEND_CPU ? "cpu" : b == COLL_BACKEND_NCCL ? "nccl" : NULL;
}

/* ---- communicators --------------------------------------------------------------------- */

int ff_coll_comm_init(ff_coll_comm **out, int nranks, const ff_coll_id *id, int rank, const ff_coll_options *opt) {
    *out = NULL;
    const char *where = "ff_coll_comm_init";
    if (nranks < 1 || nranks > 65536)
        return ff_error_set(where, NULL, "nranks %d is outside 1..65536", nranks);
    if (rank < 0 || rank >= nranks)
        return ff_error_set(where, "ranks are numbered 0..nranks-1", "rank %d is outside 0..%d", rank, nranks - 1);
    ff_coll_id copy;
    const char *end = memchr(id->text, '\0', sizeof id->text);
    if (!end || ff_coll_id_from_string(&copy, id->text, (size_t)(end - id->text))) {
        if (!end) ff_error_set("unique id", NULL, "not NUL-terminated");
        return ff_error_wrap("%s", where);
    }
    int backend = backend_of_text(copy.text);
    ff_coll_comm *c = coll_comm_alloc(backend, nranks, rank, opt);
    if (!c) return -1;
    int rc;
    if (backend == COLL_BACKEND_CPU) {
        rc = coll_cpu_comm_init(c, &copy);
        if (rc) {
            coll_cpu_comm_free(c);
            coll_work_free(c);
        }
    } else {
        rc = coll_nccl ? coll_nccl->comm_init(c, &copy)
                       : ff_error_set(where, "use the \"cpu\" backend, or rebuild with CUDA and NCCL",
                                      "this id is for backend \"nccl\", which this build does not have");
    }
    if (rc) {
        coll_comm_free_shell(c);
        return -1;
    }
    *out = c;
    return 0;
}

int ff_coll_comm_split(ff_coll_comm *comm, int color, int key, ff_coll_comm **out) {
    if (!comm || !out) return ff_error_set("ff_coll_comm_split", NULL, "NULL communicator or output");
    *out = NULL;
    if (color < 0 && color != FF_COLL_SPLIT_NOCOLOR)
        return ff_error_set("ff_coll_comm_split", "use a color >= 0, or FF_COLL_SPLIT_NOCOLOR to take no part",
                            "color %d is negative", color);
    if (coll_check_usable(comm, "ff_coll_comm_split")) return -1;
    int rc;
    if (comm->backend == COLL_BACKEND_CPU) {
        rc = coll_cpu_comm_split(comm, color, key, out);
    } else {
        if (!coll_nccl) return ff_error_set("ff_coll_comm_split", NULL, "this build has no NCCL");
        ff_coll_comm *child = coll_comm_alloc(COLL_BACKEND_NCCL, 0, 0, NULL);
        if (!child) return -1;
        child->timeout_s = comm->timeout_s;
        child->algo = comm->algo;
        rc = coll_nccl->comm_split(comm, color, key, child);
        if (rc || !child->nccl) {
            coll_comm_free_shell(child);
            child = NULL;
        }
        *out = child;
    }
    return rc;
}

int ff_coll_comm_twin(ff_coll_comm *comm, const char *backend, ff_coll_comm **out) {
    const char *where = "ff_coll_comm_twin";
    if (!comm || !out || !backend) return ff_error_set(where, NULL, "NULL communicator, backend or output");
    *out = NULL;
    if (!strcmp(backend, ff_coll_comm_backend(comm))) {
        *out = comm;
        return 0;
    }
    if (comm->twin) {
        *out = comm->twin;
        return 0;
    }
    if (coll_check_usable(comm, where)) return -1;
    /* every rank learns whether rank 0 could make the id (a failure there would otherwise
     * leave the others waiting in comm_init until the timeout) */
    ff_coll_id id;
    memset(&id, 0, sizeof id);
    const char *why = NULL;
    if (comm->rank == 0 && (!ff_coll_backend_available(backend, &why) || ff_coll_get_unique_id(&id, backend, NULL) != 0)) {
        if (why) ff_error_set(where, "use the cpu backend's collectives (host memory)", "backend \"%s\": %s", backend, why);
        snprintf(id.text, sizeof id.text, "!%s", ff_error_message());
    }
    if (ff_coll_broadcast(&id, &id, sizeof id.text, FF_DTYPE_U8, 0, comm, NULL) != 0) return ff_error_wrap("%s: sharing the unique id", where);
    id.text[sizeof id.text - 1] = '\0';
    if (id.text[0] == '!') return ff_error_set(where, NULL, "rank 0 could not make a \"%s\" id: %s", backend, id.text + 1);
    ff_coll_options o = {.timeout_s = comm->timeout_s};
    if (ff_coll_comm_init(&comm->twin, comm->nranks, &id, comm->rank, &o) != 0)
        return ff_error_wrap("%s: joining the \"%s\" twin of a group of %d", where, backend, comm->nranks);
    *out = comm->twin;
    return 0;
}

void ff_coll_comm_destroy(ff_coll_comm **comm) {
    if (!comm || !*comm) return;
    ff_coll_comm *c = *comm;
    ff_coll_comm_destroy(&c->twin);
    if (c->backend == COLL_BACKEND_CPU) {
        coll_cpu_comm_free(c);
        coll_work_free(c);
    }
    if (c->backend == COLL_BACKEND_NCCL && coll_nccl) coll_nccl->comm_free(c);
    coll_comm_free_shell(c);
    *comm = NULL;
}

void ff_coll_comm_abort(ff_coll_comm *comm, const char *reason) {
    if (!comm || comm->error) return;
    char why[COLL_ABORT_MAX];
    snprintf(why, sizeof why, "rank %d called ff_coll_comm_abort: %s", comm->rank,
             reason && *reason ? reason : "no reason given");
    ff_error_set("ff_coll_comm_abort", NULL, "%s", why);
    if (comm->twin) ff_coll_comm_abort(comm->twin, reason);
    ff_error_set("ff_coll_comm_abort", NULL, "%s", why);
    coll_break_with(comm, why);
}

int ff_coll_comm_rank(const ff_coll_comm *comm) {
    assert(comm);
    return comm->rank;
}
int ff_coll_comm_size(const ff_coll_comm *comm) {
    assert(comm);
    return comm->nranks;
}
const char *ff_coll_comm_backend(const ff_coll_comm *comm) {
    assert(comm);
    return comm->backend == COLL_BACKEND_NCCL ? "nccl" : "cpu";
}
const char *ff_coll_comm_error(const ff_coll_comm *comm) {
    assert(comm);
    return comm->error;
}

/* ---- groups ---------------------------------------------------------------------------- */

typedef struct queued {
    ff_coll_comm *comm;
    coll_call call;
    size_t *counts_copy; /* v-variants: the counts, copied so the caller's array may go */
} queued;

static _Thread_local struct {
    int depth;
    queued *q;
    size_t n, cap;
    bool nccl_started;
    int first_rc;
} g_group;

static void group_free_queue(void) {
    for (size_t i = 0; i < g_group.n; i++) free(g_group.q[i].counts_copy);
    free(g_group.q);
    g_group.q = NULL;
    g_group.n = g_group.cap = 0;
}

int ff_coll_group_start(void) {
    g_group.depth++;
    return 0;
}

static int run_queued(void) {
    int rc = 0;
    char first_error[2048] = "";
    /* 1. every send and receive of the group at once */
    size_t np = 0;
    for (size_t i = 0; i < g_group.n; i++) np += g_group.q[i].call.op == OP_SEND;
    if (np) {
        ff_coll_comm **comms = ff_malloc(np * sizeof *comms);
        coll_call *calls = ff_malloc(np * sizeof *calls);
        if (!comms || !calls) {
            rc = -1;
        } else {
            size_t k = 0;
            bool usable = true;
            for (size_t i = 0; i < g_group.n; i++) {
                if (g_group.q[i].call.op != OP_SEND) continue;
                comms[k] = g_group.q[i].comm;
                calls[k++] = g_group.q[i].call;
                if (coll_check_usable(g_group.q[i].comm, "ff_coll_group_end")) usable = false;
            }
            if (!usable || coll_cpu_run_p2p(comms, calls, np)) {
                rc = -1;
                for (size_t i = 0; i < np; i++) coll_break(comms[i]);
            }
        }
        if (rc) snprintf(first_error, sizeof first_error, "%s", ff_error_message());
        free(comms);
        free(calls);
    }
    /* 2. collectives in the order they were issued (those on healthy communicators run even
     * after a failure elsewhere, since their peers run them too) */
    for (size_t i = 0; i < g_group.n; i++) {
        queued *q = &g_group.q[i];
        if (q->call.op == OP_SEND) continue;
        const char *name = coll_op_name(q->call.op);
        int r = coll_check_usable(q->comm, name);
        if (r == 0) {
            r = coll_cpu_run(q->comm, &q->call);
            if (r) coll_break(q->comm);
        }
        if (r && rc == 0) {
            rc = -1;
            snprintf(first_error, sizeof first_error, "%s", ff_error_message());
        }
    }
    if (rc) ff_error_set(NULL, NULL, "%s", first_error);
    return rc;
}

int ff_coll_group_end(void) {
    if (g_group.depth <= 0)
        return ff_error_set("ff_coll_group_end", "pair every group_end with a group_start",
                            "group_end without group_start");
    if (--g_group.depth > 0) return 0;
    int rc = g_group.first_rc;
    if (g_group.n) {
        int r = run_queued();
        if (r && rc == 0) rc = r;
    }
    group_free_queue();
    if (g_group.nccl_started) {
        g_group.nccl_started = false;
        char keep[2048];
        snprintf(keep, sizeof keep, "%s", ff_error_message());
        int r = coll_nccl->group_end();
        if (r && rc == 0) rc = r;
        else if (rc) ff_error_set(NULL, NULL, "%s", keep);
    }
    g_group.first_rc = 0;
    return rc;
}

static int enqueue(ff_coll_comm *c, const coll_call *call) {
    if (g_group.n == g_group.cap) {
        size_t nc = g_group.cap ? 2 * g_group.cap : 16;
        queued *q = ff_realloc(g_group.q, nc * sizeof *q);
        if (!q) return -1;
        g_group.q = q;
        g_group.cap = nc;
    }
    queued *q = &g_group.q[g_group.n];
    *q = (queued){.comm = c, .call = *call};
    if (call->counts) {
        q->counts_copy = ff_malloc((size_t)c->nranks * sizeof *q->counts_copy);
        if (!q->counts_copy) return -1;
        memcpy(q->counts_copy, call->counts, (size_t)c->nranks * sizeof *q->counts_copy);
        q->call.counts = q->counts_copy;
    }
    g_group.n++;
    return 0;
}

/* ---- calls ----------------------------------------------------------------------------- */

static int check_dtype(const char *name, ff_dtype dt, bool reduce, ff_coll_redop op) {
    if ((unsigned)dt >= FF_DTYPE_COUNT) return ff_error_set(name, NULL, "unknown dtype %d", (int)dt);
    if (reduce) {
        if ((unsigned)op >= FF_COLL_REDOP_COUNT) return ff_error_set(name, NULL, "unknown reduction op %d", (int)op);
        if (!coll_redop_supported(dt))
            return ff_error_set(name, "reductions take F32, F64, F16, BF16, I32 and I64",
                                "cannot reduce dtype %s", ff_dtype_name(dt));
    }
    return 0;
}

static int dispatch(ff_coll_comm *c, coll_call *call, ff_coll_stream stream) {
    const char *name = call->op == OP_SEND && call->is_recv ? "ff_coll_recv" : coll_op_name(call->op);
    if (coll_check_usable(c, name)) return -1;
    if (c->backend == COLL_BACKEND_NCCL) {
        if (!coll_nccl) return -1;
        if (g_group.depth > 0 && !g_group.nccl_started) {
            if (coll_nccl->group_start()) return -1;
            g_group.nccl_started = true;
        }
        int rc = coll_nccl->run(c, call, stream);
        if (rc) coll_break(c);
        return rc;
    }
    (void)stream;
    if (g_group.depth > 0) return enqueue(c, call);
    int rc = coll_cpu_run(c, call);
    if (rc) coll_break(c);
    return rc;
}

static size_t sum_counts(const size_t *counts, int n) {
    size_t s = 0;
    for (int i = 0; i < n; i++) s += counts[i];
    return s;
}

#define NEED(cond, ...)                                  \
    do {                                                 \
        if (!(cond)) return ff_error_set(__VA_ARGS__); \
    } while (0)

#define CHECK_COMM(c, name) NEED((c) != NULL, name, NULL, "NULL communicator")

int ff_coll_all_reduce(const void *sendbuf, void *recvbuf, size_t count, ff_dtype dtype, ff_coll_redop op,
                       ff_coll_comm *comm, ff_coll_stream stream) {
    const char *n = "ff_coll_all_reduce";
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, true, op)) return -1;
    NEED(count == 0 || (sendbuf && recvbuf), n, NULL, "NULL buffer with count %zu", count);
    coll_call call = {.op = OP_ALL_REDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                      .dtype = dtype, .redop = op};
    return dispatch(comm, &call, stream);
}

int ff_coll_broadcast(const void *sendbuf, void *recvbuf, size_t count, ff_dtype dtype, int root,
                      ff_coll_comm *comm, ff_coll_stream stream) {
    const char *n = "ff_coll_broadcast";
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, false, FF_COLL_SUM)) return -1;
    NEED(root >= 0 && root < comm->nranks, n, NULL, "root %d is outside 0..%d", root, comm->nranks - 1);
    NEED(count == 0 || (recvbuf && (comm->rank != root || sendbuf)), n, NULL, "NULL buffer with count %zu", count);
    coll_call call = {.op = OP_BROADCAST, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count,
                      .dtype = dtype, .root = root};
    return dispatch(comm, &call, stream);
}

int ff_coll_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, ff_dtype dtype, ff_coll_comm *comm,
                       ff_coll_stream stream) {
    const char *n = "ff_coll_all_gather";
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, false, FF_COLL_SUM)) return -1;
    NEED(sendcount == 0 || (sendbuf && recvbuf), n, NULL, "NULL buffer with count %zu", sendcount);
    coll_call call = {.op = OP_ALL_GATHER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = sendcount,
                      .dtype = dtype};
    return dispatch(comm, &call, stream);
}

int ff_coll_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, ff_dtype dtype, ff_coll_redop op,
                           ff_coll_comm *comm, ff_coll_stream stream) {
    const char *n = "ff_coll_reduce_scatter";
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, true, op)) return -1;
    NEED(recvcount == 0 || (sendbuf && recvbuf), n, NULL, "NULL buffer with count %zu", recvcount);
    coll_call call = {.op = OP_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = recvcount,
                      .dtype = dtype, .redop = op};
    return dispatch(comm, &call, stream);
}

int ff_coll_all_gather_v(const void *sendbuf, void *recvbuf, const size_t *counts, ff_dtype dtype,
                         ff_coll_comm *comm, ff_coll_stream stream) {
    const char *n = "ff_coll_all_gather_v";
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, false, FF_COLL_SUM)) return -1;
    NEED(counts != NULL, n, "pass nranks counts", "NULL counts");
    size_t total = sum_counts(counts, comm->nranks);
    NEED(total == 0 || recvbuf, n, NULL, "NULL recvbuf with %zu elements", total);
    NEED(counts[comm->rank] == 0 || sendbuf, n, NULL, "NULL sendbuf with count %zu", counts[comm->rank]);
    coll_call call = {.op = OP_ALL_GATHER_V, .sendbuf = sendbuf, .recvbuf = recvbuf, .counts = counts,
                      .count = total, .dtype = dtype};
    return dispatch(comm, &call, stream);
}

int ff_coll_reduce_scatter_v(const void *sendbuf, void *recvbuf, const size_t *counts, ff_dtype dtype,
                             ff_coll_redop op, ff_coll_comm *comm, ff_coll_stream stream) {
    const char *n = "ff_coll_reduce_scatter_v";
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, true, op)) return -1;
    NEED(counts != NULL, n, "pass nranks counts", "NULL counts");
    size_t total = sum_counts(counts, comm->nranks);
    NEED(total == 0 || sendbuf, n, NULL, "NULL sendbuf with %zu elements", total);
    NEED(counts[comm->rank] == 0 || recvbuf, n, NULL, "NULL recvbuf with count %zu", counts[comm->rank]);
    coll_call call = {.op = OP_REDUCE_SCATTER_V, .sendbuf = sendbuf, .recvbuf = recvbuf, .counts = counts,
                      .count = total, .dtype = dtype, .redop = op};
    return dispatch(comm, &call, stream);
}

static int p2p(const char *n, bool is_recv, const void *sbuf, void *rbuf, size_t count, ff_dtype dtype, int peer,
               ff_coll_comm *comm, ff_coll_stream stream) {
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, false, FF_COLL_SUM)) return -1;
    NEED(peer >= 0 && peer < comm->nranks && peer != comm->rank, n, "peer must be another rank of the communicator",
         "peer %d is not a rank of 0..%d other than this rank (%d)", peer, comm->nranks - 1, comm->rank);
    NEED(count == 0 || (is_recv ? rbuf != NULL : sbuf != NULL), n, NULL, "NULL buffer with count %zu", count);
    coll_call call = {.op = OP_SEND, .sendbuf = sbuf, .recvbuf = rbuf, .count = count, .dtype = dtype,
                      .root = peer, .is_recv = is_recv};
    return dispatch(comm, &call, stream);
}

int ff_coll_send(const void *buf, size_t count, ff_dtype dtype, int peer, ff_coll_comm *comm, ff_coll_stream stream) {
    return p2p("ff_coll_send", false, buf, NULL, count, dtype, peer, comm, stream);
}

int ff_coll_recv(void *buf, size_t count, ff_dtype dtype, int peer, ff_coll_comm *comm, ff_coll_stream stream) {
    return p2p("ff_coll_recv", true, NULL, buf, count, dtype, peer, comm, stream);
}

int ff_coll_send_post(const void *buf, size_t count, ff_dtype dtype, int peer, ff_coll_comm *comm) {
    const char *n = "ff_coll_send_post";
    CHECK_COMM(comm, n);
    if (check_dtype(n, dtype, false, FF_COLL_SUM)) return -1;
    NEED(g_group.depth == 0, n, "post sends outside ff_coll_group_start / end", "called inside a group");
    NEED(peer >= 0 && peer < comm->nranks && peer != comm->rank, n, "peer must be another rank of the communicator",
         "peer %d is not a rank of 0..%d other than this rank (%d)", peer, comm->nranks - 1, comm->rank);
    NEED(count == 0 || buf != NULL, n, NULL, "NULL buffer with count %zu", count);
    if (coll_check_usable(comm, n)) return -1;
    coll_call call = {.op = OP_SEND, .sendbuf = buf, .count = count, .dtype = dtype, .root = peer};
    int rc;
    if (comm->backend == COLL_BACKEND_NCCL && coll_nccl) { /* enqueued on the default stream: asynchronous already */
        rc = coll_nccl->run(comm, &call, NULL);
        if (rc == 0) comm->sends_posted++;
        return rc ? coll_break(comm) : 0;
    }
    rc = coll_cpu_send_post(comm, &call);
    return rc ? coll_break(comm) : 0;
}

int ff_coll_sends_done(ff_coll_comm *comm, bool wait, uint64_t *done) {
    CHECK_COMM(comm, "ff_coll_sends_done");
    if (coll_check_usable(comm, "ff_coll_sends_done")) return -1;
    int rc;
    if (comm->backend == COLL_BACKEND_NCCL && coll_nccl) {
        rc = wait ? coll_nccl->synchronize(comm, NULL) : 0;
        if (rc == 0 && wait) comm->sends_done = comm->sends_posted;
        if (done) *done = comm->sends_done;
        return rc ? coll_break(comm) : 0;
    }
    rc = coll_cpu_sends_progress(comm, wait);
    if (done) *done = comm->sends_done;
    return rc ? coll_break(comm) : 0;
}

int ff_coll_synchronize(ff_coll_comm *comm, ff_coll_stream stream) {
    CHECK_COMM(comm, "ff_coll_synchronize");
    if (coll_check_usable(comm, "ff_coll_synchronize")) return -1;
    if (comm->backend == COLL_BACKEND_NCCL && coll_nccl) {
        int rc = coll_nccl->synchronize(comm, stream);
        if (rc) coll_break(comm);
        return rc;
    }
    (void)stream;
    return 0;
}

/* ff_coll's nccl backend: maps each call onto NCCL on a cudaStream_t. Communicators are
 * non-blocking (ncclConfig_t.blocking = 0) so that every wait here is bounded by the
 * communicator's timeout: comm init, split and finalize poll ncclCommGetAsyncError, and
 * ff_coll_synchronize polls the stream and aborts the communicator when the timeout passes
 * (a dead peer otherwise hangs NCCL kernels forever). The v-variants, which NCCL lacks, are
 * grouped broadcasts (all_gather_v) and grouped reduces (reduce_scatter_v).
 *
 * Host code only (compiled by the C compiler against the CUDA runtime and NCCL headers);
 * self-contained so that ff_coll_nccl needs nothing from ff_coll. Not testable without a
 * GPU: tests/coll/test_nccl.c skips then. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/coll/coll_internal.h"

#define NCCL_HEX_PREFIX COLL_ID_PREFIX "nccl/"

static void hex_encode(const uint8_t *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_decode(const char *hex, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char ch = hex[2 * i + (size_t)k];
            int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                    : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
            if (d < 0) return -1;
            v = v * 16 + d;
        }
        out[i] = (uint8_t)v;
    }
    return 0;
}

static ncclComm_t comm_of(const ff_coll_comm *c) { return (ncclComm_t)c->nccl; }

static void nap_us(long us) {
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int nccl_error(const char *where, ncclResult_t r, ncclComm_t comm) {
    const char *last = ncclGetLastError(comm);
    return ff_error_set(where, r == ncclRemoteError ? "a peer rank failed or died; rebuild the group" : NULL,
                        "NCCL: %s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

/* After a non-blocking call returned ncclInProgress: wait until the communicator settles. */
static int wait_ready(ncclComm_t comm, double timeout_s, const char *where) {
    int64_t deadline = ff_now_ns() + (int64_t)(timeout_s * 1e9);
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) return nccl_error(where, r, comm);
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) return nccl_error(where, st, comm);
        if (ff_now_ns() > deadline)
            return ff_error_set(where, "some rank never joined or is hung; options.timeout_s sets the limit",
                                "NCCL did not finish within %.1f s", timeout_s);
        nap_us(100);
    }
}

static int settle(ff_coll_comm *c, ncclResult_t r, const char *where) {
    if (r == ncclSuccess) return 0;
    if (r == ncclInProgress) return wait_ready(comm_of(c), c->timeout_s, where);
    return nccl_error(where, r, comm_of(c));
}

static ncclConfig_t make_config(void) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

static bool coll_nccl_available(const char **why) {
    static _Thread_local char msg[256];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(msg, sizeof msg, "no CUDA device visible (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        if (why) *why = msg;
        return false;
    }
    return true;
}

static int coll_nccl_make_id(ff_coll_id *id) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_error("ff_coll_get_unique_id", r, NULL);
    char hex[2 * sizeof u.internal + 1];
    hex_encode((const uint8_t *)u.internal, sizeof u.internal, hex);
    snprintf(id->text, sizeof id->text, NCCL_HEX_PREFIX "%s", hex);
    return 0;
}

static int coll_nccl_comm_init(ff_coll_comm *c, const ff_coll_id *id) {
    const char *where = "ff_coll_comm_init";
    ncclUniqueId u;
    const char *hex = id->text + strlen(NCCL_HEX_PREFIX);
    if (strlen(hex) != 2 * sizeof u.internal || hex_decode(hex, sizeof u.internal, (uint8_t *)u.internal))
        return ff_error_set(where, NULL, "malformed nccl id");
    const char *why = NULL;
    if (!coll_nccl_available(&why)) return ff_error_set(where, "use the \"cpu\" backend here", "%s", why);
    ncclConfig_t cfg = make_config();
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, c->nranks, u, c->rank, &cfg);
    c->nccl = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
        if (comm) ncclCommAbort(comm);
        c->nccl = NULL;
        return nccl_error(where, r, NULL);
    }
    if (r == ncclInProgress && wait_ready(comm, c->timeout_s, where)) {
        ncclCommAbort(comm);
        c->nccl = NULL;
        return -1;
    }
    return 0;
}

static int coll_nccl_comm_split(ff_coll_comm *c, int color, int key, ff_coll_comm *child) {
    ncclConfig_t cfg = make_config();
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(comm_of(c), color == FF_COLL_SPLIT_NOCOLOR ? NCCL_SPLIT_NOCOLOR : color, key, &nc,
                                   &cfg);
    if (settle(c, r, "ff_coll_comm_split")) return -1;
    if (nc && wait_ready(nc, c->timeout_s, "ff_coll_comm_split")) {
        ncclCommAbort(nc);
        return -1;
    }
    child->nccl = nc;
    if (nc) {
        ncclCommUserRank(nc, &child->rank);
        ncclCommCount(nc, &child->nranks);
    }
    return 0;
}

static void coll_nccl_comm_free(ff_coll_comm *c) {
    ncclComm_t comm = comm_of(c);
    if (!comm) return;
    if (!c->error) {
        ncclResult_t r = ncclCommFinalize(comm);
        if (r == ncclInProgress) r = wait_ready(comm, c->timeout_s, "ff_coll_comm_destroy") ? ncclSystemError : ncclSuccess;
        if (r != ncclSuccess) {
            ncclCommAbort(comm);
            c->nccl = NULL;
            return;
        }
        ncclCommDestroy(comm);
    } else {
        ncclCommAbort(comm);
    }
    c->nccl = NULL;
}

/* Communicators used inside the current group (this thread): non-blocking communicators
 * finish a group asynchronously, and nothing may be issued on them until they settle. */
#define GROUP_MAX 64
static _Thread_local struct {
    bool open;
    int n;
    ncclComm_t comm[GROUP_MAX];
    double timeout_s[GROUP_MAX];
    bool doomed[GROUP_MAX]; /* broken inside the group: aborted after ncclGroupEnd, which still holds its calls */
} g_grp;

static void coll_nccl_abort(ff_coll_comm *c) {
    ncclComm_t comm = comm_of(c);
    c->nccl = NULL;
    if (!comm) return;
    for (int i = 0; g_grp.open && i < g_grp.n; i++)
        if (g_grp.comm[i] == comm) { /* calls of this group are queued on it: abort once the group is ended */
            g_grp.doomed[i] = true;
            return;
        }
    ncclCommAbort(comm);
}

static bool map_dtype(ff_dtype t, ncclDataType_t *out) {
    switch (t) {
    case FF_DTYPE_F32: *out = ncclFloat32; return true;
    case FF_DTYPE_F16: *out = ncclFloat16; return true;
    case FF_DTYPE_BF16: *out = ncclBfloat16; return true;
    case FF_DTYPE_F64: *out = ncclFloat64; return true;
    case FF_DTYPE_I8: *out = ncclInt8; return true;
    case FF_DTYPE_U8: *out = ncclUint8; return true;
    case FF_DTYPE_I32: *out = ncclInt32; return true;
    case FF_DTYPE_I64: *out = ncclInt64; return true;
    default: return false; /* I16, BOOL: moved as bytes */
    }
}

static ncclRedOp_t map_op(ff_coll_redop op) {
    switch (op) {
    case FF_COLL_PROD: return ncclProd;
    case FF_COLL_MAX: return ncclMax;
    case FF_COLL_MIN: return ncclMin;
    case FF_COLL_AVG: return ncclAvg;
    default: return ncclSum;
    }
}


static int coll_nccl_run(ff_coll_comm *c, const coll_call *call, ff_coll_stream stream) {
    ncclComm_t comm = comm_of(c);
    if (g_grp.open) {
        int i = 0;
        while (i < g_grp.n && g_grp.comm[i] != comm) i++;
        if (i == g_grp.n) {
            if (g_grp.n == GROUP_MAX)
                return ff_error_set("ff_coll_group", "use fewer communicators per group",
                                    "more than %d nccl communicators in one group", GROUP_MAX);
            g_grp.comm[g_grp.n] = comm;
            g_grp.doomed[g_grp.n] = false;
            g_grp.timeout_s[g_grp.n++] = c->timeout_s;
        }
    } else if (wait_ready(comm, c->timeout_s, "nccl")) { /* a previous call may still settle */
        return -1;
    }
    cudaStream_t st = (cudaStream_t)stream;
    ncclDataType_t dt;
    size_t es = ff_dtype_size(call->dtype), scale = 1; /* elements of dt per element of ours */
    if (!map_dtype(call->dtype, &dt)) {               /* pure data movement: move bytes */
        dt = ncclUint8;
        scale = es;
        es = 1;
    }
    size_t count = call->count * scale;
    ncclRedOp_t op = map_op(call->redop);
    ncclResult_t r = ncclSuccess;
    const char *where = "nccl";
    switch (call->op) {
    case OP_ALL_REDUCE:
        where = "ff_coll_all_reduce";
        r = ncclAllReduce(call->sendbuf, call->recvbuf, count, dt, op, comm, st);
        break;
    case OP_BROADCAST:
        where = "ff_coll_broadcast";
        r = ncclBroadcast(call->sendbuf, call->recvbuf, count, dt, call->root, comm, st);
        break;
    case OP_ALL_GATHER:
        where = "ff_coll_all_gather";
        r = ncclAllGather(call->sendbuf, call->recvbuf, count, dt, comm, st);
        break;
    case OP_REDUCE_SCATTER:
        where = "ff_coll_reduce_scatter";
        r = ncclReduceScatter(call->sendbuf, call->recvbuf, count, dt, op, comm, st);
        break;
    case OP_ALL_GATHER_V:
    case OP_REDUCE_SCATTER_V: {
        bool gather = call->op == OP_ALL_GATHER_V;
        where = gather ? "ff_coll_all_gather_v" : "ff_coll_reduce_scatter_v";
        r = ncclGroupStart();
        size_t off = 0;
        for (int p = 0; r == ncclSuccess && p < c->nranks; p++) {
            size_t n = call->counts[p] * scale;
            if (gather)
                r = ncclBroadcast(call->sendbuf, (char *)call->recvbuf + off * es, n, dt, p, comm, st);
            else
                r = ncclReduce((const char *)call->sendbuf + off * es, call->recvbuf, n, dt, op, p, comm, st);
            off += n;
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
        break;
    }
    case OP_SEND:
        where = call->is_recv ? "ff_coll_recv" : "ff_coll_send";
        r = call->is_recv ? ncclRecv(call->recvbuf, count, dt, call->root, comm, st)
                          : ncclSend(call->sendbuf, count, dt, call->root, comm, st);
        break;
    default: return ff_error_set("nccl", NULL, "unsupported call %d", call->op);
    }
    return settle(c, r, where);
}

static int coll_nccl_group_start(void) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return nccl_error("ff_coll_group_start", r, NULL);
    g_grp.open = true;
    g_grp.n = 0;
    return 0;
}

static int coll_nccl_group_end(void) {
    ncclResult_t r = ncclGroupEnd();
    g_grp.open = false;
    int rc = r == ncclSuccess || r == ncclInProgress ? 0 : nccl_error("ff_coll_group_end", r, NULL);
    /* the calls are enqueued once every communicator of the group has settled; a broken one (its
     * ff_coll_comm already failed and forgot it) is aborted now, after the group let go of it */
    for (int i = 0; i < g_grp.n; i++) {
        if (g_grp.doomed[i]) ncclCommAbort(g_grp.comm[i]);
        else if (rc == 0) rc = wait_ready(g_grp.comm[i], g_grp.timeout_s[i], "ff_coll_group_end");
    }
    g_grp.n = 0;
    return rc;
}

static int coll_nccl_synchronize(ff_coll_comm *c, ff_coll_stream stream) {
    ncclComm_t comm = comm_of(c);
    int64_t deadline = ff_now_ns() + (int64_t)(c->timeout_s * 1e9);
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady)
            return ff_error_set("ff_coll_synchronize", NULL, "CUDA: %s", cudaGetErrorString(e));
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) return nccl_error("ff_coll_synchronize", st, comm);
        if (ff_now_ns() > deadline)
            return ff_error_set("ff_coll_synchronize",
                                "a peer may have died or skipped this call; the communicator is aborted",
                                "the stream did not finish within %.1f s", c->timeout_s);
        nap_us(50);
    }
}

const coll_nccl_ops coll_nccl_real = {coll_nccl_available, coll_nccl_make_id, coll_nccl_comm_init, coll_nccl_comm_split,
                                      coll_nccl_comm_free,  coll_nccl_abort,   coll_nccl_run,       coll_nccl_group_start,
                                      coll_nccl_group_end,  coll_nccl_synchronize};

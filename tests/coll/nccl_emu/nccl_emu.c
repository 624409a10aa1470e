/* The NCCL stand-in: the calls of tests/coll/nccl_emu/nccl.h on the CUDA emulator's devices
 * (kernels/cuda/emu/), so that workers/coll/nccl/nccl_backend.c itself runs in tests without a
 * GPU: fuseflow_emu's workers (their NCCL twins) and coll/test_coll_nccl_emu.
 *
 * A communicator wraps a cpu ff_coll communicator (the unique id carries a cpu id's text). Each
 * call checks that its buffers are emulated device memory (NCCL would fault on host memory),
 * then runs the cpu collective at once, after its stream's queued work (ff_emu_stream_run_host),
 * so that peers never wait on work an emulated stream has not been asked for, into a scratch
 * copy of its output; the copy into the real output is queued on the stream
 * (ff_emu_stream_defer) and lands when something waits for it. So a collective whose stream
 * does not wait for the kernels that wrote its input reads stale data, and kernels that read its
 * output without waiting for its stream read what was there before. Calls between
 * ncclGroupStart and the outermost ncclGroupEnd run as one cpu group at the end (sends and
 * receives progress together), on one stream. A call (or group) on a stream that captures a graph
 * is recorded in it instead and runs at each replay, in the graph's order (below). As NCCL
 * requires, a collective must run from a graph on every rank of it or on none: a mix is refused
 * (check_uniform; NCCL may hang). A call on a stream whose capture was invalidated fails and
 * takes its communicator down, as NCCL's launch onto it would.
 *
 * Non-blocking communicators (ncclConfig_t.blocking = 0) behave as NCCL's do: init, split,
 * finalize and a group's end return ncclInProgress, and ncclCommGetAsyncError answers
 * ncclInProgress once before ncclSuccess, so callers' polling loops run. A call whose cpu
 * collective fails (a peer died, a timeout) leaves the communicator's asynchronous error
 * ncclRemoteError, as NCCL reports a failure after the call returned; a blocking one returns it.
 *
 * Not NCCL: its kernels, its algorithms, its summation order, its hangs. A test tool only. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/coll.h"
#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "kernels/cuda/emu/cuda_emu.h"
#include "nccl.h"

struct ff_emu_nccl_comm {
    ff_coll_comm *cpu;
    bool blocking;
    int settling;       /* answers of ncclCommGetAsyncError that are still ncclInProgress */
    ncclResult_t async; /* a failed call's error, for good */
    char last[512];
};

static _Thread_local char g_last[512]; /* the last error of a call without a communicator */

static ncclResult_t fail_comm(ncclComm_t c, ncclResult_t r, const char *msg) {
    snprintf(c ? c->last : g_last, sizeof g_last, "%s", msg);
    return r;
}

/* a non-blocking communicator settles over one more poll */
static ncclResult_t in_progress(ncclComm_t c) {
    if (c->blocking) return ncclSuccess;
    c->settling = 1;
    return ncclInProgress;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->last : g_last; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    ff_coll_id cpu;
    if (ff_coll_get_unique_id(&cpu, "cpu", NULL)) return fail_comm(NULL, ncclSystemError, ff_error_message());
    size_t n = strlen(cpu.text);
    if (n >= sizeof id->internal) return fail_comm(NULL, ncclInternalError, "a cpu id longer than an NCCL id");
    memset(id->internal, 0, sizeof id->internal);
    memcpy(id->internal, cpu.text, n);
    return ncclSuccess;
}

static ncclComm_t comm_wrap(ff_coll_comm *cpu, const ncclConfig_t *cfg) {
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cpu = cpu;
    c->blocking = !cfg || cfg->blocking;
    return c;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    *comm = NULL;
    ff_coll_id cpu;
    size_t n = strnlen(id.internal, sizeof id.internal);
    if (n == sizeof id.internal || ff_coll_id_from_string(&cpu, id.internal, n))
        return fail_comm(NULL, ncclInvalidArgument, "malformed unique id");
    ff_coll_comm *in = NULL;
    if (ff_coll_comm_init(&in, nranks, &cpu, rank, NULL)) return fail_comm(NULL, ncclSystemError, ff_error_message());
    if (!(*comm = comm_wrap(in, config))) {
        ff_coll_comm_destroy(&in);
        return fail_comm(NULL, ncclSystemError, "out of memory");
    }
    return in_progress(*comm);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    *newcomm = NULL;
    if (comm->async != ncclSuccess) return comm->async;
    ff_coll_comm *in = NULL;
    if (ff_coll_comm_split(comm->cpu, color == NCCL_SPLIT_NOCOLOR ? FF_COLL_SPLIT_NOCOLOR : color, key, &in))
        return fail_comm(comm, ncclSystemError, ff_error_message());
    if (in && !(*newcomm = comm_wrap(in, config))) {
        ff_coll_comm_destroy(&in);
        return fail_comm(comm, ncclSystemError, "out of memory");
    }
    if (*newcomm) in_progress(*newcomm);
    return in_progress(comm);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm->async != ncclSuccess ? comm->async : in_progress(comm); }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ff_coll_comm_destroy(&comm->cpu);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ff_coll_comm_abort(comm->cpu, "a peer aborted its NCCL communicator");
    return ncclCommDestroy(comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error) {
    if (comm->async != ncclSuccess) *async_error = comm->async;
    else if (comm->settling > 0) comm->settling--, *async_error = ncclInProgress;
    else *async_error = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    *rank = ff_coll_comm_rank(comm->cpu);
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    *count = ff_coll_comm_size(comm->cpu);
    return ncclSuccess;
}

/* ---- calls --------------------------------------------------------------------------------- */

enum { C_ALL_REDUCE, C_BROADCAST, C_REDUCE, C_ALL_GATHER, C_REDUCE_SCATTER, C_SEND, C_RECV };
static const char *const call_name[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather",
                                        "ncclReduceScatter", "ncclSend", "ncclRecv"};

typedef struct call {
    ncclComm_t comm;
    int op;
    const void *send;
    void *out; /* where the output lands (NULL: none on this rank) */
    size_t count, out_bytes;
    ff_dtype dt;
    ff_coll_redop redop;
    int root;    /* broadcast and reduce root, send and receive peer */
    void *scratch;
} call;

static bool map_dtype(ncclDataType_t t, ff_dtype *out) {
    switch (t) {
    case ncclInt8: *out = FF_DTYPE_I8; return true;
    case ncclUint8: *out = FF_DTYPE_U8; return true;
    case ncclInt32:
    case ncclUint32: *out = FF_DTYPE_I32; return true;
    case ncclInt64:
    case ncclUint64: *out = FF_DTYPE_I64; return true;
    case ncclFloat16: *out = FF_DTYPE_F16; return true;
    case ncclFloat32: *out = FF_DTYPE_F32; return true;
    case ncclFloat64: *out = FF_DTYPE_F64; return true;
    case ncclBfloat16: *out = FF_DTYPE_BF16; return true;
    }
    return false;
}

static ff_coll_redop map_op(ncclRedOp_t op) {
    return op == ncclProd ? FF_COLL_PROD : op == ncclMax ? FF_COLL_MAX : op == ncclMin ? FF_COLL_MIN
                        : op == ncclAvg ? FF_COLL_AVG : FF_COLL_SUM;
}

static int run_call(const call *k) {
    ff_coll_comm *in = k->comm->cpu;
    const int me = ff_coll_comm_rank(in);
    switch (k->op) {
    case C_ALL_REDUCE:
    case C_REDUCE: /* an all-reduce whose output lands on the root only */
        return ff_coll_all_reduce(k->send, k->scratch, k->count, k->dt, k->redop, in, NULL);
    case C_BROADCAST: return ff_coll_broadcast(me == k->root ? k->send : NULL, k->scratch, k->count, k->dt, k->root, in, NULL);
    case C_ALL_GATHER: return ff_coll_all_gather(k->send, k->scratch, k->count, k->dt, in, NULL);
    case C_REDUCE_SCATTER: return ff_coll_reduce_scatter(k->send, k->scratch, k->count, k->dt, k->redop, in, NULL);
    case C_SEND: return ff_coll_send(k->send, k->count, k->dt, k->root, in, NULL);
    default: return ff_coll_recv(k->scratch, k->count, k->dt, k->root, in, NULL);
    }
}

/* NCCL requires every rank to launch a collective the same way: all from a graph's replay, or
 * all directly (its docs: graph capture is a collective property of the operation; mixing may
 * hang). Before the calls run, each rank gives whether they run in a graph: an all-reduce (max)
 * of {in graph, not in graph} per collective, an exchange with the peer per send or receive (one
 * group for them all, as NCCL's own group); both set anywhere is the mix, refused on every rank
 * it reaches. 0, or -1 + error. */
static int check_uniform(const call *calls, size_t n, bool in_graph) {
    int32_t mine = in_graph ? 1 : 0;
    bool p2p = false, mixed = false;
    for (size_t i = 0; i < n; i++) {
        if (calls[i].op == C_SEND || calls[i].op == C_RECV) {
            p2p = true;
            continue;
        }
        int32_t f[2] = {mine, 1 - mine};
        if (ff_coll_all_reduce(f, f, 2, FF_DTYPE_I32, FF_COLL_MAX, calls[i].comm->cpu, NULL)) return -1;
        mixed |= f[0] && f[1];
    }
    if (p2p) {
        int32_t *theirs = calloc(n, sizeof *theirs);
        if (!theirs) return ff_error_set("nccl emulator", NULL, "out of memory");
        ff_coll_group_start();
        for (size_t i = 0; i < n; i++)
            if (calls[i].op == C_SEND || calls[i].op == C_RECV) {
                ff_coll_send(&mine, 1, FF_DTYPE_I32, calls[i].root, calls[i].comm->cpu, NULL);
                ff_coll_recv(&theirs[i], 1, FF_DTYPE_I32, calls[i].root, calls[i].comm->cpu, NULL);
            }
        const int rc = ff_coll_group_end();
        for (size_t i = 0; i < n; i++)
            if (calls[i].op == C_SEND || calls[i].op == C_RECV) mixed |= theirs[i] != mine;
        free(theirs);
        if (rc) return -1;
    }
    if (mixed)
        return ff_error_set("nccl emulator", "capture a collective on every rank of its group, or on none",
                            "%s launched from a graph's replay on some ranks and directly on others", call_name[calls[0].op]);
    return 0;
}
static int run_one(void *ctx) {
    const call *k = ctx;
    return check_uniform(k, 1, false) ? -1 : run_call(k);
}

typedef struct landing {
    void *out, *scratch;
    size_t bytes;
} landing;
static void land(void *ctx) {
    landing *l = ctx;
    memcpy(l->out, l->scratch, l->bytes);
    free(l->scratch);
    free(l);
}
/* After the call ran: its output lands when the stream gets there; or, failed, nothing does. */
static void finish(call *k, cudaStream_t stream, bool ok) {
    landing *l = ok && k->out ? malloc(sizeof *l) : NULL;
    if (!l) {
        free(k->scratch);
        k->scratch = NULL;
        return;
    }
    *l = (landing){k->out, k->scratch, k->out_bytes};
    k->scratch = NULL;
    ff_emu_stream_defer(stream, land, l);
}

/* ---- calls recorded in a graph capture ----
 * NCCL records a collective enqueued on a capturing stream in the graph, to run at each replay.
 * So does the stand-in: the calls (one, or a group's) are kept with their scratch, and each
 * replay runs them as one cpu group in the graph's order (after its earlier kernels, the stream
 * being a queue) and copies their outputs in at once. A failed replay leaves the communicators'
 * asynchronous error, as NCCL reports a failure inside a graph. */
typedef struct replay {
    call *calls;
    size_t n;
} replay;

static void replay_run(void *ctx) {
    replay *p = ctx;
    int rc = check_uniform(p->calls, p->n, true);
    if (rc == 0) {
        if (p->n > 1) ff_coll_group_start();
        for (size_t i = 0; i < p->n; i++)
            if (run_call(&p->calls[i]) && !rc) rc = -1;
        if (p->n > 1 && ff_coll_group_end()) rc = -1;
    }
    for (size_t i = 0; i < p->n; i++) {
        call *k = &p->calls[i];
        if (rc) {
            k->comm->async = ncclRemoteError;
            fail_comm(k->comm, ncclRemoteError, ff_error_message());
        } else if (k->out) {
            memcpy(k->out, k->scratch, k->out_bytes);
        }
    }
}

static void replay_free(void *ctx) {
    replay *p = ctx;
    for (size_t i = 0; i < p->n; i++) free(p->calls[i].scratch);
    free(p->calls);
    free(p);
}

/* Record n calls (copied; their scratch now the recording's) on a capturing stream. */
static ncclResult_t record(const call *calls, size_t n, cudaStream_t stream) {
    replay *p = malloc(sizeof *p);
    call *c = p ? malloc(n * sizeof *c) : NULL;
    if (!c) {
        free(p);
        for (size_t i = 0; i < n; i++) free(calls[i].scratch);
        return fail_comm(calls[0].comm, ncclSystemError, "out of memory");
    }
    memcpy(c, calls, n * sizeof *c);
    *p = (replay){c, n};
    ff_emu_stream_record(stream, replay_run, p, replay_free);
    return ncclSuccess;
}

/* Calls on a stream whose graph capture was invalidated: NCCL's launch onto it fails, and with
 * it the communicator (its asynchronous error, for good), as NCCL's does. */
static ncclResult_t capture_invalid(call *calls, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(calls[i].scratch);
        calls[i].scratch = NULL;
        calls[i].comm->async = ncclUnhandledCudaError;
        fail_comm(calls[i].comm, ncclUnhandledCudaError,
                  "a call on a stream whose graph capture was invalidated (cudaErrorStreamCaptureInvalidated)");
    }
    return ncclUnhandledCudaError;
}

/* Fill k; its buffers checked (device memory, as NCCL needs), its scratch allocated. */
static ncclResult_t make_call(call *k, int op, const void *send, void *recv, size_t count, ncclDataType_t dt,
                              ncclRedOp_t redop, int root, ncclComm_t comm) {
    memset(k, 0, sizeof *k);
    if (comm->async != ncclSuccess) return comm->async;
    if (!map_dtype(dt, &k->dt)) return fail_comm(comm, ncclInvalidArgument, "unknown data type");
    const int n = ff_coll_comm_size(comm->cpu), me = ff_coll_comm_rank(comm->cpu);
    const size_t es = ff_dtype_size(k->dt);
    k->comm = comm, k->op = op, k->send = send, k->count = count, k->redop = map_op(redop), k->root = root;
    size_t in = count, out = count; /* elements read from send, written to recv */
    switch (op) {
    case C_BROADCAST: in = me == root ? count : 0; break;
    case C_REDUCE: out = me == root ? count : 0; break;
    case C_ALL_GATHER: out = count * (size_t)n; break;
    case C_REDUCE_SCATTER: in = count * (size_t)n; break;
    case C_SEND: out = 0; break;
    case C_RECV: in = 0; break;
    }
    char msg[256];
    if (in && !ff_emu_is_device(send, in * es)) {
        snprintf(msg, sizeof msg, "%s: %zu bytes from %p are not device memory (a GPU would fault)", call_name[op], in * es, send);
        return fail_comm(comm, ncclInvalidArgument, msg);
    }
    if (out && !ff_emu_is_device(recv, out * es)) {
        snprintf(msg, sizeof msg, "%s: %zu bytes into %p are not device memory (a GPU would fault)", call_name[op], out * es, recv);
        return fail_comm(comm, ncclInvalidArgument, msg);
    }
    /* the scratch: the output, or (reduce) every rank's all-reduce result */
    const size_t scratch = op == C_REDUCE ? count * es : op == C_SEND ? 0 : out * es;
    if (scratch && !(k->scratch = malloc(scratch))) return fail_comm(comm, ncclSystemError, "out of memory");
    k->out = out ? recv : NULL;
    k->out_bytes = out * es;
    return ncclSuccess;
}

/* the current thread's group (NCCL's groups are per thread) */
static _Thread_local struct {
    int depth;
    bool failed; /* a call was refused: the group runs nothing */
    call *calls;
    size_t n, cap;
    cudaStream_t stream;
} g;

static ncclResult_t submit(int op, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t redop, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    if (count == 0) return comm->async; /* nothing moves (NCCL returns at once); every rank has the same count */
    call k;
    ncclResult_t r = make_call(&k, op, send, recv, count, dt, redop, root, comm);
    if (r != ncclSuccess) {
        if (g.depth > 0) g.failed = true;
        return r;
    }
    if (g.depth > 0) {
        if (g.n && stream != g.stream) {
            free(k.scratch);
            g.failed = true;
            return fail_comm(comm, ncclInvalidUsage, "the emulator runs a group's calls on one stream");
        }
        if (g.n == g.cap) {
            size_t nc = g.cap ? 2 * g.cap : 8;
            call *p = realloc(g.calls, nc * sizeof *p);
            if (!p) {
                free(k.scratch);
                g.failed = true;
                return fail_comm(comm, ncclSystemError, "out of memory");
            }
            g.calls = p;
            g.cap = nc;
        }
        g.stream = stream;
        g.calls[g.n++] = k;
        return ncclSuccess;
    }
    if (ff_emu_stream_capturing(stream) == 2) return capture_invalid(&k, 1);
    if (ff_emu_stream_capturing(stream)) return record(&k, 1, stream);
    int rc = ff_emu_stream_run_host(stream, run_one, &k);
    finish(&k, stream, rc == 0);
    if (rc == 0) return ncclSuccess;
    comm->async = ncclRemoteError;
    fail_comm(comm, ncclRemoteError, ff_error_message());
    return comm->blocking ? ncclRemoteError : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(C_ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(C_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return submit(C_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return submit(C_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return submit(C_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit(C_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
}
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return submit(C_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
    if (g.depth++ == 0) {
        g.failed = false;
        g.n = 0;
    }
    return ncclSuccess;
}

static int run_group(void *ctx) {
    (void)ctx;
    if (check_uniform(g.calls, g.n, false)) return -1;
    ff_coll_group_start();
    int rc = 0;
    for (size_t i = 0; i < g.n; i++)
        if (run_call(&g.calls[i]) && !rc) rc = -1;
    return ff_coll_group_end() || rc ? -1 : 0;
}

ncclResult_t ncclGroupEnd(void) {
    if (g.depth <= 0) return fail_comm(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--g.depth > 0) return ncclSuccess;
    if (!g.failed && g.n && ff_emu_stream_capturing(g.stream) == 2) {
        ncclResult_t r = capture_invalid(g.calls, g.n);
        g.n = 0;
        free(g.calls);
        g.calls = NULL;
        g.cap = 0;
        return r;
    }
    if (!g.failed && g.n && ff_emu_stream_capturing(g.stream)) { /* the group, recorded as one */
        ncclResult_t r = record(g.calls, g.n, g.stream);
        for (size_t i = 0; r == ncclSuccess && i < g.n; i++)
            if (in_progress(g.calls[i].comm) == ncclInProgress) r = ncclInProgress;
        g.n = 0;
        free(g.calls);
        g.calls = NULL;
        g.cap = 0;
        return r;
    }
    int rc = g.failed ? -1 : g.n ? ff_emu_stream_run_host(g.stream, run_group, NULL) : 0;
    ncclResult_t r = ncclSuccess;
    for (size_t i = 0; i < g.n; i++) {
        call *k = &g.calls[i];
        finish(k, g.stream, rc == 0);
        if (rc && !g.failed) { /* the group's failure is every communicator's in it */
            k->comm->async = ncclRemoteError;
            fail_comm(k->comm, ncclRemoteError, ff_error_message());
            if (k->comm->blocking) r = ncclRemoteError;
        } else if (!rc && in_progress(k->comm) == ncclInProgress && r == ncclSuccess) {
            r = ncclInProgress;
        }
    }
    if (g.failed) r = ncclInvalidUsage;
    g.n = 0;
    free(g.calls); /* not kept: a thread's storage would outlive it */
    g.calls = NULL;
    g.cap = 0;
    return r;
}

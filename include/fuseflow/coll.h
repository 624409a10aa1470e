/* fuseflow: collectives between the ranks of a worker group, behind one interface that
 * mirrors NCCL (ncclGetUniqueId, ncclCommInitRank, ncclAllReduce, ncclCommSplit, ...).
 *
 * Two backends, chosen when the unique id is made:
 *   "cpu"   host buffers; shared memory between processes of one host, TCP across hosts
 *           (FF_COLL_SHM=0: TCP only). Every call is synchronous: when it returns 0 the
 *           result is in the receive buffer (but ff_coll_send_post, a send that does not
 *           block).
 *   "nccl"  device buffers; calls are enqueued on a cudaStream_t and complete
 *           asynchronously (ff_coll_synchronize waits, with the timeout). Compiled only
 *           where the CUDA toolkit and NCCL were found; ff_coll_backend_available says.
 *
 * Life of a communicator (the same for both backends):
 *     rank 0:  ff_coll_id id; ff_coll_get_unique_id(&id, "cpu", NULL);
 *              send id.text to the other ranks out of band (the controller's group setup)
 *     every rank r of n:
 *              ff_coll_comm *comm;
 *              ff_coll_comm_init(&comm, n, &id, r, NULL);     // blocks until all n joined
 *              ff_coll_all_reduce(g, g, count, FF_DTYPE_F32, FF_COLL_AVG, comm, NULL);
 *              ... reuse comm for every call of the group ...
 *              ff_coll_comm_destroy(&comm);
 * Communicators are expensive to create (a rendezvous and n-1 connections) and cheap to
 * use: create once per group, reuse. ff_coll_comm_split derives sub-groups (tensor-parallel
 * or data-parallel slices of a group) without a new unique id.
 *
 * Rules every rank must follow (as with NCCL):
 *   - All ranks of a communicator call the same collectives in the same order with the
 *     same count, dtype, op and root. The cpu backend checks this with a header on every
 *     frame and fails with a message naming both calls when they differ.
 *   - The k-th send from rank a to rank b on a communicator matches the k-th receive of b
 *     from a, with the same count and dtype.
 *   - One thread at a time uses a communicator.
 *
 * Errors: every call returns 0, or -1 with a message (ff_error_message()) naming the call,
 * the peer rank and what to do. A peer that dies (its process exits or is killed) makes the
 * pending call of every other rank fail promptly, naming the dead rank; a peer that stops
 * making progress (hung, or never called) makes it fail after the communicator's timeout
 * (options.timeout_s, default FF_COLL_TIMEOUT_S or 600 s without progress). After a
 * failure the communicator is broken: every later call fails at once with the first error;
 * destroy it and build a new one. Bad arguments (a NULL buffer, a root out of range, a
 * dtype that cannot be reduced) fail without breaking the communicator; the accessors
 * (ff_coll_comm_rank, ...) assert on a NULL communicator.
 *
 * Determinism: for the same inputs, every rank gets bitwise the same all-reduce result, on
 * every run: the algorithm is a function of (count, dtype, nranks, options) only, and each
 * element is reduced once in a fixed order and then copied to all ranks.
 *
 * The unique id is a printable string (see ff_coll_id and docs/collectives.md):
 *     cpu:   "ffcoll1/cpu/tcp/HOST/PORT/TOKEN"   TOKEN: 32 hex digits (128 random bits)
 *     nccl:  "ffcoll1/nccl/HEX"                  HEX: ncclUniqueId, 256 hex digits
 * The cpu id names the rendezvous listener (an IPv4 or IPv6 address and TCP port) served by
 * a thread of the process that made the id, until all ranks have joined or the timeout
 * passes. A process that does not present the token cannot join, so a stale or foreign
 * process fails with a clear error instead of joining the wrong group.
 */
#ifndef FUSEFLOW_COLL_H
#define FUSEFLOW_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- unique ids --------------------------------------------------------------------- */

#define FF_COLL_ID_LEN 320 /* bytes of ff_coll_id.text, NUL included */

/* A NUL-terminated printable string (at most FF_COLL_ID_LEN - 1 characters, no spaces);
 * carry it as a string (msgpack str, command-line argument, environment variable). */
typedef struct ff_coll_id {
    char text[FF_COLL_ID_LEN];
} ff_coll_id;

/* Options for making ids and communicators. Zero-initialised (or NULL) means defaults. */
typedef struct ff_coll_options {
    /* Seconds without any progress after which a pending call fails (and comm_init gives
     * up waiting for the other ranks; the rendezvous thread of get_unique_id waits this
     * long for all ranks to join). 0: FF_COLL_TIMEOUT_S from the environment, else 600, as
     * PyTorch's NCCL default: a rank may wait that long for a peer busy with a long step. */
    double timeout_s;
    /* get_unique_id (cpu): the address (IPv4, IPv6 or host name) the rendezvous listens
     * on, which every rank must be able to reach. NULL: FF_COLL_HOST from the environment;
     * else the first IPv4 address of interface FF_COLL_IFNAME; else the first non-loopback
     * IPv4 address that is up; else 127.0.0.1. Ranks listen for their peers on the local
     * address they reach the rendezvous from, so nothing else needs configuring. */
    const char *host;
    /* cpu backend: the algorithm, the same on every rank (a difference is detected as a
     * mismatch). FF_COLL_ALGO_AUTO picks by message size (docs/collectives.md). */
    int algo;
} ff_coll_options;

enum {
    FF_COLL_ALGO_AUTO = 0, /* by message size: star / direct for small, pipelined ring for large */
    FF_COLL_ALGO_RING,     /* always the pipelined ring (chain for broadcast) */
    FF_COLL_ALGO_DIRECT,   /* always the one-step direct exchange (every rank to every rank) */
    FF_COLL_ALGO_STAR,     /* all_reduce: gather to rank 0, reduce, send back; others: direct */
};

/* Make a new unique id for `backend` ("cpu" or "nccl"). For "cpu", binds the rendezvous
 * listener and starts the thread that serves it (detached; it exits once all ranks have
 * joined or after the timeout). The calling process may be one of the ranks or not (a
 * controller), but it must stay alive until comm_init returns on every rank. Returns 0, or
 * -1 + error (unknown or unavailable backend, no address to listen on). */
int ff_coll_get_unique_id(ff_coll_id *id, const char *backend, const ff_coll_options *opt);

/* Validate and copy an id received as bytes (len bytes, a trailing NUL optional). Returns
 * 0, or -1 + error naming what is malformed. comm_init validates again. */
int ff_coll_id_from_string(ff_coll_id *id, const char *text, size_t len);

/* The backend an id was made for ("cpu", "nccl"), or NULL if the id is malformed. */
const char *ff_coll_id_backend(const ff_coll_id *id);

/* Is this backend compiled in and usable here ("nccl": built with NCCL and a CUDA device
 * is visible)? When false and why != NULL, *why says why (a static string). */
bool ff_coll_backend_available(const char *backend, const char **why);

/* NCCL across hosts: NCCL_SOCKET_IFNAME from FF_COLL_IFNAME where the former is unset, so that
 * the address NCCL puts in its unique id (its bootstrap root, member 0's) and its sockets are
 * on the interface the cpu backend uses, the one every host reaches. NCCL reads the variable
 * once, at its first call, and setenv is not safe beside threads that read the environment:
 * call this at the start of a process, before any thread (`fuseflow worker` does). Returns the
 * interface set, or NULL when nothing was set (FF_COLL_IFNAME empty, or NCCL_SOCKET_IFNAME
 * given). */
const char *ff_coll_nccl_env(void);

/* ---- communicators ------------------------------------------------------------------- */

typedef struct ff_coll_comm ff_coll_comm;

/* Join rank `rank` of `nranks` to the communicator of `id`. Blocks until every rank has
 * joined (or fails after the timeout, naming the ranks that never came). For "nccl" the
 * caller selects the CUDA device first (cudaSetDevice), as with ncclCommInitRank. On
 * success *out is the new communicator; on failure *out is NULL and -1 + error. */
int ff_coll_comm_init(ff_coll_comm **out, int nranks, const ff_coll_id *id, int rank,
                      const ff_coll_options *opt);

/* Split, as ncclCommSplit: every rank of `comm` calls it (a collective). Ranks with the
 * same color form a new communicator, ranked by (key, rank in comm). color
 * FF_COLL_SPLIT_NOCOLOR takes no part: *out is NULL and the call returns 0. The new
 * communicator has its own connections (cpu) and the options of `comm`; destroy it
 * separately, before or after `comm`. */
#define FF_COLL_SPLIT_NOCOLOR (-1)
int ff_coll_comm_split(ff_coll_comm *comm, int color, int key, ff_coll_comm **out);

/* The same ranks on another backend: the "nccl" twin of a "cpu" group, for collectives on
 * device buffers beside the group's host ones (as PyTorch keeps gloo and NCCL process groups
 * of the same ranks). Made at the first call, which is a collective on comm (every rank
 * calls it at the same point: rank 0 makes the unique id and broadcasts it over comm, then
 * every rank joins), and kept: later calls give the same one at once. comm owns it: it is
 * aborted with comm and destroyed with it (never destroy it yourself). `backend` comm's own
 * gives comm. 0 + *out, or -1 + error (an unavailable backend names why; comm is left
 * usable unless the broadcast failed). */
int ff_coll_comm_twin(ff_coll_comm *comm, const char *backend, ff_coll_comm **out);

/* Free everything and NULL *comm. Tells the peers this rank left (they fail with "rank r
 * destroyed its communicator" if they still wait for it). Safe on a broken communicator
 * (then it waits at most 1 s for its abort notices to leave) and on NULL. Does not wait
 * for peers. */
void ff_coll_comm_destroy(ff_coll_comm **comm);

/* Break the communicator on purpose (e.g. the controller reports a dead group member): the
 * peers' pending and later calls fail with "rank r aborted: REASON", and so do this
 * rank's later calls. The communicator must still be destroyed. */
void ff_coll_comm_abort(ff_coll_comm *comm, const char *reason);

int ff_coll_comm_rank(const ff_coll_comm *comm);
int ff_coll_comm_size(const ff_coll_comm *comm);
const char *ff_coll_comm_backend(const ff_coll_comm *comm); /* "cpu" or "nccl" */
/* The first error that broke the communicator, or NULL while it is healthy. */
const char *ff_coll_comm_error(const ff_coll_comm *comm);

/* ---- collectives --------------------------------------------------------------------- */

/* cpu: ignored (pass NULL); nccl: a cudaStream_t. */
typedef void *ff_coll_stream;

typedef enum ff_coll_redop {
    FF_COLL_SUM = 0,
    FF_COLL_PROD,
    FF_COLL_MAX,
    FF_COLL_MIN,
    FF_COLL_AVG, /* sum, then divided by nranks (integers: truncated toward zero) */
    FF_COLL_REDOP_COUNT
} ff_coll_redop;

const char *ff_coll_redop_name(ff_coll_redop op); /* "sum", "prod", ... */

/* Element types: every dtype moves (broadcast, all-gather, send, recv); reductions take
 * F32, F64, F16, BF16, I32 and I64. F16/BF16 reduce pairwise in f32 and round each partial
 * result back (as NCCL does), so long sums lose precision: prefer F32 for gradients.
 *
 * Counts are elements, not bytes; a count of 0 is a valid no-op (still matched across
 * ranks). Buffers hold count * ff_dtype_size(dtype) bytes; host memory for "cpu", device
 * memory for "nccl". In-place forms are allowed where noted. */

/* recvbuf[i] = op over ranks of sendbuf[i], on every rank. In place: sendbuf == recvbuf. */
int ff_coll_all_reduce(const void *sendbuf, void *recvbuf, size_t count, ff_dtype dtype,
                       ff_coll_redop op, ff_coll_comm *comm, ff_coll_stream stream);

/* recvbuf = root's sendbuf, on every rank (sendbuf is read on the root only and may be NULL
 * elsewhere). In place: sendbuf == recvbuf. */
int ff_coll_broadcast(const void *sendbuf, void *recvbuf, size_t count, ff_dtype dtype,
                      int root, ff_coll_comm *comm, ff_coll_stream stream);

/* recvbuf[r * sendcount + i] = sendbuf of rank r [i]; recvbuf holds nranks * sendcount.
 * In place: sendbuf == recvbuf + rank * sendcount (elements). */
int ff_coll_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, ff_dtype dtype,
                       ff_coll_comm *comm, ff_coll_stream stream);

/* recvbuf[i] = op over ranks of sendbuf[rank * recvcount + i]; sendbuf holds
 * nranks * recvcount. In place: recvbuf == sendbuf + rank * recvcount (elements). */
int ff_coll_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, ff_dtype dtype,
                           ff_coll_redop op, ff_coll_comm *comm, ff_coll_stream stream);

/* Per-rank counts (counts[r] elements from rank r; the same array on every rank, checked):
 * all_gather_v: rank r contributes counts[r] elements; recvbuf holds their concatenation
 * in rank order (sum of counts). reduce_scatter_v: sendbuf holds sum of counts, rank r
 * gets the reduction of its slice (counts[r] elements starting at sum of counts[0..r)).
 * In place as above, with the displacement of this rank's slice. */
int ff_coll_all_gather_v(const void *sendbuf, void *recvbuf, const size_t *counts, ff_dtype dtype,
                         ff_coll_comm *comm, ff_coll_stream stream);
int ff_coll_reduce_scatter_v(const void *sendbuf, void *recvbuf, const size_t *counts,
                             ff_dtype dtype, ff_coll_redop op, ff_coll_comm *comm,
                             ff_coll_stream stream);

/* Point to point. Outside a group the cpu send returns once the data is handed to the
 * transport, which may need the receiver to post its receive first (large messages): pair
 * sends and receives that could wait on each other inside a group. peer != own rank. */
int ff_coll_send(const void *buf, size_t count, ff_dtype dtype, int peer, ff_coll_comm *comm,
                 ff_coll_stream stream);
int ff_coll_recv(void *buf, size_t count, ff_dtype dtype, int peer, ff_coll_comm *comm,
                 ff_coll_stream stream);

/* A send that does not block: it takes its place in the channel's order when posted (the k-th
 * send from a to b, posted or not, carries b's k-th receive from a) and moves while this rank
 * makes any later call on the communicator; what the transport takes at once (the shared
 * memory FIFO, a socket's buffer: small messages whole) leaves at once. The buffer stays valid
 * and unchanged until the send is done (ff_coll_sends_done). A collective on the communicator
 * first completes every posted send. Outside groups only. nccl: ff_coll_send on the default
 * stream, which is asynchronous anyway. 0, or -1 + error (the communicator is then broken and
 * its posted sends dropped: their buffers are the caller's again). */
int ff_coll_send_post(const void *buf, size_t count, ff_dtype dtype, int peer, ff_coll_comm *comm);
/* Move the posted sends (wait: until every one is done) and say in *done (may be NULL) how many
 * are done counted from the first posted: every one up to there is, later ones may be. 0, or
 * -1 + error naming the peer (one that died while a send to it was in flight, or the timeout)
 * and the communicator is broken. A communicator destroyed with sends in flight drops them. */
int ff_coll_sends_done(ff_coll_comm *comm, bool wait, uint64_t *done);

/* Grouped calls (per thread, nestable; like ncclGroupStart/End). Calls between start and
 * the outermost end only validate their arguments and queue; at end, all queued sends and
 * receives progress together (so any pattern of pairs completes without deadlock, e.g.
 * every rank sends to the next and receives from the previous), then queued collectives run
 * in the order they were issued. Buffers must stay valid until end returns. end returns
 * the first error of any queued call (and breaks that communicator); a call that fails its
 * validation inside the group returns -1 at once and is not queued. */
int ff_coll_group_start(void);
int ff_coll_group_end(void);

/* Wait until every call enqueued on `stream` for this communicator has completed; nccl
 * polls for asynchronous errors and aborts the communicator after the timeout. cpu: calls
 * are already complete; returns 0, or -1 if the communicator is broken. */
int ff_coll_synchronize(ff_coll_comm *comm, ff_coll_stream stream);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

/* Internals of ff_coll shared by its files: the communicator, the cpu backend's wire
 * (frames), the progress engine, the reduction kernels, and the entry points of the nccl
 * backend (workers/coll/nccl/). Not a public header: nothing outside workers/coll includes
 * it. */
#ifndef FF_COLL_INTERNAL_H
#define FF_COLL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "fuseflow/coll.h"

/* Little-endian fields of the wire headers (hello, mesh, frame headers), whatever the host. */
static inline void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

enum { COLL_BACKEND_CPU = 1, COLL_BACKEND_NCCL = 2 };

#define COLL_ID_PREFIX "ffcoll1/"
#define COLL_TOKEN_BYTES 16
#define COLL_DEFAULT_TIMEOUT_S 600.0
#define COLL_HOST_MAX 64 /* numeric address text, NUL included (INET6_ADDRSTRLEN is 46) */

/* ---- wire of the cpu backend -------------------------------------------------------- */

/* Every byte between two ranks travels in frames: a 40-byte header, then `len` payload
 * bytes. The header repeats the call (op, dtype, count, root) so the receiver checks
 * that both ranks are in the same call, and carries BYE (the peer destroyed its
 * communicator) and ABORT (the peer broke it; the payload is the reason). Fields are
 * little-endian on the wire. */
#define COLL_FRAME_MAGIC 0x46434631u /* "1FCF" read as little-endian bytes: 'F','C','F','1' */
#define COLL_HDR_BYTES 40
#define COLL_ABORT_MAX 1024 /* bytes of an ABORT reason */

/* KICK: a wake-up on the socket of a shared-memory connection (no payload). */
enum { FRAME_DATA = 1, FRAME_BYE = 2, FRAME_ABORT = 3, FRAME_KICK = 4 };

enum coll_op {
    OP_NONE = 0,
    OP_ALL_REDUCE,
    OP_BROADCAST,
    OP_ALL_GATHER,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER_V,
    OP_REDUCE_SCATTER_V,
    OP_SEND, /* the receiver expects OP_SEND too: a header names what the sender did */
    OP_SPLIT,
    OP_COUNT
};

typedef struct coll_hdr {
    uint32_t magic;
    uint8_t type;    /* FRAME_* */
    uint8_t op;      /* enum coll_op */
    uint8_t dtype;   /* ff_dtype */
    uint8_t redop;   /* ff_coll_redop (low 4 bits) | algorithm << 4 */
    uint32_t seq;    /* the call's number on this connection and direction, from 1 */
    uint32_t len;    /* payload bytes of this frame */
    uint64_t count;  /* elements of the call (v-variants: a hash of the counts array) */
    uint32_t root;   /* broadcast root, else 0 */
    uint32_t frame;  /* index of this frame within the call on this connection */
    uint32_t coll;   /* collectives: the call's number on the communicator, from 1; p2p: 0 */
    uint32_t reserved;
} coll_hdr;

void coll_hdr_encode(const coll_hdr *h, uint8_t out[COLL_HDR_BYTES]);
void coll_hdr_decode(const uint8_t in[COLL_HDR_BYTES], coll_hdr *h);
/* "all_reduce(count=1000, F32, sum)" into buf. */
void coll_describe(char *buf, size_t cap, int op, int dtype, int redop, uint64_t count, int root);
const char *coll_op_name(int op);

/* ---- the cpu communicator ----------------------------------------------------------- */

/* LEFT: its BYE arrived; SENT_AHEAD: it closed with data queued for a later call of ours;
 * DEAD: its connection ended without a goodbye while we did not need it. */
enum { PEER_LIVE = 0, PEER_LEFT, PEER_SENT_AHEAD, PEER_DEAD, PEER_ABORTED };

typedef struct coll_fifo coll_fifo; /* cpu_shm.c */

typedef struct coll_conn {
    int fd;             /* -1 for this rank itself */
    int peer;           /* rank in the communicator */
    uint32_t tx_seq;    /* calls that sent on this connection */
    uint32_t rx_seq;    /* calls that received on it */
    uint32_t tx_frame_left; /* bytes of a frame partly sent (a failed call); 0 at a boundary */
    int state;          /* PEER_* */
    /* same-host fast path (cpu_shm.c): frames go through these FIFOs, the socket carries
     * only control frames (KICK, BYE, ABORT). NULL: frames go through the socket. */
    coll_fifo *tx_fifo, *rx_fifo;
    void *shm;
    size_t shm_len, fifo_cap;
    uint8_t ctl[COLL_HDR_BYTES]; /* a control frame partly read */
    size_t ctl_off;
    char *abort_reason; /* ABORTED: the peer's reason, reported once its FIFO is read */
} coll_conn;

/* Per-call work arrays, sized for the communicator once, so calls do not allocate. */
typedef struct coll_work {
    size_t *off;                 /* [n + 1] chunk byte offsets */
    const uint8_t **tx, **slot;  /* [n] */
    uint8_t **rx;                /* [n] */
    size_t *tb, *rb;             /* [n] */
    struct coll_chan *chans;     /* [2n] */
    struct ring_seg *segs;       /* [2n] */
} coll_work;

typedef struct coll_cpu {
    coll_conn *conns;            /* [nranks], conns[rank].fd == -1 */
    uint8_t token[COLL_TOKEN_BYTES];
    char local_host[COLL_HOST_MAX]; /* the address this rank listens and connects from */
    int family;                  /* AF_INET or AF_INET6 */
    uint8_t *scratch;            /* grown on demand, reused by every call */
    size_t scratch_cap;
    size_t slice;                /* bytes per frame of a pipelined transfer */
    size_t direct_max;           /* auto: direct exchange while each rank sends <= this */
    size_t star_max;             /* auto: all_reduce by the star up to this many bytes */
    uint32_t coll_seq;           /* collectives called so far (every rank counts the same) */
    coll_work w;
    /* posted sends (ff_coll_send_post) not yet done, in post order; each run of this
     * communicator's sends and receives moves them too, a collective first completes them */
    struct coll_chan *pend;
    size_t n_pend, cap_pend;
    struct coll_chan *run;       /* a p2p run's channels: the posted ones, then the group's */
    size_t cap_run;
} coll_cpu;

struct ff_coll_comm {
    int backend;
    int rank, nranks;
    double timeout_s;
    int algo;
    char *error;  /* first error that broke the communicator (owned), NULL while healthy */
    uint64_t sends_posted;  /* ff_coll_send_post calls so far */
    uint64_t sends_done;    /* of those, how many from the first are done */
    coll_cpu cpu; /* backend "cpu" */
    void *nccl;   /* backend "nccl": ncclComm_t */
    struct ff_coll_comm *twin; /* ff_coll_comm_twin's, owned; NULL until asked for */
};

/* Record the current ff_error_message() as the communicator's error (first one wins),
 * tell the peers (cpu), and return -1. */
int coll_break(ff_coll_comm *c);
/* The same, telling the peers `reason` instead of this rank's error message. */
int coll_break_with(ff_coll_comm *c, const char *reason);
/* A new communicator with defaults resolved from opt (NULL + error when memory runs out).
 * The backend fills in its part. */
ff_coll_comm *coll_comm_alloc(int backend, int nranks, int rank, const ff_coll_options *opt);
/* Free a communicator that coll_comm_alloc made, after its backend part is freed. */
void coll_comm_free_shell(ff_coll_comm *c);
/* -1 + error if the communicator is already broken. */
int coll_check_usable(const ff_coll_comm *c, const char *call);
double coll_resolve_timeout(const ff_coll_options *opt);
/* Scratch of at least n bytes, aligned to 64; NULL + error if memory runs out. */
void *coll_scratch(ff_coll_comm *c, size_t n);

/* ---- cpu networking (cpu_net.c) ------------------------------------------------------ */

int coll_cpu_make_id(ff_coll_id *id, const ff_coll_options *opt);
/* Parse "ffcoll1/cpu/tcp/HOST/PORT/TOKEN"; 0 or -1 + error. */
int coll_cpu_parse_id(const char *text, char *host, int *port, uint8_t token[COLL_TOKEN_BYTES]);
int coll_cpu_comm_init(ff_coll_comm *c, const ff_coll_id *id);
int coll_cpu_comm_split(ff_coll_comm *c, int color, int key, ff_coll_comm **out);
/* Close every connection (after BYE unless broken) and free the backend state. */
void coll_cpu_comm_free(ff_coll_comm *c);
/* Tell every peer this rank broke the communicator (best effort, bounded time). */
void coll_cpu_notify_abort(ff_coll_comm *c, const char *reason);
/* All n bytes through a socket (blocking or not) by the deadline (ff_now_ns): 0, or -1
 * with errno (ETIMEDOUT at the deadline, EPIPE when the peer closed, ECONNRESET, ...). */
int coll_write_all(int fd, const void *buf, size_t n, int64_t deadline);
int coll_read_all(int fd, void *buf, size_t n, int64_t deadline);
int coll_hex_decode(const char *hex, size_t nhex, uint8_t *out);
void coll_hex_encode(const uint8_t *in, size_t n, char *out); /* 2n chars + NUL */

/* ---- shared memory between ranks of one host (cpu_shm.c) ----------------------------- */

struct iovec;
/* After the mesh: give every pair that can share memory a pair of FIFOs. A pair that
 * cannot stays on TCP; -1 + error only when the exchange itself fails. */
int coll_shm_setup(ff_coll_comm *c, int64_t deadline);
void coll_shm_free(coll_conn *cn);
/* Bytes moved (0: the FIFO is full / empty and the waiting flag is raised). */
ssize_t coll_shm_write(coll_conn *cn, const struct iovec *iov, int niov);
ssize_t coll_shm_read(coll_conn *cn, uint8_t *buf, size_t len);
bool coll_shm_rx_empty(const coll_conn *cn);

/* ---- the progress engine (cpu_engine.c) ---------------------------------------------- */

/* A channel moves one call's frames over one connection in one direction. Frames are
 * produced (tx) or placed (rx) through callbacks, so an algorithm can forward a frame only
 * once it arrived (the ring) and reduce each frame as it lands. Channels on the same
 * connection and direction run in list order, one after the other. */
typedef struct coll_chan coll_chan;
struct coll_chan {
    ff_coll_comm *comm;
    int peer;
    bool tx;
    coll_hdr h;       /* the call: op, dtype, redop, count, root (seq, frame, len filled in) */
    size_t nframes;
    /* tx: frame k's payload if it can be sent now (return 1), 0 if not yet.
     * rx: where frame k's payload lands (return 1), 0 if no room yet. */
    int (*frame)(void *ctx, coll_chan *ch, size_t k, uint8_t **ptr, size_t *len);
    /* rx only: frame k landed (reduce it). May be NULL. */
    void (*landed)(void *ctx, coll_chan *ch, size_t k);
    void *ctx;
    uint8_t *buf;     /* coll_chan_simple's buffer and its size in bytes */
    size_t bytes;
    uint64_t serial;  /* a posted send's number (ff_coll_comm.sends_posted when posted); 0 otherwise */
    /* engine state */
    size_t k;         /* frames completed */
    size_t off;       /* bytes of frame k done, header included */
    bool started;
    uint8_t hbuf[COLL_HDR_BYTES];
    uint8_t *ptr;     /* payload of frame k */
    size_t len;
};

/* The root cause carried by the last ABORT notice this thread received (then cleared),
 * or NULL. */
const char *coll_take_forward_reason(void);

/* Run channels (of one or several communicators) until all complete. On an error (a peer
 * died, left, aborted, sent a mismatched call, or nothing moved for the timeout) returns -1
 * + error naming the peer and the call; the caller breaks the communicators involved. */
int coll_engine_run(coll_chan *chans, size_t n);
/* The same, but chans [0, optional) need not complete: they move as far as they can while the
 * others do (a posted send), and the run returns once the rest are done. With nothing else
 * (optional == n) one pass moves them without waiting. */
int coll_engine_run_opt(coll_chan *chans, size_t n, size_t optional);
/* -1 + error if a peer of c is known dead (a collective needs every rank). */
int coll_check_peers(ff_coll_comm *c, const char *call);

/* A simple channel: one contiguous buffer, cut into slice-sized frames. */
void coll_chan_simple(coll_chan *ch, ff_coll_comm *c, int peer, bool tx, const coll_hdr *h,
                      void *buf, size_t bytes);

/* ---- cpu algorithms (cpu_algos.c) ---------------------------------------------------- */

typedef struct coll_call {
    int op;
    const void *sendbuf;
    void *recvbuf;
    size_t count;          /* elements (all_reduce, broadcast); per rank (all_gather, reduce_scatter) */
    const size_t *counts;  /* v-variants: [nranks] */
    ff_dtype dtype;
    ff_coll_redop redop;
    int root;              /* broadcast root; send/recv peer */
    bool is_recv;          /* OP_SEND with is_recv: the receive side */
} coll_call;

int coll_cpu_run(ff_coll_comm *c, const coll_call *call);
/* Allocate / free c->cpu.w for c->nranks ranks. */
int coll_work_alloc(ff_coll_comm *c);
void coll_work_free(ff_coll_comm *c);
/* Sends and receives of a group, possibly on several communicators, all at once; the
 * communicators' posted sends move with them. */
int coll_cpu_run_p2p(ff_coll_comm **comms, const coll_call *calls, size_t n);
/* A send that does not block (ff_coll_send_post): queued behind the posted ones, then moved
 * as far as the transport takes without waiting. */
int coll_cpu_send_post(ff_coll_comm *c, const coll_call *call);
/* Move the posted sends: without waiting, or (wait) until all are done. Updates sends_done. */
int coll_cpu_sends_progress(ff_coll_comm *c, bool wait);

/* ---- reductions (reduce.c) ------------------------------------------------------------ */

bool coll_redop_supported(ff_dtype dtype);
/* out[i] = a[i] op b[i] for n elements, then divided by `div` when div > 1 (AVG's last
 * step). out may alias a or b. F16/BF16 compute in f32 and round once. */
void coll_reduce(void *out, const void *a, const void *b, size_t n, ff_dtype dtype,
                 ff_coll_redop op, int div);

/* ---- nccl backend ----------------------------------------------------------------------
 * Its entry points, one table: nccl/nccl_backend.c's (compiled with FF_COLL_HAVE_NCCL), or NULL
 * where this build has no NCCL. A test program may put a stand-in in coll_nccl before it makes
 * any communicator (tests/exec/fuseflow_emu.c: collectives of the CUDA emulator's streams run by
 * the cpu backend, in stream order). */
typedef struct coll_nccl_ops {
    bool (*available)(const char **why);
    int (*make_id)(ff_coll_id *id);
    int (*comm_init)(ff_coll_comm *c, const ff_coll_id *id);
    int (*comm_split)(ff_coll_comm *c, int color, int key, ff_coll_comm *child);
    void (*comm_free)(ff_coll_comm *c);
    void (*abort)(ff_coll_comm *c);
    int (*run)(ff_coll_comm *c, const coll_call *call, ff_coll_stream stream);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*synchronize)(ff_coll_comm *c, ff_coll_stream stream);
} coll_nccl_ops;
extern const coll_nccl_ops *coll_nccl;
#ifdef FF_COLL_HAVE_NCCL
extern const coll_nccl_ops coll_nccl_real;
#endif

#endif

/* fuseflow: the wire between the controller and its workers.
 *
 * A message is one ZeroMQ multipart: a msgpack header frame, then one raw frame per tensor
 * the header describes. The header is a msgpack array whose first two items are the protocol
 * version and the message type; the remaining items are positional and depend on the type
 * (docs/runtime.md has the table). Tensor frames travel without copies: a tensor handed over
 * with a free function becomes a zmq_msg_init_data frame, and a received tensor points into
 * the zmq_msg_t it arrived in, which the ff_msg keeps alive until ff_msg_reset.
 *
 * Decoding trusts nothing: a malformed, truncated, oversized or unknown message, a wrong
 * version, or tensor frames that disagree with the header are rejected with a message that
 * names the problem, and counted by reason in ff_msg_stats. The msgpack parser never sees
 * a header whose container counts exceed what its bytes could hold, so a five-byte header
 * cannot make it allocate gigabytes.
 *
 * This module does not know about workers, groups or scheduling: that is ff_controller and
 * ff_worker. msgs/transport.h (not installed) has the socket plumbing both sides share.
 */
#ifndef FUSEFLOW_MSGS_H
#define FUSEFLOW_MSGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "fuseflow/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

#define FF_PROTOCOL_VERSION 3            /* 2: error texts up to 4 KiB, errors name the refused
                                            id, hello and welcome carry frame limits; 3: the
                                            hello carries cores, CPUs, GPUs and the
                                            worker's local index */
#define FF_MSG_NAME_MAX 64               /* kind, group, tensor, host, device names (with NUL) */
#define FF_MSG_TEXT_MAX 4096             /* error texts (with NUL); longer ones are cut in the
                                            middle (ff_text_fit) */
#define FF_MSG_MAX_HEADER (64 * 1024)    /* bytes of the msgpack header frame */
#define FF_MSG_MAX_TENSORS 256           /* tensor frames per message */
#define FF_MSG_MAX_DIMS 8
#define FF_MSG_MAX_ARGS 32               /* scalar arguments of a subtask */
#define FF_MSG_ARG_KEY_MAX 32            /* argument key length (with NUL) */
#define FF_MSG_MAX_CAPS 64               /* capability strings in a hello */
#define FF_MSG_MAX_GPUS 16               /* GPU names in a hello */
#define FF_MSG_MAX_MEMBERS 4096          /* ranks in a group */
#define FF_MSG_MAX_UNIQUE_ID 512         /* bytes of a collective backend's unique id */
#define FF_MSG_MAX_ROUTING_ID 255        /* ZeroMQ routing ids are at most 255 bytes */

typedef enum ff_msg_type {
    FF_MSG_HELLO = 1,       /* worker -> controller: I am here */
    FF_MSG_WELCOME = 2,     /* controller -> worker: your rank and the liveness rules */
    FF_MSG_HEARTBEAT = 3,   /* both ways: ping (controller) and pong (worker), clock samples */
    FF_MSG_SUBTASK = 4,     /* controller -> worker: run this */
    FF_MSG_RESULT = 5,      /* worker -> controller: outcome of a subtask or group setup */
    FF_MSG_ERROR = 6,       /* either way: your message was rejected, or something failed */
    FF_MSG_CANCEL = 7,      /* controller -> worker: drop or interrupt a subtask */
    FF_MSG_SHUTDOWN = 8,    /* controller -> worker: exit cleanly */
    FF_MSG_GROUP_SETUP = 9, /* controller -> worker: you are a member of this group */
    FF_MSG_TYPE_END
} ff_msg_type;

const char *ff_msg_type_name(int type); /* "hello", ... or "unknown" */

/* Status of a result. Workers send OK, FAILED, CANCELLED, UNKNOWN_KIND, BAD_REQUEST; the
 * controller adds the others for subtasks that never got an answer, or whose message (the
 * subtask, or its result) the other side's decoder refused. */
typedef enum ff_status {
    FF_STATUS_OK = 0,
    FF_STATUS_FAILED = 1,       /* the handler reported an error (text in the result) */
    FF_STATUS_CANCELLED = 2,
    FF_STATUS_UNKNOWN_KIND = 3, /* no handler for this kind on that worker */
    FF_STATUS_BAD_REQUEST = 4,  /* the worker could not accept the subtask (bad args, no group) */
    FF_STATUS_WORKER_LOST = 5,  /* the worker died with the subtask in flight */
    FF_STATUS_SHUTDOWN = 6,     /* the controller shut down before an answer came */
    FF_STATUS_REJECTED = 7,     /* the worker refused the subtask's message, or the controller
                                   its result (a frame over the size limit...): text says why */
    FF_STATUS_END
} ff_status;

const char *ff_status_name(int status);

/* Error codes of FF_MSG_ERROR. */
typedef enum ff_error_code {
    FF_ERR_MALFORMED = 1,    /* the message was rejected by the decoder (text says why) */
    FF_ERR_UNKNOWN_PEER = 2, /* the sender has not said hello (or was declared dead) */
    FF_ERR_UNEXPECTED = 3,   /* a valid message that makes no sense here (e.g. a subtask to a controller) */
    FF_ERR_REJECTED = 4,     /* hello refused (rank taken, protocol mismatch) */
} ff_error_code;

/* A scalar argument of a subtask: int, float, bool or a byte string. Strings point into the
 * message they came from (or the caller's memory when sending) and are not NUL-terminated. */
typedef enum ff_arg_type { FF_ARG_INT = 0, FF_ARG_FLOAT, FF_ARG_BOOL, FF_ARG_STR } ff_arg_type;
typedef struct ff_arg {
    char key[FF_MSG_ARG_KEY_MAX];
    ff_arg_type type;
    union {
        int64_t i;
        double f;
        bool b;
        struct {
            const char *p;
            uint32_t len;
        } s;
    } v;
} ff_arg;

ff_arg ff_arg_int(const char *key, int64_t v);
ff_arg ff_arg_float(const char *key, double v);
ff_arg ff_arg_bool(const char *key, bool v);
ff_arg ff_arg_str(const char *key, const char *s); /* s must outlive the encoding */

/* A tensor in a message: header description plus the bytes of its frame. */
typedef struct ff_tensor {
    char name[FF_MSG_NAME_MAX];
    ff_dtype dtype;
    int ndim;
    int64_t shape[FF_MSG_MAX_DIMS]; /* row-major, outermost first */
    void *data;                     /* nbytes bytes, aligned to the element size */
    size_t nbytes;
} ff_tensor;

int64_t ff_tensor_numel(const ff_tensor *t);

/* What a worker sees of its machine, as its hello reports it (ff_devices_probe,
 * include/fuseflow/worker.h, fills it). */
typedef struct ff_devices {
    uint32_t cores; /* online cores of the machine */
    uint32_t cpus;  /* the cores the worker may run on (its affinity: a Slurm task's binding) */
    int ngpus;      /* GPUs the CUDA driver lists, CUDA_VISIBLE_DEVICES applied */
    char gpus[FF_MSG_MAX_GPUS][FF_MSG_NAME_MAX]; /* their names, in CUDA's order */
    int32_t local_index; /* its place among its host's workers, which on a cluster with rails
                            is its rail (its GPU and NIC; a Slurm task's SLURM_LOCALID); -1:
                            not given */
} ff_devices;

/* "4 of 16 cores, 8 GPUs: 8 x NVIDIA H200" (4: its affinity's) or "2 cores, no GPU", cut to
 * cap bytes. */
void ff_devices_describe(const ff_devices *d, char *buf, size_t cap);

/* ---- message bodies (positional fields of the header after [version, type]) ---------- */
typedef struct ff_msg_hello {
    int32_t rank; /* requested rank, -1 = any */
    int64_t pid;
    char host[FF_MSG_NAME_MAX];
    char device[FF_MSG_NAME_MAX];
    int ncaps;
    char caps[FF_MSG_MAX_CAPS][FF_MSG_NAME_MAX]; /* subtask kinds and features */
    uint64_t max_frame; /* largest tensor frame it accepts (bytes; 0: 1 GiB): the controller
                           fails a subtask with a larger one instead of sending it */
    ff_devices devices; /* its cores and GPUs */
} ff_msg_hello;

typedef struct ff_msg_welcome {
    int32_t rank;
    uint32_t heartbeat_ms;     /* the controller pings this often */
    uint32_t timeout_ms;       /* silence longer than this means the other side is gone */
    uint32_t max_inflight;     /* subtasks the controller keeps in flight on this worker */
    uint64_t max_frame;        /* largest tensor frame the controller accepts (0: 1 GiB): a
                                  result with a larger one is sent as a failure instead */
} ff_msg_welcome;

typedef struct ff_msg_heartbeat {
    uint64_t seq;
    bool reply;       /* false: ping from the controller; true: pong from the worker */
    int64_t t0;       /* controller clock when the ping left (ns) */
    int64_t t1, t2;   /* worker clock when the ping arrived and the pong left (pong only) */
    uint32_t busy;    /* pong: subtasks queued or running on the worker */
    uint64_t errors;  /* pong: messages the worker has rejected so far */
} ff_msg_heartbeat;

typedef struct ff_msg_subtask {
    uint64_t id;
    char kind[FF_MSG_NAME_MAX];
    char group[FF_MSG_NAME_MAX]; /* "" when not a group subtask */
    int nargs;
    ff_arg args[FF_MSG_MAX_ARGS];
} ff_msg_subtask;

typedef struct ff_msg_result {
    uint64_t id;
    int32_t status;              /* ff_status */
    char error[FF_MSG_TEXT_MAX]; /* "" when OK */
    int64_t start_ns, end_ns;    /* worker clock */
    uint32_t queued;             /* subtasks queued or running on the worker when this arrived */
} ff_msg_result;

typedef struct ff_msg_error {
    int32_t code; /* ff_error_code */
    uint64_t ref; /* the id the error is about, 0 if none: for FF_ERR_MALFORMED, the id of the
                     rejected subtask, group setup or result (ff_msg.rejected_id) */
    char text[FF_MSG_TEXT_MAX];
} ff_msg_error;

typedef struct ff_msg_cancel {
    uint64_t id;
} ff_msg_cancel;

typedef struct ff_msg_shutdown {
    char reason[FF_MSG_TEXT_MAX];
} ff_msg_shutdown;

typedef struct ff_msg_group_setup {
    uint64_t id;                 /* answered by a RESULT with this id */
    char name[FF_MSG_NAME_MAX];
    int32_t index;               /* this worker's position in members */
    int nmembers;
    int32_t *members;            /* ranks, in group order (points into the ff_msg) */
    char backend[FF_MSG_NAME_MAX]; /* collective backend: "cpu", "nccl", or "none" */
    uint32_t unique_id_len;        /* the backend's unique id (fuseflow/coll.h: its text) */
    uint8_t unique_id[FF_MSG_MAX_UNIQUE_ID];
    uint32_t timeout_ms;           /* collective timeout (0 = the backend's default) */
} ff_msg_group_setup;

/* A message, decoded or to be sent. The body in use is the one of `type`. Reuse one ff_msg
 * across messages: ff_msg_reset keeps its buffers, so the hot path does not allocate. */
typedef struct ff_msg {
    ff_msg_type type;
    union {
        ff_msg_hello hello;
        ff_msg_welcome welcome;
        ff_msg_heartbeat heartbeat;
        ff_msg_subtask subtask;
        ff_msg_result result;
        ff_msg_error error;
        ff_msg_cancel cancel;
        ff_msg_shutdown shutdown;
        ff_msg_group_setup group;
    } u;
    int ntensors;
    ff_tensor *tensors; /* [ntensors] */
    /* The sender's ZeroMQ routing id (on a ROUTER). */
    uint8_t peer[FF_MSG_MAX_ROUTING_ID];
    size_t peer_len;
    /* After a rejected receive (ff_msg_recv / ff_msg_decode returned -1): the type and id the
     * header names, read as far as its first items are well formed (0 when not, or for types
     * without an id), so the receiver can tell the sender which subtask it refused. */
    int rejected_type;
    uint64_t rejected_id;
    /* private: frames and storage */
    zmq_msg_t header;    /* the received header frame (args point into it) */
    bool has_header;
    zmq_msg_t *frames;   /* [ntensors], one per tensor */
    void **owned;        /* [ntensors], realigned copies of misaligned received frames */
    int cap;
    int32_t *member_buf;
    int member_cap;
} ff_msg;

void ff_msg_init(ff_msg *m);
/* Close frames (their free functions run when ZeroMQ is done) and forget the body; keeps
 * buffers for reuse. */
void ff_msg_reset(ff_msg *m);
void ff_msg_free(ff_msg *m); /* reset and free buffers */

/* ---- building outgoing messages -------------------------------------------------------- */
/* Start a message of this type (resets m). Fill m->u.<type> afterwards. */
void ff_msg_begin(ff_msg *m, ff_msg_type type);
/* Append a tensor frame. With free_fn, the data is handed over without a copy: ZeroMQ calls
 * free_fn(data, hint) when the last frame referring to it is gone (possibly on one of its
 * I/O threads, possibly after ff_msg_reset). Without free_fn the bytes are copied now.
 * On failure (bad shape, out of memory) free_fn is still called. Returns the tensor or NULL
 * + error. */
ff_tensor *ff_msg_add_tensor(ff_msg *m, const char *name, ff_dtype dtype, int ndim, const int64_t *shape,
                             void *data, void (*free_fn)(void *data, void *hint), void *hint);
/* Append a tensor that shares the frame of tensor `index` of `src` (reference counted, no
 * copy), optionally renamed (name NULL keeps it). */
ff_tensor *ff_msg_add_tensor_ref(ff_msg *m, const ff_msg *src, int index, const char *name);
/* A reference-counted buffer that several frames share (a batch split by rows, one slice
 * per DP rank): free_fn(data, hint) runs when the last reference is released. Thread-safe
 * (ZeroMQ releases frames on its I/O threads). */
typedef struct ff_shared_buf ff_shared_buf;
ff_shared_buf *ff_shared_buf_new(void *data, void (*free_fn)(void *data, void *hint), void *hint);
void ff_shared_buf_release(ff_shared_buf *b);
/* Append a tensor whose bytes are data(b) + offset, taking a reference on b. */
ff_tensor *ff_msg_add_tensor_shared(ff_msg *m, const char *name, ff_dtype dtype, int ndim, const int64_t *shape,
                                    ff_shared_buf *b, size_t offset);
/* A tensor kept beyond the life of its message, sharing the frame (no copy): for results
 * an embedding program stores (ff_result.msg). Thread-safe to free from any thread. */
typedef struct ff_tensor_ref {
    ff_tensor t; /* t.data stays valid until ff_tensor_ref_free */
    /* private */
    zmq_msg_t frame;
    void *owned;
} ff_tensor_ref;
ff_tensor_ref *ff_tensor_ref_new(const ff_msg *m, int index); /* NULL + error */
void ff_tensor_ref_free(ff_tensor_ref **r);

/* Members of a group setup message (copied into m). */
int ff_msg_set_members(ff_msg *m, const int32_t *ranks, int n);

/* Pack the header of m into buf (cap bytes). Returns its length, or -1 + error (too large,
 * a string too long). */
long ff_msg_pack(const ff_msg *m, void *buf, size_t cap);

/* Send m on a socket, to `peer` on a ROUTER (peer NULL on a DEALER). Tensor frames are
 * shared, not consumed: m still holds them afterwards, so the same message can be sent
 * again. Returns 0, or -1 + error (errno-style detail: EHOSTUNREACH when the ROUTER does
 * not know the peer, EAGAIN when the socket would block). */
int ff_msg_send(void *sock, const void *peer, size_t peer_len, const ff_msg *m);
/* Send a pre-packed header with m's tensor frames (the controller keeps packed headers of
 * subtasks it may re-send). */
int ff_msg_send_packed(void *sock, const void *peer, size_t peer_len, const void *hdr, size_t hdr_len,
                       const ff_msg *m);
/* Send a pre-packed header and frames (shared, not consumed). */
int ff_msg_send_frames(void *sock, const void *peer, size_t peer_len, const void *hdr, size_t hdr_len,
                       zmq_msg_t *frames, int nframes);

/* ---- decoding ----------------------------------------------------------------------- */
/* Why messages were rejected, counted by the decoder. */
typedef enum ff_reject {
    FF_REJECT_MALFORMED = 0, /* not msgpack, wrong shape, wrong field type */
    FF_REJECT_TRUNCATED,     /* header ends early, or fewer frames than tensors */
    FF_REJECT_OVERSIZED,     /* header, frame, count or string over its limit */
    FF_REJECT_UNKNOWN_TYPE,
    FF_REJECT_VERSION,
    FF_REJECT_FRAMES,        /* tensor frames that disagree with the header */
    FF_REJECT_COUNT
} ff_reject;

typedef struct ff_msg_stats {
    uint64_t received, rejected;
    uint64_t by_reason[FF_REJECT_COUNT];
    uint64_t realigned; /* tensor frames copied because ZeroMQ delivered them misaligned */
} ff_msg_stats;

const char *ff_reject_name(int reason);

typedef struct ff_msg_decoder ff_msg_decoder;

/* max_frame_bytes bounds every tensor frame (0 = 1 GiB). */
ff_msg_decoder *ff_msg_decoder_new(size_t max_frame_bytes);
void ff_msg_decoder_destroy(ff_msg_decoder **d);
const ff_msg_stats *ff_msg_decoder_stats(const ff_msg_decoder *d);

/* A frame as bytes, for decoding without ZeroMQ (tests, the fuzzer). */
typedef struct ff_frame {
    const void *data;
    size_t len;
} ff_frame;

/* Decode frames[0] (header) and frames[1..n-1] (tensors) into m. Tensor data points into
 * the given frames (or into realigned copies that m owns). Returns 0, or -1 + error (and
 * the reject counter of the reason is incremented; *reason set when not NULL). */
int ff_msg_decode(ff_msg_decoder *d, ff_msg *m, const ff_frame *frames, int nframes, ff_reject *reason);

/* Receive one whole multipart from sock without blocking and decode it into m. On a ROUTER
 * (router=true) the first frame is the sender's routing id, stored in m->peer. Returns 1 (a
 * valid message in m), 0 (nothing waiting), or -1 (a message arrived and was rejected:
 * error set, m->peer set so the caller can answer, all its frames consumed and released;
 * *reason set when not NULL) or -2 (socket error, errno set). */
int ff_msg_recv(ff_msg_decoder *d, void *sock, bool router, ff_msg *m, ff_reject *reason);

/* Send an ERROR message (code, ref, text) to peer; text longer than FF_MSG_TEXT_MAX - 1 is
 * cut in the middle. Best effort: failures are ignored. */
void ff_msg_send_error(void *sock, const void *peer, size_t peer_len, int code, uint64_t ref, const char *text);

/* Arguments of a decoded subtask by key. Return 0 and *out, or -1 + error naming the key
 * (missing, or of another type; ints convert to float). */
const ff_arg *ff_msg_find_arg(const ff_msg_subtask *s, const char *key);
int ff_msg_arg_int(const ff_msg_subtask *s, const char *key, int64_t *out);
int ff_msg_arg_float(const ff_msg_subtask *s, const char *key, double *out);
int ff_msg_arg_str(const ff_msg_subtask *s, const char *key, const char **p, size_t *len);

/* ---- CURVE ---------------------------------------------------------------------------- */
/* Write DIR/controller.key and DIR/worker.key (mode 0600): a server key pair for the
 * controller and a client key pair the controller accepts. 0 / -1 + error. */
int ff_curve_keygen(const char *dir);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

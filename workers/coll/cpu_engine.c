/* The cpu backend's progress engine: moves the frames of a set of channels over
 * non-blocking sockets with one poll() loop, checks every received header against the
 * call this rank is in, and watches every other connection of the communicators involved
 * so that a peer's death, departure or abort ends the call at once with its name. Not
 * here: which frames to send where (cpu_algos.c), connection setup (cpu_net.c). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/coll/coll_internal.h"

/* ---- headers -------------------------------------------------------------------------- */

void coll_hdr_encode(const coll_hdr *h, uint8_t out[COLL_HDR_BYTES]) {
    put32(out + 0, h->magic);
    out[4] = h->type;
    out[5] = h->op;
    out[6] = h->dtype;
    out[7] = h->redop;
    put32(out + 8, h->seq);
    put32(out + 12, h->len);
    put64(out + 16, h->count);
    put32(out + 24, h->root);
    put32(out + 28, h->frame);
    put32(out + 32, h->coll);
    put32(out + 36, h->reserved);
}

void coll_hdr_decode(const uint8_t in[COLL_HDR_BYTES], coll_hdr *h) {
    h->magic = get32(in + 0);
    h->type = in[4];
    h->op = in[5];
    h->dtype = in[6];
    h->redop = in[7];
    h->seq = get32(in + 8);
    h->len = get32(in + 12);
    h->count = get64(in + 16);
    h->root = get32(in + 24);
    h->frame = get32(in + 28);
    h->coll = get32(in + 32);
    h->reserved = get32(in + 36);
}

const char *coll_op_name(int op) {
    static const char *names[OP_COUNT] = {
        [OP_NONE] = "none",
        [OP_ALL_REDUCE] = "all_reduce",
        [OP_BROADCAST] = "broadcast",
        [OP_ALL_GATHER] = "all_gather",
        [OP_REDUCE_SCATTER] = "reduce_scatter",
        [OP_ALL_GATHER_V] = "all_gather_v",
        [OP_REDUCE_SCATTER_V] = "reduce_scatter_v",
        [OP_SEND] = "send",
        [OP_SPLIT] = "comm_split",
    };
    return op >= 0 && op < OP_COUNT && names[op] ? names[op] : "unknown call";
}

static const char *algo_name(int algo) {
    return algo == FF_COLL_ALGO_RING     ? "ring"
           : algo == FF_COLL_ALGO_DIRECT ? "direct"
           : algo == FF_COLL_ALGO_STAR   ? "star"
                                         : "auto";
}

void coll_describe(char *buf, size_t cap, int op, int dtype, int redop_algo, uint64_t count, int root) {
    int redop = redop_algo & 15, algo = redop_algo >> 4;
    const char *dt = (unsigned)dtype < FF_DTYPE_COUNT ? ff_dtype_name((ff_dtype)dtype) : "?";
    switch (op) {
    case OP_ALL_REDUCE:
    case OP_REDUCE_SCATTER:
        snprintf(buf, cap, "%s(count=%llu, %s, %s, %s)", coll_op_name(op), (unsigned long long)count, dt,
                 ff_coll_redop_name((ff_coll_redop)redop), algo_name(algo));
        break;
    case OP_REDUCE_SCATTER_V:
        snprintf(buf, cap, "%s(counts hash=%016llx, %s, %s, %s)", coll_op_name(op), (unsigned long long)count, dt,
                 ff_coll_redop_name((ff_coll_redop)redop), algo_name(algo));
        break;
    case OP_ALL_GATHER_V:
        snprintf(buf, cap, "%s(counts hash=%016llx, %s, %s)", coll_op_name(op), (unsigned long long)count, dt,
                 algo_name(algo));
        break;
    case OP_BROADCAST:
        snprintf(buf, cap, "broadcast(count=%llu, %s, root=%d, %s)", (unsigned long long)count, dt, root,
                 algo_name(algo));
        break;
    case OP_SEND:
    case OP_SPLIT:
        snprintf(buf, cap, "%s(count=%llu, %s)", coll_op_name(op), (unsigned long long)count, dt);
        break;
    default:
        snprintf(buf, cap, "%s(count=%llu, %s, %s)", coll_op_name(op), (unsigned long long)count, dt, algo_name(algo));
    }
}

/* This rank's side of a channel's call: a receive of OP_SEND is a "recv". */
static void describe_local(char *buf, size_t cap, const coll_chan *ch) {
    if (ch->h.op == OP_SEND)
        snprintf(buf, cap, "%s(count=%llu, %s, peer=%d)", ch->tx ? "send" : "recv", (unsigned long long)ch->h.count,
                 ff_dtype_name((ff_dtype)ch->h.dtype), ch->peer);
    else
        coll_describe(buf, cap, ch->h.op, ch->h.dtype, ch->h.redop, ch->h.count, (int)ch->h.root);
}

/* ---- simple channels ------------------------------------------------------------------- */

static int simple_frame(void *ctx, coll_chan *ch, size_t k, uint8_t **ptr, size_t *len) {
    (void)ctx;
    size_t slice = ch->comm->cpu.slice;
    size_t off = k * slice;
    *ptr = ch->buf + off;
    *len = ch->bytes - off < slice ? ch->bytes - off : slice;
    return 1;
}

void coll_chan_simple(coll_chan *ch, ff_coll_comm *c, int peer, bool tx, const coll_hdr *h, void *buf,
                      size_t bytes) {
    memset(ch, 0, sizeof *ch);
    ch->comm = c;
    ch->peer = peer;
    ch->tx = tx;
    ch->h = *h;
    ch->buf = buf;
    ch->bytes = bytes;
    size_t slice = c->cpu.slice;
    ch->nframes = bytes ? (bytes + slice - 1) / slice : 1; /* an empty call still sends a header */
    ch->frame = simple_frame;
}

/* ---- peers that go away ---------------------------------------------------------------- */

/* Read n bytes within `ms` milliseconds (the rest of a frame already on its way). */
static int read_soon(int fd, uint8_t *buf, size_t n, int ms) {
    int64_t deadline = ff_now_ns() + (int64_t)ms * 1000000;
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0) return -1;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        int64_t left = (deadline - ff_now_ns()) / 1000000;
        if (left <= 0) return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, (int)left);
    }
    return 0;
}

/* The channels of the engine run in progress on this thread (to find, when a send fails,
 * how far the receive on the same connection is). */
static _Thread_local coll_chan *g_run_chans;
static _Thread_local size_t g_run_n;

static bool chan_done(const coll_chan *ch) { return ch->k >= ch->nframes; }

/* "rank 2 (receive frame 0 of 1), rank 3 (send frame 4 of 9)": what this rank still waits
 * for in the engine run in progress. */
static void pending_list(char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < g_run_n && len + 80 < cap; i++) {
        const coll_chan *ch = &g_run_chans[i];
        if (chan_done(ch)) continue;
        len += (size_t)snprintf(buf + len, cap - len, "%srank %d (%s frame %zu of %zu)", len ? ", " : "", ch->peer,
                                ch->tx ? "send" : "receive", ch->k, ch->nframes);
    }
}

/* The reason of the last ABORT this thread received: when this rank breaks in turn it
 * forwards that root cause instead of wrapping it once more per hop. */
static _Thread_local char g_forward[COLL_ABORT_MAX + 1];

const char *coll_take_forward_reason(void) {
    static _Thread_local char out[COLL_ABORT_MAX + 1];
    memcpy(out, g_forward, sizeof out);
    g_forward[0] = '\0';
    return out[0] ? out : NULL;
}

static int report_abort(coll_conn *cn, const char *reason, const char *call);

/* The peer sent an ABORT header (already read): read its reason and set the error. */
static int abort_error(coll_conn *cn, const coll_hdr *h, const char *call) {
    char reason[COLL_ABORT_MAX + 1] = "(reason not received)";
    size_t n = h->len < COLL_ABORT_MAX ? h->len : COLL_ABORT_MAX;
    if (h->len <= COLL_ABORT_MAX && read_soon(cn->fd, (uint8_t *)reason, n, 1000) == 0) reason[n] = '\0';
    if (cn->rx_fifo && !coll_shm_rx_empty(cn)) {
        /* the notice overtook frames still in the FIFO: a receive in progress reads them
         * first (they may explain the abort), as it would over TCP */
        for (size_t i = 0; i < g_run_n; i++) {
            const coll_chan *o = &g_run_chans[i];
            if (!o->tx && o->k < o->nframes && &o->comm->cpu.conns[o->peer] == cn) {
                free(cn->abort_reason);
                cn->abort_reason = strdup(reason);
                cn->state = PEER_ABORTED;
                return 0;
            }
        }
    }
    return report_abort(cn, reason, call);
}

static int report_abort(coll_conn *cn, const char *reason, const char *call) {
    cn->state = PEER_ABORTED; /* it reads no more: nothing to tell it, nothing to flush to it */
    snprintf(g_forward, sizeof g_forward, "%s", reason);
    char waits[512];
    pending_list(waits, sizeof waits);
    if (waits[0])
        return ff_error_set(call, NULL, "rank %d aborted the communicator: %s; this rank was still waiting for %s",
                            cn->peer, reason, waits);
    return ff_error_set(call, NULL, "rank %d aborted the communicator: %s", cn->peer, reason);
}

static int left_error(coll_conn *cn, const char *call) {
    return ff_error_set(call, "every rank must make the same calls before destroying its communicator",
                        "rank %d destroyed its communicator (left) while this rank still needs it", cn->peer);
}

static int died_error(coll_conn *cn, const char *call, const char *what) {
    return ff_error_set(call, "look at that rank's log; the communicator is broken, rebuild the group",
                        "rank %d died or lost its connection (%s)", cn->peer, what);
}

/* A watched (idle) connection signalled a hang-up or error. Returns -1 + error if the peer
 * aborted the communicator. A peer that died is only marked DEAD: this call may not need
 * it (its part may be done), and the ranks that do need it fail and tell everyone. 0 also
 * when it left cleanly or closed with data still queued for a later call of ours. */
static int classify_hangup(coll_conn *cn, const char *call) {
    uint8_t hb[COLL_HDR_BYTES];
    ssize_t r;
    do r = recv(cn->fd, hb, sizeof hb, MSG_PEEK | MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        cn->state = PEER_DEAD;
        return 0;
    }
    if (r < 0) return 0; /* spurious wake-up */
    if (r < COLL_HDR_BYTES) {
        cn->state = PEER_SENT_AHEAD;
        return 0;
    }
    coll_hdr h;
    coll_hdr_decode(hb, &h);
    if (h.magic == COLL_FRAME_MAGIC && h.type == FRAME_BYE) {
        (void)recv(cn->fd, hb, sizeof hb, MSG_DONTWAIT); /* consume it */
        cn->state = PEER_LEFT;
        return 0;
    }
    if (h.magic == COLL_FRAME_MAGIC && h.type == FRAME_ABORT) {
        (void)recv(cn->fd, hb, sizeof hb, MSG_DONTWAIT);
        return abort_error(cn, &h, call);
    }
    cn->state = PEER_SENT_AHEAD;
    return 0;
}

/* Bytes to skip on ch's connection to reach the next frame boundary of the incoming
 * stream, or -1 if unknown (a header partly read). */
static long bytes_to_boundary(const coll_chan *ch) {
    for (size_t i = 0; i < g_run_n; i++) {
        const coll_chan *o = &g_run_chans[i];
        if (o->tx || o->comm != ch->comm || o->peer != ch->peer || !o->started || o->k >= o->nframes) continue;
        if (o->off == 0) return 0;
        if (o->off < COLL_HDR_BYTES) return -1;
        return (long)(COLL_HDR_BYTES + o->len - o->off);
    }
    return 0;
}

/* A channel's socket failed or hit end of stream. */
static int lost_error(coll_chan *ch, const char *call, int err) {
    coll_conn *cn = &ch->comm->cpu.conns[ch->peer];
    if (cn->state == PEER_LEFT) return left_error(cn, call);
    if (cn->state == PEER_DEAD) return died_error(cn, call, "its connection closed without a goodbye");
    if (cn->state == PEER_ABORTED) return report_abort(cn, cn->abort_reason ? cn->abort_reason : "?", call);
    if (ch->tx && !cn->tx_fifo) {
        /* The peer may have said why before closing: an ABORT follows the frame it was
         * sending us (it pads that frame), and received bytes survive a reset. */
        long skip = bytes_to_boundary(ch);
        uint8_t sink[4096];
        while (skip > 0) {
            size_t k = (size_t)skip < sizeof sink ? (size_t)skip : sizeof sink;
            if (read_soon(cn->fd, sink, k, 200)) break;
            skip -= (long)k;
        }
        uint8_t hb[COLL_HDR_BYTES];
        ssize_t r = skip == 0 ? recv(cn->fd, hb, sizeof hb, MSG_PEEK | MSG_DONTWAIT) : -1;
        if (r == COLL_HDR_BYTES) {
            coll_hdr h;
            coll_hdr_decode(hb, &h);
            if (h.magic == COLL_FRAME_MAGIC && h.type == FRAME_BYE) return left_error(cn, call);
            if (h.magic == COLL_FRAME_MAGIC && h.type == FRAME_ABORT) {
                (void)recv(cn->fd, hb, sizeof hb, MSG_DONTWAIT);
                return abort_error(cn, &h, call);
            }
        }
    }
    return died_error(cn, call, err ? strerror(err) : "connection closed");
}

/* A shared-memory connection's socket is readable: consume its control frames. KICKs
 * only wake us; BYE and end of stream mark the peer LEFT or DEAD (what it already put in
 * the FIFO can still be read); ABORT fails the call. */
static int drain_control(coll_conn *cn, const char *call) {
    for (;;) {
        ssize_t r = recv(cn->fd, cn->ctl + cn->ctl_off, COLL_HDR_BYTES - cn->ctl_off, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (r <= 0) {
            if (cn->state == PEER_LIVE) cn->state = PEER_DEAD;
            return 0;
        }
        cn->ctl_off += (size_t)r;
        if (cn->ctl_off < COLL_HDR_BYTES) continue;
        cn->ctl_off = 0;
        coll_hdr h;
        coll_hdr_decode(cn->ctl, &h);
        if (h.magic != COLL_FRAME_MAGIC)
            return ff_error_set(call, NULL, "rank %d sent a corrupt control frame", cn->peer);
        if (h.type == FRAME_BYE) cn->state = PEER_LEFT;
        if (h.type == FRAME_ABORT) return abort_error(cn, &h, call);
    }
}

static bool gone(const coll_conn *cn) {
    return cn->state == PEER_LEFT || cn->state == PEER_DEAD || cn->state == PEER_ABORTED;
}

/* Bytes moved; 0 would block; -1 + errno (0: end of stream). */
static ssize_t xsend(coll_conn *cn, struct iovec *iov, int niov) {
    if (cn->tx_fifo) {
        if (gone(cn)) {
            errno = EPIPE;
            return -1;
        }
        return coll_shm_write(cn, iov, niov);
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    for (;;) {
        ssize_t r = sendmsg(cn->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r >= 0) return r;
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
}

static ssize_t xrecv(coll_conn *cn, uint8_t *buf, size_t len) {
    if (cn->rx_fifo) {
        ssize_t r = coll_shm_read(cn, buf, len);
        if (r == 0 && gone(cn) && coll_shm_rx_empty(cn)) {
            errno = 0;
            return -1;
        }
        return r;
    }
    for (;;) {
        ssize_t r = recv(cn->fd, buf, len, MSG_DONTWAIT);
        if (r > 0) return r;
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
}

int coll_check_peers(ff_coll_comm *c, const char *call) {
    for (int r = 0; r < c->nranks; r++) {
        coll_conn *cn = &c->cpu.conns[r];
        if (cn->state == PEER_DEAD) return died_error(cn, call, "its connection closed without a goodbye");
        if (cn->state == PEER_ABORTED) return report_abort(cn, cn->abort_reason ? cn->abort_reason : "?", call);
    }
    return 0;
}

/* ---- moving frames ---------------------------------------------------------------------- */

enum { STEP_DONE = 0, STEP_WAIT_IO, STEP_NOT_READY, STEP_ERROR };

static int check_header(coll_chan *ch, const coll_hdr *h, const char *call) {
    coll_conn *cn = &ch->comm->cpu.conns[ch->peer];
    if (h->magic != COLL_FRAME_MAGIC)
        return ff_error_set(call, "a process that is not this group's rank may have connected",
                            "rank %d sent bytes that are not a fuseflow collectives frame (magic %08x)",
                            ch->peer, h->magic);
    if (h->type == FRAME_BYE) {
        cn->state = PEER_LEFT;
        return left_error(cn, call);
    }
    if (h->type == FRAME_ABORT) return abort_error(cn, h, call);
    if (h->type != FRAME_DATA)
        return ff_error_set(call, NULL, "rank %d sent a frame of unknown type %u", ch->peer, h->type);
    if (h->op != ch->h.op || h->dtype != ch->h.dtype || h->redop != ch->h.redop || h->count != ch->h.count ||
        h->root != ch->h.root || h->seq != ch->h.seq || h->coll != ch->h.coll) {
        char theirs[160], which[64];
        coll_describe(theirs, sizeof theirs, h->op, h->dtype, h->redop, h->count, (int)h->root);
        if (h->coll || ch->h.coll)
            snprintf(which, sizeof which, "collective #%u (this rank: #%u)", h->coll, ch->h.coll);
        else
            snprintf(which, sizeof which, "message #%u to this rank (this rank: #%u)", h->seq, ch->h.seq);
        return ff_error_set(call,
                            "every rank must make the same collective calls in the same order with the same "
                            "count, dtype, op and root, and each send must match a recv of the same count",
                            "mismatched calls: rank %d sent %s as its %s", ch->peer, theirs, which);
    }
    if (h->frame != ch->k)
        return ff_error_set(call, NULL, "rank %d sent frame %u, expected frame %zu (corrupt stream)", ch->peer,
                            h->frame, ch->k);
    return 0;
}

/* Advance a channel as far as the socket allows. *moved is set when bytes moved. */
static int step(coll_chan *ch, bool *moved, const char *call) {
    coll_conn *cn = &ch->comm->cpu.conns[ch->peer];
    if (!ch->started) {
        ch->started = true;
        ch->h.seq = ch->tx ? ++cn->tx_seq : ++cn->rx_seq;
    }
    while (ch->k < ch->nframes) {
        if (ch->tx) {
            if (ch->off == 0) {
                if (!ch->frame(ch->ctx, ch, ch->k, &ch->ptr, &ch->len)) return STEP_NOT_READY;
                coll_hdr h = ch->h;
                h.magic = COLL_FRAME_MAGIC;
                h.type = FRAME_DATA;
                h.frame = (uint32_t)ch->k;
                h.len = (uint32_t)ch->len;
                coll_hdr_encode(&h, ch->hbuf);
            }
            struct iovec iov[2];
            int niov = 0;
            if (ch->off < COLL_HDR_BYTES) {
                iov[niov++] = (struct iovec){ch->hbuf + ch->off, COLL_HDR_BYTES - ch->off};
                if (ch->len) iov[niov++] = (struct iovec){ch->ptr, ch->len};
            } else {
                size_t p = ch->off - COLL_HDR_BYTES;
                iov[niov++] = (struct iovec){ch->ptr + p, ch->len - p};
            }
            ssize_t r = xsend(cn, iov, niov);
            if (r == 0) return STEP_WAIT_IO;
            if (r < 0) {
                lost_error(ch, call, errno);
                return STEP_ERROR;
            }
            *moved = true;
            ch->off += (size_t)r;
            size_t total = COLL_HDR_BYTES + ch->len;
            if (!cn->tx_fifo) cn->tx_frame_left = (uint32_t)(total - ch->off); /* for an abort's padding */
            if (ch->off == total) {
                ch->k++;
                ch->off = 0;
            }
        } else {
            if (ch->off < COLL_HDR_BYTES) {
                ssize_t r = xrecv(cn, ch->hbuf + ch->off, COLL_HDR_BYTES - ch->off);
                if (r == 0) return STEP_WAIT_IO;
                if (r < 0) {
                    lost_error(ch, call, errno);
                    return STEP_ERROR;
                }
                *moved = true;
                ch->off += (size_t)r;
                if (ch->off < COLL_HDR_BYTES) continue;
                coll_hdr h;
                coll_hdr_decode(ch->hbuf, &h);
                if (check_header(ch, &h, call)) return STEP_ERROR;
                ch->ptr = NULL;
                ch->len = h.len; /* checked against the destination below */
            }
            if (!ch->ptr) {
                size_t sent_len = ch->len;
                if (!ch->frame(ch->ctx, ch, ch->k, &ch->ptr, &ch->len)) {
                    ch->len = sent_len;
                    ch->ptr = NULL;
                    return STEP_NOT_READY;
                }
                if (sent_len != ch->len) {
                    ff_error_set(call, "all ranks must use the same FF_COLL_SLICE_BYTES and options",
                                 "rank %d sent frame %zu with %zu bytes, this rank expected %zu", ch->peer, ch->k,
                                 sent_len, ch->len);
                    return STEP_ERROR;
                }
            }
            size_t p = ch->off - COLL_HDR_BYTES;
            if (p < ch->len) {
                ssize_t r = xrecv(cn, ch->ptr + p, ch->len - p);
                if (r == 0) return STEP_WAIT_IO;
                if (r < 0) {
                    lost_error(ch, call, errno);
                    return STEP_ERROR;
                }
                *moved = true;
                ch->off += (size_t)r;
            }
            if (ch->off == COLL_HDR_BYTES + ch->len) {
                if (ch->landed) ch->landed(ch->ctx, ch, ch->k);
                ch->k++;
                ch->off = 0;
                ch->ptr = NULL;
            }
        }
    }
    return STEP_DONE;
}

/* ---- the loop ---------------------------------------------------------------------------- */

/* Channels on one connection and direction run one after the other, in list order. */
static bool eligible(const coll_chan *chans, size_t i) {
    for (size_t j = 0; j < i; j++)
        if (!chan_done(&chans[j]) && chans[j].comm == chans[i].comm && chans[j].peer == chans[i].peer &&
            chans[j].tx == chans[i].tx)
            return false;
    return true;
}

#define MAX_COMMS 16

static int timeout_error(double secs, const char *call) {
    char list[1024];
    pending_list(list, sizeof list);
    return ff_error_set(call,
                        "a rank may be hung or may have skipped this call; options.timeout_s or "
                        "FF_COLL_TIMEOUT_S sets the timeout",
                        "nothing moved for %.1f s; waiting for %s", secs, list);
}

int coll_engine_run(coll_chan *chans, size_t n) { return coll_engine_run_opt(chans, n, 0); }

int coll_engine_run_opt(coll_chan *chans, size_t n, size_t optional) {
    if (n == 0) return 0;
    ff_coll_comm *comms[MAX_COMMS];
    size_t ncomms = 0;
    double timeout_s = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < ncomms && comms[j] != chans[i].comm) j++;
        if (j == ncomms) {
            if (ncomms == MAX_COMMS)
                return ff_error_set("ff_coll_group_end", "split the group", "more than %d communicators in one group",
                                    MAX_COMMS);
            comms[ncomms++] = chans[i].comm;
            if (timeout_s == 0 || chans[i].comm->timeout_s < timeout_s) timeout_s = chans[i].comm->timeout_s;
        }
    }
    /* pollfd slots: one per channel plus one per watched connection */
    size_t watch_cap = 0;
    for (size_t j = 0; j < ncomms; j++) watch_cap += (size_t)comms[j]->nranks;
    size_t cap = n + watch_cap;
    struct pollfd stack_pfd[64];
    int stack_who[64];
    struct pollfd *pfd = stack_pfd;
    int *who = stack_who; /* >= 0: channel index; < 0: -(watched index) - 1 */
    coll_conn *stack_watched[64];
    coll_conn **watched = stack_watched;
    if (cap > 64) {
        pfd = ff_malloc(cap * sizeof *pfd);
        who = ff_malloc(cap * sizeof *who);
        watched = ff_malloc(cap * sizeof *watched);
        if (!pfd || !who || !watched) {
            if (pfd != stack_pfd) free(pfd);
            if (who != stack_who) free(who);
            if (watched != stack_watched) free(watched);
            return -1;
        }
    }
    char call[200];
    describe_local(call, sizeof call, &chans[0]);
    int rc = 0;
    g_run_chans = chans;
    g_run_n = n;
    for (size_t i = 0; i < n; i++) {
        coll_conn *cn = &chans[i].comm->cpu.conns[chans[i].peer];
        if (cn->state == PEER_DEAD || cn->state == PEER_ABORTED || (cn->state == PEER_LEFT && chans[i].tx)) {
            describe_local(call, sizeof call, &chans[i]);
            if (cn->state == PEER_DEAD)
                died_error(cn, call, "its connection closed without a goodbye");
            else if (cn->state == PEER_ABORTED)
                report_abort(cn, cn->abort_reason ? cn->abort_reason : "?", call);
            else
                left_error(cn, call);
            rc = -1;
            goto out;
        }
    }
    int64_t last = ff_now_ns();
    for (;;) {
        bool moved = false, all_done = true, any_io = false;
        for (size_t i = 0; i < n; i++) {
            if (chan_done(&chans[i])) continue;
            if (i >= optional) all_done = false;
            if (!eligible(chans, i)) continue;
            describe_local(call, sizeof call, &chans[i]);
            if (step(&chans[i], &moved, call) == STEP_ERROR) {
                rc = -1;
                goto out;
            }
        }
        if (all_done) break;
        if (moved) {
            last = ff_now_ns();
            continue;
        }
        /* Nothing moved: sleep until a socket is ready, a watched peer hangs up, or the
         * timeout. Channels waiting on another channel (NOT_READY) need no wake-up of their
         * own: that channel's progress wakes the loop. */
        size_t np = 0, nw = 0;
        for (size_t i = 0; i < n; i++) {
            coll_chan *ch = &chans[i];
            if (chan_done(ch) || !eligible(chans, i)) continue;
            if (ch->tx && ch->off == 0 && ch->started) {
                uint8_t *p;
                size_t l;
                if (!ch->frame(ch->ctx, ch, ch->k, &p, &l)) continue; /* waits for a receive */
            }
            coll_conn *cn = &ch->comm->cpu.conns[ch->peer];
            /* shared memory: sleep until a KICK (or a control frame) comes on the socket */
            short ev = cn->tx_fifo ? POLLIN : ch->tx ? POLLOUT : POLLIN;
            pfd[np] = (struct pollfd){.fd = cn->fd, .events = (short)(ev | POLLRDHUP)};
            who[np++] = (int)i;
            any_io = true;
        }
        if (!any_io) {
            rc = ff_error_set(call, "this is a bug in ff_coll; please report it",
                              "internal error: no channel can make progress");
            goto out;
        }
        for (size_t j = 0; j < ncomms; j++) {
            ff_coll_comm *c = comms[j];
            for (int r = 0; r < c->nranks; r++) {
                coll_conn *cn = &c->cpu.conns[r];
                if (cn->fd < 0 || cn->state != PEER_LIVE) continue;
                bool busy = false;
                for (size_t i = 0; i < n && !busy; i++)
                    busy = !chan_done(&chans[i]) && chans[i].comm == c && chans[i].peer == r;
                if (busy) continue;
                watched[nw] = cn;
                pfd[np] = (struct pollfd){.fd = cn->fd, .events = (short)(cn->tx_fifo ? POLLIN | POLLRDHUP : POLLRDHUP)};
                who[np++] = -(int)nw - 1;
                nw++;
            }
        }
        int64_t left_ms = (last + (int64_t)(timeout_s * 1e9) - ff_now_ns()) / 1000000;
        if (left_ms <= 0) {
            rc = timeout_error(timeout_s, call);
            goto out;
        }
        int pr = poll(pfd, (nfds_t)np, left_ms > 1000000 ? 1000000 : (int)left_ms);
        if (pr < 0 && errno != EINTR) {
            rc = ff_error_set(call, NULL, "poll failed: %s", strerror(errno));
            goto out;
        }
        for (size_t p = 0; pr > 0 && p < np; p++) {
            short ev = pfd[p].revents;
            if (!ev) continue;
            coll_conn *pc = who[p] < 0 ? watched[-who[p] - 1] : &chans[who[p]].comm->cpu.conns[chans[who[p]].peer];
            if (pc->tx_fifo) { /* shared memory: the socket carries control frames only */
                if (pc->state == PEER_LIVE && drain_control(pc, call)) {
                    rc = -1;
                    goto out;
                }
                continue;
            }
            if (who[p] < 0) {
                if (classify_hangup(pc, call)) {
                    rc = -1;
                    goto out;
                }
                continue;
            }
            /* A send whose peer hung up and takes no more bytes would spin here: find out
             * why, unless a receive on the same connection will read it anyway. */
            coll_chan *ch = &chans[who[p]];
            if (!ch->tx || (ev & POLLOUT) || !(ev & (POLLRDHUP | POLLHUP | POLLERR))) continue;
            bool reader = false;
            for (size_t i = 0; i < n && !reader; i++)
                reader = !chans[i].tx && !chan_done(&chans[i]) && chans[i].comm == ch->comm &&
                         chans[i].peer == ch->peer && eligible(chans, i);
            if (reader) continue;
            describe_local(call, sizeof call, ch);
            coll_conn *cn = &ch->comm->cpu.conns[ch->peer];
            if (classify_hangup(cn, call) == 0) {
                if (cn->state == PEER_LEFT)
                    left_error(cn, call);
                else
                    died_error(cn, call,
                               cn->state == PEER_DEAD ? "its connection closed without a goodbye"
                                                      : "it stopped reading and closed its side");
            }
            rc = -1;
            goto out;
        }
    }
out:
    g_run_chans = NULL;
    g_run_n = 0;
    if (pfd != stack_pfd) free(pfd);
    if (who != stack_who) free(who);
    if (watched != stack_watched) free(watched);
    return rc;
}

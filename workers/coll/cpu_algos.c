/* The cpu backend's algorithms, expressed as channels for the progress engine.
 *
 * Large messages: the pipelined ring (bandwidth-optimal: each rank sends and receives
 * 2(n-1)/n of the buffer for an all-reduce). The buffer is cut into n chunks (the first
 * count % n chunks one element longer), each chunk into slice-sized frames. Reduce-scatter
 * step s: rank r sends chunk r-s-1 and receives chunk r-s-2 (mod n), adding its own
 * contribution as each frame lands; after n-1 steps it owns the full reduction of chunk r.
 * All-gather step t: it sends chunk r-t and receives chunk r-t-1. A frame received at one
 * step is the frame sent at the next, so forwarding starts as soon as the first frame of
 * a step has landed (the pipeline), and received data lands in place (no staging copy)
 * except the one slice being reduced. Broadcast uses the same machinery as a chain from
 * the root.
 *
 * Small messages: the direct exchange (one step, latency-optimal): every rank sends its
 * data to every rank that needs it, then reduces the n contributions in rank order.
 *
 * Determinism: in both, each element of the result is reduced exactly once, in an order
 * fixed by (count, nranks, algorithm), and copied to the other ranks: every rank holds
 * the same bits. The choice between the two depends only on sizes and options, which are
 * the same on every rank (and checked in every frame header). */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/coll/coll_internal.h"


static size_t nframes_of(size_t bytes, size_t slice) { return bytes ? (bytes + slice - 1) / slice : 1; }

/* ---- the ring ------------------------------------------------------------------------ */

typedef struct ring_seg {
    uint8_t *dst;         /* where this segment's data ends up (reduced or copied) */
    const uint8_t *local; /* reduce: this rank's contribution; NULL: a plain copy */
    size_t bytes;
    int div;              /* AVG's last step: divide by nranks */
    size_t first, nf;     /* frames: global index of the first, how many */
} ring_seg;

typedef struct ring {
    size_t slice, es;
    ff_dtype dtype;
    ff_coll_redop redop;
    ring_seg *rx;
    size_t nrx, rx_frames;
    const uint8_t *lead; /* tx: this rank's own data sent first (NULL: none) */
    size_t lead_bytes, lead_frames;
    size_t nfwd;         /* rx segments forwarded to the next rank */
    uint8_t *staging;    /* one slice: a frame being received for a reduction */
    coll_chan *rxch;
    size_t rxcur, txcur; /* segment cursors (frames only move forward) */
} ring;

static void seg_frame(const ring *g, size_t s, size_t k, size_t *j_off, size_t *len) {
    size_t j = k - g->rx[s].first;
    *j_off = j * g->slice;
    size_t rest = g->rx[s].bytes - *j_off;
    *len = rest < g->slice ? rest : g->slice;
}

static size_t seg_of(const ring *g, size_t *cur, size_t k) {
    while (*cur + 1 < g->nrx && k >= g->rx[*cur + 1].first) (*cur)++;
    return *cur;
}

static int ring_rx_frame(void *ctx, coll_chan *ch, size_t k, uint8_t **ptr, size_t *len) {
    (void)ch;
    ring *g = ctx;
    size_t s = seg_of(g, &g->rxcur, k), off;
    seg_frame(g, s, k, &off, len);
    *ptr = g->rx[s].local ? g->staging : g->rx[s].dst + off;
    return 1;
}

static void ring_rx_landed(void *ctx, coll_chan *ch, size_t k) {
    (void)ch;
    ring *g = ctx;
    size_t s = seg_of(g, &g->rxcur, k), off, len;
    seg_frame(g, s, k, &off, &len);
    const ring_seg *sg = &g->rx[s];
    if (sg->local)
        coll_reduce(sg->dst + off, g->staging, sg->local + off, len / g->es, g->dtype, g->redop, sg->div);
}

static int ring_tx_frame(void *ctx, coll_chan *ch, size_t k, uint8_t **ptr, size_t *len) {
    (void)ch;
    ring *g = ctx;
    if (k < g->lead_frames) {
        size_t off = k * g->slice, rest = g->lead_bytes - off;
        *ptr = (uint8_t *)g->lead + off;
        *len = rest < g->slice ? rest : g->slice;
        return 1;
    }
    size_t kk = k - g->lead_frames;
    if (g->rxch->k <= kk) return 0; /* not arrived yet */
    size_t s = seg_of(g, &g->txcur, kk), off;
    seg_frame(g, s, kk, &off, len);
    *ptr = g->rx[s].dst + off;
    return 1;
}

/* Run a ring: receive the segments rx[0..nrx) from `prev`, send lead then the first nfwd
 * received segments to `next` (either may be -1: no such channel). */
static int ring_run(ff_coll_comm *c, ring *g, const coll_hdr *h, int prev, int next) {
    g->slice = c->cpu.slice;
    size_t f = 0;
    for (size_t s = 0; s < g->nrx; s++) {
        g->rx[s].first = f;
        g->rx[s].nf = nframes_of(g->rx[s].bytes, g->slice);
        f += g->rx[s].nf;
    }
    g->rx_frames = f;
    g->lead_frames = g->lead ? nframes_of(g->lead_bytes, g->slice) : 0;
    coll_chan ch[2];
    size_t nch = 0;
    coll_chan *rxch = NULL;
    if (prev >= 0) {
        rxch = &ch[nch++];
        memset(rxch, 0, sizeof *rxch);
        *rxch = (coll_chan){.comm = c, .peer = prev, .tx = false, .h = *h, .nframes = g->rx_frames,
                            .frame = ring_rx_frame, .landed = ring_rx_landed, .ctx = g};
    }
    g->rxch = rxch;
    if (next >= 0) {
        size_t fwd = g->nfwd < g->nrx ? g->rx[g->nfwd].first : g->rx_frames;
        coll_chan *tx = &ch[nch++];
        *tx = (coll_chan){.comm = c, .peer = next, .tx = true, .h = *h, .nframes = g->lead_frames + fwd,
                          .frame = ring_tx_frame, .ctx = g};
    }
    return coll_engine_run(ch, nch);
}

/* Chunk byte offsets: off[i] .. off[i+1] is rank i's chunk. counts == NULL: `count`
 * elements split as evenly as possible (even == true) or `count` per rank. */
static void chunks(size_t *off, int n, size_t count, const size_t *counts, bool even, size_t es) {
    size_t base = even ? count / (size_t)n : count, extra = even ? count % (size_t)n : 0, o = 0;
    for (int i = 0; i < n; i++) {
        off[i] = o * es;
        o += counts ? counts[i] : base + ((size_t)i < extra);
    }
    off[n] = o * es;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Reduce-scatter then (optionally) all-gather around the ring. off: chunk byte offsets of
 * the full buffer. rs_out: where chunk r's result goes. mid: where the other chunks'
 * results go (all-reduce: recvbuf; reduce-scatter: a scratch the size of the input). */
static int ring_reduce(ff_coll_comm *c, const coll_call *call, const coll_hdr *h, const size_t *off,
                       uint8_t *mid, uint8_t *rs_out, bool gather) {
    int n = c->nranks, r = c->rank;
    const uint8_t *send = call->sendbuf;
    ring g = {.es = ff_dtype_size(call->dtype), .dtype = call->dtype, .redop = call->redop, .rx = c->cpu.w.segs};
    g.nrx = (size_t)(gather ? 2 * (n - 1) : n - 1);
    g.staging = coll_scratch(c, c->cpu.slice);
    if (!g.staging) return -1;
    for (int s = 0; s < n - 1; s++) {
        int ci = mod(r - s - 2, n);
        bool last = s == n - 2;
        g.rx[s] = (ring_seg){.dst = last ? rs_out : mid + off[ci], .local = send + off[ci],
                             .bytes = off[ci + 1] - off[ci],
                             .div = last && call->redop == FF_COLL_AVG ? n : 0};
    }
    for (int t = 0; gather && t < n - 1; t++) {
        int ci = mod(r - t - 1, n);
        g.rx[n - 1 + t] = (ring_seg){.dst = mid + off[ci], .bytes = off[ci + 1] - off[ci]};
    }
    int c0 = mod(r - 1, n);
    g.lead = send + off[c0];
    g.lead_bytes = off[c0 + 1] - off[c0];
    g.nfwd = g.nrx - 1;
    return ring_run(c, &g, h, mod(r - 1, n), mod(r + 1, n));
}

/* ---- the direct exchange ------------------------------------------------------------- */

/* Every rank sends w.tx[p] (w.tb[p] bytes) to each peer p and receives w.rb[p] bytes into
 * w.rx[p]; NULL entries are skipped. */
static int direct_run(ff_coll_comm *c, const coll_hdr *h) {
    int n = c->nranks;
    coll_work *w = &c->cpu.w;
    size_t nch = 0;
    /* sends in rank order starting after this rank, so the ranks do not all queue on
     * rank 0 at once */
    for (int i = 1; i < n; i++) {
        int p = (c->rank + i) % n;
        if (w->tx[p]) coll_chan_simple(&w->chans[nch++], c, p, true, h, (uint8_t *)w->tx[p], w->tb[p]);
    }
    for (int i = 1; i < n; i++) {
        int p = (c->rank - i + n) % n;
        if (w->rx[p]) coll_chan_simple(&w->chans[nch++], c, p, false, h, w->rx[p], w->rb[p]);
    }
    return coll_engine_run(w->chans, nch);
}

/* dst = slot[0] op slot[1] op ... op slot[n-1], left to right; AVG divides at the end. */
static void reduce_in_order(uint8_t *dst, const uint8_t *const *slot, int n, size_t count, ff_dtype dt,
                            ff_coll_redop op) {
    if (n == 1) {
        if (dst != slot[0]) memmove(dst, slot[0], count * ff_dtype_size(dt));
        return;
    }
    for (int i = 1; i < n; i++)
        coll_reduce(dst, i == 1 ? slot[0] : dst, slot[i], count, dt, op, i == n - 1 && op == FF_COLL_AVG ? n : 0);
}

/* The direct reduction shared by all-reduce and reduce-scatter: rank p sends the bytes at
 * send + off[p] (all_reduce: off[p] == 0 for every p) to p, and every rank reduces the n
 * contributions to its own part in rank order. */
static int direct_reduce(ff_coll_comm *c, const coll_call *call, const coll_hdr *h, const size_t *tx_off,
                         const size_t *tx_len, size_t mine) {
    int n = c->nranks, r = c->rank;
    coll_work *w = &c->cpu.w;
    const uint8_t *send = call->sendbuf;
    uint8_t *recv = call->recvbuf;
    uint8_t *scr = coll_scratch(c, (size_t)n * mine + 64);
    if (!scr) return -1;
    for (int p = 0; p < n; p++) {
        w->tx[p] = p == r ? NULL : send + tx_off[p];
        w->tb[p] = tx_len[p];
        w->rx[p] = p == r ? NULL : scr + (size_t)p * mine;
        w->rb[p] = mine;
        w->slot[p] = p == r ? send + tx_off[r] : scr + (size_t)p * mine;
    }
    if (recv == send + tx_off[r] && r != 0) { /* the result would overwrite our input first */
        memcpy(scr + (size_t)r * mine, send + tx_off[r], mine);
        w->slot[r] = scr + (size_t)r * mine;
    }
    if (direct_run(c, h)) return -1;
    reduce_in_order(recv, w->slot, n, mine / ff_dtype_size(call->dtype), call->dtype, call->redop);
    return 0;
}

/* ---- the collectives ----------------------------------------------------------------- */

static uint64_t counts_hash(const size_t *counts, int n) {
    uint64_t h = FF_HASH_FNV1A_INIT; /* over the counts as little-endian u64: every rank agrees */
    for (int i = 0; i < n; i++) {
        uint8_t le[8];
        for (int b = 0; b < 8; b++) le[b] = (uint8_t)((uint64_t)counts[i] >> (8 * b));
        h = ff_hash_fnv1a(le, sizeof le, h);
    }
    return h;
}

/* The argument must be the same on every rank (not this rank's share of a v-variant):
 * every rank must pick the same algorithm. */
static int choose_algo(const ff_coll_comm *c, size_t bytes_each_rank_sends) {
    if (c->algo == FF_COLL_ALGO_RING || c->algo == FF_COLL_ALGO_DIRECT) return c->algo;
    if (c->algo == FF_COLL_ALGO_STAR) return FF_COLL_ALGO_DIRECT; /* star is all_reduce's alone */
    return bytes_each_rank_sends <= c->cpu.direct_max ? FF_COLL_ALGO_DIRECT : FF_COLL_ALGO_RING;
}

/* The star all-reduce: every rank sends its buffer to rank 0, which reduces the n of them
 * in rank order (the same order, so the same bits, as the direct exchange) and sends the
 * result back. Two steps and 2(n-1) messages: the fewest wake-ups, which is what small
 * messages cost. */
static int star_all_reduce(ff_coll_comm *c, const coll_call *call, const coll_hdr *h, size_t bytes) {
    int n = c->nranks, r = c->rank;
    coll_work *w = &c->cpu.w;
    uint8_t *recv = call->recvbuf;
    if (r != 0) {
        coll_chan_simple(&w->chans[0], c, 0, true, h, (uint8_t *)call->sendbuf, bytes);
        coll_chan_simple(&w->chans[1], c, 0, false, h, recv, bytes);
        return coll_engine_run(w->chans, 2);
    }
    uint8_t *scr = coll_scratch(c, (size_t)n * bytes + 64);
    if (!scr) return -1;
    for (int p = 1; p < n; p++) coll_chan_simple(&w->chans[p - 1], c, p, false, h, scr + (size_t)p * bytes, bytes);
    if (coll_engine_run(w->chans, (size_t)n - 1)) return -1;
    w->slot[0] = call->sendbuf;
    for (int p = 1; p < n; p++) w->slot[p] = scr + (size_t)p * bytes;
    reduce_in_order(recv, w->slot, n, call->count, call->dtype, call->redop);
    for (int p = 1; p < n; p++) coll_chan_simple(&w->chans[p - 1], c, p, true, h, recv, bytes);
    return coll_engine_run(w->chans, (size_t)n - 1);
}

static coll_hdr make_hdr(const ff_coll_comm *c, const coll_call *call, int algo, uint64_t count, int root) {
    return (coll_hdr){.op = (uint8_t)call->op, .dtype = (uint8_t)call->dtype,
                      .redop = (uint8_t)((call->redop & 15) | (algo << 4)), .count = count, .root = (uint32_t)root,
                      .coll = c->cpu.coll_seq};
}

static int all_reduce(ff_coll_comm *c, const coll_call *call) {
    int n = c->nranks, r = c->rank;
    coll_work *w = &c->cpu.w;
    size_t es = ff_dtype_size(call->dtype), bytes = call->count * es;
    if (n == 1) {
        if (call->recvbuf != call->sendbuf) memmove(call->recvbuf, call->sendbuf, bytes);
        return 0;
    }
    int algo = c->algo == FF_COLL_ALGO_STAR                                   ? FF_COLL_ALGO_STAR
               : c->algo == FF_COLL_ALGO_AUTO && bytes * (size_t)(n - 1) <= c->cpu.star_max ? FF_COLL_ALGO_STAR
                                                                            : choose_algo(c, bytes * (size_t)(n - 1));
    coll_hdr h = make_hdr(c, call, algo, call->count, 0);
    if (algo == FF_COLL_ALGO_STAR) return star_all_reduce(c, call, &h, bytes);
    /* the ring needs every chunk non-empty; fewer elements than ranks go direct */
    if (algo == FF_COLL_ALGO_RING && call->count >= (size_t)n) {
        chunks(w->off, n, call->count, NULL, true, es);
        uint8_t *recv = call->recvbuf;
        return ring_reduce(c, call, &h, w->off, recv, recv + w->off[r], true);
    }
    for (int p = 0; p < n; p++) { /* every rank sends its whole buffer to every rank */
        w->off[p] = 0;
        w->tb[p] = bytes;
    }
    return direct_reduce(c, call, &h, w->off, w->tb, bytes);
}

static int broadcast(ff_coll_comm *c, const coll_call *call) {
    int n = c->nranks, r = c->rank, root = call->root;
    coll_work *w = &c->cpu.w;
    size_t bytes = call->count * ff_dtype_size(call->dtype);
    uint8_t *recv = call->recvbuf;
    if (r == root && recv != call->sendbuf) memmove(recv, call->sendbuf, bytes);
    if (n == 1) return 0;
    int algo = choose_algo(c, bytes * (size_t)(n - 1));
    coll_hdr h = make_hdr(c, call, algo, call->count, root);
    if (algo == FF_COLL_ALGO_RING) { /* a pipelined chain root, root+1, ..., root-1 */
        int pos = mod(r - root, n);
        ring g = {.es = ff_dtype_size(call->dtype), .dtype = call->dtype, .redop = FF_COLL_SUM, .rx = w->segs};
        if (pos == 0) {
            g.lead = recv;
            g.lead_bytes = bytes;
        } else {
            g.rx[0] = (ring_seg){.dst = recv, .bytes = bytes};
            g.nrx = 1;
            g.nfwd = pos < n - 1 ? 1 : 0;
        }
        return ring_run(c, &g, &h, pos == 0 ? -1 : mod(r - 1, n), pos == n - 1 ? -1 : mod(r + 1, n));
    }
    for (int p = 0; p < n; p++) {
        w->tx[p] = r == root && p != r ? recv : NULL;
        w->tb[p] = bytes;
        w->rx[p] = r != root && p == root ? recv : NULL;
        w->rb[p] = bytes;
    }
    return direct_run(c, &h);
}

/* all_gather, all_gather_v and split's exchange: rank p's chunk lands at off[p]. */
static int all_gather(ff_coll_comm *c, const coll_call *call) {
    int n = c->nranks, r = c->rank;
    coll_work *w = &c->cpu.w;
    size_t es = ff_dtype_size(call->dtype), *off = w->off;
    chunks(off, n, call->count, call->counts, false, es);
    uint64_t hcount = call->counts ? counts_hash(call->counts, n) : call->count;
    uint8_t *recv = call->recvbuf;
    size_t mine = off[r + 1] - off[r];
    if (recv + off[r] != (const uint8_t *)call->sendbuf) memmove(recv + off[r], call->sendbuf, mine);
    if (n == 1) return 0;
    int algo = call->op == OP_SPLIT ? FF_COLL_ALGO_DIRECT : choose_algo(c, off[n] / (size_t)n * (size_t)(n - 1));
    coll_hdr h = make_hdr(c, call, algo, hcount, 0);
    if (algo == FF_COLL_ALGO_RING) {
        ring g = {.es = es, .dtype = call->dtype, .redop = FF_COLL_SUM, .rx = w->segs};
        g.nrx = (size_t)n - 1;
        for (int t = 0; t < n - 1; t++) {
            int ci = mod(r - t - 1, n);
            g.rx[t] = (ring_seg){.dst = recv + off[ci], .bytes = off[ci + 1] - off[ci]};
        }
        g.lead = recv + off[r];
        g.lead_bytes = mine;
        g.nfwd = g.nrx - 1;
        return ring_run(c, &g, &h, mod(r - 1, n), mod(r + 1, n));
    }
    for (int p = 0; p < n; p++) {
        w->tx[p] = p == r ? NULL : recv + off[r];
        w->tb[p] = mine;
        w->rx[p] = p == r ? NULL : recv + off[p];
        w->rb[p] = off[p + 1] - off[p];
    }
    return direct_run(c, &h);
}

static int reduce_scatter(ff_coll_comm *c, const coll_call *call) {
    int n = c->nranks, r = c->rank;
    coll_work *w = &c->cpu.w;
    size_t es = ff_dtype_size(call->dtype), *off = w->off;
    chunks(off, n, call->count, call->counts, false, es);
    uint64_t hcount = call->counts ? counts_hash(call->counts, n) : call->count;
    const uint8_t *send = call->sendbuf;
    uint8_t *recv = call->recvbuf;
    size_t mine = off[r + 1] - off[r], total = off[n];
    if (n == 1) {
        if (recv != send) memmove(recv, send, mine);
        return 0;
    }
    int algo = choose_algo(c, total / (size_t)n * (size_t)(n - 1));
    coll_hdr h = make_hdr(c, call, algo, hcount, 0);
    if (algo == FF_COLL_ALGO_RING) {
        /* partial sums of the other ranks' chunks go to a scratch the size of the input,
         * after the one-slice staging area that ring_reduce takes from the same scratch */
        size_t stage = (c->cpu.slice + 63) & ~(size_t)63;
        uint8_t *scr = coll_scratch(c, stage + total);
        if (!scr) return -1;
        return ring_reduce(c, call, &h, off, scr + stage, recv, false);
    }
    for (int p = 0; p < n; p++) w->tb[p] = off[p + 1] - off[p]; /* rank p gets its chunk */
    return direct_reduce(c, call, &h, off, w->tb, mine);
}

int coll_work_alloc(ff_coll_comm *c) {
    size_t n = (size_t)c->nranks;
    coll_work *w = &c->cpu.w;
    w->off = ff_calloc(n + 1, sizeof *w->off);
    w->tx = ff_calloc(n, sizeof *w->tx);
    w->slot = ff_calloc(n, sizeof *w->slot);
    w->rx = ff_calloc(n, sizeof *w->rx);
    w->tb = ff_calloc(n, sizeof *w->tb);
    w->rb = ff_calloc(n, sizeof *w->rb);
    w->chans = ff_calloc(2 * n, sizeof *w->chans);
    w->segs = ff_calloc(2 * n, sizeof *w->segs);
    if (!w->off || !w->tx || !w->slot || !w->rx || !w->tb || !w->rb || !w->chans || !w->segs) {
        coll_work_free(c);
        return -1;
    }
    return 0;
}

void coll_work_free(ff_coll_comm *c) {
    coll_work *w = &c->cpu.w;
    free(w->off);
    free(w->tx);
    free(w->slot);
    free(w->rx);
    free(w->tb);
    free(w->rb);
    free(w->chans);
    free(w->segs);
    memset(w, 0, sizeof *w);
}

int coll_cpu_run(ff_coll_comm *c, const coll_call *call) {
    if (call->op != OP_SEND) {
        /* the posted sends' frames go first on their connections: complete them */
        if (coll_cpu_sends_progress(c, true)) return -1;
        if (coll_check_peers(c, coll_op_name(call->op))) return -1;
        c->cpu.coll_seq++; /* make_hdr stamps it into every frame of this call */
    }
    switch (call->op) {
    case OP_ALL_REDUCE: return all_reduce(c, call);
    case OP_BROADCAST: return broadcast(c, call);
    case OP_ALL_GATHER:
    case OP_ALL_GATHER_V:
    case OP_SPLIT: return all_gather(c, call);
    case OP_REDUCE_SCATTER:
    case OP_REDUCE_SCATTER_V: return reduce_scatter(c, call);
    case OP_SEND: {
        ff_coll_comm *cs[1] = {c};
        return coll_cpu_run_p2p(cs, call, 1);
    }
    default: return ff_error_set("ff_coll", NULL, "unknown call %d", call->op);
    }
}

/* Room for n channels in c's run array. */
static coll_chan *run_room(ff_coll_comm *c, size_t n) {
    coll_cpu *p = &c->cpu;
    if (n > p->cap_run) {
        size_t cap = p->cap_run ? p->cap_run : 16;
        while (cap < n) cap *= 2;
        coll_chan *r = ff_realloc(p->run, cap * sizeof *r);
        if (!r) return NULL;
        p->run = r, p->cap_run = cap;
    }
    return p->run;
}

/* The posted sends' state back from a run (they were copied to run [0, n_pend) of c's slice),
 * less the done ones, and sends_done: every send before the first one still moving. */
static void pend_update(ff_coll_comm *c, const coll_chan *ran) {
    coll_cpu *p = &c->cpu;
    size_t keep = 0;
    for (size_t i = 0; i < p->n_pend; i++)
        if (ran[i].k < ran[i].nframes) p->pend[keep++] = ran[i];
    p->n_pend = keep;
    c->sends_done = keep ? p->pend[0].serial - 1 : c->sends_posted;
}

/* Runs the posted sends of every communicator involved first (optional: they move,
 * nothing waits for them), then calls [n]. */
static int run_with_posted(ff_coll_comm **comms, const coll_call *calls, size_t n, bool wait_posted) {
    ff_coll_comm *distinct[16];
    size_t nd = 0, np = 0;
    for (size_t i = 0; i < (n ? n : 1); i++) { /* n == 0: comms[0]'s posted sends alone */
        size_t j = 0;
        while (j < nd && distinct[j] != comms[i]) j++;
        if (j < nd) continue;
        if (nd == 16) return ff_error_set("ff_coll_group_end", "split the group", "more than 16 communicators in one group");
        distinct[nd++] = comms[i];
        np += comms[i]->cpu.n_pend;
    }
    coll_chan *ch = run_room(comms[0], np + n);
    if (!ch) return -1;
    size_t o = 0;
    for (size_t j = 0; j < nd; j++) {
        if (distinct[j]->cpu.n_pend) memcpy(ch + o, distinct[j]->cpu.pend, distinct[j]->cpu.n_pend * sizeof *ch);
        o += distinct[j]->cpu.n_pend;
    }
    for (size_t i = 0; i < n; i++) {
        const coll_call *k = &calls[i];
        coll_hdr h = {.op = OP_SEND, .dtype = (uint8_t)k->dtype, .count = k->count};
        coll_chan_simple(&ch[np + i], comms[i], k->root, !k->is_recv, &h, k->is_recv ? k->recvbuf : (void *)k->sendbuf,
                         k->count * ff_dtype_size(k->dtype));
    }
    int rc = coll_engine_run_opt(ch, np + n, wait_posted ? 0 : np);
    if (rc == 0) { /* (a failure breaks the communicators, which drops their posted sends) */
        o = 0;
        for (size_t j = 0; j < nd; j++) {
            const size_t k = distinct[j]->cpu.n_pend;
            pend_update(distinct[j], ch + o);
            o += k;
        }
    }
    return rc;
}

int coll_cpu_run_p2p(ff_coll_comm **comms, const coll_call *calls, size_t n) {
    return n ? run_with_posted(comms, calls, n, false) : 0;
}

int coll_cpu_send_post(ff_coll_comm *c, const coll_call *call) {
    coll_cpu *p = &c->cpu;
    if (p->n_pend == p->cap_pend) {
        size_t cap = p->cap_pend ? 2 * p->cap_pend : 16;
        coll_chan *q = ff_realloc(p->pend, cap * sizeof *q);
        if (!q) return -1;
        p->pend = q, p->cap_pend = cap;
    }
    coll_hdr h = {.op = OP_SEND, .dtype = (uint8_t)call->dtype, .count = call->count};
    coll_chan *ch = &p->pend[p->n_pend++];
    coll_chan_simple(ch, c, call->root, true, &h, (void *)call->sendbuf, call->count * ff_dtype_size(call->dtype));
    ch->serial = ++c->sends_posted;
    return coll_cpu_sends_progress(c, false);
}

int coll_cpu_sends_progress(ff_coll_comm *c, bool wait) {
    if (!c->cpu.n_pend) {
        c->sends_done = c->sends_posted;
        return 0;
    }
    ff_coll_comm *cs[1] = {c};
    return run_with_posted(cs, NULL, 0, wait);
}

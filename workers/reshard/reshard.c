/* Resharding a model's weights between two layouts over ff_coll (fuseflow/reshard.h).
 *
 * Every rank describes, per tensor of the whole model (ff_model_tensor_info's index), the
 * interval it holds along the tensor's TP axis (source) and the interval it needs
 * (destination); the descriptions are all-gathered and every rank derives the same plan
 * from them: for each receiver and each tensor, its needed interval minus its own held one,
 * cut into pieces each held by one other rank (the holders of a piece taken in turn by the
 * receiver's rank). A rank keeps the operations it takes part in, in plan order, so that the
 * sends from one rank to another match the receives there one for one (ff_coll pairs them
 * in order). Runs go bucket by bucket (whole tensors, up to a staging size): read the source
 * shards to host, post the bucket's sends and receives in one group, copy the local pieces,
 * write the destination shards. Each rank cuts its own buckets: a group may end on one rank
 * where the peer's goes on, which grouped calls allow (the pairs match in order, and each
 * group posts the next run of them).
 *
 * A piece along rows (axis 0, or a whole tensor) is one contiguous range of both shards; a
 * piece along columns (axis 1: o_proj, down_proj) is a strided block, packed on the wire.
 *
 * Buckets are cut at the same tensors on every rank (each rank's own cuts, by its staging,
 * united at planning): a delta sync's bucket takes several rounds (headers, payloads, the
 * receivers' verdicts, dense resends) and a pair's rounds must hold the same pieces on both
 * sides. A delta piece goes as u32 element indices within the packed piece, then their
 * values, both in the packed piece's order.
 *
 * A destination that views the source (ff_model_opts.view_of: the colocated generation shard
 * over the training shard) takes its local pieces where they are: they are neither read nor
 * copied, and ff_model_write_tensor writes only its own (the received) pieces.
 *
 * Not here: which ranks form the group, the models' memory. */
#include "fuseflow/reshard.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "fuseflow/kernels.h"
#include "fuseflow/util.h"

enum { OP_LOCAL, OP_SEND, OP_RECV };

typedef struct op {
    int kind, peer;
    int slot;       /* the tensor's index in the whole model */
    int64_t lo, hi; /* the piece along the tensor's axis */
} op;

/* this rank's view of one tensor: its source and destination shard (-1: none held) */
typedef struct tensor_at {
    int src_i, dst_i;
} tensor_at;

struct ff_reshard_plan {
    ff_coll_comm *comm;
    int size, rank;
    bool bf16;
    /* opts.device: the models' backend, its packed pieces (send_cap, recv_cap elements of the
     * wire type) and the conversions' scratch (CONV elements in fp32 and in bf16) */
    ff_backend *be;
    ff_buffer *send_dev, *recv_dev, *conv32, *conv16;
    int nslots;
    op *ops; /* this rank's, in plan order (grouped by slot, ascending) */
    int64_t nops;
    int64_t received, sent; /* bytes per run */
    /* host staging, sized by the plan: a source and a destination shard of one tensor, and
     * the packed pieces of one tensor's sends and receives */
    float *src_host, *dst_host;
    void *send_pack, *recv_pack;
    int *src_at, *dst_at; /* [nslots] each slot's place in the models' tensor tables (-1: none) */
    /* buckets: runs of whole tensors moved in one group of sends and receives, their staging
     * at most bucket_bytes (or one tensor); a tensor's shards sit at src_off / dst_off [slot]
     * of the host buffers, its packed pieces in order after the bucket's earlier ones */
    int64_t bucket_bytes;
    int64_t *bucket_end; /* [nbuckets] the op index each ends before */
    int64_t nbuckets;
    int64_t *src_off, *dst_off; /* [nslots] elements */
    int64_t src_cap, dst_cap, send_cap, recv_cap; /* elements */
    /* delta syncs: the wire values of every send op as last sent (kept_bytes in all), whether
     * the receiver holds them, and the rounds' small messages, per op */
    bool delta;
    uint8_t *kept, *kept_ok;     /* [kept_bytes], [nops] */
    int64_t *kept_off;           /* [nops] bytes (send ops) */
    int64_t kept_bytes;
    int64_t *hdr;                /* [nops][HDR]: mode, changed elements, hash of the new piece */
    int64_t *verdict;            /* [nops] 1: the patched piece's hash differed, resend dense */
};

/* a delta header's mode: dense without a base (the first run), dense by choice, sparse */
enum { MODE_FIRST, MODE_DENSE, MODE_SPARSE, HDR = 3 };

/* Per slot: hold lo, hold hi, need lo, need hi (lo -1: none). */
enum { DESC = 4 };

static void describe(const ff_model *m, bool need, int64_t *d, int nslots) {
    if (!m) return;
    for (int i = 0; i < ff_model_n_tensors(m); i++) {
        ff_model_tensor_info t;
        ff_model_tensor_info_of(m, i, &t);
        assert(t.index >= 0 && t.index < nslots);
        (void)nslots;
        int64_t *e = d + (size_t)t.index * DESC + (need ? 2 : 0);
        e[0] = t.start, e[1] = t.start + t.len;
    }
}

/* where each slot sits in a model's tensor table (-1: not held) */
static void index_slots(const ff_model *m, int *at, int nslots) {
    for (int k = 0; k < nslots; k++) at[k] = -1;
    for (int i = 0; m && i < ff_model_n_tensors(m); i++) {
        ff_model_tensor_info t;
        ff_model_tensor_info_of(m, i, &t);
        if (t.index >= 0 && t.index < nslots) at[t.index] = i;
    }
}

/* the model's tensor at a slot by the plan's table, or -1 when the model is not of the plan's
 * layout there */
static int local_index(const ff_model *m, const int *at, int slot) {
    const int i = at[slot];
    if (!m || i < 0 || i >= ff_model_n_tensors(m)) return -1;
    ff_model_tensor_info t;
    ff_model_tensor_info_of(m, i, &t);
    return t.index == slot ? i : -1;
}

/* The shape of a piece [lo, hi) inside a shard that holds [start, start + len) along axis:
 * rows x width elements at off + r * stride. */
typedef struct piece {
    int64_t rows, width, stride, off;
} piece;

static piece piece_of(const ff_model_tensor_info *t, int64_t lo, int64_t hi) {
    if (t->axis == 1) return (piece){t->full[0], hi - lo, t->len, lo - t->start};
    const int64_t row = t->axis == 0 ? t->full[1] : t->full[0] * t->full[1]; /* a whole tensor: one unit */
    return (piece){1, (hi - lo) * row, (hi - lo) * row, (lo - t->start) * row};
}
static int64_t piece_numel(const piece *p) { return p->rows * p->width; }
static bool contiguous(const piece *p) { return p->rows == 1 || p->width == p->stride; }

static int64_t shard_numel(const ff_model_tensor_info *t) {
    if (t->axis < 0) return t->full[0] * t->full[1];
    return t->axis == 0 ? t->len * t->full[1] : t->full[0] * t->len;
}

static int add_op(ff_reshard_plan *p, int64_t *cap, op o) {
    if (p->nops == *cap) {
        int64_t c = *cap ? 2 * *cap : 64;
        op *v = ff_realloc(p->ops, (size_t)c * sizeof *v);
        if (!v) return -1;
        p->ops = v, *cap = c;
    }
    p->ops[p->nops++] = o;
    return 0;
}

void ff_reshard_plan_destroy(ff_reshard_plan **pp) {
    if (!pp || !*pp) return;
    ff_reshard_plan *p = *pp;
    free(p->ops);
    free(p->src_host), free(p->dst_host), free(p->send_pack), free(p->recv_pack);
    free(p->src_at), free(p->dst_at), free(p->bucket_end), free(p->src_off), free(p->dst_off);
    free(p->kept), free(p->kept_ok), free(p->kept_off), free(p->hdr), free(p->verdict);
    ff_buffer_destroy(&p->send_dev), ff_buffer_destroy(&p->recv_dev), ff_buffer_destroy(&p->conv32), ff_buffer_destroy(&p->conv16);
    free(p);
    *pp = NULL;
}

int64_t ff_reshard_plan_received(const ff_reshard_plan *p) { return p->received; }
int64_t ff_reshard_plan_sent(const ff_reshard_plan *p) { return p->sent; }
int64_t ff_reshard_plan_kept_bytes(const ff_reshard_plan *p) { return p->kept_bytes; }

/* Cut every receiver's needed intervals into pieces (the same on every rank); keep this
 * rank's. d: [size][nslots][DESC]. */
static int plan_pieces(ff_reshard_plan *p, const int64_t *d) {
    int64_t cap = 0;
    const int n = p->size, me = p->rank;
    int *cand = ff_malloc((size_t)n * sizeof *cand);
    if (!cand) return -1;
    int rc = 0;
    for (int s = 0; s < p->nslots && rc == 0; s++)
        for (int r = 0; r < n && rc == 0; r++) {
            const int64_t *e = d + ((size_t)r * (size_t)p->nslots + (size_t)s) * DESC;
            if (e[2] < 0) continue;
            const int64_t hl = e[0], hh = e[1], need_hi = e[3];
            for (int64_t pos = e[2]; pos < need_hi && rc == 0;) {
                if (hl >= 0 && pos >= hl && pos < hh) { /* held here: stays */
                    int64_t end = hh < need_hi ? hh : need_hi;
                    if (r == me) rc = add_op(p, &cap, (op){OP_LOCAL, me, s, pos, end});
                    pos = end;
                    continue;
                }
                int nc = 0;
                for (int h = 0; h < n; h++) {
                    const int64_t *f = d + ((size_t)h * (size_t)p->nslots + (size_t)s) * DESC;
                    if (h != r && f[0] >= 0 && pos >= f[0] && pos < f[1]) cand[nc++] = h;
                }
                if (!nc) {
                    rc = ff_error_set("reshard", "the generation layout must be covered by the training shards of the group",
                                      "rank %d needs [%" PRId64 ", %" PRId64 ") of tensor %d, which no rank of the group holds",
                                      r, pos, need_hi, s);
                    break;
                }
                const int h = cand[r % nc];
                const int64_t *f = d + ((size_t)h * (size_t)p->nslots + (size_t)s) * DESC;
                int64_t end = f[1] < need_hi ? f[1] : need_hi;
                if (hl > pos && hl < end) end = hl; /* then the receiver's own part */
                if (r == me) rc = add_op(p, &cap, (op){OP_RECV, h, s, pos, end});
                else if (h == me) rc = add_op(p, &cap, (op){OP_SEND, r, s, pos, end});
                pos = end;
            }
        }
    free(cand);
    return rc;
}

/* Bytes per run, the buckets and their staging. cuts NULL: this rank's own buckets, by its
 * staging, each first tensor's slot marked in own_cuts [nslots]; else: buckets that start at
 * the slots counted there (cuts: [nslots] the number of cuts at slots <= s). */
static int size_staging(ff_reshard_plan *p, const ff_model *src, const ff_model *dst, const int64_t *cuts, int64_t *own_cuts) {
    const size_t es = p->bf16 ? 2 : 4;
    int64_t bsrc = 0, bdst = 0, bspack = 0, brpack = 0; /* the open bucket's, elements */
    int64_t cap = p->nbuckets ? p->nbuckets : 0;
    p->sent = p->received = 0, p->nbuckets = 0;
    p->src_cap = p->dst_cap = p->send_cap = p->recv_cap = 0;
    int prev = -1; /* the slot of the tensor before */
    for (int64_t i = 0; i < p->nops;) {
        const int s = p->ops[i].slot;
        const int si = local_index(src, p->src_at, s), di = local_index(dst, p->dst_at, s);
        ff_model_tensor_info ts, td;
        if (si >= 0) ff_model_tensor_info_of(src, si, &ts);
        if (di >= 0) ff_model_tensor_info_of(dst, di, &td);
        int64_t spack = 0, rpack = 0;
        bool need_src = false, need_dst = false;
        const int64_t first = i;
        for (; i < p->nops && p->ops[i].slot == s; i++) {
            const op *o = &p->ops[i];
            if ((o->kind != OP_RECV && si < 0) || (o->kind != OP_SEND && di < 0))
                return ff_error_set("reshard", NULL, "tensor %d: the plan moves a piece this rank's models do not hold", s);
            if (o->kind == OP_SEND) {
                piece pc = piece_of(&ts, o->lo, o->hi);
                p->sent += piece_numel(&pc) * (int64_t)es;
                if (p->bf16 || p->delta || !contiguous(&pc)) spack += piece_numel(&pc);
                need_src = true;
            } else if (o->kind == OP_RECV) {
                piece pc = piece_of(&td, o->lo, o->hi);
                p->received += piece_numel(&pc) * (int64_t)es;
                /* on the device a piece is received packed also where the destination stores bf16 */
                if (p->be || p->bf16 || p->delta || !contiguous(&pc)) rpack += piece_numel(&pc);
                need_dst = true;
            } else {
                need_src = need_dst = true;
            }
        }
        const int64_t ns = need_src ? shard_numel(&ts) : 0, nd = need_dst ? shard_numel(&td) : 0;
        const int64_t bytes = (ns + nd) * 4 + (spack + rpack) * (int64_t)es;
        const int64_t open = (bsrc + bdst) * 4 + (bspack + brpack) * (int64_t)es;
        const bool close = cuts ? first > 0 && cuts[s] > cuts[prev] : first > 0 && open > 0 && open + bytes > p->bucket_bytes;
        prev = s;
        if (close) { /* close the open bucket */
            if (own_cuts) own_cuts[s] = 1;
            if (p->nbuckets == cap) {
                int64_t c = cap ? 2 * cap : 16, *v = ff_realloc(p->bucket_end, (size_t)c * sizeof *v);
                if (!v) return -1;
                p->bucket_end = v, cap = c;
            }
            p->bucket_end[p->nbuckets++] = first;
            bsrc = bdst = bspack = brpack = 0;
        }
        p->src_off[s] = bsrc, p->dst_off[s] = bdst;
        bsrc += ns, bdst += nd, bspack += spack, brpack += rpack;
        if (bsrc > p->src_cap) p->src_cap = bsrc;
        if (bdst > p->dst_cap) p->dst_cap = bdst;
        if (bspack > p->send_cap) p->send_cap = bspack;
        if (brpack > p->recv_cap) p->recv_cap = brpack;
    }
    if (p->nops > 0) {
        int64_t *v = ff_realloc(p->bucket_end, (size_t)(p->nbuckets + 1) * sizeof *v);
        if (!v) return -1;
        p->bucket_end = v;
        p->bucket_end[p->nbuckets++] = p->nops;
    }
    return 0;
}

enum { CONV = 1 << 20 }; /* elements converted at a time on the device (opts.device) */

/* The staging buffers, and a delta sync's kept copy and per-op messages. */
static int alloc_staging(ff_reshard_plan *p, const ff_model *src) {
    const size_t es = p->bf16 ? 2 : 4;
    if (p->delta) {
        p->kept_off = ff_malloc((size_t)(p->nops ? p->nops : 1) * sizeof *p->kept_off);
        p->kept_ok = ff_calloc((size_t)(p->nops ? p->nops : 1), 1);
        p->hdr = ff_malloc((size_t)(p->nops ? p->nops : 1) * HDR * sizeof *p->hdr);
        p->verdict = ff_malloc((size_t)(p->nops ? p->nops : 1) * sizeof *p->verdict);
        if (!p->kept_off || !p->kept_ok || !p->hdr || !p->verdict) return -1;
        for (int64_t i = 0; i < p->nops; i++) {
            p->kept_off[i] = -1;
            if (p->ops[i].kind != OP_SEND) continue;
            ff_model_tensor_info ts;
            ff_model_tensor_info_of(src, local_index(src, p->src_at, p->ops[i].slot), &ts);
            piece pc = piece_of(&ts, p->ops[i].lo, p->ops[i].hi);
            p->kept_off[i] = p->kept_bytes;
            p->kept_bytes += piece_numel(&pc) * (int64_t)es;
        }
        if (!(p->kept = ff_malloc((size_t)(p->kept_bytes ? p->kept_bytes : 1)))) return -1;
    }
    if (p->be) { /* on the models' backend: the packed pieces and the conversions' scratch */
        p->send_dev = ff_buffer_new(p->be, (size_t)(p->send_cap ? p->send_cap : 1) * es);
        p->recv_dev = ff_buffer_new(p->be, (size_t)(p->recv_cap ? p->recv_cap : 1) * es);
        p->conv32 = ff_buffer_new(p->be, (size_t)CONV * 4);
        p->conv16 = ff_buffer_new(p->be, (size_t)CONV * 2);
        return p->send_dev && p->recv_dev && p->conv32 && p->conv16 ? 0 : -1;
    }
    p->src_host = ff_malloc((size_t)(p->src_cap ? p->src_cap : 1) * sizeof(float));
    p->dst_host = ff_malloc((size_t)(p->dst_cap ? p->dst_cap : 1) * sizeof(float));
    p->send_pack = ff_malloc((size_t)(p->send_cap ? p->send_cap : 1) * es);
    p->recv_pack = ff_malloc((size_t)(p->recv_cap ? p->recv_cap : 1) * es);
    return p->src_host && p->dst_host && p->send_pack && p->recv_pack ? 0 : -1;
}

ff_reshard_plan *ff_reshard_plan_new(ff_coll_comm *comm, const ff_model *src, const ff_model *dst, const ff_reshard_opts *opts) {
    if (!comm) return ff_error_set("reshard", "give the group's communicator", "no communicator"), NULL;
    if (!src && !dst) return ff_error_set("reshard", NULL, "a rank of the group with neither a source nor a destination model"), NULL;
    const ff_model_config *cfg = ff_model_config_of(src ? src : dst);
    if (src && dst && ff_model_tensor_slots(ff_model_config_of(src)) != ff_model_tensor_slots(ff_model_config_of(dst)))
        return ff_error_set("reshard", "both models load the same checkpoint", "the source and destination configs differ"), NULL;
    if (dst && ff_model_viewed(dst) && ff_model_viewed(dst) != src)
        return ff_error_set("reshard", "give the model the destination views as this rank's source",
                            "the destination reads part of its weights in place from a model that is not the source"),
               NULL;
    if (dst && ff_model_viewed(dst) && opts && opts->bf16)
        return ff_error_set("reshard", "sync in fp32 into a view, or give the bf16 copy a model of its own",
                            "bf16 on the wire into a destination that reads the fp32 source in place"),
               NULL;
    if (opts && opts->device && (opts->delta || (dst && ff_model_viewed(dst))))
        return ff_error_set("reshard", "move a delta sync or a view's pieces through host memory (opts.device false)",
                            "opts.device with %s", opts->delta ? "delta" : "a destination that views the source"),
               NULL;
    ff_reshard_plan *p = ff_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->comm = comm, p->size = ff_coll_comm_size(comm), p->rank = ff_coll_comm_rank(comm), p->bf16 = opts && opts->bf16;
    if (opts && opts->device) p->be = ff_model_backend(src ? src : dst);
    p->delta = opts && opts->delta;
    p->bucket_bytes = opts && opts->bucket_bytes > 0 ? opts->bucket_bytes : FF_RESHARD_BUCKET_BYTES;
    p->nslots = ff_model_tensor_slots(cfg);
    /* key[3]: the library this rank would move device memory with (0: host memory; 1: the cpu
     * ff_coll, 2: NCCL); the plan moves device memory only where every rank of the group would
     * with the same one (the other ranks' backends are not known here), else host memory */
    const int64_t lib = !p->be ? 0 : ff_backend_shares_memory_with(p->be, "cpu") ? 1 : 2;
    int64_t key[4] = {p->nslots, cfg->hidden_size, p->delta, lib}, *keys = ff_malloc((size_t)p->size * sizeof key);
    const size_t nd = (size_t)p->nslots * DESC;
    int64_t *mine = ff_malloc(nd * sizeof *mine), *all = ff_malloc((size_t)p->size * nd * sizeof *all);
    p->src_at = ff_malloc((size_t)p->nslots * sizeof *p->src_at);
    p->dst_at = ff_malloc((size_t)p->nslots * sizeof *p->dst_at);
    p->src_off = ff_calloc((size_t)p->nslots, sizeof *p->src_off);
    p->dst_off = ff_calloc((size_t)p->nslots, sizeof *p->dst_off);
    int rc = keys && mine && all && p->src_at && p->dst_at && p->src_off && p->dst_off ? 0 : -1;
    if (rc == 0) index_slots(src, p->src_at, p->nslots), index_slots(dst, p->dst_at, p->nslots);
    if (rc == 0) rc = ff_coll_all_gather(key, keys, 4, FF_DTYPE_I64, comm, NULL);
    for (int r = 0; rc == 0 && r < p->size; r++) {
        if (keys[4 * r + 2] != key[2])
            rc = ff_error_set("reshard", "give every rank of the group the same delta option", "rank %d plans %s syncs, this rank %s", r,
                              keys[4 * r + 2] ? "delta" : "dense", key[2] ? "delta" : "dense");
        else if (keys[4 * r] != key[0] || keys[4 * r + 1] != key[1])
            rc = ff_error_set("reshard", "every model of the group loads the same checkpoint",
                              "rank %d's model has %" PRId64 " tensor slots and hidden size %" PRId64 ", this rank's %" PRId64
                              " and %" PRId64,
                              r, keys[4 * r], keys[4 * r + 1], key[0], key[1]);
        if (keys[4 * r + 3] != lib) p->be = NULL; /* not every rank moves device memory with this library */
    }
    if (rc == 0) {
        for (size_t i = 0; i < nd; i++) mine[i] = -1;
        describe(src, false, mine, p->nslots);
        describe(dst, true, mine, p->nslots);
        rc = ff_coll_all_gather(mine, all, nd, FF_DTYPE_I64, comm, NULL);
    }
    if (rc == 0) rc = plan_pieces(p, all);
    /* buckets cut at the same slots on every rank: the union of each rank's own cuts, each
     * bucket of them inside one of this rank's own, so within its staging */
    int64_t *cuts = rc == 0 ? ff_calloc((size_t)p->nslots, sizeof *cuts) : NULL;
    if (rc == 0 && !cuts) rc = -1;
    if (rc == 0) rc = size_staging(p, src, dst, NULL, cuts);
    if (rc == 0) rc = ff_coll_all_reduce(cuts, cuts, (size_t)p->nslots, FF_DTYPE_I64, FF_COLL_MAX, comm, NULL);
    for (int k = 1; rc == 0 && k < p->nslots; k++) cuts[k] += cuts[k - 1];
    if (rc == 0) rc = size_staging(p, src, dst, cuts, NULL);
    if (rc == 0) rc = alloc_staging(p, src);
    free(cuts);
    free(keys), free(mine), free(all);
    if (rc) {
        ff_reshard_plan_destroy(&p);
        ff_error_wrap("reshard plan (rank %d of %d)", ff_coll_comm_rank(comm), ff_coll_comm_size(comm));
    }
    return p;
}

/* ---- running ------------------------------------------------------------------------------- */

/* piece of `from` (a shard's host copy) into `to` (packed, fp32 or bf16) */
static void pack(const float *from, const piece *pc, void *to, bool bf16) {
    int64_t k = 0;
    for (int64_t r = 0; r < pc->rows; r++) {
        const float *row = from + pc->off + r * pc->stride;
        if (bf16) {
            uint16_t *o = (uint16_t *)to + k;
            for (int64_t c = 0; c < pc->width; c++) o[c] = ff_f32_to_bf16(row[c]);
        } else {
            memcpy((float *)to + k, row, (size_t)pc->width * sizeof(float));
        }
        k += pc->width;
    }
}

static void unpack(const void *from, const piece *pc, float *to, bool bf16) {
    int64_t k = 0;
    for (int64_t r = 0; r < pc->rows; r++) {
        float *row = to + pc->off + r * pc->stride;
        if (bf16) {
            const uint16_t *in = (const uint16_t *)from + k;
            for (int64_t c = 0; c < pc->width; c++) row[c] = ff_bf16_to_f32(in[c]);
        } else {
            memcpy(row, (const float *)from + k, (size_t)pc->width * sizeof(float));
        }
        k += pc->width;
    }
}

/* a local piece: src shard host -> dst shard host (rounded like the wire under bf16) */
static void copy_local(const float *from, const piece *ps, float *to, const piece *pd, bool bf16) {
    for (int64_t r = 0; r < ps->rows; r++) {
        const float *a = from + ps->off + r * ps->stride;
        float *b = to + pd->off + r * pd->stride;
        if (bf16)
            for (int64_t c = 0; c < ps->width; c++) b[c] = ff_bf16_to_f32(ff_f32_to_bf16(a[c]));
        else
            memcpy(b, a, (size_t)ps->width * sizeof(float));
    }
}

/* The ops of the tensor that starts at op i: they end at *j; its shards' info (has_*: this
 * rank reads the source shard, writes the destination shard). */
static int tensor_at_op(const ff_reshard_plan *p, const ff_model *src, const ff_model *dst, int64_t i, int64_t *j, ff_model_tensor_info *ts,
                        ff_model_tensor_info *td, bool *has_src, bool *has_dst) {
    const int slot = p->ops[i].slot;
    *j = i, *has_src = *has_dst = false;
    for (; *j < p->nops && p->ops[*j].slot == slot; (*j)++) {
        *has_src = *has_src || p->ops[*j].kind != OP_RECV;
        *has_dst = *has_dst || p->ops[*j].kind != OP_SEND;
    }
    const int si = local_index(src, p->src_at, slot), di = local_index(dst, p->dst_at, slot);
    if ((*has_src && si < 0) || (*has_dst && di < 0))
        return ff_error_set("reshard", "run the plan with models of the layouts it was made for",
                            "tensor %d is not held by this rank's %s model", slot, *has_src && si < 0 ? "source" : "destination");
    if (*has_src) ff_model_tensor_info_of(src, si, ts);
    if (*has_dst) ff_model_tensor_info_of(dst, di, td);
    if ((*has_src && p->src_off[slot] + shard_numel(ts) > p->src_cap) || (*has_dst && p->dst_off[slot] + shard_numel(td) > p->dst_cap))
        return ff_error_set("reshard", "run the plan with the models it was made for", "%s: a shard larger than planned",
                            *has_src ? ts->name : td->name);
    return 0;
}

/* a local piece that a view destination reads in place from the source (no copy) */
static bool in_place(const ff_model_tensor_info *td, const op *o) {
    return o->kind == OP_LOCAL && td->view_lo < td->view_hi && td->view_lo <= o->lo && o->hi <= td->view_hi;
}

/* ---- delta syncs ---------------------------------------------------------------------- */

static inline uint32_t wire_bits(float x, bool bf16) {
    if (bf16) return ff_f32_to_bf16(x);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float from_wire(uint32_t w, bool bf16) {
    if (bf16) return ff_bf16_to_f32((uint16_t)w);
    float x;
    memcpy(&x, &w, sizeof x);
    return x;
}
/* element e of packed wire values (es bytes each; memcpy: no alignment assumed) */
static inline uint32_t packed_at(const uint8_t *v, int64_t e, size_t es) {
    if (es == 2) {
        uint16_t h;
        memcpy(&h, v + 2 * e, 2);
        return h;
    }
    uint32_t u;
    memcpy(&u, v + 4 * e, 4);
    return u;
}
static inline void packed_put(uint8_t *v, int64_t e, size_t es, uint32_t w) {
    if (es == 2) {
        const uint16_t h = (uint16_t)w;
        memcpy(v + 2 * e, &h, 2);
    } else {
        memcpy(v + 4 * e, &w, 4);
    }
}
/* one element into a running 64-bit FNV-style hash of a piece (an element at a time: a
 * multiply each, not a byte loop). What is hashed is the fp32 bits the receiver holds (a bf16
 * value w as w << 16, exactly its fp32): the receiver hashes its copy as it is, without
 * rounding, so a change in any bit of it shows. */
static inline uint64_t mix(uint64_t h, uint32_t w) { return (h ^ w) * 0x100000001b3ULL; }

/* The sender's piece k: its new wire values against the kept ones; the header, the payload
 * (sparse: n u32 indices then n values; dense: the packed piece) at `out`, the kept copy
 * updated. Returns the payload's bytes. */
static int64_t delta_encode(ff_reshard_plan *p, int64_t k, const float *sh, const piece *pc, uint8_t *out) {
    const bool bf16 = p->bf16;
    const size_t es = bf16 ? 2 : 4;
    const int64_t numel = piece_numel(pc);
    uint8_t *kept = p->kept + p->kept_off[k];
    const bool base = p->kept_ok[k];
    uint64_t h = FF_HASH_FNV1A_INIT;
    int64_t n = 0;
    for (int64_t r = 0, e = 0; r < pc->rows; r++) {
        const float *row = sh + pc->off + r * pc->stride;
        for (int64_t c = 0; c < pc->width; c++, e++) {
            const uint32_t w = wire_bits(row[c], bf16);
            h = mix(h, bf16 ? w << 16 : w);
            if (base) n += w != packed_at(kept, e, es);
        }
    }
    const bool sparse = base && numel <= (int64_t)UINT32_MAX && n * (int64_t)(4 + es) < numel * (int64_t)es;
    int64_t *hd = p->hdr + k * HDR;
    hd[0] = !base ? MODE_FIRST : sparse ? MODE_SPARSE : MODE_DENSE, hd[1] = base ? n : numel, hd[2] = (int64_t)h;
    p->kept_ok[k] = 1;
    if (!sparse) {
        pack(sh, pc, out, bf16);
        memcpy(kept, out, (size_t)numel * es);
        return numel * (int64_t)es;
    }
    uint8_t *vals = out + 4 * n;
    for (int64_t r = 0, e = 0, j = 0; n > 0 && r < pc->rows; r++) {
        const float *row = sh + pc->off + r * pc->stride;
        for (int64_t c = 0; c < pc->width; c++, e++) {
            const uint32_t w = wire_bits(row[c], bf16);
            if (w == packed_at(kept, e, es)) continue;
            const uint32_t idx = (uint32_t)e;
            memcpy(out + 4 * j, &idx, 4);
            packed_put(vals, j++, es, w);
            packed_put(kept, e, es, w);
        }
    }
    return n * (int64_t)(4 + es);
}

/* The payload's bytes a receiver's header announces; -1 + error: a header no sender wrote. */
static int64_t delta_bytes(const ff_reshard_plan *p, const int64_t *hd, int64_t numel) {
    const int64_t es = p->bf16 ? 2 : 4;
    if (hd[0] < MODE_FIRST || hd[0] > MODE_SPARSE || hd[1] < 0 || hd[1] > numel)
        return ff_error_set("reshard", NULL, "a delta header of mode %" PRId64 " and %" PRId64 " elements for a piece of %" PRId64, hd[0],
                            hd[1], numel);
    return hd[0] == MODE_SPARSE ? hd[1] * (4 + es) : numel * es;
}

/* The receiver: the payload into its shard's host copy (holding the values before); 0, or 1
 * when the patched piece's hash is not the sender's (its base differed), -1 + error. */
static int delta_apply(const ff_reshard_plan *p, const int64_t *hd, const uint8_t *in, const piece *pc, float *dh) {
    const bool bf16 = p->bf16;
    const size_t es = bf16 ? 2 : 4;
    if (hd[0] != MODE_SPARSE) {
        unpack(in, pc, dh, bf16);
        return 0;
    }
    const int64_t n = hd[1], numel = piece_numel(pc);
    const uint8_t *vals = in + 4 * n;
    for (int64_t j = 0; j < n; j++) {
        uint32_t idx;
        memcpy(&idx, in + 4 * j, 4);
        if ((int64_t)idx >= numel) return ff_error_set("reshard", NULL, "a delta index %u past a piece of %" PRId64 " elements", idx, numel);
        dh[pc->off + (int64_t)idx / pc->width * pc->stride + (int64_t)idx % pc->width] = from_wire(packed_at(vals, j, es), bf16);
    }
    uint64_t h = FF_HASH_FNV1A_INIT;
    for (int64_t r = 0; r < pc->rows; r++) {
        const float *row = dh + pc->off + r * pc->stride;
        for (int64_t c = 0; c < pc->width; c++) h = mix(h, wire_bits(row[c], false));
    }
    return h != (uint64_t)hd[2];
}

/* One bucket's sends and receives as a delta sync: headers, payloads, the receivers'
 * verdicts, dense resends of the pieces whose hash differed. The destination shards' host
 * copies hold the values before. */
static int move_delta(ff_reshard_plan *p, ff_model *src, ff_model *dst, int64_t i0, int64_t i1, ff_reshard_stats *s) {
    const size_t es = p->bf16 ? 2 : 4;
    ff_model_tensor_info ts = {0}, td = {0};
    bool has_src, has_dst;
    int rc = 0;
    int64_t nresend = 0, nops = 0;
    for (int round = 0; round < 4 && rc == 0; round++) {
        if (round == 3 && nresend == 0) break;
        if (round > 0 && nops == 0) break;
        int64_t so = 0, ro = 0; /* bytes into the packs */
        rc = ff_coll_group_start();
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
            const float *sh = p->src_host + p->src_off[p->ops[i].slot];
            for (int64_t k = i; k < j && rc == 0; k++) {
                const op *o = &p->ops[k];
                if (o->kind == OP_LOCAL) continue;
                const bool snd = o->kind == OP_SEND;
                piece pc = piece_of(snd ? &ts : &td, o->lo, o->hi);
                const int64_t numel = piece_numel(&pc), dense = numel * (int64_t)es;
                int64_t *hd = p->hdr + k * HDR;
                uint8_t *pack_at = (uint8_t *)(snd ? p->send_pack : p->recv_pack) + (snd ? so : ro);
                if (snd) so += dense;
                else ro += dense;
                if (round == 0) { /* headers (the sender's payload encoded first) */
                    nops++;
                    if (snd) {
                        delta_encode(p, k, sh, &pc, pack_at);
                        rc = ff_coll_send(hd, HDR, FF_DTYPE_I64, o->peer, p->comm, NULL);
                        s->sent += HDR * 8;
                    } else {
                        rc = ff_coll_recv(hd, HDR, FF_DTYPE_I64, o->peer, p->comm, NULL);
                        s->received += HDR * 8, s->messages++;
                    }
                } else if (round == 1) { /* payloads */
                    const int64_t bytes = delta_bytes(p, hd, numel);
                    if (bytes < 0) rc = -1;
                    else if (bytes > 0 && snd) rc = ff_coll_send(pack_at, (size_t)bytes, FF_DTYPE_U8, o->peer, p->comm, NULL), s->sent += bytes;
                    else if (bytes > 0) rc = ff_coll_recv(pack_at, (size_t)bytes, FF_DTYPE_U8, o->peer, p->comm, NULL), s->received += bytes, s->messages++;
                } else if (round == 2) { /* the receivers' verdicts */
                    if (snd) rc = ff_coll_recv(p->verdict + k, 1, FF_DTYPE_I64, o->peer, p->comm, NULL), s->received += 8, s->bytes_saved -= 8;
                    else rc = ff_coll_send(p->verdict + k, 1, FF_DTYPE_I64, o->peer, p->comm, NULL), s->sent += 8;
                } else if (p->verdict[k]) { /* dense resends: the sender's kept copy is the new piece */
                    if (snd) rc = ff_coll_send(p->kept + p->kept_off[k], (size_t)dense, FF_DTYPE_U8, o->peer, p->comm, NULL), s->sent += dense;
                    else rc = ff_coll_recv(pack_at, (size_t)dense, FF_DTYPE_U8, o->peer, p->comm, NULL), s->received += dense, s->messages++;
                }
            }
        }
        if (ff_coll_group_end() != 0 && rc == 0) rc = -1;
        if (rc == 0 && round == 2)
            for (int64_t k = i0; k < i1; k++) nresend += p->ops[k].kind != OP_LOCAL && p->verdict[k];
        if (rc || (round != 1 && round != 3)) continue;
        /* the receivers apply: the payloads (round 1), the resends (round 3) */
        ro = 0;
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
            float *dh = p->dst_host + p->dst_off[p->ops[i].slot];
            for (int64_t k = i; k < j && rc == 0; k++) {
                const op *o = &p->ops[k];
                if (o->kind != OP_RECV) continue;
                piece pc = piece_of(&td, o->lo, o->hi);
                const int64_t numel = piece_numel(&pc);
                const uint8_t *in = (const uint8_t *)p->recv_pack + ro;
                ro += numel * (int64_t)es;
                int64_t *hd = p->hdr + k * HDR;
                if (round == 3) {
                    if (p->verdict[k]) unpack(in, &pc, dh, p->bf16);
                    continue;
                }
                const int v = delta_apply(p, hd, in, &pc, dh);
                if (v < 0) {
                    rc = -1;
                    break;
                }
                p->verdict[k] = v;
                if (hd[0] != MODE_FIRST) s->delta_elems += numel, s->delta_changed += hd[1];
                s->bytes_saved += numel * (int64_t)es - HDR * 8 - delta_bytes(p, hd, numel) - (v ? numel * (int64_t)es : 0);
                if (hd[0] == MODE_SPARSE && !v) s->pieces_sparse++;
                else s->pieces_dense++;
                if (v) {
                    s->fallbacks++;
                    ff_warn("reshard: %s [%" PRId64 ", %" PRId64 ") from rank %d: the patched piece's hash differs from the sender's "
                            "(this rank's copy is not the one it last sent): resending it dense",
                            td.name, o->lo, o->hi, o->peer);
                }
            }
        }
    }
    return rc;
}
/* One bucket's sends and receives in one group, fp32 or bf16: the received pieces into the
 * destination shards' host copies. */
static int move_dense(ff_reshard_plan *p, ff_model *src, ff_model *dst, int64_t i0, int64_t i1, ff_reshard_stats *s) {
    const ff_dtype wire = p->bf16 ? FF_DTYPE_BF16 : FF_DTYPE_F32;
    const size_t es = p->bf16 ? 2 : 4;
    ff_model_tensor_info ts = {0}, td = {0};
    bool has_src, has_dst;
    /* packed pieces laid out in order */
    int64_t so = 0, ro = 0;
    int rc = ff_coll_group_start();
    for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
        if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
        const float *sh = p->src_host + p->src_off[p->ops[i].slot];
        float *dh = p->dst_host + p->dst_off[p->ops[i].slot];
        for (int64_t k = i; k < j && rc == 0; k++) {
            const op *o = &p->ops[k];
            if (o->kind == OP_SEND) {
                piece pc = piece_of(&ts, o->lo, o->hi);
                const void *buf = sh + pc.off;
                if (p->bf16 || !contiguous(&pc)) {
                    buf = (char *)p->send_pack + (size_t)so * es;
                    pack(sh, &pc, (char *)p->send_pack + (size_t)so * es, p->bf16);
                    so += piece_numel(&pc);
                }
                rc = ff_coll_send(buf, (size_t)piece_numel(&pc), wire, o->peer, p->comm, NULL);
                s->sent += piece_numel(&pc) * (int64_t)es;
            } else if (o->kind == OP_RECV) {
                piece pc = piece_of(&td, o->lo, o->hi);
                void *buf = dh + pc.off;
                if (p->bf16 || !contiguous(&pc)) {
                    buf = (char *)p->recv_pack + (size_t)ro * es;
                    ro += piece_numel(&pc);
                }
                rc = ff_coll_recv(buf, (size_t)piece_numel(&pc), wire, o->peer, p->comm, NULL);
                s->received += piece_numel(&pc) * (int64_t)es;
                s->messages++;
            }
        }
    }
    if (ff_coll_group_end() != 0 && rc == 0) rc = -1;
    ro = 0;
    for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
        if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
        float *dh = p->dst_host + p->dst_off[p->ops[i].slot];
        for (int64_t k = i; k < j; k++) {
            const op *o = &p->ops[k];
            if (o->kind != OP_RECV) continue;
            piece pc = piece_of(&td, o->lo, o->hi);
            if (p->bf16 || !contiguous(&pc)) {
                unpack((char *)p->recv_pack + (size_t)ro * es, &pc, dh, p->bf16);
                ro += piece_numel(&pc);
            }
        }
    }
    return rc;
}

/* ---- on the models' backend (opts.device) ------------------------------------------------ */

/* a piece laid out packed: rows x width at stride width from 0 */
static piece packed(const piece *pc) { return (piece){pc->rows, pc->width, pc->width, 0}; }

static size_t esize(ff_dtype t) { return t == FF_DTYPE_BF16 ? 2 : 4; }

/* n rows of w elements, a (type ta, row stride sa elements) -> b (tb, sb), through the scratch:
 * gathered packed in ta, converted (rounded to bf16 on the way when `round`), scattered. */
static void convert_rows(ff_reshard_plan *p, ff_stream *st, ff_dptr a, ff_dtype ta, int64_t sa, ff_dptr b, ff_dtype tb,
                         int64_t sb, int64_t w, int64_t n, bool round) {
    const int64_t k = w * n;
    const ff_dptr c32 = ff_dptr_of(p->conv32, 0), c16 = ff_dptr_of(p->conv16, 0);
    ff_dptr at = ta == FF_DTYPE_BF16 ? c16 : c32;
    ff_memcpy_2d(st, at, (size_t)w * esize(ta), a, (size_t)sa * esize(ta), (size_t)w * esize(ta), (size_t)n);
    if (ta == FF_DTYPE_F32 && (tb == FF_DTYPE_BF16 || round)) ff_cast_f32_bf16(st, c32, c16, k), at = c16;
    if (tb == FF_DTYPE_F32 && at.buf == p->conv16) ff_cast_bf16_f32(st, c16, c32, k), at = c32;
    ff_memcpy_2d(st, b, (size_t)sb * esize(tb), at, (size_t)w * esize(tb), (size_t)w * esize(tb), (size_t)n);
}

/* piece pa of a (type ta) into piece pb of b (type tb), the same rows x width; round: the
 * values pass through bf16 (the wire's rounding, for a local piece under bf16) */
static void copy_piece(ff_reshard_plan *p, ff_stream *st, ff_dptr a, ff_dtype ta, const piece *pa, ff_dptr b, ff_dtype tb,
                       const piece *pb, bool round) {
    const size_t ea = esize(ta), eb = esize(tb);
    if (ta == tb && !(round && ta == FF_DTYPE_F32)) {
        ff_memcpy_2d(st, ff_dptr_add(b, (size_t)pb->off, eb), (size_t)pb->stride * eb, ff_dptr_add(a, (size_t)pa->off, ea),
                     (size_t)pa->stride * ea, (size_t)pa->width * ea, (size_t)pa->rows);
        return;
    }
    if (pa->width <= CONV) {
        const int64_t step = CONV / pa->width;
        for (int64_t r = 0; r < pa->rows; r += step) {
            const int64_t n = pa->rows - r < step ? pa->rows - r : step;
            convert_rows(p, st, ff_dptr_add(a, (size_t)(pa->off + r * pa->stride), ea), ta, pa->stride,
                         ff_dptr_add(b, (size_t)(pb->off + r * pb->stride), eb), tb, pb->stride, pa->width, n, round);
        }
        return;
    }
    for (int64_t r = 0; r < pa->rows; r++) /* rows longer than the scratch (a whole tensor as one row) */
        for (int64_t c = 0; c < pa->width; c += CONV) {
            const int64_t w = pa->width - c < CONV ? pa->width - c : CONV;
            convert_rows(p, st, ff_dptr_add(a, (size_t)(pa->off + r * pa->stride + c), ea), ta, w,
                         ff_dptr_add(b, (size_t)(pb->off + r * pb->stride + c), eb), tb, w, w, 1, round);
        }
}

/* a tensor's storage in a model, for the ops [i, j) of one tensor */
typedef struct stored {
    ff_dptr at;
    ff_dtype type;
} stored;

static int run_device(ff_reshard_plan *p, ff_model *src, ff_model *dst, ff_reshard_stats *s) {
    ff_coll_comm *c;
    if (ff_coll_comm_twin(p->comm, ff_backend_shares_memory_with(p->be, "cpu") ? "cpu" : "nccl", &c)) return -1;
    ff_stream *st = ff_backend_stream(p->be);
    void *ns = ff_stream_native(st);
    const ff_dtype wire = p->bf16 ? FF_DTYPE_BF16 : FF_DTYPE_F32;
    const size_t es = esize(wire);
    ff_model_tensor_info ts = {0}, td = {0};
    bool has_src, has_dst;
    int rc = 0;
    for (int64_t b = 0, i0 = 0; b < p->nbuckets && rc == 0; i0 = p->bucket_end[b++]) {
        const int64_t i1 = p->bucket_end[b];
        int64_t so = 0, ro = 0;
        rc = ff_coll_group_start();
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
            stored a = {0}, d = {0};
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
            if (has_src && (rc = ff_model_tensor_storage(src, ts.name, &a.at, &a.type)) != 0) break;
            if (has_dst && (rc = ff_model_tensor_storage(dst, td.name, &d.at, &d.type)) != 0) break;
            for (int64_t k = i; k < j && rc == 0; k++) {
                const op *o = &p->ops[k];
                if (o->kind == OP_SEND) {
                    const piece pc = piece_of(&ts, o->lo, o->hi), pk = packed(&pc);
                    ff_dptr buf = ff_dptr_add(a.at, (size_t)pc.off, esize(a.type));
                    if (a.type != wire || !contiguous(&pc)) {
                        buf = ff_dptr_add(ff_dptr_of(p->send_dev, 0), (size_t)so, es);
                        copy_piece(p, st, a.at, a.type, &pc, buf, wire, &pk, false);
                        so += piece_numel(&pc);
                    }
                    rc = ff_coll_send(ff_dptr_addr(buf), (size_t)piece_numel(&pc), wire, o->peer, c, ns);
                    s->sent += piece_numel(&pc) * (int64_t)es;
                } else if (o->kind == OP_RECV) {
                    const piece pc = piece_of(&td, o->lo, o->hi);
                    ff_dptr buf = ff_dptr_add(d.at, (size_t)pc.off, esize(d.type));
                    if (d.type != wire || !contiguous(&pc)) {
                        buf = ff_dptr_add(ff_dptr_of(p->recv_dev, 0), (size_t)ro, es);
                        ro += piece_numel(&pc);
                    }
                    rc = ff_coll_recv(ff_dptr_addr(buf), (size_t)piece_numel(&pc), wire, o->peer, c, ns);
                    s->received += piece_numel(&pc) * (int64_t)es;
                    s->messages++;
                }
            }
        }
        if (ff_coll_group_end() != 0 && rc == 0) rc = -1;
        /* the packed receives into place, in the same order; the local pieces */
        ro = 0;
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
            stored a = {0}, d = {0};
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
            if (has_src && (rc = ff_model_tensor_storage(src, ts.name, &a.at, &a.type)) != 0) break;
            if (has_dst && (rc = ff_model_tensor_storage(dst, td.name, &d.at, &d.type)) != 0) break;
            for (int64_t k = i; k < j; k++) {
                const op *o = &p->ops[k];
                if (o->kind == OP_RECV) {
                    const piece pc = piece_of(&td, o->lo, o->hi), pk = packed(&pc);
                    if (d.type == wire && contiguous(&pc)) continue; /* received in place */
                    copy_piece(p, st, ff_dptr_add(ff_dptr_of(p->recv_dev, 0), (size_t)ro, es), wire, &pk, d.at, d.type, &pc, false);
                    ro += piece_numel(&pc);
                } else if (o->kind == OP_LOCAL) {
                    const piece ps = piece_of(&ts, o->lo, o->hi), pd = piece_of(&td, o->lo, o->hi);
                    copy_piece(p, st, a.at, a.type, &ps, d.at, d.type, &pd, p->bf16);
                    s->local += piece_numel(&ps) * (int64_t)sizeof(float);
                }
            }
        }
        if (rc == 0) rc = ff_stream_sync(st); /* the bucket's staging is reused by the next */
    }
    return rc;
}

int ff_reshard_run(ff_reshard_plan *p, ff_model *src, ff_model *dst, ff_reshard_stats *st) {
    const int64_t t0 = ff_now_ns();
    if (p->be) {
        ff_reshard_stats s = {0};
        if ((src && ff_model_backend(src) != p->be) || (dst && ff_model_backend(dst) != p->be))
            return ff_error_set("reshard", "run the plan with models on the backend it was made for", "opts.device: another backend");
        int rc = run_device(p, src, dst, &s);
        s.time_s = (double)(ff_now_ns() - t0) * 1e-9;
        if (st) *st = s;
        return rc ? ff_error_wrap("resharding the weights on %s (rank %d of %d)", ff_backend_name(p->be), p->rank, p->size) : 0;
    }
    if (dst && ff_model_viewed(dst) && ff_model_viewed(dst) != src)
        return ff_error_set("reshard", "give the model the destination views as this rank's source",
                            "rank %d: the destination reads part of its weights in place from a model that is not the source", p->rank);
    ff_reshard_stats s = {0};
    int rc = 0;
    ff_model_tensor_info ts = {0}, td = {0};
    bool has_src, has_dst;
    for (int64_t b = 0, i0 = 0; b < p->nbuckets && rc == 0; i0 = p->bucket_end[b++]) {
        const int64_t i1 = p->bucket_end[b];
        /* the bucket's source shards to host (unless only read in place here); a delta
         * sync's destination shards too (the values the patches apply to) */
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
            bool read = false;
            for (int64_t k = i; k < j; k++) read = read || p->ops[k].kind == OP_SEND || (p->ops[k].kind == OP_LOCAL && !in_place(&td, &p->ops[k]));
            if (has_src && read) rc = ff_model_read_tensor(src, ts.name, false, p->src_host + p->src_off[p->ops[i].slot]);
            if (rc == 0 && has_dst && p->delta) rc = ff_model_read_tensor(dst, td.name, false, p->dst_host + p->dst_off[p->ops[i].slot]);
        }
        if (rc == 0) rc = p->delta ? move_delta(p, src, dst, i0, i1, &s) : move_dense(p, src, dst, i0, i1, &s);
        /* the local pieces, the destination shards written */
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
            const float *sh = p->src_host + p->src_off[p->ops[i].slot];
            float *dh = p->dst_host + p->dst_off[p->ops[i].slot];
            for (int64_t k = i; k < j; k++) {
                const op *o = &p->ops[k];
                if (o->kind != OP_LOCAL) continue;
                piece ps = piece_of(&ts, o->lo, o->hi), pd = piece_of(&td, o->lo, o->hi);
                if (in_place(&td, o)) { /* a view destination reads it where it is */
                    s.in_place += piece_numel(&ps) * (int64_t)sizeof(float);
                    continue;
                }
                copy_local(sh, &ps, dh, &pd, p->bf16);
                s.local += piece_numel(&ps) * (int64_t)sizeof(float);
            }
            if (has_dst) rc = ff_model_write_tensor(dst, td.name, dh);
        }
    }
    /* a failed delta run leaves the receivers' copies unknown: the next run goes dense */
    if (rc && p->delta) memset(p->kept_ok, 0, (size_t)(p->nops ? p->nops : 1));
    s.time_s = (double)(ff_now_ns() - t0) * 1e-9;
    if (st) *st = s;
    return rc ? ff_error_wrap("resharding the weights (rank %d of %d)", p->rank, p->size) : 0;
}

int64_t ff_reshard_plan_buckets(const ff_reshard_plan *p) { return p->nbuckets; }

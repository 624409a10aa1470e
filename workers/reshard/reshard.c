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
 * Not here: which ranks form the group, the models' memory. */
#include "fuseflow/reshard.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
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
};

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
    free(p);
    *pp = NULL;
}

int64_t ff_reshard_plan_received(const ff_reshard_plan *p) { return p->received; }
int64_t ff_reshard_plan_sent(const ff_reshard_plan *p) { return p->sent; }

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

/* Bytes per run, the buckets and their staging. */
static int size_staging(ff_reshard_plan *p, const ff_model *src, const ff_model *dst) {
    const size_t es = p->bf16 ? 2 : 4;
    int64_t bsrc = 0, bdst = 0, bspack = 0, brpack = 0; /* the open bucket's, elements */
    int64_t cap = 0;
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
                if (p->bf16 || !contiguous(&pc)) spack += piece_numel(&pc);
                need_src = true;
            } else if (o->kind == OP_RECV) {
                piece pc = piece_of(&td, o->lo, o->hi);
                p->received += piece_numel(&pc) * (int64_t)es;
                if (p->bf16 || !contiguous(&pc)) rpack += piece_numel(&pc);
                need_dst = true;
            } else {
                need_src = need_dst = true;
            }
        }
        const int64_t ns = need_src ? shard_numel(&ts) : 0, nd = need_dst ? shard_numel(&td) : 0;
        const int64_t bytes = (ns + nd) * 4 + (spack + rpack) * (int64_t)es;
        const int64_t open = (bsrc + bdst) * 4 + (bspack + brpack) * (int64_t)es;
        if (first > 0 && open > 0 && open + bytes > p->bucket_bytes) { /* close the open bucket */
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
    ff_reshard_plan *p = ff_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->comm = comm, p->size = ff_coll_comm_size(comm), p->rank = ff_coll_comm_rank(comm), p->bf16 = opts && opts->bf16;
    p->bucket_bytes = opts && opts->bucket_bytes > 0 ? opts->bucket_bytes : FF_RESHARD_BUCKET_BYTES;
    p->nslots = ff_model_tensor_slots(cfg);
    int64_t key[2] = {p->nslots, cfg->hidden_size}, *keys = ff_malloc((size_t)p->size * sizeof key);
    const size_t nd = (size_t)p->nslots * DESC;
    int64_t *mine = ff_malloc(nd * sizeof *mine), *all = ff_malloc((size_t)p->size * nd * sizeof *all);
    p->src_at = ff_malloc((size_t)p->nslots * sizeof *p->src_at);
    p->dst_at = ff_malloc((size_t)p->nslots * sizeof *p->dst_at);
    p->src_off = ff_calloc((size_t)p->nslots, sizeof *p->src_off);
    p->dst_off = ff_calloc((size_t)p->nslots, sizeof *p->dst_off);
    int rc = keys && mine && all && p->src_at && p->dst_at && p->src_off && p->dst_off ? 0 : -1;
    if (rc == 0) index_slots(src, p->src_at, p->nslots), index_slots(dst, p->dst_at, p->nslots);
    if (rc == 0) rc = ff_coll_all_gather(key, keys, 2, FF_DTYPE_I64, comm, NULL);
    for (int r = 0; rc == 0 && r < p->size; r++)
        if (keys[2 * r] != key[0] || keys[2 * r + 1] != key[1])
            rc = ff_error_set("reshard", "every model of the group loads the same checkpoint",
                              "rank %d's model has %" PRId64 " tensor slots and hidden size %" PRId64 ", this rank's %" PRId64
                              " and %" PRId64,
                              r, keys[2 * r], keys[2 * r + 1], key[0], key[1]);
    if (rc == 0) {
        for (size_t i = 0; i < nd; i++) mine[i] = -1;
        describe(src, false, mine, p->nslots);
        describe(dst, true, mine, p->nslots);
        rc = ff_coll_all_gather(mine, all, nd, FF_DTYPE_I64, comm, NULL);
    }
    if (rc == 0) rc = plan_pieces(p, all);
    if (rc == 0) rc = size_staging(p, src, dst);
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

int ff_reshard_run(ff_reshard_plan *p, ff_model *src, ff_model *dst, ff_reshard_stats *st) {
    const int64_t t0 = ff_now_ns();
    ff_reshard_stats s = {0};
    const ff_dtype wire = p->bf16 ? FF_DTYPE_BF16 : FF_DTYPE_F32;
    const size_t es = p->bf16 ? 2 : 4;
    int rc = 0;
    ff_model_tensor_info ts = {0}, td = {0};
    bool has_src, has_dst;
    for (int64_t b = 0, i0 = 0; b < p->nbuckets && rc == 0; i0 = p->bucket_end[b++]) {
        const int64_t i1 = p->bucket_end[b];
        /* the bucket's source shards to host */
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j)
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) == 0 && has_src)
                rc = ff_model_read_tensor(src, ts.name, false, p->src_host + p->src_off[p->ops[i].slot]);
        if (rc) break;
        /* its sends and receives in one group; packed pieces laid out in order */
        int64_t so = 0, ro = 0;
        rc = ff_coll_group_start();
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
                    s.sent += piece_numel(&pc) * (int64_t)es;
                } else if (o->kind == OP_RECV) {
                    piece pc = piece_of(&td, o->lo, o->hi);
                    void *buf = dh + pc.off;
                    if (p->bf16 || !contiguous(&pc)) {
                        buf = (char *)p->recv_pack + (size_t)ro * es;
                        ro += piece_numel(&pc);
                    }
                    rc = ff_coll_recv(buf, (size_t)piece_numel(&pc), wire, o->peer, p->comm, NULL);
                    s.received += piece_numel(&pc) * (int64_t)es;
                    s.messages++;
                }
            }
        }
        if (ff_coll_group_end() != 0 && rc == 0) rc = -1;
        /* unpack, the local pieces, the destination shards written */
        ro = 0;
        for (int64_t i = i0, j; i < i1 && rc == 0; i = j) {
            if ((rc = tensor_at_op(p, src, dst, i, &j, &ts, &td, &has_src, &has_dst)) != 0) break;
            const float *sh = p->src_host + p->src_off[p->ops[i].slot];
            float *dh = p->dst_host + p->dst_off[p->ops[i].slot];
            for (int64_t k = i; k < j; k++) {
                const op *o = &p->ops[k];
                if (o->kind == OP_RECV) {
                    piece pc = piece_of(&td, o->lo, o->hi);
                    if (p->bf16 || !contiguous(&pc)) {
                        unpack((char *)p->recv_pack + (size_t)ro * es, &pc, dh, p->bf16);
                        ro += piece_numel(&pc);
                    }
                } else if (o->kind == OP_LOCAL) {
                    piece ps = piece_of(&ts, o->lo, o->hi), pd = piece_of(&td, o->lo, o->hi);
                    copy_local(sh, &ps, dh, &pd, p->bf16);
                    s.local += piece_numel(&ps) * (int64_t)sizeof(float);
                }
            }
            if (has_dst) rc = ff_model_write_tensor(dst, td.name, dh);
        }
    }
    s.time_s = (double)(ff_now_ns() - t0) * 1e-9;
    if (st) *st = s;
    return rc ? ff_error_wrap("resharding the weights (rank %d of %d)", p->rank, p->size) : 0;
}

int64_t ff_reshard_plan_buckets(const ff_reshard_plan *p) { return p->nbuckets; }

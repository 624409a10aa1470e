/* fuseflow: moving a model's weights from one layout to another over ff_coll (issue 11, the
 * 3D-HybridEngine's resharding, docs/run.md "Weight sync"): the trained actor's shards (TP
 * shards of pipeline stages) to the generating copy's shards, on the same ranks (the micro-DP
 * group of HybridFlow's mapping) or on ranks of their own (a generation pool).
 *
 * A plan, computed once per pair of layouts on a communicator, says for every rank which
 * pieces of its destination shard it already holds in its source shard (copied locally) and
 * which it receives, each from one rank that holds it; no rank receives a piece it holds,
 * so a rank receives exactly its destination shard minus what it held (never a whole tensor
 * unless its destination shard is one). Pieces move in buckets of whole tensors, each in one
 * group of sends and receives (ff_coll_group_start / end), fp32 or rounded to bf16 on the wire.
 * Every rank cuts its buckets at the same tensors (the union of each rank's own cuts).
 *
 * Delta syncs (opts.delta): the sender keeps, per piece it sends, the last values that crossed
 * the wire (in the wire dtype: ff_reshard_plan_kept_bytes), and the receiver's copy holds the
 * same values; each run sends per piece a header (the count of elements whose wire value
 * changed, and a 64-bit hash of the new piece), then either those elements (u32 index + value)
 * or the dense piece when that is not larger. The receiver patches its copy, hashes the
 * result and answers; a mismatch (the receiver's copy was not what the sender kept) is
 * logged and the piece is resent dense in the same run. Only for a destination that keeps its
 * weights between runs (a generation pool): a copy released between syncs has no base.
 *
 * In place (the 3D-HybridEngine's colocated transition): a destination that views this rank's
 * source (ff_model_opts.view_of) holds the pieces of its shard that the source holds there
 * already; a run leaves them where they are (stats.in_place) and writes the received pieces
 * into the view's own buffer, which holds exactly the missing part (fp32 only: bf16 on the
 * wire into a view is refused at planning).
 *
 * Not here: which ranks form the group or where the layouts come from (the worker's, and the
 * controller's placement); the models' memory (ff_model_release_params). */
#ifndef FUSEFLOW_RESHARD_H
#define FUSEFLOW_RESHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/coll.h"
#include "fuseflow/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

typedef struct ff_reshard_plan ff_reshard_plan;

/* What one run moved on this rank (bytes as they travel: 2 per element in bf16). */
typedef struct ff_reshard_stats {
    int64_t received, sent; /* bytes from and to other ranks */
    int64_t local;          /* bytes copied from the source shard on this rank */
    int64_t in_place;       /* bytes of the destination shard that it reads in place from the
                               source (a view, ff_model_opts.view_of): neither copied nor sent */
    int64_t messages;       /* receives posted */
    double time_s;
    /* delta syncs (zero otherwise), over the pieces this rank received: */
    int64_t delta_elems;    /* elements of the pieces compared against the previous run */
    int64_t delta_changed;  /* ... of them, changed on the wire (dense first runs not counted) */
    int64_t pieces_sparse, pieces_dense; /* how each piece travelled (a resend counts dense) */
    int64_t fallbacks;      /* pieces whose patched hash differed: resent dense */
    int64_t bytes_saved;    /* the dense sync's received bytes minus what was received
                               (headers and a sender's verdicts included: negative on a
                               first run) */
} ff_reshard_stats;

/* A collective of every rank of comm: src is this rank's trained model (NULL: it holds
 * nothing), dst its model to fill (NULL: it receives nothing); every model of the group has
 * the same config, and every rank at least one of them. Each rank's pieces come from the
 * ranks that hold them, spread over them by the receiver's rank (several holders: the
 * replicas of a piece). opts (NULL: fp32, 64 MiB buckets): bf16 rounds on the wire (dst then
 * holds the fp32 weights rounded to bf16, to nearest even). NULL + error: a piece that no rank of the group holds (the
 * layouts do not cover one another), configs that differ, the group broken. Keeps comm (it
 * must outlive the plan) and no pointer to the models: a run may take models of the same
 * layouts re-created since. */
typedef struct ff_reshard_opts {
    bool bf16;            /* round to bf16 on the wire */
    int64_t bucket_bytes; /* host staging per bucket of tensors (0: FF_RESHARD_BUCKET_BYTES;
                             a tensor larger than it is a bucket of its own) */
    bool delta;           /* send only what changed since the last run (above); every rank of
                             the group must give the same value */
    bool device;          /* move the models' memory itself: every piece packed, sent, received
                             and unpacked on the models' backend (ff_model_tensor_storage,
                             ff_memcpy_2d, the bf16 casts), no host copy of a shard. The
                             communicator's library must read that memory: the cpu ff_coll
                             beside the cpu backend, else comm's NCCL twin (ff_coll_comm_twin,
                             made at the first run). The same bits as without it. Not with delta
                             (its hashes are computed on the host) nor into a view. Where the
                             ranks of the group would not all move device memory with the same
                             library (a rank without it, a cpu beside a cuda backend), every
                             rank goes through host memory. */
} ff_reshard_opts;
#define FF_RESHARD_BUCKET_BYTES ((int64_t)64 << 20)
/* NULL + error also: a view destination (ff_model_viewed) whose model is not src, or with bf16. */
ff_reshard_plan *ff_reshard_plan_new(ff_coll_comm *comm, const ff_model *src, const ff_model *dst, const ff_reshard_opts *opts);
void ff_reshard_plan_destroy(ff_reshard_plan **p);
/* The bytes this rank will receive and send per run, by the plan, and its buckets. */
int64_t ff_reshard_plan_received(const ff_reshard_plan *p);
int64_t ff_reshard_plan_sent(const ff_reshard_plan *p);
int64_t ff_reshard_plan_buckets(const ff_reshard_plan *p);
/* Delta syncs: the bytes this rank keeps of what it sent (its sent bytes; 0 without delta). */
int64_t ff_reshard_plan_kept_bytes(const ff_reshard_plan *p);

/* Move the weights: every rank of the plan's communicator calls it with models of the
 * layouts the plan was made for (dst's parameters held: ff_model_restore_params). st may be
 * NULL. 0 or -1 + error (the group broken; dst then holds a mix). */
int ff_reshard_run(ff_reshard_plan *p, ff_model *src, ff_model *dst, ff_reshard_stats *st);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif

/* fuseflow: splitting a mini-batch over data-parallel ranks and into micro-batches, balanced
 * by token count. The controller plans (it sees the whole mini-batch); the trainers follow
 * the plan. Pure functions on arrays: no model, no transport.
 *
 * Not here: what a token costs (the caller passes counts), the training step (roles.h). */
#ifndef FUSEFLOW_MICROBATCH_H
#define FUSEFLOW_MICROBATCH_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* Partition n items with weights w [n] into k bins with sums as equal as possible by the
 * largest differencing method (Karmarkar-Karp, k-way). equal_count: every bin gets n/k or
 * n/k + 1 items. Deterministic (ties broken by index). bin_of [n] gets each item's bin in
 * [0, k); bins are numbered by decreasing sum. 0, or -1 + error (allocation; k < 1). */
int ff_balance_kk(const int64_t *w, int32_t n, int32_t k, bool equal_count, int32_t *bin_of);

/* A mini-batch split over DP ranks and into micro-batches. Sample indices of rank r's
 * micro-batch b: items[mb_start[m] .. mb_start[m + 1]) with m in [rank_mb[r], rank_mb[r + 1]). */
typedef struct ff_mb_plan {
    int32_t n_ranks, n_micro; /* n_micro: micro-batches over all ranks */
    int32_t *items;           /* [n] sample indices (into the caller's mini-batch) */
    int32_t *mb_start;        /* [n_micro + 1] */
    int32_t *rank_mb;         /* [n_ranks + 1] */
    int64_t *mb_tokens;       /* [n_micro] tokens per micro-batch */
} ff_mb_plan;

/* Plan a mini-batch of n samples of tokens[i] tokens (prompt + response) over n_ranks:
 * each rank gets n/n_ranks (or one more) samples, balanced by tokens (equal-count KK); each
 * rank's share is cut into micro-batches of at most micro_batch_size samples (0: no limit)
 * and at most micro_batch_tokens tokens (0: no limit; a sample longer than that is a
 * micro-batch alone), as few as the limits allow, balanced by tokens. Every rank gets the
 * same number of micro-batches when the limits allow it (a rank may get an empty one),
 * which keeps ranks in step. Within a micro-batch, indices ascend. 0 or -1 + error. */
int ff_mb_plan_make(const int64_t *tokens, int32_t n, int32_t n_ranks, int32_t micro_batch_size, int32_t micro_batch_tokens,
                    ff_mb_plan *out);
void ff_mb_plan_free(ff_mb_plan *p);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

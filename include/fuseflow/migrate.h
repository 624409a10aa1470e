/* fuseflow: what moving a decoding sequence to another engine costs, and which way is cheaper:
 * sending its KV rows (bytes over a link, plus the host staging at both ends) or sending only
 * its tokens and recomputing the rows by a prefill on the receiver (RLHFuse's long-tail
 * migration, docs/roles.md "Moving a sequence"). Pure arithmetic the controller can use when
 * it decides a migration; the inputs are measured by the engines (ff_rollout_stats:
 * recomputed_tokens, recompute_s) or by bench/bench_migrate.c.
 *
 * Not here: moving anything (roles.h ff_rollout_export / ff_rollout_import), when to migrate
 * and where to (the controller; the planner's simulator, plan.h ff_plan_rollout_simulate). */
#ifndef FUSEFLOW_MIGRATE_H
#define FUSEFLOW_MIGRATE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef enum { FF_MIGRATE_KV = 0, FF_MIGRATE_RECOMPUTE = 1 } ff_migrate_how;

typedef struct ff_migrate_costs {
    double kv_bytes_per_token;   /* one position's KV rows on one rank, all its layers (ff_migrate_kv_bytes_per_token) */
    double link_bytes_per_s;     /* sender to receiver, > 0 */
    double copy_bytes_per_s;     /* host staging of the rows at each end (device to host at the sender, host to
                                    device at the receiver; a memcpy each on the CPU backend); 0: free */
    double prefill_tokens_per_s; /* the receiver's prefill rate at about this context, measured; > 0 */
    double prefill_latency_s;    /* a prefill's fixed cost besides its tokens (its forward's floor), >= 0 */
} ff_migrate_costs;

/* Bytes of one position's KV rows on one rank of tp: 2 (K, V) x layers x the rank's key/value
 * heads (kv_heads / tp, or 1 when tp > kv_heads: heads are replicated, plan.h's rule) x
 * head_dim x dtype_bytes (4 in fuseflow's cache). */
double ff_migrate_kv_bytes_per_token(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t tp, double dtype_bytes);
/* Seconds that sending the rows of `positions` positions adds to the move (the tokens and the
 * sampling state travel either way and are not counted). */
double ff_migrate_kv_s(const ff_migrate_costs *c, int64_t positions);
/* Seconds of recomputing them on the receiver instead. */
double ff_migrate_recompute_s(const ff_migrate_costs *c, int64_t positions);
/* The cheaper of the two (ties go to the rows, which are exact bit for bit). */
ff_migrate_how ff_migrate_choose(const ff_migrate_costs *c, int64_t positions);
/* The link bandwidth below which a recompute of `positions` positions is cheaper, bytes/s
 * (0 when the rows' staging alone costs more than the recompute). */
double ff_migrate_breakeven_bytes_per_s(const ff_migrate_costs *c, int64_t positions);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

/* The cost model of moving a decoding sequence (include/fuseflow/migrate.h): the rows' bytes
 * at a link's and a staging copy's bandwidth against a prefill at a measured rate.
 *
 * Not here: measuring the rates (the engines' stats, bench/bench_migrate.c), the decision of
 * when and where to migrate (the controller). */
#include <assert.h>

#include "fuseflow/migrate.h"
#include "fuseflow/plan.h"

double ff_migrate_kv_bytes_per_token(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t tp, double dtype_bytes) {
    assert(layers >= 0 && kv_heads >= 1 && head_dim >= 0 && tp >= 1 && dtype_bytes > 0);
    return 2.0 * (double)layers * ff_plan_kv_heads_per_rank(kv_heads, tp) * (double)head_dim * dtype_bytes;
}

/* Seconds per position of the rows' staging (both ends), apart from the link. */
static double staging_s_per_token(const ff_migrate_costs *c) {
    return c->copy_bytes_per_s > 0 ? 2.0 * c->kv_bytes_per_token / c->copy_bytes_per_s : 0.0;
}

double ff_migrate_kv_s(const ff_migrate_costs *c, int64_t positions) {
    assert(c->link_bytes_per_s > 0 && positions >= 0);
    return (double)positions * (c->kv_bytes_per_token / c->link_bytes_per_s + staging_s_per_token(c));
}

double ff_migrate_recompute_s(const ff_migrate_costs *c, int64_t positions) {
    assert(c->prefill_tokens_per_s > 0 && positions >= 0);
    return positions > 0 ? c->prefill_latency_s + (double)positions / c->prefill_tokens_per_s : 0.0;
}

ff_migrate_how ff_migrate_choose(const ff_migrate_costs *c, int64_t positions) {
    return ff_migrate_kv_s(c, positions) <= ff_migrate_recompute_s(c, positions) ? FF_MIGRATE_KV : FF_MIGRATE_RECOMPUTE;
}

double ff_migrate_breakeven_bytes_per_s(const ff_migrate_costs *c, int64_t positions) {
    if (positions <= 0) return 0.0;
    /* positions kv / link + positions staging = recompute  ->  link = positions kv / (recompute - positions staging) */
    double room = ff_migrate_recompute_s(c, positions) - (double)positions * staging_s_per_token(c);
    return room > 0 ? (double)positions * c->kv_bytes_per_token / room : 0.0;
}

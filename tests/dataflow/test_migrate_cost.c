/* The cost model of moving a decoding sequence (fuseflow/migrate.h), on hand-worked numbers:
 * the KV bytes per position (GQA and replicated heads under TP), the two times, the choice on
 * either side of the break-even link, and the break-even itself. */
#include "fuseflow/migrate.h"
#include "tests/test_util.h"

int main(void) {
    /* 2 x 32 layers x 8 kv heads x 128 x 2 bytes = 131072 B/token; TP 4: 2 heads a rank; TP 16: 1 (replicated) */
    CHECK_CLOSE(ff_migrate_kv_bytes_per_token(32, 8, 128, 1, 2), 131072.0, 0, 0);
    CHECK_CLOSE(ff_migrate_kv_bytes_per_token(32, 8, 128, 4, 2), 32768.0, 0, 0);
    CHECK_CLOSE(ff_migrate_kv_bytes_per_token(32, 8, 128, 16, 2), 16384.0, 0, 0);

    /* 1000 B/token, 1e6 B/s link, 1e7 B/s staging: 1000 positions send in 1 s + 2 x 0.1 s; a
     * prefill of 5000 tokens/s and 0.05 s floor recomputes them in 0.25 s */
    ff_migrate_costs c = {.kv_bytes_per_token = 1000, .link_bytes_per_s = 1e6, .copy_bytes_per_s = 1e7,
                          .prefill_tokens_per_s = 5000, .prefill_latency_s = 0.05};
    CHECK_CLOSE(ff_migrate_kv_s(&c, 1000), 1.2, 1e-12, 0);
    CHECK_CLOSE(ff_migrate_recompute_s(&c, 1000), 0.25, 1e-12, 0);
    CHECK(ff_migrate_choose(&c, 1000) == FF_MIGRATE_RECOMPUTE);
    CHECK_CLOSE(ff_migrate_recompute_s(&c, 0), 0.0, 0, 0);
    CHECK(ff_migrate_choose(&c, 0) == FF_MIGRATE_KV);
    /* break-even: 1000 x 1000 / (0.25 - 0.2) = 2e7 B/s; just above it the rows win, below recompute */
    double be = ff_migrate_breakeven_bytes_per_s(&c, 1000);
    CHECK_CLOSE(be, 2e7, 1e-3, 0);
    c.link_bytes_per_s = be * 1.01;
    CHECK(ff_migrate_choose(&c, 1000) == FF_MIGRATE_KV);
    c.link_bytes_per_s = be * 0.99;
    CHECK(ff_migrate_choose(&c, 1000) == FF_MIGRATE_RECOMPUTE);
    /* a short prefix: the prefill's floor makes the rows cheaper even on the slow link */
    c.link_bytes_per_s = 1e6;
    CHECK(ff_migrate_choose(&c, 10) == FF_MIGRATE_KV); /* 0.012 s vs 0.052 s */
    /* staging alone dearer than the recompute: no link is fast enough */
    c.copy_bytes_per_s = 1e6;
    CHECK_CLOSE(ff_migrate_breakeven_bytes_per_s(&c, 1000), 0.0, 0, 0);
    TEST_MAIN_END();
}

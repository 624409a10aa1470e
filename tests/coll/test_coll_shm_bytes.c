/* FF_COLL_SHM_BYTES: a byte count in [4096, 268435456] sets each shared-memory FIFO's size
 * (the segment of a pair of ranks holds two FIFOs, so it grows by twice the difference);
 * anything else fails ff_coll_comm_init on every rank with a message that names the
 * variable, the value and the range (such values were once replaced by the default
 * without a word). */
#include "coll_test.h"

static char *msg_slot(int rank) { return (char *)g_shared + 4096 + (size_t)rank * 1024; }
static size_t *seg_slot(int rank) { return (size_t *)g_shared + rank; }

/* Bytes of this process's shared-memory segment mappings (/proc/self/maps). */
static size_t segment_bytes(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[512];
    size_t total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (strstr(line, "/ffcoll-") && sscanf(line, "%lx-%lx", &lo, &hi) == 2) total += hi - lo;
    }
    fclose(f);
    return total;
}

static int join(ff_coll_comm *unused, int rank, int n, const ff_coll_id *id, void *arg) {
    (void)unused, (void)arg;
    int fails = 0;
    ff_coll_options o = {.timeout_s = 10};
    ff_coll_comm *c = NULL;
    if (ff_coll_comm_init(&c, n, id, rank, &o) != 0) {
        snprintf(msg_slot(rank), 1024, "%s", ff_error_message());
        return 0; /* the parent judges the message */
    }
    *seg_slot(rank) = segment_bytes();
    float x = 1.0f;
    RCHECK(ff_coll_all_reduce(&x, &x, 1, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) == 0 && x == (float)n, "all_reduce: %s",
           ff_error_message());
    ff_coll_comm_destroy(&c);
    return fails;
}

/* Two ranks with FF_COLL_SHM_BYTES=value (NULL: unset); the segment bytes rank 0 mapped. */
static size_t run_with(const char *value) {
    if (value) setenv("FF_COLL_SHM_BYTES", value, 1);
    else unsetenv("FF_COLL_SHM_BYTES");
    run_opts ro = default_run();
    ro.no_comm = 1;
    ro.watchdog_s = 30;
    CHECK_EQ_INT(run_ranks(2, &ro, join, NULL), 0);
    return *seg_slot(0);
}

int main(void) {
    /* values in range: the FIFOs are that big, rounded up to pages */
    size_t small = run_with("65536"), big = run_with("1048576"), odd = run_with("65537");
    CHECK(small > 0 && msg_slot(0)[0] == 0);
    CHECK(big - small == 2 * (1048576 - 65536));
    CHECK(odd - small == 2 * 4096);
    CHECK(run_with(NULL) == big); /* the default for two ranks: 1 MiB */
    CHECK(run_with("") == big);   /* empty is unset */

    const char *bad[] = {"4095", "268435457", "abc", "64k", "-1", "1e6", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        run_with(bad[i]);
        char want[128];
        snprintf(want, sizeof want, "FF_COLL_SHM_BYTES: '%s' is not a byte count in [4096, 268435456]", bad[i]);
        for (int r = 0; r < 2; r++) CHECK_STR_CONTAINS(msg_slot(r), want);
    }
    unsetenv("FF_COLL_SHM_BYTES");
    TEST_MAIN_END();
}

/* The CPU backend's thread pool: every chunk of every job runs exactly once, with 1 to 4
 * threads, jobs of 1 to 97 chunks back to back, and pauses long enough for the workers to
 * fall asleep (the wake-up path). */
#include <stdint.h>
#include <time.h>

#include "kernels/cpu/cpu_pool.h"
#include "tests/test_util.h"

typedef struct job {
    int64_t hits[97];
    int64_t n;
} job;

static void count(void *ctx, int64_t i) {
    job *j = ctx;
    j->hits[i]++; /* each chunk index is claimed by exactly one thread */
}

int main(void) {
    for (int nt = 1; nt <= 4; nt++) {
        ff_pool *p = ff_pool_new(nt);
        REQUIRE(p);
        CHECK_EQ_INT(ff_pool_threads(p), nt);
        job j;
        for (int rep = 0; rep < 3000; rep++) {
            j.n = 1 + rep % 97;
            for (int i = 0; i < j.n; i++) j.hits[i] = 0;
            ff_pool_run(p, j.n, count, &j);
            int bad = 0;
            for (int i = 0; i < j.n; i++) bad += j.hits[i] != 1;
            CHECK_EQ_INT(bad, 0);
            if (rep % 1000 == 999) {
                struct timespec ts = {0, 2000000}; /* 2 ms: the workers go to sleep */
                nanosleep(&ts, NULL);
            }
        }
        ff_pool_run(p, 0, count, &j); /* nothing to do */
        ff_pool_destroy(&p);
        CHECK(p == NULL);
    }
    TEST_MAIN_END();
}

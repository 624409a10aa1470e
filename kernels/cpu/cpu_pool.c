/* The CPU backend's thread pool (see cpu_pool.h for why it is not OpenMP).
 *
 * Protocol. A 64-bit atomic counter holds (generation << 32 | next chunk). Publishing a job
 * writes its descriptor into jobs[gen & 1], then stores (gen << 32 | 0). A thread claims
 * chunk i by a compare-and-swap from (gen, i) to (gen, i + 1) after reading the descriptor
 * of that generation; if the CAS succeeds the descriptor is the job's (a descriptor is only
 * rewritten two generations later, after this job completed, which needs this chunk). Every
 * finished chunk increments the job's done count; the caller returns when done == n. So
 * the caller never waits for a thread that has not claimed anything.
 *
 * Idle workers spin for SPIN_NS, then sleep on a condition variable. A publisher wakes them
 * only if some are asleep: store(counter) then load(sleepers), against the sleeper's
 * store(sleepers) then load(counter), both sequentially consistent, so no wake-up is lost.
 *
 * Workers block all signals. Create pools after fork(): a child keeps the pool's memory
 * but not its workers (jobs still complete, on the caller alone). */
#include "kernels/cpu/cpu_pool.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"

#define SPIN_NS 50000 /* idle workers stay awake this long after a job */

typedef struct pool_job {
    _Atomic(ff_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t n;
    _Atomic int64_t done;
} pool_job;

struct ff_pool {
    int n_threads;
    pthread_t *workers; /* [n_threads - 1] */
    int n_started;
    _Atomic uint64_t counter;
    pool_job jobs[2];
    _Atomic int stop;
    _Atomic int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool busy; /* a job is running (the caller's side only) */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run chunks of generation g until none are left. */
static void work(ff_pool *p, uint64_t g) {
    for (;;) {
        uint64_t v = atomic_load_explicit(&p->counter, memory_order_acquire);
        if (v >> 32 != g) return;
        pool_job *j = &p->jobs[g & 1];
        int64_t i = (int64_t)(v & 0xffffffffu);
        int64_t n = atomic_load_explicit(&j->n, memory_order_relaxed);
        if (i >= n) return;
        ff_pool_fn fn = atomic_load_explicit(&j->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&j->ctx, memory_order_relaxed);
        if (!atomic_compare_exchange_weak_explicit(&p->counter, &v, v + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        fn(ctx, i);
        atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    ff_pool *p = arg;
    uint64_t seen = atomic_load(&p->counter) >> 32;
    for (;;) {
        int64_t t0 = ff_now_ns();
        unsigned k = 0;
        uint64_t g;
        while ((g = atomic_load_explicit(&p->counter, memory_order_acquire) >> 32) == seen) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
            cpu_relax();
            if ((++k & 63) == 0 && ff_now_ns() - t0 > SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while ((atomic_load(&p->counter) >> 32) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
                t0 = ff_now_ns();
            }
        }
        seen = g;
        work(p, g);
    }
}

ff_pool *ff_pool_new(int n_threads) {
    ff_pool *p = ff_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads < 1 ? 1 : n_threads;
    atomic_init(&p->counter, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->sleepers, 0);
    for (int i = 0; i < 2; i++) {
        atomic_init(&p->jobs[i].fn, NULL);
        atomic_init(&p->jobs[i].ctx, NULL);
        atomic_init(&p->jobs[i].n, 0);
        atomic_init(&p->jobs[i].done, 0);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (p->n_threads > 1) {
        p->workers = ff_calloc((size_t)p->n_threads - 1, sizeof(pthread_t));
        if (!p->workers) {
            ff_pool_destroy(&p);
            return NULL;
        }
        /* workers block every signal (they inherit the mask), so signals go to the
         * application's threads, e.g. an event loop that handles Ctrl-C */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int failed = 0;
        for (int i = 0; i < p->n_threads - 1 && !failed; i++) {
            if (pthread_create(&p->workers[i], NULL, worker_main, p)) {
                ff_error_set("cpu backend", "use fewer threads", "cannot start worker thread %d", i + 1);
                failed = 1;
            } else {
                p->n_started++;
            }
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (failed) {
            ff_pool_destroy(&p);
            return NULL;
        }
    }
    return p;
}

void ff_pool_destroy(ff_pool **pp) {
    if (!pp || !*pp) return;
    ff_pool *p = *pp;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->workers);
    free(p);
    *pp = NULL;
}

int ff_pool_threads(const ff_pool *p) { return p->n_threads; }

void ff_pool_run(ff_pool *p, int64_t n_chunks, ff_pool_fn fn, void *ctx) {
    if (n_chunks <= 0) return;
    if (p->n_threads == 1 || n_chunks == 1) {
        for (int64_t i = 0; i < n_chunks; i++) fn(ctx, i);
        return;
    }
    assert(!p->busy && n_chunks < ((int64_t)1 << 32));
    p->busy = true;
    uint64_t g = (atomic_load_explicit(&p->counter, memory_order_relaxed) >> 32) + 1;
    g &= 0xffffffffu;
    pool_job *j = &p->jobs[g & 1];
    atomic_store_explicit(&j->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&j->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&j->n, n_chunks, memory_order_relaxed);
    atomic_store_explicit(&j->done, 0, memory_order_relaxed);
    atomic_store(&p->counter, g << 32); /* seq_cst: publishes the descriptor */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    work(p, g);
    /* only chunks that others claimed and are still running remain */
    unsigned k = 0;
    while (atomic_load_explicit(&j->done, memory_order_acquire) < n_chunks) {
        if (++k < 2048) cpu_relax();
        else sched_yield(); /* the thread holding a chunk may be waiting for this core */
    }
    p->busy = false;
}

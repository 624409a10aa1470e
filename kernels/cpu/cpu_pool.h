/* The CPU backend's thread pool: a job is n chunks of work, claimed one at a time from an
 * atomic counter by the calling thread and by n_threads - 1 workers.
 *
 * Why not OpenMP parallel regions: a region ends at a barrier that every thread of the team
 * must reach, even a thread the OS has not run yet, so on a machine with more runnable
 * threads than cores (other jobs, colocated RLHF workers) each kernel can wait a whole
 * scheduler timeslice. Here the caller runs every chunk nobody has claimed and waits only
 * for chunks already being worked on: a late worker finds nothing left and the kernel has
 * run at single-thread speed instead of stalling. Idle workers spin briefly, then sleep.
 *
 * Chunking is chosen by the kernels, independent of the thread count, so results do not
 * depend on how many threads there are or which thread runs which chunk. */
#ifndef FF_KERNELS_CPU_POOL_H
#define FF_KERNELS_CPU_POOL_H

#include <stdint.h>

typedef struct ff_pool ff_pool;
typedef void (*ff_pool_fn)(void *ctx, int64_t chunk);

/* A pool running jobs on the caller plus n_threads - 1 workers. NULL + error. */
ff_pool *ff_pool_new(int n_threads);
void ff_pool_destroy(ff_pool **p);
int ff_pool_threads(const ff_pool *p);
/* Run fn(ctx, i) for i in [0, n_chunks) and return when all have finished. One job at a
 * time (the backend has one caller); fn must not call ff_pool_run. n_chunks == 1 or a pool
 * of one thread runs inline. */
void ff_pool_run(ff_pool *p, int64_t n_chunks, ff_pool_fn fn, void *ctx);

#endif

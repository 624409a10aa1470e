/* fuseflow: the RL worker, the other side of `fuseflow run` (include/fuseflow/executor.h):
 * the kinds of include/fuseflow/rl_protocol.h, served from the engines of fuseflow/roles.h:
 * rl.init, rl.generate (deferred: continuous batching across subtasks), rl.logprob,
 * rl.value, rl.score, rl.train, rl.sync, rl.save, rl.digest. `fuseflow worker` registers
 * them, so local workers spawned by `fuseflow run` serve them; an embedding program does
 * the same with ff_rlworker_setup and ff_worker_serve.
 *
 * Not here: the worker process itself (fuseflow/worker.h), the algorithm (the controller). */
#ifndef FUSEFLOW_RL_WORKER_H
#define FUSEFLOW_RL_WORKER_H

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */


typedef struct ff_worker ff_worker;
typedef struct ff_rlworker ff_rlworker;

ff_rlworker *ff_rlworker_new(void); /* NULL + error */
/* Free the engines; after the worker that used it has been destroyed. */
void ff_rlworker_destroy(ff_rlworker **r);
/* Register the rl.* kinds and the generation step hook on w. 0 / -1 + error. */
int ff_rlworker_register(ff_rlworker *r, ff_worker *w);
/* The same as an ff_worker_setup_fn: ud is the ff_rlworker. */
int ff_rlworker_setup(ff_worker *w, void *ud);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

/* Shared by dataflow/fuse.c and dataflow/fuse_solve.c (not a public header): the event
 * simulator's reusable workspace, so the solver scores thousands of schedules a second
 * without allocating, and the per-task heads and tails the bounds and the solver's
 * priorities both come from. */
#ifndef FF_DATAFLOW_FUSE_INTERNAL_H
#define FF_DATAFLOW_FUSE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/fuse.h"

typedef struct fuse_ctx {
    const ff_fuse_instance *in;
    int32_t stage_of[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES]; /* stage of model i on node n, -1: none */
    int64_t off[FF_FUSE_MAX_MODELS + 1]; /* model i's (stage, micro) items start at off[i]: off[i] + s m + k */
    int64_t tasks[FF_FUSE_MAX_NODES];    /* tasks a complete schedule has on each node */
    double *f_end, *b_end;               /* [off[n_models]] end of each forward and backward (-1: not run) */
    int32_t *stack;                      /* [nodes] nodes to look at again */
    bool queued[FF_FUSE_MAX_NODES];
} fuse_ctx;

int fuse_ctx_init(fuse_ctx *c, const ff_fuse_instance *in); /* 0 or -1 + error */
void fuse_ctx_free(fuse_ctx *c);

typedef struct fuse_score {
    double makespan, peak;
    double node_peak[FF_FUSE_MAX_NODES], node_busy[FF_FUSE_MAX_NODES];
    int32_t stuck;                       /* deadlock: a node that did not finish, else -1 */
} fuse_score;

/* Run a complete schedule (ff_fuse_simulate checked it). start/end: NULL, or [nodes][n_tasks]
 * to receive every task's times. 0, or 1 on deadlock (r->stuck). */
int fuse_run(fuse_ctx *c, const ff_fuse_schedule *s, fuse_score *r, double **start, double **end);

/* Model i's earliest starts and least remaining times, [S m] each, item s m + k: ef/eb the
 * earliest start of the forward / backward of micro-batch k at stage s, qf/qb the least time
 * from its end to the end of the schedule. Each model alone (others only add waiting). */
void fuse_heads_tails(const ff_fuse_instance *in, int i, double *ef, double *eb, double *qf, double *qb);

/* Whether the bounds' propagation (fuse_bound.c) proves that no schedule ends by T: 1 yes, 0 no
 * (some may), -1 out of memory (+ error). */
int fuse_refutes(const ff_fuse_instance *in, double T);

/* For every model and node of its stages, the fewest micro-batches of it that must be in flight
 * there at some time in a schedule that ends by T (the peak bound's reason). 0 or -1 + error. */
int fuse_least_in_flight(const ff_fuse_instance *in, double T, int32_t out[FF_FUSE_MAX_MODELS][FF_FUSE_MAX_NODES]);

/* Lower s's peak activation memory at a makespan cap (fuse_mem.c): on a node (the highest peak
 * first), a backward moved before the forward that reaches its peak, or a forward moved past the
 * next other task, kept when the schedule still ends by cap; until no such move is left or max_tries
 * simulations are spent (*tries: how many). s must run by cap (else it is left as it is).
 * The moves kept (>= 0), or -1 (a bug: the result does not run). */
int fuse_mem_descend(fuse_ctx *c, ff_fuse_schedule *s, double cap, int64_t max_tries, int64_t *tries);

/* Lower s's peak at a makespan cap by a random walk (fuse_mem.c): a task of a node moved up to 3
 * places, or a micro-batch's forward or backward moved by the same 1-2 places on every stage of
 * its model from one on; kept when the schedule still ends by cap and the peak plus a tenth of
 * the mean node peak does not rise (plateaus are walked). Until peak_floor (the peak bound), 20000
 * simulations without a lower energy, max_tries simulations, or deadline_ns (ff_now_ns; 0: none) (*tries: how many). Deterministic
 * for a seed when the deadline does not stop it. s must run by cap (else left as it is). The
 * times the peak came down (>= 0), or -1 (a bug: the result does not run or is higher). */
int fuse_mem_walk(fuse_ctx *c, ff_fuse_schedule *s, double cap, double peak_floor, uint64_t seed, int64_t max_tries, int64_t deadline_ns, int64_t *tries);

#endif

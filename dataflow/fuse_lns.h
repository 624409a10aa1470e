/* The fused solver's makespan repair (dataflow/fuse_lns.c), for dataflow/fuse_solve.c only (not
 * a public header): a large-neighbourhood step on a complete schedule. Not here: the search that
 * calls it, nor anything about memory beyond carrying the peak along. */
#ifndef FF_DATAFLOW_FUSE_LNS_H
#define FF_DATAFLOW_FUSE_LNS_H

#include "fuseflow/fuse.h"
#include "fuseflow/util.h"

typedef struct fuse_lns fuse_lns;

/* A workspace for one thread. qf/qb: the tails of every item (fuse_heads_tails, fuse_ctx
 * offsets), kept by pointer; lb, peak_lb: the bounds (the energy's units); scale: a typical task
 * time. NULL + error. */
fuse_lns *fuse_lns_new(const ff_fuse_instance *in, const double *qf, const double *qb, double lb, double peak_lb, double scale);
void fuse_lns_free(fuse_lns **l);

/* One repair try on s, a valid complete schedule: a window around its critical path (a time span
 * on a few nodes) gets its tasks' order freed and re-decoded by list scheduling with random keys,
 * the rest of every node's list kept. s takes the result by Metropolis at temperature temp (0:
 * only when not worse) on the energy makespan / bound + a tenth of the mean node end past the
 * bound / bound + the peak's tie-break; *mk and *pk are then s's makespan and peak. Returns 1 when
 * s changed, 0 when not, -1 when s does not run (a bug). */
int fuse_lns_step(fuse_lns *l, ff_fuse_schedule *s, ff_rng *rng, double temp, double *mk, double *pk);

#endif

/* The activation bytes of a fused instance's stage (ff_fuse_stage_activation), shared by the
 * executor's measured instance (workers/pipe) and `fuseflow run`'s fuse: auto (controller/rl).
 * Not here: the times (measured by the executor), the solver. */
#include "fuseflow/fuse.h"
#include "fuseflow/plan.h"

double ff_fuse_stage_activation(double layers, double tokens, int64_t hidden) {
    return layers * ff_plan_layer_activation_bytes(FF_FUSE_ACT_COEFF, tokens, hidden, 1, false);
}

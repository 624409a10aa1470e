/* fuseflow: the public C API, one include for embedding programs and plugins: every header
 * of include/fuseflow/, which together are the whole API of libfuseflow.so (what it
 * exports; tests/arch/test_exports.sh checks both). */
#ifndef FUSEFLOW_H
#define FUSEFLOW_H

#include "fuseflow/backend.h"
#include "fuseflow/coll.h"
#include "fuseflow/config.h"
#include "fuseflow/controller.h"
#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "fuseflow/executor.h"
#include "fuseflow/fuse.h"
#include "fuseflow/graph.h"
#include "fuseflow/jsonl.h"
#include "fuseflow/kernels.h"
#include "fuseflow/microbatch.h"
#include "fuseflow/migrate.h"
#include "fuseflow/model.h"
#include "fuseflow/model_config.h"
#include "fuseflow/modelio.h"
#include "fuseflow/msgs.h"
#include "fuseflow/pipe_exec.h"
#include "fuseflow/pipeline.h"
#include "fuseflow/plan.h"
#include "fuseflow/plugin.h"
#include "fuseflow/registry.h"
#include "fuseflow/reshard.h"
#include "fuseflow/reward.h"
#include "fuseflow/reward_client.h"
#include "fuseflow/rl_protocol.h"
#include "fuseflow/rl_worker.h"
#include "fuseflow/rlhf.h"
#include "fuseflow/roles.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/sft.h"
#include "fuseflow/tensor_set.h"
#include "fuseflow/tfevents.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/trace_summary.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"

#define FF_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *ff_version(void);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

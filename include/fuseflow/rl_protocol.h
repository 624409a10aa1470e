/* fuseflow: the rl.* contract between the RL controller (controller/rl/, ff_exec_run) and
 * the RL worker (workers/rl/, ff_rlworker): subtask kinds, the tensor names they carry, the
 * role bits of rl.init and the order of rl.train's metrics. Both sides include this header
 * and nothing else of each other, so a change here is a change of the protocol for both.
 *
 * Not here: what the kinds compute (include/fuseflow/executor.h and docs/run.md), the
 * message framing (fuseflow/msgs.h). */
#ifndef FUSEFLOW_RL_PROTOCOL_H
#define FUSEFLOW_RL_PROTOCOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- subtask kinds and their arguments ---------------------------------------------------
 * role: "actor", "gen", "critic", "ref" or "reward"; mb: micro-batch size in samples. */
#define FF_RL_INIT "rl.init"         /* config (tensor, YAML text), roles, updates_actor, updates_critic,
                                        slots, max_seq, backend, resume, name; dp_rank_actor,
                                        dp_size_actor, dp_rank_critic, dp_size_critic (the
                                        worker's place in the trained roles' DP groups:
                                        ZeRO-1 shards the optimizer state by it) */
#define FF_RL_GENERATE "rl.generate" /* prompts x n samples; n, temperature, top_p, top_k, max_new
                                        (deferred: continuous batching across subtasks) */
#define FF_RL_LOGPROB "rl.logprob"   /* per-token log-probs (entropy=1: and entropy); role, mb */
#define FF_RL_VALUE "rl.value"       /* per-token values of the critic; mb */
#define FF_RL_SCORE "rl.score"       /* a reward model's score per sample; mb */
#define FF_RL_TRAIN "rl.train"       /* one optimizer step on this rank's share; role, denom,
                                        tensor "mb" (micro-batch offsets); stage_times=1: the
                                        step's stage times too */
/* RLHFuse's fused step (graph.<actor train>.fuse): the actor's and the critic's shares of
 * their k-th mini-batches in one subtask to every rank of an actor pipeline replica; the
 * samples and columns of rl.train twice, their names prefixed "actor." and "critic." (with
 * "actor.mb", "critic.mb"); args denom_actor, denom_critic, timeline, fuse_instance (the
 * instance's JSON, fuseflow/fuse.h); tensor "fuse_schedule" I32: per node,
 * its task count c then c pairs (model, 0 forward | 1 backward). -> "metrics" F64 [2, FF_RL_NM]
 * (the actor's row, the critic's) [, pipe_times]. */
#define FF_RL_TRAIN_FUSED "rl.train_fused"
#define FF_RL_T_FUSE_SCHEDULE "fuse_schedule"
#define FF_RL_SYNC "rl.sync"         /* trained actor -> generating actor; mode local | reshard */
#define FF_RL_SAVE "rl.save"         /* a trained role's checkpoint; role, dir (to DP rank 0, or at
                                        ZeRO-1 to every DP rank of the role's group: they
                                        gather the optimizer state, rank 0 writes) */
#define FF_RL_DIGEST "rl.digest"     /* a hash of a role's weights; role */
/* Long-tail migration (docs/run.md "Migration"), DP generation workers only. Both subtasks
 * name the "migrate" group (a communicator over the generation workers); the states go from
 * the source to the survivor over it, never through the controller. */
#define FF_RL_MIGRATE_OUT "rl.migrate_out" /* peer (the survivor's member index), how (0 the KV rows,
                                              1 recompute, 2 auto: the cost model with link_bps
                                              and prefill_tps): at the worker's next step boundary
                                              with no sample waiting for a slot, every open
                                              rl.generate job's unfinished sequences go to the
                                              peer and the job completes with its finished
                                              samples and "state_len" (the moved ones' bytes);
                                              -> moved I64 [4] (sequences, bytes, KV positions,
                                              how: 0 kv or 1 recompute) */
#define FF_RL_MIGRATE_IN "rl.migrate_in"   /* peer (the source's member index): receive its
                                              sequences and continue them here (deferred, as
                                              rl.generate) -> tag I64 [m, 2] (each one's
                                              rl.generate subtask id and response index in it),
                                              xfer F64 [3] (bytes, seconds of the receive, how),
                                              rlen, finish I32 [m], resp I32, logprob F32 */

/* ---- what a worker hosts (rl.init's `roles`, a bit mask; also rl.*'s `role`) ----------- */
enum {
    FF_RL_ACTOR = 1,  /* the actor being trained (model + trainer + optimizer) */
    FF_RL_GEN = 2,    /* the generating actor (model + rollout engine) */
    FF_RL_CRITIC = 4, /* model with a value head + trainer */
    FF_RL_REF = 8,    /* reference policy (log-probs) */
    FF_RL_REWARD = 16 /* reward model (a value head's score at the last token) */
};

/* rl.init's outputs, with one row per role in the order of the bits above (actor, gen,
 * critic, ref, reward), zero where the worker does not host it:
 *   "params"     I64 [FF_RL_NROLES]: the role's parameter count
 *   "memory"     I64 [FF_RL_MEM_N]: the worker's resident memory once loaded, in bytes, and
 *                its backend's: the bytes it holds there (ff_backend_memory's in_use), the
 *                device's capacity (0 on the cpu) and its free bytes (ff_backend_device_free;
 *                -1 on the cpu)
 *   "role_bytes" I64 [FF_RL_NROLES, FF_RL_RB_N]: the bytes the role's parameters, gradients
 *                and optimizer state need (0 gradients and optimizer: it only infers), and of
 *                its parameters' those it reads in place from another role's memory on the
 *                worker (the colocated generating copy's view of the actor's training shard:
 *                counted in the actor's parameters, so not allocated twice) */
#define FF_RL_NROLES 5
#define FF_RL_T_PARAMS "params"
#define FF_RL_T_MEMORY "memory"
#define FF_RL_T_ROLE_BYTES "role_bytes"
enum { FF_RL_MEM_RSS = 0, FF_RL_MEM_PEAK, FF_RL_MEM_DEV, FF_RL_MEM_DEV_CAP, FF_RL_MEM_DEV_FREE, FF_RL_MEM_N }; /* VmRSS now, VmHWM (the peak so far), backend in_use, capacity, free */
enum { FF_RL_RB_PARAMS = 0, FF_RL_RB_GRADS, FF_RL_RB_OPTIM, FF_RL_RB_VIEWED, FF_RL_RB_N };
/* The roles' names, indexed by row ("actor", "gen", "critic", "ref", "reward"). */
extern const char *const ff_rl_role_names[FF_RL_NROLES];

/* ---- tensors -------------------------------------------------------------------------- */
/* Packed samples (I32): prompts [sum plen], their lengths [n], responses [sum rlen], theirs [n]. */
#define FF_RL_T_PROMPT "prompt"
#define FF_RL_T_PLEN "plen"
#define FF_RL_T_RESP "resp"
#define FF_RL_T_RLEN "rlen"
/* Outputs: rl.generate "rlen", "resp" (as above), "finish" (I32 [k n], ff_finish_reason)
 * and "logprob" (F32 [sum rlen]); rl.logprob "logprob" and, with entropy=1, "entropy";
 * rl.value "values" (F32 [sum rlen]); rl.score "score" (F32 [n]); rl.train "metrics"
 * (F64 [FF_RL_NM]). */
/* A job migrated out adds "state_len" (I64 [k n]: the bytes of each sample's state sent to
 * the survivor, 0 where it finished; a moved one's rlen is 0). Every generation result adds
 * "prefill" (F64 [2]: the tokens the worker's rollout prefilled and their seconds, the
 * recompute rate of the cost model) and "kv" (I64 [5]: the most KV blocks its rollout held
 * since its previous result, the blocks of its pool, the positions per block, and the decode
 * steps it replayed as graphs and launched eagerly since then). "state" (U8) is not used by the run: states never travel
 * through the controller (the name is kept for tests that count such bytes). */
#define FF_RL_T_STATE "state"
#define FF_RL_T_STATE_LEN "state_len"
#define FF_RL_T_MOVED "moved"
#define FF_RL_T_TAG "tag"
#define FF_RL_T_XFER "xfer"
#define FF_RL_T_PREFILL "prefill"
#define FF_RL_T_KV "kv"
#define FF_RL_T_FINISH "finish"
#define FF_RL_T_LOGPROB "logprob"
#define FF_RL_T_ENTROPY "entropy"
#define FF_RL_T_VALUES "values"
#define FF_RL_T_SCORE "score"
#define FF_RL_T_METRICS "metrics"
/* rl.train over a pipeline, from every rank: its instructions in the step, F64 [n, 5] rows of
 * (ff_pipe_op, micro-batch, chunk, start, end), seconds after the handler began */
#define FF_RL_T_PIPE_TIMES "pipe_times"
/* rl.train over a pipeline with stage_times=1: F64 [2, pp], the mean seconds of one
 * micro-batch's forward (row 0) and backward (row 1) through each stage of the role's
 * pipeline in the step (what fuse: auto measures) */
#define FF_RL_T_STAGE_TIMES "stage_times"
/* rl.sync, from every rank: I64 [1], the bytes of weights it received from other ranks */
#define FF_RL_T_RECEIVED "received"
#define FF_RL_T_SYNC_DELTA "sync_delta" /* rl.sync with sync_delta: I64 [3] elements compared, changed, bytes saved */
/* roles.actor.offload on the actor's workers (docs/run.md "Memory of the colocated copy"):
 * rl.sync, where the actor went away for generation, and the actor's rl.train or
 * rl.train_fused, where it came back: F64 [3] the AdamW bytes moved (to host memory, or
 * back), the gradient bytes released (or allocated again), the seconds it took. Absent when
 * nothing moved. */
#define FF_RL_T_OFFLOAD "offload"
/* roles.<ref|reward>.weights: on_demand (docs/run.md "Weights on demand"). rl.migrate_out's
 * argument prefetch (FF_RL_REF | FF_RL_REWARD bits, 0 none): the source, freed by the move,
 * starts loading those roles' weights onto its backend now, on a helper thread. Every
 * rl.generate result of a worker hosting such a role: "weights_held" I64 [1], those roles'
 * weight bytes on its backend when the job began. Every rl.logprob (role ref) or rl.score
 * on such a worker: "weights" F64 [FF_RL_W_N], the load it needed (bytes 0: the weights were
 * there): bytes copied onto the backend, the copy's seconds, the seconds the subtask waited
 * for it (load - waited: hidden by a prefetch), the role's bytes on the backend during the
 * subtask, 1 when prefetched, and the copy's start and end in seconds after the handler began
 * (a prefetch starts before it). */
#define FF_RL_T_WEIGHTS "weights"
#define FF_RL_T_WEIGHTS_HELD "weights_held"
enum { FF_RL_W_BYTES = 0, FF_RL_W_LOAD_S, FF_RL_W_WAITED_S, FF_RL_W_HELD, FF_RL_W_PREFETCHED, FF_RL_W_START, FF_RL_W_END, FF_RL_W_N };

/* A worker on a device (its backend has a capacity: cuda), on every result of rl.generate (each
 * rank of a TP replica too), rl.logprob, rl.value, rl.score, rl.train, rl.train_fused and rl.sync:
 * "device_peak" I64 [FF_RL_DP_N]: the most its backend held at once since its previous such
 * result (or since loading), what it holds now (ff_backend_memory: buffers and the backend's
 * own workspace) and what is free on the device now (ff_backend_device_free; -1 unknown), in
 * bytes. The controller keeps each rank's most held, and its least free, per iteration
 * (metrics.jsonl "device_memory"). */
enum { FF_RL_DP_PEAK = 0, FF_RL_DP_HELD, FF_RL_DP_FREE, FF_RL_DP_N };
/* The least that was free on the device since the previous result, from a "device_peak": what
 * is free now less what fuseflow held above what it holds now (at its peak; the others' use
 * taken as now), at least 0; -1 where the free figure is unknown. */
static inline int64_t ff_rl_device_least_free(const int64_t dp[FF_RL_DP_N]) {
    if (dp[FF_RL_DP_FREE] < 0) return -1;
    const int64_t above = dp[FF_RL_DP_PEAK] - dp[FF_RL_DP_HELD];
    return dp[FF_RL_DP_FREE] > above ? dp[FF_RL_DP_FREE] - above : 0;
}
#define FF_RL_T_DEVICE_PEAK "device_peak"

/* Per-token columns (F32 [sum rlen]) an rl.train subtask carries, aligned with "resp". */
enum {
    FF_RL_COL_OLD_LOGPROB = 0,
    FF_RL_COL_ADVANTAGES,
    FF_RL_COL_REF_LOGPROB,
    FF_RL_COL_OLD_VALUES,
    FF_RL_COL_RETURNS,
    FF_RL_NCOL
};
/* Their tensor names, indexed by FF_RL_COL_*: "old_logprob", "advantages", ... */
extern const char *const ff_rl_col_names[FF_RL_NCOL];

/* ---- rl.train's metrics, in this order --------------------------------------------------- */
enum {
    FF_RL_M_STEPS = 0, /* optimizer steps taken (0 or 1) */
    FF_RL_M_SKIPPED,   /* steps skipped (non-finite gradients) */
    FF_RL_M_MICRO,     /* micro-batches */
    FF_RL_M_TOKENS,    /* response tokens trained on */
    FF_RL_M_SAMPLES,
    FF_RL_M_LOSS,
    FF_RL_M_PG,
    FF_RL_M_KL,
    FF_RL_M_ENT_AGG,
    FF_RL_M_CLIP,
    FF_RL_M_APPROX_KL,
    FF_RL_M_RATIO_MAX,
    FF_RL_M_ENT_MEAN,
    FF_RL_M_VLOSS,
    FF_RL_M_VCLIP,
    FF_RL_M_VMEAN,
    FF_RL_M_GNORM,
    FF_RL_M_LR,
    FF_RL_M_TIME, /* seconds */
    FF_RL_M_BUBBLE, /* over a pipeline: the step's bubble fraction over its stages, else 0 */
    FF_RL_NM
};

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

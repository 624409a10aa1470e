/* The RL worker's two halves and the interface between them.
 *
 *   rlw_engine.c  the engines a worker hosts for `fuseflow run` (include/fuseflow/roles.h):
 *                 models per role, the rollout engine with its open generation jobs, scoring,
 *                 the trainers, weight sync, checkpoints. Sees roles.h and graph.h.
 *   rlw_kinds.c   the subtask kinds (rl.init, rl.generate, ...) that unpack a subtask's
 *                 tensors and arguments, call the engines and write the outputs. Sees
 *                 worker.h.
 *
 * Two translation units because graph.h (the scheduler's task) and worker.h (a subtask on a
 * worker) both name a type ff_task; this header names neither.
 *
 * Everything runs on the worker's compute thread. */
#ifndef FF_WORKERS_RL_RLW_H
#define FF_WORKERS_RL_RLW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/backend.h"
#include "fuseflow/dtype.h"
#include "fuseflow/fuse.h"
#include "fuseflow/rl_protocol.h"

typedef struct ff_coll_comm ff_coll_comm;
typedef struct rlw rlw;

/* Packed samples, views of a subtask's tensors. */
typedef struct rlw_samples {
    int32_t n;
    const int32_t *prompt, *plen; /* [sum plen], [n] */
    const int32_t *resp, *rlen;   /* [sum rlen], [n] */
    const float *col[FF_RL_NCOL];   /* [sum rlen] or NULL */
} rlw_samples;

/* A rank's coordinates in a layout, as the planner numbers them (TP innermost, then PP, then
 * DP): tp x pp ranks per DP replica, dp replicas (a ZeRO-1 optimizer holds its replica's range). */
typedef struct rlw_place {
    int32_t tp, tp_rank, pp, pp_rank, dp, dp_rank;
} rlw_place;

typedef struct rlw_init_args {
    const char *config;      /* the run config's text (YAML), as the controller read it */
    const char *config_name; /* its path: messages, plugins relative to it */
    const char *overrides;   /* the command line's key=value overrides, one per line */
    unsigned roles;          /* FF_RL_* bits */
    const char *backend;     /* "cpu:2", ... */
    const char *resume_dir;  /* a checkpoint folder to load trained roles from, or NULL */
    int64_t total_updates[2]; /* optimizer steps of the run: actor, critic (cosine schedules) */
    int32_t slots;           /* KV-cache slots of the rollout engine */
    int32_t max_seq_len;     /* prompt + response positions */
    /* This rank's place in its roles' layout (every role of a worker but the generating copy
     * shares one: colocated roles have their target's), and in the generation copy's layout
     * (gen.tp 0: the same place; else the actor's generation layout on the same workers, which
     * must have pp 1). With tp x pp > 1 in either, group is the communicator of the rank's pool
     * (every rank of the pool calls rlw_init together): it is split into the TP group the
     * models run their collectives on (colour: replica and stage), the pipeline group (colour:
     * replica and TP rank) and the DP group of the gradient all-reduce (colour: stage and TP
     * rank). */
    rlw_place main, gen;
    ff_coll_comm *group;
} rlw_init_args;

rlw *rlw_new(void);
void rlw_destroy(rlw **s);
/* Load what `roles` asks for (again: a second init replaces everything). 0 / -1 + error. */
int rlw_init(rlw *s, const rlw_init_args *a);
/* Whether generation runs in lockstep with other ranks (the generation copy under TP: each job
 * to its end in its handler), and whether this rank returns a role's per-sample outputs (TP
 * rank 0 of the first stage of its replica: the pipeline hands the outputs to every stage). */
bool rlw_gen_lockstep(const rlw *s);
bool rlw_returns_outputs(const rlw *s, unsigned role);
/* Parameters of a hosted role's model (FF_RL_ACTOR, FF_RL_GEN, ...), 0 when not hosted. */
int64_t rlw_param_count(const rlw *s, unsigned role);
/* The bytes a hosted role's parameters, gradients and optimizer state need, indexed by
 * FF_RL_RB_*; zeros when not hosted, 0 gradients and optimizer for a role that only infers. */
void rlw_role_bytes(const rlw *s, unsigned role, int64_t out[FF_RL_RB_N]);
/* The backend's memory counters (ff_backend_memory_of); all 0 before rlw_init made it. */
void rlw_backend_memory(const rlw *s, ff_backend_memory *out);
/* The device's free bytes now (ff_backend_device_free); -1 on the cpu and before rlw_init. */
int64_t rlw_device_free(const rlw *s);
/* The backend's peak := what it holds now (ff_backend_memory_reset_peak); nothing before rlw_init. */
void rlw_backend_reset_peak(rlw *s);

/* ---- generation (continuous batching) -------------------------------------------------- */
typedef struct rlw_sampling {
    float temperature; /* 0: greedy */
    float top_p;
    int32_t top_k;
    int32_t max_new;
    float len_median, len_p99_ratio; /* drawn lengths (ff_sampling.len_median; 0: off) */
    int32_t len_max;
} rlw_sampling;

/* A finished job: k prompts x n samples in prompt-major order. Arrays live until the
 * callback returns. */
typedef struct rlw_gen_done {
    void *owner;
    int32_t k, n;
    const int32_t *rlen;   /* [k n] response lengths */
    const int32_t *finish; /* [k n] ff_finish_reason */
    const int32_t *tokens; /* [total] */
    const float *logprobs; /* [total] */
    int64_t total;
    /* a job migrated out (rlw_gen_migrate_out), else NULL: each sample's state bytes [k n]
     * sent to the survivor (0: it finished here; > 0: moved, rlen 0) */
    const int64_t *moved;
} rlw_gen_done;
typedef void (*rlw_gen_cb)(void *ctx, const rlw_gen_done *d);

/* Queue k prompts with n samples each (one shared prefill per prompt; sample j of prompt i
 * draws from the stream (seeds[i], j)). owner identifies the job. 0 / -1 + error. */
int rlw_gen_add(rlw *s, void *owner, const int32_t *prompts, const int32_t *plens, const int64_t *seeds, int32_t k,
                int32_t n, const rlw_sampling *sp);
/* Under TP: generate k prompts x n samples to the end now, handing the job to cb (the TP ranks
 * of a replica must decode the same batch step by step, which jobs joining between steps at
 * each rank's own moment would break; so a TP replica runs its jobs one at a time, each
 * batched in itself). Needs no other job open. 0 / -1 + error. */
int rlw_gen_run(rlw *s, void *owner, const int32_t *prompts, const int32_t *plens, const int64_t *seeds, int32_t k, int32_t n,
                const rlw_sampling *sp, rlw_gen_cb cb, void *ctx);
/* One engine step; every job that finished in it is handed to cb and forgotten. 0 / -1. */
int rlw_gen_step(rlw *s, rlw_gen_cb cb, void *ctx);
/* Drop a job (its requests end, their samples are discarded). */
void rlw_gen_abort(rlw *s, void *owner);
/* Forget every job (after a failed step). */
void rlw_gen_clear(rlw *s);
int rlw_gen_open(const rlw *s); /* jobs not finished */
bool rlw_gen_waiting(const rlw *s); /* samples queued for a slot (no state to move yet) */
int32_t rlw_gen_free_slots(const rlw *s); /* KV slots no sequence holds */
/* Long-tail migration (docs/run.md "Migration"), the source's side, between two steps when no
 * sample waits for a slot (rlw_gen_waiting false, else refused): every open job's unfinished
 * sequences leave the rollout as ff_gen_seq_state bytes, with their KV rows (RLW_MIG_KV) or
 * without (RLW_MIG_RECOMPUTE: the survivor rebuilds them by a prefill), or, RLW_MIG_AUTO, the
 * cheaper by migrate.h's cost model (ff_migrate_choose over the sequences' positions, with
 * the measured link and the survivor's prefill rate; the rows while either is unknown).
 * send(send_ctx, batch) carries them to the survivor; when it fails they go back into this
 * rollout under their own ids and the jobs go on here (-1 + its error); when it succeeds each
 * job is handed to cb as migrated (its finished samples and the others' `moved` marks) and
 * forgotten. Refused under TP. 0 / -1 + error. */
enum { RLW_MIG_KV = 0, RLW_MIG_RECOMPUTE = 1, RLW_MIG_AUTO = 2 };
typedef struct rlw_mig_costs {
    int how;                     /* RLW_MIG_* */
    double link_bytes_per_s;     /* auto: source to survivor, measured (0: unknown) */
    double prefill_tokens_per_s; /* auto: the survivor's prefill rate, measured (0: unknown) */
} rlw_mig_costs;
/* The sequences on their way: states one after the other, each one's bytes, its job (the
 * owner given to rlw_gen_add) and its response in the job ([k n] order). */
typedef struct rlw_mig_batch {
    int32_t m;
    const uint8_t *states; /* [bytes] */
    const int64_t *lens;   /* [m] */
    void *const *owners;   /* [m] */
    const int32_t *index;  /* [m] */
    int64_t bytes;
} rlw_mig_batch;
typedef int (*rlw_mig_send_fn)(void *ctx, const rlw_mig_batch *b);
typedef struct rlw_mig_report {
    int64_t moved, bytes; /* sequences and state bytes that left (0 after a failed send) */
    int64_t positions;    /* the KV positions they stand for (prompt + generated - 1, summed) */
    int how;              /* RLW_MIG_KV or RLW_MIG_RECOMPUTE: what was sent */
} rlw_mig_report;
int rlw_gen_migrate_out(rlw *s, const rlw_mig_costs *how, rlw_mig_send_fn send, void *send_ctx, rlw_gen_cb cb, void *ctx,
                        rlw_mig_report *rep);
/* The rollout's prefills so far (prompts and recomputes): tokens and seconds, the rate the
 * cost model of a move takes (0, 0 without a rollout). */
void rlw_gen_prefill_rate(const rlw *s, int64_t *tokens, double *seconds);
/* The rollout's KV use since the previous call: out[0] the most blocks held at once, out[1]
 * the pool's blocks, out[2] positions per block (all 0 without a rollout). */
void rlw_gen_kv_take(rlw *s, int64_t out[5]);
/* Continue m sequence states (bytes one after the other, lens [m]) here as one job of owner,
 * m prompts x 1 sample in their order; finished, it comes to cb as any job. 0 / -1 + error
 * (nothing imported). */
int rlw_gen_import(rlw *s, void *owner, const uint8_t *states, const int64_t *lens, int32_t m);

/* ---- scoring ------------------------------------------------------------------------------ */
/* role FF_RL_ACTOR (the trained actor), FF_RL_GEN or FF_RL_REF. logp [sum rlen]; ent NULL or [sum rlen]. */
int rlw_logprob(rlw *s, unsigned role, const rlw_samples *in, int32_t micro_batch, float *logp, float *ent);
int rlw_values(rlw *s, const rlw_samples *in, int32_t micro_batch, float *values);
int rlw_reward_model(rlw *s, const rlw_samples *in, int32_t micro_batch, float *scores);

/* ---- frozen weights on demand (roles.<ref|reward>.weights: on_demand) --------------------
 * docs/run.md "Weights on demand". Such a role's weights wait in a host allocation of the
 * model's own (ff_model_params_to_host at rl.init); its inference (rlw_logprob of FF_RL_REF,
 * rlw_reward_model, rlw_digest) first brings them onto the backend: what a prefetch left, or the
 * whole copy there. The policy: they stay while the role's inference subtasks keep coming and
 * go when the worker's rollout stage is over (its next rl.train, rl.train_fused, rl.sync or
 * rl.save: rlw_weights_release), so each iteration's generation starts without them. */
/* Start loading those of `roles` (FF_RL_REF | FF_RL_REWARD bits) held on demand here and not on
 * the backend, each on a helper thread, while the compute thread goes on (a worker freed by a
 * migration, told ahead by rl.migrate_out). */
void rlw_weights_prefetch(rlw *s, unsigned roles);
/* Every on-demand role's weights off the backend (a load in flight finishes first). */
void rlw_weights_release(rlw *s);
bool rlw_weights_on_demand(const rlw *s, unsigned role);
/* The on-demand roles' weight bytes on the backend now (a load in flight not counted). */
int64_t rlw_weights_held(const rlw *s);
/* What the role's last inference needed: bytes copied onto the backend (0: they were there),
 * the copy's seconds, the seconds the subtask waited for it (a prefetch's remainder, or the
 * whole copy), the role's weight bytes on the backend during the subtask, and the copy's start
 * and end (ff_now_ns). NULL when the role is not on demand here. */
typedef struct rlw_load {
    int64_t bytes;
    double load_s, waited_s;
    int64_t held;
    int64_t start_ns, end_ns;
    bool prefetched;
} rlw_load;
const rlw_load *rlw_weights_last(const rlw *s, unsigned role);

/* ---- training ------------------------------------------------------------------------------ */
/* rl.train: one optimizer step of role FF_RL_ACTOR or FF_RL_CRITIC on this rank's share (micro-batch
 * offsets mb [n_micro + 1]) with the mini-batch's global normaliser; gradients summed over
 * comm (NULL: one rank), or, with tp x pp > 1, over the ranks of the other replicas at this
 * stage and TP rank (comm is then ignored); with pp > 1 every stage of the replica calls it
 * with the same share and runs the role's schedule. m [FF_RL_NM]. 0 / -1 + error. */
int rlw_train(rlw *s, unsigned role, const rlw_samples *in, const int32_t *mb, int32_t n_micro, double denom,
              ff_coll_comm *comm, double *m);

/* The critic's replicas in a fused step's share (rl.train_fused's critic.split): replica b's
 * micro-batches [at[b], at[b + 1]) of the critic's offsets, b < n. */
typedef struct rlw_split {
    const int32_t *at;
    int32_t n;
} rlw_split;

/* rl.train_fused: one optimizer step of the actor and one of the critic in one fused pipeline
 * step (ff_trainer_step_fused) on the actor's pipeline: in[0] and mb[0] the actor's share, in[1]
 * and mb[1] the critic's (all its replicas in this pipeline: split, the one of this rank's
 * block trains here), denom[2], the instance and its schedule; the actor's gradients summed as
 * rlw_train does, the critic's over all its replicas (its DP group). m [2 * FF_RL_NM]: the
 * actor's metrics, then this rank's critic replica's. 0 / -1 + error. */
int rlw_train_fused(rlw *s, const rlw_samples in[2], const int32_t *const mb[2], const int32_t n_micro[2], const rlw_split *split,
                    const double denom[2], const ff_fuse_instance *inst, const ff_fuse_schedule *sched, ff_coll_comm *comm, double *m);

/* The last rl.train's mean seconds of one micro-batch's forward and backward through each
 * stage of the role's pipeline, over the pipeline (ff_pipe_exec_stage_times; the same on every
 * rank): fwd, bwd [n] owned by s, n the stages, 0 without a pipeline. */
int32_t rlw_train_stage_times(const rlw *s, const double **fwd, const double **bwd);

/* The instructions of this rank's last rl.train over a pipeline (FF_RL_T_PIPE_TIMES rows,
 * owned by s, valid until the next rlw_train), or 0 rows. */
int64_t rlw_train_timeline(const rlw *s, const double **rows);

/* ---- weight sync ------------------------------------------------------------------------- */
/* The generating copy beside a trained actor on this worker holds its weights and its rollout
 * (KV cache) only from a sync to the actor's next training step, which gives them back
 * (ff_model_release_params): a rank's weights peak at the training shard + gradients +
 * optimizer, or the training shard + the copy + its KV cache, not all of them at once. In a
 * layout of its own with fp32 syncs the copy is a view of the training shard
 * (ff_model_opts.view_of): what it holds and gives back is only the part of its generation
 * shard that the training shard lacks, so the weights while generating are the generation
 * shard, no byte twice (docs/run.md "Memory of the colocated copy"). */
/* With roles.actor.offload (the default) the train -> generate transition (a sync into the
 * colocated copy) first releases the actor's gradients and moves its AdamW state to host
 * memory, and the actor's next rl.train brings them back before it steps (a checkpoint in
 * between brings them back for its export and sends them away again):
 * while generating a rank holds the generation shard and the KV cache only. The last move:
 * reload false, the sync's; true, the last rl.train's (nothing when that step found them in
 * place): out {AdamW bytes, gradient bytes, seconds}; false when there was none. */
bool rlw_offload(const rlw *s, bool reload, double out[3]);
/* The trained actor's weights into the generating actor of this process (the same layout). */
int rlw_sync_local(rlw *s);
/* The bytes of weights this rank received from other ranks in its last sync (0 after a
 * local copy). */
int64_t rlw_sync_received(const rlw *s);
/* A delta sync's (roles.actor.rollout.sync_delta, into a pool): elements compared, changed
 * and bytes saved on this rank in the last sync; false when syncs here are not deltas. */
bool rlw_sync_delta(const rlw *s, int64_t out[3]);
/* Across layouts (ff_reshard): every rank hosting FF_RL_GEN receives exactly the pieces of
 * its generation shard it does not hold, from ranks that hold them. On the actor's workers
 * (a generation layout of its own) inside the group split at rl.init (HybridFlow's micro-DP
 * group when the layouts nest, else the training replica), by a plan made at the first
 * sync; with a pool of its own inside comm (the sync group: the actor's replica 0, which
 * sends, and the generation ranks), planned again when the group changed. bf16 on the wire
 * with roles.actor.rollout.sync_dtype: bf16; into a pool, only the changed values with
 * roles.actor.rollout.sync_delta (the colocated copy releases its weights: always dense). */
int rlw_sync_reshard(rlw *s, ff_coll_comm *comm);

/* ---- checkpoints and checks -------------------------------------------------------------- */
/* DIR/<role>/ (a model folder, with the tokenizer when the role's model had one) and
 * DIR/<role>.optim.safetensors for a trained role. role FF_RL_ACTOR or FF_RL_CRITIC. Under
 * TP and PP every rank of the replica calls it (each stage's tensors are gathered whole over
 * its TP group, the stages hand theirs to the first stage) and TP rank 0 of the first stage
 * writes one whole checkpoint; at ZeRO-1 over several replicas every rank of every replica
 * calls it with its group (comm: the DP group when tp x pp is 1): they gather the optimizer
 * state, and replica 0 writes. */
int rlw_save(rlw *s, unsigned role, const char *dir, ff_coll_comm *comm);
/* A hash of a model's flat parameters (equal weights, equal hash) and their sum. */
int rlw_digest(rlw *s, unsigned role, uint64_t *hash, double *sum);

#endif

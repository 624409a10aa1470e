/* fuseflow: the RL engines that run inside one worker: rollout (generation with continuous
 * batching), scoring (log-probs, values, reward-model scores over micro-batches), micro-batch
 * balancing, the actor and critic trainers, and weight sync. In-process and single-threaded:
 * a worker calls them from its compute thread; the executor (controller side) decides what
 * runs where and moves the columns. docs/roles.md has the whole story.
 *
 * Samples. Every engine reads samples as views of columns the caller owns (the executor's
 * sample store, or a driver's arrays): a prompt, a response, and per-token columns aligned
 * with the response. Position conventions (the same as verl's):
 *
 *     sequence = prompt[0..P) response[0..R)       P + R tokens, packed one after another
 *     per-token column x[j], j in [0, R): about response token j, computed at the position
 *     that predicts it (P - 1 + j): its log-prob, the entropy of the distribution it was
 *     drawn from, the critic's value of the state before it.
 *
 * A reward model's score is its value head at the last token of the sequence (P + R - 1).
 *
 * Log-probs and temperature: the rollout returns, by default, log softmax(logits / T)[token]
 * at the sampling temperature T (FF_LOGPROB_TEMPERATURE), and the trainer's forward uses the
 * same T, so the rollout's log-probs are PPO's old_logprob without a recompute (they equal a
 * fresh forward's up to float rounding; tests/roles checks it). top-k/top-p do not enter.
 *
 * Data parallelism. A mini-batch is split over the DP ranks and into micro-batches balanced
 * by token count (ff_mb_plan_make, deterministic, computed once where the whole mini-batch is
 * known). Each rank runs ff_trainer_step on its share with the mini-batch's GLOBAL loss
 * normaliser (ff_trainer_denom summed over every rank's share); the gradients then add up,
 * so the DP hook must SUM (not average) the gradient buffer across ranks. The hook runs after
 * the last micro-batch's backward and before clipping and the optimizer step. With ZeRO-1
 * (ff_trainer_config.zero) the optimizer does that sum itself, as a reduce-scatter, and
 * holds the AdamW state of its share of the parameters only.
 *
 * Pipeline parallelism (docs/roles.md "Pipeline parallelism"). A trainer or a scoring call
 * given an ff_roles_pipe runs on a stage model (ff_roles_pipe_stage) through the pipeline
 * executor (fuseflow/pipe_exec.h): every rank of the pipeline calls it with the same samples
 * and micro-batches, and every rank gets the same results (metrics, scores). Data
 * parallelism composes as above: each stage's DP hook (or ZeRO-1) sums its own gradients
 * over the stage's DP group.
 *
 * Errors: -1 / NULL + ff_error message (bad sample, a model without the head asked for,
 * allocation); misuse (NULL pointers, negative counts) asserts.
 */
#ifndef FUSEFLOW_ROLES_H
#define FUSEFLOW_ROLES_H

#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/graph.h"
#include "fuseflow/microbatch.h"
#include "fuseflow/model.h"
#include "fuseflow/pipe_exec.h"
#include "fuseflow/registry.h"
#include "fuseflow/rlhf.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- pipeline groups ---------------------------------------------------------------------- */

/* The pipeline a trainer or a scoring call runs over. */
typedef struct ff_roles_pipe {
    const ff_pipe_transport *transport; /* the pipeline group, rank = stage rank; NULL or size 1: no
                                           pipeline. Borrowed: it (and its ctx) outlives the users */
    ff_pipe_kind kind; /* FF_PIPE_GPIPE, FF_PIPE_1F1B or FF_PIPE_INTERLEAVED (training; scoring always
                          runs the forward-only schedule of the same placement) */
    int32_t vpp;       /* virtual stages per rank (interleaved; 1 otherwise; 0 means 1) */
} ff_roles_pipe;

/* The layers rank `rank` of the pipeline holds for cfg under p, placed as the planner and
 * ff_pipe_place_layers place them (virtual stage k on rank k mod pp, balanced): first, count
 * [FF_MODEL_MAX_CHUNKS] each, *out pointing at them, out->comm set to a communicator made from
 * p->transport (ff_pipe_model_comm) that lives in *norm (caller storage that must outlive the
 * model). The caller builds its stage model with ff_model_opts.stage = out (TP composes via
 * ff_model_opts.comm). 0 or -1 + error (no pipeline, more virtual stages than layers, vpp
 * without the interleaved kind, a rank outside the group). */
int ff_roles_pipe_stage(const ff_model_config *cfg, const ff_roles_pipe *p, int32_t rank, int32_t *first, int32_t *count,
                        ff_model_comm *norm, ff_model_stage *out);

/* ---- samples ------------------------------------------------------------------------------- */

/* One sample as views of caller-owned columns. Per-token columns are [response_len] or NULL
 * (not present; each engine says which it needs). */
typedef struct ff_rl_sample {
    const int32_t *prompt;
    int32_t prompt_len;       /* >= 1 */
    const int32_t *response;
    int32_t response_len;     /* >= 0 (an empty response contributes nothing to a loss) */
    const float *mask;        /* 1 = the token counts in losses, 0 = it does not; NULL = all */
    const float *old_logprob; /* actor training: the rollout's log-probs */
    const float *advantages;  /* actor training */
    const float *ref_logprob; /* actor training with a KL loss */
    const float *old_values;  /* critic training: values at rollout time */
    const float *returns;     /* critic training */
} ff_rl_sample;

/* Tokens of the packed sequence: prompt_len + response_len. */
static inline int32_t ff_rl_sample_tokens(const ff_rl_sample *s) { return s->prompt_len + s->response_len; }

/* ---- rollout: continuous batching -------------------------------------------------------- */

/* A queue of generation requests over one policy model. Each request is a prompt, n samples
 * and sampling settings; its n samples share one prefill of the prompt (its K/V copied into n
 * KV-cache slots). ff_rollout_step admits waiting requests while slots are free, prefills
 * them, and decodes one token for every running sequence; a finished sequence leaves at once
 * and its slot goes to the next waiting request. Sample j of a request draws from its own RNG
 * stream seeded by (request seed, j), so a sample's tokens do not depend on what else is in
 * the batch, on the order of requests, or on max_slots. Built on ff_generator (model.h). */
typedef struct ff_rollout_config {
    int32_t max_slots;          /* sequences decoding together (KV-cache slots), >= 1 */
    int32_t max_seq_len;        /* prompt + response positions per slot */
    int32_t max_prefill_tokens; /* prompt tokens prefilled per step (0: max_seq_len) */
    ff_logprob_mode logprob_mode; /* applied to every request (FF_LOGPROB_TEMPERATURE: see top) */
    const ff_gen_pipe *pipe;    /* the model is a pipeline stage: its stages' pipeline (model.h), or NULL */
    int32_t kv_block_rows;      /* KV-cache positions per block (0: the generator's default, 16) */
    int32_t kv_blocks;          /* KV-cache blocks (0: every slot at max_seq_len) */
    bool kv_bf16;               /* the KV cache in bf16 (ff_generator_config.kv_bf16) */
    bool eager;                 /* decode steps without graphs (ff_generator_config.eager) */
} ff_rollout_config;
void ff_rollout_config_default(ff_rollout_config *c); /* 64 slots, 256 positions, TEMPERATURE */

typedef struct ff_rollout_request {
    uint64_t id;           /* the caller's, returned with each sample */
    const int32_t *prompt; /* [prompt_len], copied */
    int32_t prompt_len;
    int32_t n;             /* samples, sharing one prefill */
    ff_sampling sampling;  /* its logprob_mode is replaced by the config's */
    uint64_t seed;
} ff_rollout_request;

typedef struct ff_rollout_stats {
    int64_t steps;          /* ff_rollout_step calls that did work */
    int64_t prefill_tokens; /* prompt tokens of the requests added (prefilled once each) */
    int64_t decode_tokens;  /* tokens of the samples handed out */
    int64_t samples_done;   /* samples handed out (ff_rollout_take, ff_rollout_run) */
    int32_t max_running;    /* most sequences decoding together after a step */
    double busy_s;          /* time inside ff_rollout_step */
    int64_t exported;       /* sequences moved out (ff_rollout_export) */
    int64_t imported;       /* sequences moved in (ff_rollout_import) */
    int64_t recomputed_tokens; /* KV positions rebuilt by a prefill for imports without their rows */
    double recompute_s;        /* time of those imports: with recomputed_tokens, the prefill rate that
                                  migrate.h's cost model takes */
    int64_t prefilled_tokens;  /* prompt tokens prefilled so far (ff_generator_prefill_stats), */
    double prefill_s;          /* and the time of those forwards: the same rate measured on every prompt */
} ff_rollout_stats;

typedef struct ff_rollout ff_rollout;

/* A rollout engine on m (needs an LM head; must outlive the engine). NULL + error. */
ff_rollout *ff_rollout_new(ff_model *m, const ff_rollout_config *c);
void ff_rollout_destroy(ff_rollout **r);
ff_model *ff_rollout_model(const ff_rollout *r);

/* Queue a request (checked: tokens in range, prompt fits, n <= max_slots). 0 or -1 + error. */
int ff_rollout_add(ff_rollout *r, const ff_rollout_request *q);
/* One step (admit + prefill + one decode token per running sequence). Returns the number of
 * samples that finished in this step (>= 0), or -1 + error. */
int ff_rollout_step(ff_rollout *r);
/* Samples waiting or running. 0: idle. */
int32_t ff_rollout_pending(const ff_rollout *r);
int32_t ff_rollout_running(const ff_rollout *r);
/* Sequences of max_seq_len it could take in now (free slots, and KV blocks not promised to
 * running sequences: ff_generator_room). */
int32_t ff_rollout_room(const ff_rollout *r);
/* The most KV blocks held at once since the previous call (or since it was made), which starts
 * the measure over; *pool and *block_rows: its pool's blocks and their positions. */
int32_t ff_rollout_kv_peak_take(ff_rollout *r, int32_t *pool, int32_t *block_rows);
/* Take one finished sample in finishing order: 1 and *out (the caller owns its arrays; free
 * with ff_gen_output_free), or 0 when none is ready. out->id is the request id, out->sample
 * its index in [0, n); out->logprobs are per the config's logprob_mode. */
int ff_rollout_take(ff_rollout *r, ff_gen_output *out);
/* End a request's samples now (running ones come out of ff_rollout_take as ABORTED with
 * what they have; waiting ones vanish). Returns the number ended. */
int32_t ff_rollout_abort(ff_rollout *r, uint64_t id);
const ff_rollout_stats *ff_rollout_stats_of(const ff_rollout *r);
/* Decode steps since the previous call (or the engine's start): replayed as a CUDA graph, and
 * launched kernel by kernel (ff_generator_graph_stats; the cpu backend's are all eager). */
void ff_rollout_decode_steps_take(ff_rollout *r, int64_t *graph_steps, int64_t *eager_steps);
void ff_rollout_stats_reset(ff_rollout *r);

/* Run everything queued to completion. *outs (malloc'd; free each with ff_gen_output_free,
 * then free(*outs)) gets every sample finished during the call, ordered by the order in
 * which the requests were added, then by sample index; *n_outs their count. Samples finished
 * before the call and not taken are included. 0 or -1 + error. */
int ff_rollout_run(ff_rollout *r, ff_gen_output **outs, int32_t *n_outs);

/* ---- moving a sequence between engines (docs/roles.md "Moving a sequence") --------------- */

/* A sequence on its way from one engine to another (RLHFuse's long-tail migration): the
 * generator's state (model.h ff_gen_seq_state: prompt and generated tokens, log-probs so far,
 * RNG stream position, sampling settings with the remaining budget and stop rules, and the
 * KV rows or none), with id the caller's request id. As bytes: ff_gen_seq_state_size,
 * ff_gen_seq_state_write and ff_gen_seq_state_read (validated: a truncated or corrupt buffer
 * is refused). Free with ff_gen_seq_state_free. */
typedef ff_gen_seq_state ff_rollout_seq_state;

/* Take sample `sample` of request `id` (decoding, not waiting or finished) out of r: it stops
 * decoding here and will not come out of ff_rollout_take. with_kv: its KV rows come along
 * (ff_gen_kv: 2 layers kv_heads head_dim 4 bytes per position); else the receiver recomputes
 * them. 0 or -1 + error (no such sequence running). */
int ff_rollout_export(ff_rollout *r, uint64_t id, int32_t sample, bool with_kv, ff_rollout_seq_state *out);
/* Continue s in r (an engine over a model with the same config and weights, the same
 * logprob_mode): it takes a slot of its own now (its rows written, or recomputed from its
 * tokens), decodes from the next ff_rollout_step, and comes out of ff_rollout_take (or
 * ff_rollout_run, after the requests added before it) with s->id and s->sample and every
 * token and log-prob, those made before the move included: the ones it would have had
 * without moving (bitwise with its rows; with a recompute up to the prefill's rounding,
 * docs/roles.md). Refused, r unchanged, when no slot is free, when its budget does not fit
 * r's slots, or when the state does not match r's model (ff_generator_import). 0 or -1 +
 * error. */
int ff_rollout_import(ff_rollout *r, const ff_rollout_seq_state *s);

/* ---- weight sync ------------------------------------------------------------------------- */

/* Trained actor -> generating actor in one process: one copy of the flat parameter buffer
 * (ff_model_copy_params). Refused (-1 + error) while r has sequences in flight: they would
 * continue under other weights. Across processes the same flat buffer of
 * ff_model_param_count() fp32 values is what crosses (docs/roles.md). */
int ff_rollout_sync_weights(ff_rollout *r, ff_model *trained);

/* ---- scoring over micro-batches ---------------------------------------------------------- */

/* Micro-batches of scoring calls: consecutive samples packed while both limits hold (a
 * sample alone is always one micro-batch). 0 = no limit. */
typedef struct ff_score_opts {
    int32_t micro_batch_size;   /* samples per forward (0: no limit) */
    int32_t micro_batch_tokens; /* tokens per forward (0: no limit; default 4096 when both 0) */
    float temperature;          /* log-probs/entropy of softmax(logits / T); 0 means 1 */
    /* NULL (or no pipeline): m is a whole model. Else m is this rank's stage (ff_roles_pipe_stage),
     * every rank of the pipeline calls with the same samples and options, the micro-batches run
     * the forward-only schedule of p's placement (padded with one-token micro-batches to a
     * multiple of pp for the interleaved placement), and the results come out on every rank. */
    const ff_roles_pipe *pipe;
} ff_score_opts;

/* Per-token log-probs (and entropy, when entropy != NULL) of each sample's response under m:
 * logprobs[i] (and entropy[i]) are caller arrays of samples[i].response_len floats. Reads
 * prompt and response only. 0 or -1 + error. */
int ff_score_logprobs(ff_model *m, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, float *const *logprobs,
                      float *const *entropy);
/* Per-token values of each response under a critic (a model with a value head): values[i]
 * is [samples[i].response_len]. */
int ff_score_values(ff_model *critic, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, float *const *values);
/* Reward-model scores: the value head at each sequence's last token. scores [n]. */
int ff_score_reward_model(ff_model *rm, const ff_rl_sample *samples, int32_t n, const ff_score_opts *o, float *scores);

/* ---- trainers ------------------------------------------------------------------------------- */

typedef enum { FF_TRAIN_ACTOR = 0, FF_TRAIN_CRITIC } ff_train_kind;

/* Called once per optimizer step, after the last micro-batch's backward and before clipping
 * and the update: all-reduce (SUM) the n floats of grads across the DP ranks (ff_coll). With
 * the global normaliser (see top) the sum is the mini-batch's gradient. 0, or -1 + error
 * (the step is abandoned, the gradients zeroed). On a pipeline stage: the stage's buffer (its
 * tied copy included), to be summed over the DP replicas of the same stage. */
typedef int (*ff_grad_hook)(void *user, ff_model *m, ff_buffer *grads, int64_t n);

typedef struct ff_trainer_config {
    ff_train_kind kind;
    ff_adamw_config optim;
    /* actor */
    ff_policy_loss *loss;   /* a registry instance (ff_policy_loss_new: "vanilla" = PPO clip,
                               "gpg", plugins); borrowed, outlives the trainer */
    const ff_kl_def *kl;    /* KL loss term against ref_logprob (registry KL kind), or NULL */
    double kl_coef;
    double entropy_coeff;   /* loss -= entropy_coeff * agg(entropy) */
    float temperature;      /* of the forward (= the rollout's sampling temperature); 0 = 1 */
    /* critic */
    ff_rlhf_value_cfg value; /* clip (cliprange_value) and agg; its denom is ignored */
    /* data parallelism. zero 0: grad_hook sums the whole gradient buffer over the DP ranks
     * (NULL: one rank) and each rank keeps the whole AdamW state. zero 1 (ZeRO-1, model.h
     * ff_optimizer_opts): no hook; the optimizer reduce-scatters the gradients over dp in
     * buckets of zero_bucket floats (0: FF_ZERO_BUCKET_DEFAULT), steps the state of its 1/d
     * range and all-gathers the parameters. dp's ctx is the host's (a worker passes its DP
     * group's communicator through it, set for each step); dp.size 1 (or 0): one rank. */
    ff_grad_hook grad_hook;
    void *grad_hook_user;
    int zero;
    ff_model_comm dp;
    int64_t zero_bucket;
    /* pipeline parallelism: zeroed = none (a whole model). With a transport of size > 1 the
     * model is this rank's stage (ff_roles_pipe_stage of the same p) and ff_trainer_step runs
     * the schedule of `kind` over the micro-batches (see ff_trainer_step). */
    ff_roles_pipe pipe;
} ff_trainer_config;

/* Metrics of a step (or the mean over the steps of ff_trainer_train_batch). Loss values are
 * this rank's contribution computed with the global normaliser (summed over ranks they give
 * the mini-batch's loss; with one rank they are the loss); clipfrac, approx_kl, entropy mean,
 * value mean are token means over this rank's counted tokens (combine ranks weighted by
 * `tokens`); grad_norm and lr are the optimizer's (global after the hook). */
typedef struct ff_train_metrics {
    int64_t steps;         /* optimizer steps */
    int64_t skipped;       /* steps skipped for a non-finite gradient */
    int64_t micro_batches;
    int64_t tokens;        /* counted response tokens */
    int64_t samples;
    double loss;           /* the total objective */
    double pg_loss, kl_loss, entropy; /* actor: policy loss, KL term (before coef), agg entropy */
    double clipfrac, approx_kl, ratio_max;
    double entropy_mean;   /* actor: token mean of the entropy */
    double value_loss, vf_clipfrac, value_mean; /* critic */
    double grad_norm, lr;
    double time_s;
    double pipe_bubble;    /* over a pipeline: the step's bubble over the group (ff_pipe_exec_stats), else 0 */
} ff_train_metrics;

typedef struct ff_trainer ff_trainer;

/* A trainer for m with its own AdamW state (at zero 1: of its range). An actor needs an LM
 * head and config->loss; a critic needs a value head. zero 2 and 3 are refused (not built),
 * and so is a grad_hook at zero 1. A stage model needs config->pipe, and its chunks must be
 * the ones ff_roles_pipe_stage places on the transport's rank; a whole model takes no pipe.
 * NULL + error. */
ff_trainer *ff_trainer_new(ff_model *m, const ff_trainer_config *c);
void ff_trainer_destroy(ff_trainer **t);
ff_model *ff_trainer_model(const ff_trainer *t);
ff_optimizer *ff_trainer_optimizer(const ff_trainer *t);
/* The last step over a pipeline on this rank, for timelines: its executor (ff_pipe_exec_times,
 * the instructions of *s's stream of this rank), its schedule, and when the executor's run
 * began in seconds after ff_trainer_step was called. NULL when the last step ran none. */
const ff_pipe_exec *ff_trainer_last_pipe(const ff_trainer *t, const ff_pipe_schedule **s, double *t0_s);
/* The aggregation of this trainer's loss (the policy loss's, or the critic's value.agg). */
ff_rlhf_agg_mode ff_trainer_agg(const ff_trainer *t);

/* The loss normaliser of these samples for this trainer's aggregation: counted tokens
 * (token-mean) or sequences with a counted token (seq-mean-*). Sum it over every rank's share
 * of a mini-batch and pass the sum to ff_trainer_step. */
double ff_trainer_denom(const ff_trainer *t, const ff_rl_sample *samples, int32_t n);

/* One optimizer step on this rank's share of a mini-batch: samples [n] in micro-batches
 * mb_start[0..n_micro] (offsets into samples; NULL = one micro-batch of all n), each one
 * forward + backward accumulating gradients; then the DP hook; then clip + AdamW. Needs
 * old_logprob and advantages (and ref_logprob with a KL loss) for an actor; old_values and
 * returns for a critic. denom: the global normaliser (<= 0: this share's own, right for one
 * rank). metrics (may be NULL) is overwritten. No samples and no hook: no step (with a hook,
 * or at zero 1 over several ranks, a rank without samples still joins the collectives and
 * steps). 0, or -1 + error (a missing
 * column, a model error, a non-finite gradient: the update is skipped and counted in
 * metrics->skipped).
 *
 * With a pipeline (config->pipe): every rank of the pipeline calls it with THE SAME samples,
 * offsets and denom. The non-empty micro-batches are packed up front and run by the
 * executor under the schedule of pipe.kind (interleaved: their count must be a multiple of
 * pp); the loss is computed on the last virtual stage's rank; the DP hook runs before the
 * step (the executor's before_step), ZeRO-1 inside it. An empty share with a hook or ZeRO-1
 * (every rank of the pipeline has it) runs filler micro-batches of one token and zero
 * gradient, so the hook, the tied embeddings' sum and the step are the executor's as with
 * samples. The metrics are summed over the pipeline, so every rank returns the same (time_s
 * aside: this rank's), the single-rank values up to the gradients' rounding; a skipped
 * step's grad_norm is NaN. Packs, the schedule and the executor are
 * cached per micro-batch count: a step allocates nothing once one as large has run. */
int ff_trainer_step(ff_trainer *t, const ff_rl_sample *samples, int32_t n, const int32_t *mb_start, int32_t n_micro,
                    double denom, ff_train_metrics *metrics);

/* RLHFuse's fused step (docs/run.md "Fused actor and critic training"): the actor's share and
 * the critic's share of their k-th mini-batches train in ONE run of the pipeline executor,
 * both models' forwards and backwards interleaved on every rank as a fused schedule orders
 * them (fuseflow/fuse.h), each model's hook and optimizer step after its last backward there.
 * Every rank of the actor's pipeline calls it with the same instance, schedule and shares. */
typedef struct ff_trainer_share {
    const ff_rl_sample *samples;
    int32_t n;
    const int32_t *mb_start; /* [n_micro + 1] offsets into samples, or NULL: one micro-batch */
    int32_t n_micro;
    double denom;            /* the mini-batch's global normaliser (<= 0: the share's own) */
} ff_trainer_share;

/* One optimizer step of each: a is an actor trainer and c a critic trainer, both pipelined, the
 * critic's pp dividing the actor's (r = actor pp / critic pp replicas of the critic in a's
 * pipeline, c this rank's stage of one of them), one chunk per stage, without ZeRO; c's pipeline
 * may be reversed in its block (its stage k on a's rank b x critic pp + critic pp - 1 - k:
 * in->models[1 + b].stages). in: nodes = a's ranks, model 0 the actor (stages 0..pp-1), models
 * 1..r the critic's replicas (stages[k] the actor rank of its stage k), micro = each share's
 * non-empty micro-batches (1 for an empty share: a filler, as ff_trainer_step); cs is the
 * share of the replica on this rank; sched: a valid schedule of in (ff_fuse_solve,
 * ff_fuse_serial). The executor runs on a's transport; its streams and executor are cached in a
 * per (instance, schedule). Each trainer's gradient hook runs at its step (the critic's sums
 * over its replicas there: the streams place the replicas' steps at one time). The metrics
 * are each trainer's as ff_trainer_step gives them (pipe_bubble: the fused step's). 0 or -1 +
 * error (a failure after a model's step is its skipped update, as in ff_trainer_step). */
int ff_trainer_step_fused(ff_trainer *a, ff_trainer *c, const ff_fuse_instance *in, const ff_fuse_schedule *sched,
                          const ff_trainer_share *as, const ff_trainer_share *cs, ff_train_metrics *am, ff_train_metrics *cm);

/* Whole-batch training in one process (one rank): `epochs` passes over samples [n], each
 * shuffled (when shuffle; a function of seed and epoch) and cut into mini-batches of
 * mini_batch_size samples (0: the whole batch; a last short mini-batch is kept), each planned
 * into micro-batches (ff_mb_plan_make with one rank) and stepped. metrics (may be NULL) get
 * the mean over the steps (sums for the counts). 0 or -1 + error. */
typedef struct ff_train_batch_opts {
    int32_t mini_batch_size;
    int32_t micro_batch_size;
    int32_t micro_batch_tokens;
    int32_t epochs; /* 0 means 1 */
    bool shuffle;
    uint64_t seed;
} ff_train_batch_opts;
int ff_trainer_train_batch(ff_trainer *t, const ff_rl_sample *samples, int32_t n, const ff_train_batch_opts *o,
                           ff_train_metrics *metrics);

/* ---- settings from a run config (graph.h) ------------------------------------------------ */

/* Sampling of a generate node: temperature (0 with greedy: true), top_k, top_p,
 * max_new_tokens (the node's max_tokens, else data.max_response_length), the model's eos as
 * stop tokens, logprob mode TEMPERATURE. */
void ff_roles_sampling_from_node(const ff_run_config *run, const ff_node *gen, ff_sampling *out);

/* A trainer config for a validated train node: the kind from its role; AdamW from the role's
 * optim (lr, betas, eps, weight_decay, grad_clip, warmup_steps, min_lr_ratio; lr_schedule
 * cosine decays over total_updates optimizer steps, constant ignores it); loss, KL loss and
 * entropy_coeff (actor) or the value loss settings (critic) from the node; the forward
 * temperature from the graph's sample-level generate node. No DP hook. 0 or -1 + error. */
int ff_roles_trainer_config_from_node(const ff_run_config *run, const ff_node *train, int64_t total_updates,
                                      ff_trainer_config *out);

/* ---- critics and reward models from a policy checkpoint ---------------------------------- */

/* Turn an LM's config and weights into a critic's: value_head on, score.weight [1, hidden]
 * added ~ Normal(0, std) from seed (std 0: zeros), lm_head.weight dropped (untied models;
 * tied embeddings stay, and are then only an embedding since the critic is never asked for
 * log-probs). Modifies cfg and weights in place. 0 or -1 + error. */
int ff_roles_add_value_head(ff_model_config *cfg, ff_tensor_set *weights, double std, uint64_t seed);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

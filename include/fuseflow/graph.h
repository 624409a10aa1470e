/* fuseflow: RLHF algorithms as dataflow graphs, the run config that holds one, and the
 * scheduling view an executor drives.
 *
 * A graph is nodes and the columns between them (DESIGN.md "Dataflow"). A column is a named
 * per-sample value (prompt tokens, response tokens, per-token log-probs, a scalar score, ...).
 * A node has an op, a role (the model it runs on), the columns it reads and writes, bound to
 * the op's slots, a granularity, and its parameters. Built with the C API below or read from
 * YAML as part of a run config (docs/graphs.md has the schema and examples/ the algorithms).
 *
 * Validation happens before anything starts and names the line: an unknown op, role, slot
 * or column, a column of the wrong kind, a column read that nothing writes, a column written
 * twice, a cycle, a role without a model, a batch that does not divide the layout, an unknown
 * estimator / loss / KL / reward name, parameters out of range or misspelled.
 *
 * Execution is not here. An executor (the controller) runs an iteration like this:
 *
 *     ff_sched *s = ff_sched_new(run->graph, run->data.train_batch_size, n, run->trainer.schedule);
 *     while (!ff_sched_finished(s)) {
 *         const ff_sched_task *t;
 *         while (ff_sched_next(s, &t) == 1) dispatch(t);     // to the node's role's workers
 *         wait for a finished task t; ff_sched_complete(s, t->id);   // its outputs now exist
 *         (a filter task: ff_sched_complete_filter(s, t->id, keep); then add
 *          ff_sched_groups_wanted(s) more prompts with ff_sched_add_groups)
 *     }
 *
 * and computes a node's math with ff_node_advantage / ff_node_actor_loss / ff_node_critic_loss
 * / ff_node_reward (all plain host functions) on the columns the task names.
 */
#ifndef FUSEFLOW_GRAPH_H
#define FUSEFLOW_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fuseflow/config.h"
#include "fuseflow/registry.h"
#include "fuseflow/rlhf.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- vocabulary ---------------------------------------------------------------------------- */

typedef enum { FF_ROLE_NONE = 0, FF_ROLE_ACTOR, FF_ROLE_CRITIC, FF_ROLE_REF, FF_ROLE_REWARD, FF_ROLE_COUNT } ff_role;
/* "none", "actor", "critic", "ref", "reward" */
const char *ff_role_name(ff_role r);

typedef enum {
    FF_OP_GENERATE = 0, /* actor: prompt -> response (+ the sampler's log-probs) */
    FF_OP_LOGPROB,      /* actor or ref: per-token log-probs of the response */
    FF_OP_VALUE,        /* critic: per-token values */
    FF_OP_SCORE,        /* reward (a reward model): a scalar score per response */
    FF_OP_REWARD_FN,    /* no role: a registered reward function on decoded text */
    FF_OP_ADVANTAGE,    /* no role: a registered advantage estimator (+ KL penalty) */
    FF_OP_TRAIN,        /* actor or critic: mini-batch updates over the whole batch */
    FF_OP_SYNC_WEIGHTS, /* actor: training weights -> generation weights */
    FF_OP_FILTER,       /* no role: keep or drop whole groups (DAPO's dynamic sampling) */
    FF_OP_COUNT
} ff_op;
/* "generate", "logprob", "value", "score", "reward_fn", "advantage", "train", "sync_weights",
 * "filter" */
const char *ff_op_name(ff_op op);

typedef enum {
    FF_COL_TOKENS = 0, /* token ids */
    FF_COL_PER_TOKEN,  /* one float per response token */
    FF_COL_SCALAR,     /* one float per sample */
    FF_COL_TEXT,       /* text (a reference answer, metadata) */
    FF_COL_KIND_COUNT
} ff_col_kind;
const char *ff_col_kind_name(ff_col_kind k); /* "tokens", "per_token", "scalar", "text" */

/* Slots: the named inputs and outputs of ops. Each has a fixed column kind. */
typedef enum {
    FF_SLOT_PROMPT = 0,  /* tokens */
    FF_SLOT_RESPONSE,    /* tokens */
    FF_SLOT_ANSWER,      /* text */
    FF_SLOT_LOGPROB,     /* per_token: what generate / logprob write */
    FF_SLOT_OLD_LOGPROB, /* per_token: log-probs at sampling time */
    FF_SLOT_REF_LOGPROB, /* per_token */
    FF_SLOT_VALUES,      /* per_token */
    FF_SLOT_SCORE,       /* scalar */
    FF_SLOT_BASELINE,    /* scalar */
    FF_SLOT_ADVANTAGES,  /* per_token */
    FF_SLOT_RETURNS,     /* per_token */
    FF_SLOT_COUNT
} ff_slot;
const char *ff_slot_name(ff_slot s);
ff_col_kind ff_slot_kind(ff_slot s);

/* The slots of an op (the role matters for train), in positional order. Returns the count;
 * slots[i] and required[i] filled up to cap. */
size_t ff_op_slots(ff_op op, ff_role role, bool output, ff_slot *slots, bool *required, size_t cap);

typedef enum { FF_SCHED_FUSED = 0, FF_SCHED_SERIAL } ff_schedule;

/* ---- graph ----------------------------------------------------------------------------------- */

typedef struct ff_column {
    char *name;
    ff_col_kind kind;
    bool from_data; /* present when a sample enters (the dataset provides it) */
    int writer;     /* index of the node that writes it; -1 none (or from data) */
} ff_column;

/* Settings of a generate node. */
typedef enum { FF_MIGRATE_WITH_AUTO = 0, FF_MIGRATE_WITH_KV, FF_MIGRATE_WITH_RECOMPUTE } ff_migrate_with;

typedef struct ff_gen_params {
    int64_t n;          /* responses per prompt (the group size) */
    double temperature; /* 1.0 */
    double top_p;       /* 1.0 */
    int64_t top_k;      /* 0 = off */
    int64_t max_tokens; /* 0 = data.max_response_length */
    bool greedy;        /* argmax decoding (ReMax's baseline) */
    /* long-tail migration (`migrate: off | auto | R_t`, docs/run.md): 0 off, -1 auto, else the
     * fraction R_t in (0, 1] of the iteration's samples still decoding at which the workers
     * with the fewest hand theirs to migrate_to survivors (0: 1); migrate_with: auto (each
     * move by migrate.h's cost model on measured costs), kv (send the KV rows) or recompute
     * (the survivors rebuild them by a prefill) */
    double migrate;
    int64_t migrate_to;
    ff_migrate_with migrate_with;
    /* `lengths: {median, p99_ratio, max}` (docs/run.md "Response lengths"): each response's
     * length drawn log-normal (ff_sampling.len_median); median 0: off */
    double len_median, len_p99_ratio;
    int64_t len_max;
} ff_gen_params;

/* RLHFuse's intra-stage fusion of the actor's and the critic's training (`fuse` of the actor's
 * train node, docs/run.md "Fused actor and critic training"). */
typedef enum { FF_FUSE_OFF = 0, FF_FUSE_ON, FF_FUSE_AUTO } ff_fuse_mode;

/* Settings of a train node. The optimizer is the role's (ff_role_cfg). */
typedef struct ff_train_params {
    int64_t mini_batch_size;  /* prompts per optimizer step (x n responses), verl ppo_mini_batch_size */
    int64_t micro_batch_size; /* samples per forward/backward on one rank */
    int64_t epochs;           /* passes over the batch (ppo_epochs) */
    bool shuffle;             /* draw mini-batches at random from the whole batch */
    double entropy_coeff;     /* actor: the loss gets -entropy_coeff * agg(entropy) */
    /* actor */
    ff_policy_loss *loss;     /* from `loss` (default vanilla) */
    const ff_kl_def *kl_loss; /* KL as a loss term (`kl_loss: {type, coef}`), or NULL */
    double kl_loss_coef;
    /* `fuse: off | on | auto` (actor; a critic's node refuses the key): train the critic in the
     * same pipeline step, its stages in the reverse direction. After validation with a run
     * config: off also where `auto` cannot fuse, with the reason in fuse_note; on and auto
     * have a critic train node (fuse_partner, its index) that meets the constraints */
    ff_fuse_mode fuse;
    int fuse_partner;        /* -1: none */
    double fuse_peak;        /* `fuse_peak`: the most activation memory per rank a fused schedule may
                              * hold, as a multiple of the serial 1F1B's (0.1..100); 0: no limit */
    char fuse_note[256];     /* auto that fell back to off: why (for the run's log line) */
    /* critic */
    ff_rlhf_value_cfg value; /* `cliprange_value`, `loss_agg_mode` */
} ff_train_params;

typedef struct ff_node {
    char *name;
    ff_op op;
    ff_role role;
    ff_granularity gran;
    int in[FF_SLOT_COUNT];  /* column index bound to each input slot, -1 = unbound */
    int out[FF_SLOT_COUNT]; /* column index bound to each output slot, -1 = unbound */
    int *after;             /* nodes that must finish first (besides the column edges) */
    int n_after;
    ff_cnode *params; /* the node's map in the config (its parameters), or NULL */
    char where[256];  /* "grpo.yaml:31", or "node 'adv'" for a graph built in C */
    int stage;        /* topological level: 0 for nodes that read only data */
    /* resolved by ff_graph_validate */
    int64_t micro_batch_size; /* micro_batch granularity: samples per task (default 8) */
    ff_gen_params gen;
    ff_train_params train;
    ff_advantage *adv;               /* advantage: the estimator */
    const ff_kl_def *kl_penalty;     /* advantage: KL as a reward penalty (`kl_penalty: {type, coef, ...}`), or NULL */
    ff_rlhf_kl_ctl kl_ctl;           /* its coefficient (adaptive ones change: ff_node_kl_ctl_update) */
    ff_reward *reward;               /* reward_fn: the function */
} ff_node;

typedef struct ff_graph ff_graph;

/* An empty graph with the built-in columns (prompt and answer from the data; response,
 * old_logprob, ref_logprob, values, score, advantages, returns). NULL + error. */
ff_graph *ff_graph_new(void);
void ff_graph_destroy(ff_graph **g);

/* Declare a column (an error if the name exists). Returns its index or -1. */
int ff_graph_add_column(ff_graph *g, const char *name, ff_col_kind kind, bool from_data);
/* Add a node; gran FF_GRAN_COUNT means the op's default. Returns its index or -1 + error. */
int ff_graph_add_node(ff_graph *g, const char *name, ff_op op, ff_role role, ff_granularity gran);
/* Bind a column to a named slot of a node ("response", "score", ...). -1 + error. */
int ff_graph_bind(ff_graph *g, int node, bool output, const char *slot, const char *column);
/* node runs after `other` has finished (for nodes with no column between them). */
int ff_graph_add_after(ff_graph *g, int node, const char *other);
/* A node parameter, in override form: "clip_ratio_high=0.28", "kl_loss.type=low_var_kl". */
int ff_graph_set_param(ff_graph *g, int node, const char *assignment);

size_t ff_graph_n_nodes(const ff_graph *g);
const ff_node *ff_graph_node(const ff_graph *g, size_t i);
ff_node *ff_graph_node_mut(ff_graph *g, size_t i);
int ff_graph_find_node(const ff_graph *g, const char *name); /* index or -1 */
size_t ff_graph_n_columns(const ff_graph *g);
const ff_column *ff_graph_column(const ff_graph *g, size_t i);
int ff_graph_find_column(const ff_graph *g, const char *name); /* index or -1 */
/* The node indices in a topological order (valid after ff_graph_validate). */
const int *ff_graph_order(const ff_graph *g);
/* The group size: n of the (first) sample-level generate node; 1 if none. */
int64_t ff_graph_group_size(const ff_graph *g);
/* The main response column (written by the sample-level generate node): per-token columns
 * are aligned with it. -1 before validation. */
int ff_graph_response_column(const ff_graph *g);

struct ff_run_config;
/* Check the graph and resolve its nodes' parameters against the registry (which must outlive
 * the graph). run, when not NULL, adds the checks against roles and layouts. 0, or -1 + an
 * error naming the node's line. */
int ff_graph_validate(ff_graph *g, const ff_registry *reg, const struct ff_run_config *run);

/* Print the graph (nodes in order, their columns, granularity, stage) for `fuseflow graph`. */
void ff_graph_print(const ff_graph *g, FILE *out);

/* ---- run config ------------------------------------------------------------------------------ */

/* A role's parallel layout (`roles.<role>.layout`, docs/run.md "Layouts"): the planner's
 * degrees (fuseflow/plan.h), ranks ordered TP innermost, then PP, then DP. */
typedef struct ff_layout {
    int64_t workers;     /* processes (one per device) */
    int64_t dp, tp, pp;  /* dp x tp x pp = workers */
    int64_t vpp;         /* interleaved chunks per pipeline stage (1) */
    bool sp;             /* sequence parallelism inside the TP group */
    int64_t zero;        /* a trained role's ZeRO stage: 0, or 1 (optimizer state sharded over dp) */
    int schedule;        /* the pipeline schedule, an ff_plan_schedule (1f1b) */
} ff_layout;

typedef struct ff_optim_cfg {
    double lr, weight_decay, beta1, beta2, eps, grad_clip, min_lr_ratio;
    int64_t warmup_steps;
    const char *lr_schedule; /* "constant" or "cosine" */
} ff_optim_cfg;

typedef struct ff_role_cfg {
    bool present;
    const char *model;    /* Hugging Face folder */
    ff_layout layout;     /* training / inference layout (a colocated role's defaults to its target's) */
    ff_layout rollout;    /* actor: generation layout (`rollout.layout`; defaults to layout, or to
                             data parallel over rollout_workers) */
    ff_role colocate_with; /* shares the worker processes of another role, or FF_ROLE_NONE */
    bool cuda;            /* `backend: cuda` (default cpu): its workers compute on a GPU each
                             (a colocated role's follows its target's; the actor's generation
                             pool, `rollout.workers`, follows the actor's) */
    ff_optim_cfg optim;   /* actor and critic */
    char where[256];
    int64_t rollout_workers; /* actor: `rollout: {workers: N}` puts generation on N workers of its
                                own (0: on the training workers, colocated) */
    bool rollout_bf16;       /* actor: `rollout: {sync_dtype: bf16}`: a weight sync that reshards
                                sends bf16 (the generating copy holds the weights rounded to bf16;
                                fp32, the default, moves them exactly; a local copy is exact) */
    bool rollout_w16;        /* actor: `rollout: {dtype: bf16}`: the generating copy stores its
                                weight matrices in bf16 (ff_model_opts.bf16_weights), half their
                                memory; always a copy of its own, never a view of the training
                                shard. The default: bf16 for a pool of its own on cuda without
                                sync_delta, else fp32 */
    bool rollout_delta;      /* actor: `rollout: {sync_delta: true}`: a pool's sync sends only the
                                elements whose wire value changed (ff_reshard_opts.delta) */
    int64_t rollout_kv_block; /* actor: `rollout: {kv_block: N}`: positions per KV-cache block
                                 (default 16; ff_generator_config.kv_block_rows) */
    bool rollout_kv16;        /* actor: `rollout: {kv_dtype: bf16}` (default: bf16 on cuda, fp32 on
                                 the cpu): the KV cache in bf16, half its bytes
                                 (ff_generator_config.kv_bf16) */
    bool rollout_eager;       /* actor: `rollout: {graphs: false}` (default true): decode steps
                                 kernel by kernel, not replayed as CUDA graphs
                                 (ff_generator_config.eager) */
    double rollout_kv_memory; /* actor: `rollout: {kv_memory: f}`, (0, 1]: the KV pool as a share of
                                 every slot at full length (default 1); less memory, requests wait */
    bool offload;            /* actor: `offload: true` (the default): while its colocated copy
                                generates (train -> generate at the sync, back at rl.train), its
                                gradients are released and its AdamW state waits in host memory */
    bool on_demand;          /* ref, reward: `weights: on_demand` (default `resident`): the
                                worker keeps the frozen weights in host memory and loads them
                                onto its backend for the role's inference subtasks only
                                (docs/run.md "Weights on demand") */
    bool w16;                /* ref, reward: `dtype: bf16` (the default on cuda, fp32 on the cpu):
                                the frozen model stores its weight matrices in bf16
                                (ff_model_opts.bf16_weights) */
} ff_role_cfg;

/* Bounds of sizes read from a run config. Token lengths (data.max_prompt_length,
 * data.max_response_length, a generate node's max_tokens) travel to the workers as 32-bit
 * integers and are added (prompt + response), so each is at most 2^30; counts (batch sizes,
 * workers) at most INT32_MAX. The model's context and the machine's memory bound them more
 * tightly; `fuseflow run` checks those before it starts. */
#define FF_RUN_MAX_TOKENS (1 << 30)
#define FF_RUN_MAX_GEN_BATCHES (1 << 20)

typedef struct ff_data_cfg {
    const char *train_files, *val_files; /* JSONL */
    const char *prompt_key, *answer_key;
    int64_t train_batch_size; /* prompts per iteration */
    int64_t val_batch_size;
    int64_t max_prompt_length, max_response_length;
    bool shuffle;
} ff_data_cfg;

typedef struct ff_trainer_cfg {
    int64_t steps; /* iterations */
    int64_t seed;
    ff_schedule schedule;
    int64_t save_freq, test_freq; /* every N steps; 0 = never */
    int64_t max_gen_batches;      /* dynamic sampling: prompts drawn at most this many batches' worth */
    const char *out_dir;
    const char *acc_reward;       /* the reward function whose score 1 counts as a hit in acc and eval_acc */
    unsigned loggers;             /* FF_LOGGER_* (config.h): trainer.logger */
    const char **plugins;
    size_t n_plugins;
} ff_trainer_cfg;

typedef struct ff_run_config {
    ff_config *cfg; /* the whole tree (owned); strings above point into it */
    char *path;
    ff_data_cfg data;
    ff_trainer_cfg trainer;
    ff_role_cfg roles[FF_ROLE_COUNT];
    ff_graph *graph;
} ff_run_config;

/* Load a run config: YAML, then the dotted overrides (argv style, "graph.adv.estimator=rloo"),
 * then the plugins it names (loaded into reg), then the graph, then every check, ending with
 * unknown keys. NULL + error that names the file and line. */
ff_run_config *ff_run_config_load(const char *path, int n_overrides, char *const *overrides, ff_registry *reg);
/* The same from text (name is used in messages). */
ff_run_config *ff_run_config_parse(const char *text, const char *name, int n_overrides, char *const *overrides,
                                   ff_registry *reg);
void ff_run_config_destroy(ff_run_config **run);
/* The KV blocks of a rollout of `slots` sequences of max_seq positions in blocks of
 * block_rows (the actor's rollout.kv_block, capped at max_seq): rollout.kv_memory of every slot
 * at full length, at least 1. Worker and controller size the pool with it. */
int32_t ff_rollout_kv_blocks(int32_t slots, int32_t max_seq, int32_t block_rows, double kv_memory);
/* Checks that need the file system: the data files and model folders exist. Separate so a
 * config can be validated on a machine without them. 0, or -1 + error with the line. */
int ff_run_config_check_files(const ff_run_config *run);
/* Each role's layout (and the actor's generation layout) against its model's config.json, by
 * the planner's rules (ff_plan_resolve, fuseflow/plan.h): TP divides the key-value heads
 * (the planner, as Megatron, never replicates them; so the query heads too), the intermediate
 * size and the vocabulary (split as it is); no more stages than layers; vpp, zero and the
 * schedule consistent. Needs the model folders (after ff_run_config_check_files). 0, or -1 +
 * error naming the layout's line, the model and the planner's constraint. */
int ff_run_config_check_layouts(const ff_run_config *run);
/* The planner's input for a role's layout on its model (rollout: the actor's generation
 * layout), resolved; ff_plan_rank_coords gives each worker's coordinates (TP innermost, then
 * PP, then DP). 0, or -1 + error as ff_run_config_check_layouts. */
struct ff_plan_input;
int ff_run_config_plan_input(const ff_run_config *run, ff_role role, bool rollout, struct ff_plan_input *out);

/* The critic's place on a worker at stage pp_rank of the actor's replica dp_rank, when the
 * critic is colocated with the actor in a layout nested in the actor's: tp 1, the critic's pp
 * (>= 2) dividing the actor's and its dp = actor dp x r (r = actor pp / critic pp), or the
 * same layout with graph.<actor train>.fuse on or auto (after validation). Each actor
 * pipeline's ranks then hold r critic replicas, replica b on the block of pp ranks b x critic
 * pp ..., the critic's replica dp_rank x r + b; inside its block the critic's stage k sits on
 * the block's rank k, or on rank (critic pp - 1 - k) when the actor's train node fuses
 * (RLHFuse's bidirectional layout, docs/run.md "Fused actor and critic training"). The
 * controller's placement and the workers' groups both come from here. false (the critic, if
 * colocated, shares the actor's place) otherwise. */
bool ff_run_config_critic_place(const ff_run_config *run, int64_t pp_rank, int64_t dp_rank, int64_t *c_pp_rank, int64_t *c_dp_rank);

/* ---- node math (for the executor; plain host functions) ------------------------------------ */

/* Inputs of an advantage node for a set of samples (packed as in rlhf.h). */
typedef struct ff_node_adv_in {
    ff_rlhf_seqs seqs;      /* response tokens of the samples */
    const float *scores;    /* [n_seq] the score column */
    const float *values;    /* [T] or NULL */
    const float *baseline;  /* [n_seq] or NULL */
    const float *old_logp;  /* [T] or NULL (needed with a KL penalty) */
    const float *ref_logp;  /* [T] or NULL (needed with a KL penalty) */
    const int32_t *group;   /* [n_seq] group ids in [0, n_seq) */
} ff_node_adv_in;

/* token rewards = score on the last token - kl_ctl.coef * KL (when the node has a KL
 * penalty), then the estimator. adv, ret [T]. *mean_kl (may be NULL) gets the token-mean KL
 * for ff_node_kl_ctl_update. 0, or -1 + error. */
int ff_node_advantage(ff_node *n, const ff_node_adv_in *in, float *adv, float *ret, double *mean_kl);
/* Adaptive KL penalty: update the coefficient after an iteration. */
void ff_node_kl_ctl_update(ff_node *n, double mean_kl, int64_t n_steps);

typedef struct ff_actor_loss_in {
    ff_rlhf_seqs seqs;
    const float *logp, *old_logp, *adv;
    const float *ref_logp; /* needed with kl_loss */
    const float *entropy;  /* [T] or NULL: per-token entropy, when entropy_coeff != 0 */
    double denom;          /* the mini-batch's normaliser: ff_node_loss_denom over the whole mini-batch */
} ff_actor_loss_in;

typedef struct ff_actor_loss_out {
    double loss;              /* pg + kl_loss_coef * kl - entropy_coeff * entropy */
    double pg_loss, kl_loss, entropy;
    ff_rlhf_pg_stats stats;
    float *dlogp;    /* [T] caller's: d loss / d logp */
    float *dentropy; /* [T] caller's or NULL: d loss / d entropy (backprop it into the logits) */
} ff_actor_loss_out;

/* The normaliser of a mini-batch for this train node's aggregation: sum it over the
 * micro-batches (and DP ranks) of the mini-batch and pass it as denom to each. */
double ff_node_loss_denom(const ff_node *n, const ff_rlhf_seqs *s);
int ff_node_actor_loss(ff_node *n, const ff_actor_loss_in *in, ff_actor_loss_out *out);

typedef struct ff_critic_loss_in {
    ff_rlhf_seqs seqs;
    const float *values, *old_values, *returns;
    double denom;
} ff_critic_loss_in;
/* 0.5 * agg(clipped squared error); dvalues [T]; *clipfrac may be NULL. */
int ff_node_critic_loss(ff_node *n, const ff_critic_loss_in *in, double *loss, float *dvalues, double *clipfrac);

int ff_node_reward(ff_node *n, const ff_reward_item *items, size_t count, float *scores);

/* Sampling of a generate node: temperature (0 with greedy: true), top_k, top_p, the
 * tokens to generate at most (the node's max_tokens, else data.max_response_length, at
 * least 1), and its drawn lengths (len_median 0: none; len_max 0: max_new). The engines turn
 * it into their own settings (fuseflow/roles.h). */
typedef struct ff_node_sampling {
    float temperature, top_p;
    int32_t top_k, max_new;
    float len_median, len_p99_ratio;
    int32_t len_max;
} ff_node_sampling;
void ff_node_sampling_of(const ff_run_config *run, const ff_node *gen, ff_node_sampling *out);

/* Filter node: keep a group? (`rule: nonzero_std` keeps groups whose scores differ, DAPO). */
bool ff_node_filter_keep(const ff_node *n, const float *group_scores, size_t count);

/* ---- scheduling view ------------------------------------------------------------------------- */

typedef struct ff_sched_task {
    int64_t id;
    int node;            /* index into the graph */
    ff_granularity gran;
    int64_t group;       /* the group of a group task, else -1 */
    const int64_t *samples; /* the samples the task covers, ascending */
    int64_t n_samples;
} ff_sched_task;

typedef struct ff_sched ff_sched;

/* One iteration over n_groups prompts with group_size responses each: samples 0..N-1,
 * sample i in group i / group_size. Columns from data exist from the start. */
ff_sched *ff_sched_new(const ff_graph *g, int64_t n_groups, int64_t group_size, ff_schedule schedule);
void ff_sched_destroy(ff_sched **s);

/* The next ready task: 1 and *t (valid until it is completed), 0 when nothing is ready now,
 * -1 + error when nothing is ready, nothing is running and the iteration is not finished
 * (the executor forgot to complete a task or to add groups). */
int ff_sched_next(ff_sched *s, const ff_sched_task **t);
/* The task finished: its output columns exist for its (still live) samples. 0, or -1 + error
 * for an unknown id. */
int ff_sched_complete(ff_sched *s, int64_t task_id);
/* A filter task finished: keep or drop its group. */
int ff_sched_complete_filter(ff_sched *s, int64_t task_id, bool keep);
/* Dynamic sampling: groups to add so the batch can fill (0 without filters). */
int64_t ff_sched_groups_wanted(const ff_sched *s);
/* Add k groups (new prompts); returns the first new group id, or -1 + error. */
int64_t ff_sched_add_groups(ff_sched *s, int64_t k);
/* No more prompts: barriers run with the groups kept so far. */
void ff_sched_source_exhausted(ff_sched *s);
bool ff_sched_finished(const ff_sched *s);
bool ff_sched_sample_alive(const ff_sched *s, int64_t sample);
int64_t ff_sched_n_samples(const ff_sched *s);
/* Tasks dispatched and not completed. */
int64_t ff_sched_in_flight(const ff_sched *s);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

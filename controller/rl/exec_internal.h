/* The executor's internals (include/fuseflow/executor.h is the public side).
 *
 *   exec_run.c    ff_exec_run: config, data, placement of roles on workers, the controller
 *                 and its workers, the loop over iterations, evaluation, shutdown
 *   exec_iter.c   one iteration: the sample store, the ff_sched loop, dispatch by op, results
 *   exec_train.c  train nodes (mini-batches, DP shares, micro-batches) and weight sync
 *   exec_data.c   datasets (JSONL, tokenized prompts)
 *   exec_limits.c the run against the models' context, memory, the machine and the data
 *   exec_ckpt.c   what a checkpoint holds, and resuming from one (the run folder, the data
 *                 order and metrics.jsonl are fuseflow/train_dir.h's)
 *   exec_trace.c  the run's timeline: stages, controller-side work and dependencies added to
 *                 the runtime controller's trace
 */
#ifndef FF_CONTROLLER_RL_EXEC_INTERNAL_H
#define FF_CONTROLLER_RL_EXEC_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "fuseflow/controller.h"
#include "fuseflow/error.h"
#include "fuseflow/executor.h"
#include "fuseflow/fuse.h"
#include "fuseflow/graph.h"
#include "fuseflow/registry.h"
#include "fuseflow/rl_protocol.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"

#define EX_MAX_RANKS 256
#define EX_MAX_COLS 64
#define EX_MAX_NODES 64

/* Pools of ranks, one worker group each. */
enum { POOL_ACTOR = 0, POOL_GEN, POOL_CRITIC, POOL_REF, POOL_REWARD, POOL_COUNT };
extern const char *const ex_pool_names[POOL_COUNT]; /* the group names: "actor", "gen", ... */


/* ---- data ------------------------------------------------------------------------------------- */
typedef struct ex_dataset {
    int64_t n;
    json_t **rows;         /* the JSONL objects */
    const char **prompt;   /* [n] texts inside rows */
    const char **answer;   /* [n] or NULL entries */
    char **meta;           /* [n] JSON text of the other keys (made on first use) */
    int32_t **ids;         /* [n] tokenized prompts */
    int32_t *len;
    int64_t skipped;       /* lines dropped: prompt too long */
} ex_dataset;

int ex_dataset_load(ex_dataset *d, const char *path, const ff_run_config *run, const ff_tokenizer *tok, bool need_answer);
void ex_dataset_free(ex_dataset *d);
const char *ex_dataset_meta(ex_dataset *d, int64_t row, const char *prompt_key, const char *answer_key);
/* Response ids to text (special tokens skipped); ids the tokenizer has no token for (a
 * vocabulary padded past it) decode to nothing. 0 / -1 + error. */
int ex_decode(const ff_tokenizer *tok, const int32_t *ids, int32_t n, char **text, size_t *len);

/* ---- the sample store ---------------------------------------------------------------------- */
/* One column value of one sample: tokens (int32 [len]), per-token (float [len]), scalar (v),
 * text (char *). Data columns point into the dataset (not owned). */
typedef struct ex_cell {
    void *p;
    int32_t len;
    float v;
    bool has, owned;
    uint64_t job; /* the job (or controller-side job slice) that wrote it, 0 for data: the
                     trace's dependencies */
} ex_cell;

typedef struct ex_run ex_run;

/* A job in flight: what its callback must do. */
typedef enum { JOB_GEN = 0, JOB_SCORE, JOB_TRAIN, JOB_SYNC, JOB_EVAL, JOB_CTL, JOB_INIT, JOB_MIGRATE, JOB_MIGRATE_IN } ex_job_kind;

typedef struct ex_job {
    ex_run *x;
    ex_job_kind kind;
    int node;
    int64_t iteration;
    int64_t *tasks, ntasks;     /* scheduler tasks it completes */
    int64_t *samples, nsamples; /* samples it covers (generation: its groups', in order) */
    int64_t group;              /* generation: its first group */
    int64_t ngroups;            /* generation: groups group .. in groups */
    int64_t *groups;            /* generation: [ngroups] (a TP replica gets several at once) */
    int pool, replica;          /* a job addressed to a replica of a TP pool (its load), else -1 */
    int minibatch, member;      /* train: which step, which DP rank */
    bool fused;                 /* train: rl.train_fused, node the actor's, x->fuse.critic the critic's */
    uint64_t id;                /* controller job */
    bool done;
    /* long-tail migration: the pair (ex_iter.mig_pair) of an rl.migrate_out / rl.migrate_in
     * job, else -1; a migrated rl.generate's holder (never submitted: its sequences continue
     * in its pair's rl.migrate_in) keeps the job's groups, samples and tasks, the responses
     * moved (their index in the job's [k n] outputs), the source job's id (the tags the
     * survivor returns name it) and the tokens its finished samples added */
    int pair;
    int64_t nmig, *mig_src, mig_tokens;
    uint64_t mig_from;
    struct ex_job *next;
} ex_job;

/* Per-node bookkeeping within an iteration. */
typedef struct ex_node_stat {
    int64_t dispatched, done;   /* samples */
    int64_t t_first_ns, t_last_ns;
    int64_t tokens;             /* generated or scored tokens */
} ex_node_stat;

/* Training of one train node within an iteration. */
typedef struct ex_train {
    int node;
    int64_t task;        /* the scheduler's batch task */
    int pool;
    int n_steps, n_ranks, pending;
    double (*m)[FF_RL_NM]; /* [n_steps * n_ranks] */
    bool active;
} ex_train;

/* One DP rank's share of one mini-batch of a train node: its samples, micro-batch offsets
 * [nm + 1] and the mini-batch's loss normaliser. */
typedef struct ex_share {
    int64_t *samples, n;
    int32_t *mb, nm;
    double denom;
} ex_share;

/* A train node's shares in an iteration, kept until its partner's are planned (fusion). */
typedef struct ex_shares {
    ex_share *v; /* [n_steps * dp], step-major */
    int n_steps, dp;
    bool ready;
} ex_shares;

/* A prompt group ready to generate, waiting for the end of the dispatch pass (TP pools). */
typedef struct ex_gen_pend {
    int node;
    int64_t group, task; /* task: a group-level node's, else -1 (the samples' are in pend_task) */
} ex_gen_pend;

/* The generation + inference stage simulated on the run's measured costs (exec_rollout.c):
 * auto's R_t and survivors, and the stage's predicted seconds three ways. */
typedef struct ex_rollout_plan {
    bool valid;       /* something was measured: the simulation ran */
    double rt;        /* the best threshold (fraction of the samples; 0: no migration pays) */
    int survivors;    /* the simulation's survivors at rt */
    double serial_s, fused_s, migrate_s; /* generation then inference; fused; fused with migration at rt */
    double step_a, step_b, step_c;       /* the decode step fit: a + b batch + c context tokens, seconds */
    double infer_per_tok;                /* the inference forwards, worker-seconds per token */
    double move_latency_s, move_per_sample_s; /* a migration: t = latency + per sample x moved */
    int64_t step_jobs;                   /* the rl.generate jobs the step fit has read, over the run */
} ex_rollout_plan;
typedef struct ex_rollout ex_rollout;
/* A move of long-tail migration (exec_iter.c): the source's rl.migrate_out and the
 * survivor's rl.migrate_in, and what the survivor returned (its sequences' tags, lengths,
 * tokens and log-probs, copied out of its result). */
typedef struct ex_mig_pair {
    int src, dst;             /* ranks */
    uint64_t in_id;           /* the rl.migrate_in job (the trace's arrows end there) */
    bool out_done, in_done, in_ok, finished;
    int64_t m, total;         /* sequences the survivor continued, their tokens */
    int64_t *tag;             /* [m, 2]: the source's rl.generate job id, the response in it */
    int32_t *rlen, *tok;      /* [m], [total] */
    float *lp;                /* [total] */
} ex_mig_pair;

/* Frozen weights on demand (exec_weights.c): per role (0 ref, 1 reward) what its workers
 * loaded in the iteration, and the on-demand weight bytes they held when generation jobs began
 * (the most) and during the role's inference (the least). */
enum { EX_OD_N = 2 };
typedef struct ex_weights_role {
    int64_t loads, prefetched, bytes, held_infer_min;
    double load_s, hidden_s; /* hidden: load seconds no subtask waited for */
    bool infer_seen;
} ex_weights_role;
typedef struct ex_weights {
    ex_weights_role role[EX_OD_N];
    int64_t held_gen_max;
    bool gen_seen;
} ex_weights;

typedef struct ex_iter {
    int64_t it;
    ff_sched *s;
    int64_t n_groups, cap_groups, cap_samples;
    int64_t *group_row;                 /* dataset row of each group */
    ex_cell *cells[EX_MAX_COLS];        /* [cap_samples] each */
    char **resp_text[EX_MAX_COLS];      /* decoded tokens columns (reward inputs), lazily */
    int64_t *pend_task[EX_MAX_NODES];   /* generate nodes: scheduler task of each sample */
    int32_t *pend_count[EX_MAX_NODES];  /* generate nodes: tasks buffered per group */
    uint64_t *gen_job;                  /* controller job generating each group (to cancel) */
    ex_gen_pend *gen_pend;              /* TP generation: groups of this dispatch pass */
    int64_t n_gen_pend, cap_gen_pend;
    ex_node_stat st[EX_MAX_NODES];
    ex_train train[EX_MAX_NODES];
    ex_shares fuse_sh[2];               /* fusion: the actor's and the critic's shares until both are planned */
    bool fuse_used;                     /* this iteration's steps were fused */
    double fuse_gain;                   /* their simulated gain over serial */
    double fuse_peak_ratio;             /* the highest of their fused / serial peak activations, 0: not planned */
    double kl_sum[EX_MAX_NODES], kl_w[EX_MAX_NODES]; /* advantage nodes' KL penalty means */
    int64_t sync_bytes, sync_bytes_max; /* weights received by the sync's ranks: in all, the most by one */
    int64_t sync_ns;                    /* the syncs' subtasks, first start to last end */
    int64_t sync_delta[3];              /* delta syncs: elements compared, changed, bytes saved (all ranks) */
    bool sync_is_delta;
    /* roles.actor.offload: the actor's moves for generation (0: at the sync, 1: back at its
     * first step): AdamW bytes and gradient bytes summed over the ranks, the slowest rank's
     * seconds */
    double off_bytes[2], off_grads[2], off_s[2];
    bool off_seen;
    int64_t prompts_drawn;
    bool training_started, announced;
    int64_t t0_ns;
    /* long-tail migration (exec_iter.c): decided once per iteration; the survivors and the
     * samples on each; what moved, the decision's time and the last rl.migrate_in's start */
    bool mig_decided;
    double mig_rt;
    int mig_to[EX_MAX_RANKS], mig_load[EX_MAX_RANKS], n_mig_to, mig_sources;
    int64_t mig_moved, mig_bytes, mig_t0_ns, mig_t1_ns;
    /* the stage simulated at the iteration's start (the fixed threshold's, or auto's best), and
     * that simulation at the threshold used (predicted_s; 0: none) */
    ex_rollout_plan plan;
    double mig_predicted_s;
    /* each source -> survivor move: its two jobs' outcomes and the survivor's result (kept
     * until the source's results are in); the holders of the migrated jobs; the moves that
     * sent the KV rows / a recompute; state bytes seen in results at the controller (0: they
     * went between the workers) */
    ex_mig_pair mig_pair[EX_MAX_RANKS];
    int n_mig_pair;
    ex_job **mig_hold;
    int n_mig_hold, cap_mig_hold;
    int64_t mig_kv, mig_recompute, mig_via_ctl;
    int64_t kv_use[3]; /* the rollouts' KV cache: the most blocks one held at once, its pool, positions per block */
    int64_t decode_steps[2]; /* the rollouts' decode steps: replayed as a CUDA graph, kernel by kernel */
    ex_weights weights; /* roles.*.weights: on_demand */
} ex_iter;

/* A pool's layout: tp x pp ranks per DP replica (mp, the model-parallel ranks), dp replicas
 * (pool_n = tp x pp x dp), each member's coordinates by the planner's rank map (TP innermost,
 * then PP, then DP), the ranks of each replica in that order, and, with mp > 1, the worker
 * group of each replica (one subtask to it reaches all of them, in the same order as every
 * other group job they share) and the jobs in flight on it. */
typedef struct ex_layout {
    int tp, pp, dp, mp;
    int tp_idx[EX_MAX_RANKS], pp_idx[EX_MAX_RANKS], dp_idx[EX_MAX_RANKS]; /* by member */
    int rep_ranks[EX_MAX_RANKS];                    /* replica r's ranks: rep_ranks[r * mp + pp_idx * tp + tp_idx] */
    char rep_group[EX_MAX_RANKS][FF_MSG_NAME_MAX];  /* "replica@RANK" (shared by colocated pools of one layout) */
    int load[EX_MAX_RANKS];                         /* jobs in flight per replica */
    unsigned rr;
} ex_layout;

/* A fused step's problem and schedule for one set of micro-batch counts (exec_fuse.c). */
typedef struct ex_fuse_plan {
    int32_t ma;            /* the actor's micro-batches */
    int32_t mc[FF_FUSE_MAX_MODELS - 1]; /* [reps] each critic replica's in the actor's pipeline */
    int reps;
    ff_fuse_instance in;
    char *json;            /* the instance's JSON (rl.train_fused's fuse_instance) */
    int32_t *sched;        /* its schedule as FF_RL_T_FUSE_SCHEDULE */
    int64_t n_sched;
    double serial, fused;  /* simulated makespans of the executor streams (ff_fuse_streams_makespan) */
    double gain;           /* 1 - fused / serial */
    double peak_serial, peak_fused; /* the simulated peak activation per rank of each schedule (the instance's units) */
    double slack;          /* the makespan slack the schedule was solved at (fuse_peak: the least that fits), -1: none fits */
    bool use;              /* fuse these steps (on; auto: gain >= 5%) */
} ex_fuse_plan;

enum { EX_FUSE_PLANS = 16 };
typedef struct ex_fuse {
    ff_fuse_mode mode;     /* the actor train node's, after validation (auto that cannot fuse: off) */
    double peak_cap;       /* fuse_peak: fused peak activation per rank at most this x serial's; 0: none */
    int actor, critic;     /* the two train nodes, or -1 */
    char note[256];        /* auto that fell back to off: why */
    /* auto: what the serial steps measured (the actor's [0], the critic's [1]): sums of the
     * stages' mean forward and backward seconds, of one micro-batch's tokens, and counts */
    double sum_fwd[2], sum_bwd[2], n_times[2], sum_tok[2], n_tok[2];
    int64_t hidden[2], layers[2]; /* of the two models' configs */
    ex_fuse_plan plans[EX_FUSE_PLANS];
    int n_plans;
} ex_fuse;

/* Placement across hosts (exec_place.c). host_of[w]: worker w's host, hosts numbered in the
 * order of their lowest worker rank; local_index[w]: its hello's (-1: not given).
 * order[l] = the worker that takes the planner's rank l: host by host, inside one by local
 * index (those without one after, by rank), so that on hosts of one shape the ranks at the
 * same place of each host's share sit on the same rail. */
void ex_place_order(int n, const int *host_of, const int *local_index, int *order);
/* 1 when each DP group of a layout (its members at one place g = pp_idx x tp + tp_idx of
 * every replica; rep_ranks: workers, dp x mp) has the same local indices on every host it
 * spans, so that its traffic between hosts stays on rails (the planner's a x y grid); 0 and
 * the first group that does not, with its indices on two of its hosts ("-1": not given). */
typedef struct ex_rail_gap {
    int group, host_a, host_b;
    char on_a[256], on_b[256]; /* "0 2" */
} ex_rail_gap;
int ex_rail_aligned(int dp, int mp, const int *rep_ranks, const int *host_of, const int *local_index, ex_rail_gap *gap);

/* ---- the run --------------------------------------------------------------------------------- */
struct ex_run {
    ff_exec_opts o;
    ff_registry *reg;
    ff_run_config *run;
    char *config_text;
    char *overrides_text;
    ff_tokenizer *tok;
    ex_dataset train, val;
    ff_data_order order;
    ff_train_dir td;  /* the run folder: checks, metrics, checkpoints (the newest in td.checkpoint) */
    ff_reward *exact; /* arith_exact_match with defaults: accuracy */
    FILE *out;
    bool tty;

    /* placement */
    int nranks;
    unsigned rank_roles[EX_MAX_RANKS];
    int pool_ranks[POOL_COUNT][EX_MAX_RANKS];
    int pool_n[POOL_COUNT];
    bool gen_separate;
    bool gen_relaid; /* the generating copy on the actor's workers in a layout of its own (weights
                        resharded inside the actor's group) */
    bool gen_hybrid; /* ... placed by HybridFlow's mapping (tg | t, pg | p): each rank's generation
                        shard contains its training shard; the gather stays in micro-DP groups */
    bool sync_group; /* a "sync" group (the actor's replica 0 + generation ranks) with a communicator */
    ex_layout lay[POOL_COUNT];
    int rank_pool[EX_MAX_RANKS]; /* the pool that owns each rank (the others share it) */
    int rank_gpu[EX_MAX_RANKS];  /* the CUDA device each rank computes on (roles.<role>.backend: cuda), or -1: cpu */
    int threads;

    ff_controller *c;
    int known_dead;

    /* graph facts */
    int n_nodes, n_cols;
    int gen_node;        /* the sample-level generate node */
    int resp_col, prompt_col, answer_col, score_col;
    int64_t group_size, batch;
    int64_t max_seq;     /* positions of a rollout sequence slot: prompt + longest response + 1 */
    int logprob_col;     /* the column the generate node writes its log-probs into, or -1 */

    /* state */
    ex_iter *cur;
    ex_job *jobs;        /* in flight (for cancel and cleanup) */
    int64_t iteration;   /* last completed */
    char failed[8192];   /* first fatal error, "" while fine */
    /* the first failure of a subtask, not yet blamed (ex_subtask_failed) */
    char suspect[FF_MSG_TEXT_MAX + 256];
    /* a weight sync to a generation pool of its own that failed (a rank of its group may have
     * died during it): run again in a group of the live ranks once the death is confirmed */
    struct ex_sync_redo {
        bool pending;
        int node;
        int64_t task, iteration;
    } sync_redo;
    bool stop_now;
    int64_t updates[2];  /* total optimizer steps of the run: actor, critic */
    double eval_time_s;
    int64_t eval_done, eval_total; /* progress of the evaluation running (total 0: none) */
    int64_t eval_hits;             /* exact matches among eval_done */
    int64_t progress_ns;           /* when the live line was last drawn */
    double iter_time_avg;

    /* metrics of the iteration being finished */
    json_t *metrics;

    /* each rank's memory once its roles are loaded (rl.init's outputs, in bytes); the first
     * metrics line after the workers start carries it */
    struct {
        bool has;
        int64_t mem[FF_RL_MEM_N];
        int64_t role[FF_RL_NROLES][FF_RL_RB_N];
    } loaded[EX_MAX_RANKS];
    bool memory_pending;
    /* each device rank's most held on its device since the last iteration's metrics (the
     * results' FF_RL_T_DEVICE_PEAK), 0 where none reported, and the least free there then (-1:
     * none known; ff_rl_device_least_free of each result) */
    int64_t device_peak[EX_MAX_RANKS], device_min_free[EX_MAX_RANKS];

    ex_fuse fuse;        /* graph.<actor train>.fuse (exec_fuse.c) */
    struct ex_trace *tr; /* --trace: what the executor adds to the controller's trace */
    int64_t gen_slots;   /* sequences of max_seq each generation engine holds at once: its slots
                            (rl.init's), fewer when roles.actor.rollout.kv_memory < 1 */
    ex_rollout *ro;      /* the stage's measured costs and last lengths (exec_rollout.c), lazily */
    /* long-tail migration: the "migrate" group (a communicator over the generation ranks) is
     * rebuilt before the next move after a failed one; the link bandwidth measured by the last
     * move (bytes/s, 0 before any) and each generation rank's prefill rate (tokens/s, from its
     * results), the cost model's inputs for migrate_with: auto */
    bool mig_group, mig_rebuild;
    double mig_link_bps;
    double prefill_tps[EX_MAX_RANKS];
};

/* exec_run.c */
bool ex_has_node(const ex_run *x, ff_op op, ff_role role); /* role FF_ROLE_COUNT: any role */
/* The sequence slots of each generation engine (rl.init's slots): a replica's share of an
 * iteration's samples, in [max(16, n), 256]. */
int64_t ex_gen_slots(const ex_run *x);
/* Each generation engine's KV pool in blocks (as its worker sizes it: ff_rollout_kv_blocks),
 * their positions (*block_rows) and the blocks of one sequence at full length (*per_seq). */
int64_t ex_gen_kv_pool(const ex_run *x, int32_t *block_rows, int64_t *per_seq);
/* Address spec to replica r of pool: its rank (tp 1: FF_TARGET_RANK, the pool's group named
 * for its communicator), or all its TP ranks (a group job on the replica's group); j counts
 * in the replica's load until released. */
void ex_target_replica(ex_run *x, ex_job *j, int pool, int r, ff_subtask_spec *spec);
/* The TP pool's replica with the fewest jobs in flight (round robin among equals). */
int ex_pick_replica(ex_run *x, int pool);
static inline bool ex_pool_grouped(const ex_run *x, int pool) { return x->lay[pool].mp > 1; }
/* A job's result: the first that failed, else member 0's (TP rank 0 of the replica, the one
 * that returns per-sample outputs). */
const ff_result *ex_result_of(const ff_result *r, int n);
bool ex_role_used(const ex_run *x, ff_role role);          /* some node runs on it */
int ex_sync_group(ex_run *x);
/* The "migrate" group over the live generation ranks (exec_iter.c), made at start when a
 * generate node migrates on DP generation workers; made again after a failed move. 0 / -1. */
int ex_migrate_group(ex_run *x);
void ex_eval_done(ex_run *x, ex_job *j, const ff_result *r, int n);
void ex_init_done(ex_run *x, const ff_result *r); /* one rank's rl.init */

/* exec_limits.c: before any worker starts; -1 + error naming the key, the value and the limit */
int ex_check_limits(ex_run *x);  /* context of the models, memory, local workers (after place) */
int ex_check_dataset(ex_run *x); /* the batch against the training set (after the data is read) */

/* exec_iter.c */
int ex_iteration(ex_run *x, int64_t it);
void ex_iter_free(ex_run *x, ex_iter **pi);
void ex_iter_metrics(ex_run *x, json_t *m);
/* A result's device peak (FF_RL_T_DEVICE_PEAK) into x->device_peak. */
void ex_device_peak_note(ex_run *x, const ff_result *r);
void ex_iter_finish(ex_run *x);
void ex_dump_samples(ex_run *x, FILE *f);
void ex_fail(ex_run *x, const char *fmt, ...) FF_PRINTF(2, 3);
ex_job *ex_job_new(ex_run *x, ex_job_kind kind, int node);
void ex_job_release(ex_run *x, ex_job *j);
/* Submit a job; its callback releases it. The controller's job id, or 0 with the run failed
 * (the job freed). */
uint64_t ex_submit(ex_run *x, ex_job *j, const ff_subtask_spec *spec);
/* Pack samples' prompt and response (column col) as the rl.* kinds want them (inputs[0..4),
 * their shapes in shapes[0..4): the callers' storage, alive until the submit). */
int ex_pack_samples(ex_run *x, ex_iter *I, const int64_t *samples, int64_t n, int resp_col, ff_input *in, int64_t *shapes);
const ff_tensor *ex_out_named(const ff_result *r, const char *name); /* NULL: no such output */
void ex_free_buf(void *data, void *hint);
/* Wait (running the loop) until every job of the list is done or the run failed. */
int ex_wait_jobs(ex_run *x);
void ex_progress(ex_run *x, bool force);
void ex_check_workers(ex_run *x);
/* A subtask failed (the text says how): the run stops, unless a worker's death, found once
 * the workers are confirmed, explains it, and then the death is what stops the run. A
 * failure is often the echo of a death not declared yet: a collective whose peer was
 * killed, a job refused because its group's worker just went. From callbacks. */
void ex_subtask_failed(ex_run *x, const char *fmt, ...) FF_PRINTF(2, 3);
/* Judge a failure held by ex_subtask_failed (outside callbacks: it runs the loop). */
void ex_judge(ex_run *x);

/* exec_rollout.c: the stage's measurements (from the result callbacks; a record lost to memory
 * is only a lost observation) and its simulation */
void ex_rollout_free(ex_rollout **r);
/* an rl.generate job on `rank`: its n response lengths, its prompts' mean; `moved`: its open
 * samples were migrated away (it ended early: its span marks its rank's lockstep as unreadable) */
void ex_rollout_gen(ex_run *x, int rank, int64_t start_ns, int64_t end_ns, double plen, const int32_t *rl, int64_t n, bool moved);
/* final response lengths of n samples (every sample once per iteration) */
void ex_rollout_final(ex_run *x, double plen, const int32_t *rl, int64_t n);
/* an inference subtask of scoring node `node` over `tokens` tokens */
void ex_rollout_infer(ex_run *x, int node, int rank, int64_t start_ns, int64_t end_ns, int64_t tokens);
/* the iteration is over: fold its records into the fit, keep its lengths */
void ex_rollout_finish(ex_run *x, const ex_iter *I);
/* Simulate the stage on `workers` generation workers (migrate and survivors as plan.h's: < 0
 * the best, else R_t and that many). 0 with p->valid false before anything was measured; -1 +
 * error when the simulator refuses. */
int ex_rollout_plan_stage(ex_run *x, int workers, int64_t samples, int32_t max_len, double migrate, int64_t survivors,
                          ex_rollout_plan *p);

/* exec_train.c */
int ex_train_start(ex_run *x, ex_iter *I, const ff_sched_task *t);
void ex_train_done(ex_run *x, ex_job *j, const ff_result *r, int n);
void ex_train_free(ex_iter *I); /* shares kept for fusion (ex_iter_free) */
int ex_sync_start(ex_run *x, ex_iter *I, const ff_sched_task *t);
void ex_sync_done(ex_run *x, ex_job *j, const ff_result *r, int n);
/* After a failure was judged: a failed sync whose group lost a generation rank runs again
 * (true), else false. */
bool ex_sync_redo(ex_run *x);
void ex_train_metrics(ex_run *x, ex_iter *I, json_t *m);

/* exec_fuse.c */
int ex_fuse_init(ex_run *x);      /* after placement: the mode, the two nodes (auto: the models' sizes); 0 or -1 + error */
/* auto, before the first measurement: steps train serially and report their stage times */
bool ex_fuse_measuring(const ex_run *x);
/* A serial step's FF_RL_T_STAGE_TIMES of train node `node` (others ignored). */
void ex_fuse_measured(ex_run *x, int node, const ff_tensor *times);
/* One share's mean tokens per micro-batch of the actor (which 0) or the critic (1). */
void ex_fuse_tokens(ex_run *x, int which, double tokens_per_micro);
void ex_fuse_describe(ex_run *x); /* the run's log lines about it */
void ex_fuse_free(ex_run *x);
/* The critic's replicas in each actor pipeline (actor pp / critic pp: ff_run_config_critic_place). */
int ex_fuse_reps(const ex_run *x);
/* The plan of a step with ma actor micro-batches and mc[ex_fuse_reps] of each critic replica
 * in the pipeline (solved once, then cached; its log line printed then). NULL + error. */
const ex_fuse_plan *ex_fuse_plan_for(ex_run *x, int32_t ma, const int32_t *mc);

/* exec_ckpt.c */
int ex_ckpt_save(ex_run *x, int64_t iteration, const ff_data_order *order_at);
int ex_ckpt_load_state(ex_run *x, const char *dir);

/* exec_trace.c: the run's additions to the controller's trace; every call is a no-op
 * without --trace (x->tr NULL) */
typedef struct ex_trace ex_trace;
ex_trace *ex_trace_new(ff_controller *c);
void ex_trace_free(ex_trace **t);
/* The jobs a job of `node` (-1: none) over these samples depends on: the writers of the
 * node's input cells, the last jobs that changed pool's weights (-1: none), and extra
 * (zeros skipped); sorted, each once, valid until the next call; *n set. */
const uint64_t *ex_trace_deps(ex_run *x, int node, const int64_t *samples, int64_t n, int pool, const uint64_t *extra, int nextra,
                              int *nout);
/* These jobs changed the weights of pool (its ranks' load, train steps, sync). */
void ex_trace_weights(ex_run *x, int pool, const uint64_t *jobs, int n);
/* A controller-side node's work on the controller's track: its id (the job that wrote its
 * output cells), 0 without a trace. */
uint64_t ex_trace_local(ex_run *x, int node, int64_t start_ns, int64_t end_ns, const int64_t *samples, int64_t n);
/* A node's span in an iteration on its stage track (node -1: the iterations track). */
void ex_trace_span(ex_run *x, int node, const char *name, int64_t start_ns, int64_t end_ns);
/* The pipeline instructions a train step's result carries (FF_RL_T_PIPE_TIMES), on the
 * rank's "rank R: pipeline" track. */
void ex_trace_pipeline(ex_run *x, const ff_result *r, const char *node);
/* A worker was lost (an instant, once per rank). */
void ex_trace_lost(ex_run *x, int rank, const char *why);
/* One weight sync on the "weight transitions" track: its ranks' span, the bytes they
 * received in all and the most one received. */
void ex_trace_transition(ex_run *x, const char *label, int64_t start_ns, int64_t end_ns, int64_t bytes, int64_t bytes_max);
/* A load of frozen weights onto a worker's backend, on its "rank R: weights" track. */
void ex_trace_load(ex_run *x, int rank, const char *label, int64_t start_ns, int64_t end_ns, int64_t bytes);

/* ---- frozen weights on demand (exec_weights.c) ---- */
/* The FF_RL_REF | FF_RL_REWARD bits of the on-demand roles that rank hosts (rl.migrate_out's
 * prefetch: the source, freed, takes their inference next). */
unsigned ex_weights_prefetch_roles(const ex_run *x, int rank);
/* A generation or inference job's results: their FF_RL_T_WEIGHTS_HELD and FF_RL_T_WEIGHTS into
 * the iteration's ex_weights, each load on the trace. */
void ex_weights_note(ex_run *x, const ex_job *j, const ff_result *r, int n);
/* metrics.jsonl's "weights": {ref|reward: {loads, prefetched, bytes, load_s, hidden_s,
 * resident_generating, resident_inferring}} for the roles on demand; nothing without one. */
void ex_weights_metrics(const ex_run *x, const ex_iter *I, json_t *m);

#endif

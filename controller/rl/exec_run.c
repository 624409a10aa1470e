/* ff_exec_run: a whole run. The config (with overrides) is loaded and checked, data and the
 * tokenizer read, roles placed on worker ranks, the controller started with its local
 * workers and their groups, each worker told what to load (rl.init), then iterations run
 * one after another (exec_iter.c) with metrics, held-out evaluation and checkpoints between
 * them. A failure anywhere stops the run with one message; workers are always shut down.
 *
 * Placement:
 *   actor      roles.actor.workers ranks, each with the trained actor (and, unless the
 *              rollout has workers of its own, the generating copy: colocated, weights
 *              synced by a local copy, or resharded when it has a layout of its own)
 *   rollout    roles.actor.rollout.workers ranks of its own when given (a separate
 *              generation pool; weights resharded inside the "sync" group)
 *   critic, ref, reward  their own ranks, or the ranks of the role they colocate with
 * Each pool is a worker group ("actor", "gen", "critic", "ref", "reward"); trained pools with
 * more than one rank get a communicator for the gradient all-reduce.
 * With workers from other hosts (--listen: join_workers), the ranks in this order are then
 * given to the workers sorted by host (place_by_host), so a replica's TP group sits on one.
 *
 * Layouts (roles.<role>.layout, docs/run.md "Layouts"): the ranks of a pool are ordered as the
 * planner orders them (ff_plan_rank_coords: TP innermost, then PP, then DP), checked against
 * the models by the planner's rules before any worker starts (ff_run_config_check_layouts).
 * Executed: dp, tp, sp, pp (with its schedule and vpp; generation at vpp 1) and zero 1. A pool with tp x pp > 1 has a group of its own for each DP replica (its ranks), and
 * every subtask of its roles goes to a whole replica through that group; its group's
 * communicator is split on the workers into TP, pipeline and DP groups (rl.init). Roles that
 * share workers share their layout, but for the generation copy on the actor's workers, which
 * may have a layout of its own (replica groups of its own, weights broadcast in the actor's
 * group: a full gather, not resharding).
 *
 * Not here: the iteration (exec_iter.c), training (exec_train.c), checkpoints (exec_ckpt.c). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/reward_client.h"
#include "fuseflow/util.h"

/* The run's waits on its workers, in seconds.
 * WORKER_SILENT_S: a worker silent this long is dead (ff_exec_opts.worker_timeout_s's
 *   default): twenty of the controller's 0.5 s heartbeats, so a worker starved for a moment
 *   on a loaded machine is not taken for dead.
 * WORKER_START_S: for the local workers to say hello. A worker execs the command and loads
 *   nothing before it does, so this takes well under a second; the slack is for machines
 *   busy with other jobs and for sanitized builds, without waiting forever on a broken start.
 * WORKER_STOP_S: for the workers to exit before they are killed. A worker first finishes the
 *   subtask it computes (a train step or a checkpoint of a large model takes seconds).
 * GROUP_S: a group's setup and each of its collectives (the weight broadcast to the rollout
 *   ranks moves a whole model). */
#define WORKER_SILENT_S 10
#define WORKER_START_S 60
#define WORKER_JOIN_S 600 /* for remote workers (--listen): someone starts them by hand, or Slurm */
#define WORKER_STOP_S 20
#define GROUP_S 120

void ff_exec_opts_default(ff_exec_opts *o) {
    memset(o, 0, sizeof *o);
    o->progress = -1;
    o->worker_timeout_s = WORKER_SILENT_S;
    o->local_workers = -1;
}

static const ff_node *node_of(const ex_run *x, int m) { return ff_graph_node(x->run->graph, (size_t)m); }

bool ex_has_node(const ex_run *x, ff_op op, ff_role role) {
    for (int m = 0; m < x->n_nodes; m++)
        if (node_of(x, m)->op == op && (role == FF_ROLE_COUNT || node_of(x, m)->role == role)) return true;
    return false;
}

bool ex_role_used(const ex_run *x, ff_role role) {
    for (int m = 0; m < x->n_nodes; m++)
        if (node_of(x, m)->role == role) return true;
    return false;
}

/* ---- graph facts ------------------------------------------------------------------------------- */
static int graph_facts(ex_run *x) {
    const ff_graph *g = x->run->graph;
    x->n_nodes = (int)ff_graph_n_nodes(g);
    x->n_cols = (int)ff_graph_n_columns(g);
    if (x->n_nodes > EX_MAX_NODES || x->n_cols > EX_MAX_COLS)
        return ff_error_set(x->run->path, NULL, "at most %d nodes and %d columns", EX_MAX_NODES, EX_MAX_COLS);
    x->resp_col = ff_graph_response_column(g);
    x->prompt_col = ff_graph_find_column(g, "prompt");
    x->answer_col = ff_graph_find_column(g, "answer");
    x->gen_node = -1;
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *n = node_of(x, m);
        if (n->op == FF_OP_GENERATE && n->out[FF_SLOT_RESPONSE] == x->resp_col && n->gran == FF_GRAN_SAMPLE) x->gen_node = m;
    }
    if (x->gen_node < 0 || x->resp_col < 0 || x->prompt_col < 0)
        return ff_error_set(x->run->path, "add a node with op: generate, role: actor, in: [prompt], out: [response, ...]",
                            "the graph has no sample-level generate node writing the responses");
    x->logprob_col = node_of(x, x->gen_node)->out[FF_SLOT_LOGPROB];
    x->score_col = -1;
    for (int m = 0; m < x->n_nodes && x->score_col < 0; m++)
        if (node_of(x, m)->op == FF_OP_ADVANTAGE) x->score_col = node_of(x, m)->in[FF_SLOT_SCORE];
    for (int m = 0; m < x->n_nodes && x->score_col < 0; m++)
        if (node_of(x, m)->op == FF_OP_REWARD_FN || node_of(x, m)->op == FF_OP_SCORE) x->score_col = node_of(x, m)->out[FF_SLOT_SCORE];
    x->group_size = ff_graph_group_size(g);
    x->batch = x->run->data.train_batch_size;
    /* optimizer steps of the run per trained role (cosine schedules decay over them) */
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *n = node_of(x, m);
        if (n->op != FF_OP_TRAIN) continue;
        int64_t mb = n->train.mini_batch_size > 0 ? n->train.mini_batch_size : x->batch;
        int64_t per = ((x->batch + mb - 1) / mb) * (n->train.epochs > 0 ? n->train.epochs : 1);
        x->updates[n->role == FF_ROLE_CRITIC] = per * x->run->trainer.steps;
    }
    return 0;
}

/* ---- placement ------------------------------------------------------------------------------------- */
static int add_ranks(ex_run *x, int pool, int n, unsigned roles) {
    if (x->nranks + n > EX_MAX_RANKS) return ff_error_set("placement", NULL, "more than %d workers", EX_MAX_RANKS);
    for (int i = 0; i < n; i++) {
        x->pool_ranks[pool][x->pool_n[pool]++] = x->nranks;
        x->rank_pool[x->nranks] = pool;
        x->rank_roles[x->nranks++] = roles;
    }
    return 0;
}

static void share_ranks(ex_run *x, int pool, int with, unsigned roles) {
    for (int i = 0; i < x->pool_n[with]; i++) {
        x->pool_ranks[pool][i] = x->pool_ranks[with][i];
        x->rank_roles[x->pool_ranks[with][i]] |= roles;
    }
    x->pool_n[pool] = x->pool_n[with];
}

static int pool_of_role(ff_role r) {
    switch (r) {
    case FF_ROLE_ACTOR: return POOL_ACTOR;
    case FF_ROLE_CRITIC: return POOL_CRITIC;
    case FF_ROLE_REF: return POOL_REF;
    case FF_ROLE_REWARD: return POOL_REWARD;
    default: return -1;
    }
}

static const char *const role_keys[FF_ROLE_COUNT] = {NULL, "actor", "critic", "ref", "reward"};

/* file:line of a role's layout (rollout: the actor's generation layout), else of the role. */
static const char *layout_where(const ex_run *x, ff_role r, bool rollout, char *buf, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "roles.%s%s.layout", role_keys[r], rollout ? ".rollout" : "");
    ff_cnode *n = ff_cnode_find(ff_config_root(x->run->cfg), key);
    if (!n) {
        snprintf(key, sizeof key, "roles.%s", role_keys[r]);
        n = ff_cnode_find(ff_config_root(x->run->cfg), key);
    }
    if (n) return ff_cnode_where(n, buf, cap);
    snprintf(buf, cap, "%s", x->run->path);
    return buf;
}

/* What this executor runs of a layout the planner accepts. */
static int executable(const ex_run *x, ff_role r, bool rollout, const ff_layout *L) {
    char w[300];
    if (rollout && L->pp > 1 && L->vpp > 1)
        return ff_error_set(layout_where(x, r, rollout, w, sizeof w), "give roles.actor.rollout.layout vpp: 1",
                            "generation runs one chunk per stage (vpp %lld)", (long long)L->vpp);
    return 0;
}

static bool same_layout(const ff_layout *a, const ff_layout *b) {
    return a->tp == b->tp && a->dp == b->dp && a->pp == b->pp && a->sp == b->sp &&
           (a->pp == 1 || (a->vpp == b->vpp && a->schedule == b->schedule));
}

/* A pool's layout: its members' coordinates by the planner's rank map, its replicas. A pool
 * that shares another's ranks in the same layout shares its replica groups (named after the
 * replica's first rank); in a layout of its own its groups carry its name. */
static int pool_layout(ex_run *x, int pool, ff_role role, bool rollout, bool own_groups) {
    ff_plan_input in;
    if (ff_run_config_plan_input(x->run, role, rollout, &in) != 0) return -1;
    ex_layout *L = &x->lay[pool];
    L->tp = (int)in.layout.tp, L->pp = (int)in.layout.pp, L->dp = (int)in.layout.dp;
    L->mp = L->tp * L->pp;
    if (L->mp * L->dp != x->pool_n[pool])
        return ff_error_set("placement", NULL, "pool '%s': tp %d x pp %d x dp %d for %d ranks", ex_pool_names[pool], L->tp, L->pp, L->dp,
                            x->pool_n[pool]);
    const ex_layout *A = &x->lay[POOL_ACTOR]; /* placed first */
    int64_t cp, cd;
    /* a critic nested in the actor's pipelines: its place from the worker's actor place, as the
     * workers make its groups (ff_run_config_critic_place); its replicas' groups its own */
    const bool nested = pool == POOL_CRITIC && x->run->roles[FF_ROLE_CRITIC].colocate_with == FF_ROLE_ACTOR &&
                        ff_run_config_critic_place(x->run, 0, 0, &cp, &cd);
    own_groups = own_groups || (nested && L->pp != A->pp);
    for (int k = 0; k < x->pool_n[pool]; k++) {
        ff_plan_rank c;
        ff_plan_rank_coords(&in, k, &c);
        L->tp_idx[k] = (int)c.idx[FF_PLAN_TP], L->pp_idx[k] = (int)c.idx[FF_PLAN_PP], L->dp_idx[k] = (int)c.idx[FF_PLAN_DP];
        if (nested && ff_run_config_critic_place(x->run, A->pp_idx[k], A->dp_idx[k], &cp, &cd))
            L->tp_idx[k] = 0, L->pp_idx[k] = (int)cp, L->dp_idx[k] = (int)cd;
        L->rep_ranks[L->dp_idx[k] * L->mp + L->pp_idx[k] * L->tp + L->tp_idx[k]] = x->pool_ranks[pool][k];
    }
    for (int r = 0; r < L->dp; r++) {
        if (own_groups) snprintf(L->rep_group[r], sizeof L->rep_group[r], "%s-replica@%d", ex_pool_names[pool], L->rep_ranks[r * L->mp]);
        else snprintf(L->rep_group[r], sizeof L->rep_group[r], "replica@%d", L->rep_ranks[r * L->mp]);
    }
    return 0;
}

/* A generation layout (pg, tg) on the actor's workers, trained at (p, t) with tg | t and
 * pg | p, placed by HybridFlow's mapping (docs/planner.md "Resharding"): the rank at TP index
 * i, stage s, replica k takes generation TP index i / (t/tg), stage s / (p/pg) and replica
 * k dg + (i mod t/tg) + (t/tg)(s mod p/pg), dg = (t/tg)(p/pg): generation TP groups are
 * strided and each micro-DP group (the dg ranks of one generation shard in one training
 * replica) is t/tg neighbouring TP ranks x p/pg neighbouring stages, so every rank's
 * generation shard contains its training shard. Other layouts keep the planner's rank order
 * (the workers' transfer plan then takes pieces wherever the training replica holds them). */
static void hybrid_layout(ex_run *x) {
    const ex_layout *A = &x->lay[POOL_ACTOR];
    ex_layout *G = &x->lay[POOL_GEN];
    x->gen_hybrid = A->tp % G->tp == 0 && A->pp % G->pp == 0;
    if (!x->gen_hybrid) return;
    const int a = A->tp / G->tp, b = A->pp / G->pp, dg = a * b;
    for (int k = 0; k < x->pool_n[POOL_GEN]; k++) {
        const int i = A->tp_idx[k], s = A->pp_idx[k], r = A->dp_idx[k];
        G->tp_idx[k] = i / a, G->pp_idx[k] = s / b, G->dp_idx[k] = r * dg + i % a + a * (s % b);
        G->rep_ranks[G->dp_idx[k] * G->mp + G->pp_idx[k] * G->tp + G->tp_idx[k]] = x->pool_ranks[POOL_GEN][k];
    }
    for (int r = 0; r < G->dp; r++)
        snprintf(G->rep_group[r], sizeof G->rep_group[r], "%s-replica@%d", ex_pool_names[POOL_GEN], G->rep_ranks[r * G->mp]);
}

static int place(ex_run *x) {
    const ff_role_cfg *rc = x->run->roles;
    for (int r = FF_ROLE_ACTOR; r < FF_ROLE_COUNT; r++) {
        if (!rc[r].present || !ex_role_used(x, (ff_role)r)) continue;
        if (executable(x, (ff_role)r, false, &rc[r].layout) != 0) return -1;
        if (r == FF_ROLE_ACTOR && executable(x, (ff_role)r, true, &rc[r].rollout) != 0) return -1;
        char w[300];
        ff_role t = rc[r].colocate_with;
        int64_t cp, cd;
        /* a critic nested in the actor's pipelines (ff_run_config_critic_place) shares its workers */
        const bool nested = r == FF_ROLE_CRITIC && ff_run_config_critic_place(x->run, 0, 0, &cp, &cd) &&
                            rc[r].layout.vpp == rc[t].layout.vpp && rc[r].layout.schedule == rc[t].layout.schedule;
        if (t && !nested && !same_layout(&rc[r].layout, &rc[t].layout))
            return ff_error_set(layout_where(x, (ff_role)r, false, w, sizeof w),
                                "give both the same layout, or the role workers of its own (a critic may also nest in the actor's "
                                "pipelines: tp 1, its pp >= 2 dividing the actor's, its dp = actor dp x actor pp / its pp)",
                                "role '%s' is colocated with '%s' but has layout dp %lld x tp %lld, the %s dp %lld x tp %lld: roles on the "
                                "same workers share their layout", role_keys[r], role_keys[t], (long long)rc[r].layout.dp,
                                (long long)rc[r].layout.tp, role_keys[t], (long long)rc[t].layout.dp, (long long)rc[t].layout.tp);
    }
    const ff_role_cfg *a = &rc[FF_ROLE_ACTOR];
    /* a generating copy on the actor's workers in another layout: its own replica groups, the
     * weights resharded inside the actor's group (hybrid_layout) */
    x->gen_relaid = !a->rollout_workers && !same_layout(&a->rollout, &a->layout);
    unsigned actor_bits = ex_has_node(x, FF_OP_TRAIN, FF_ROLE_ACTOR) || ex_has_node(x, FF_OP_LOGPROB, FF_ROLE_ACTOR) ? FF_RL_ACTOR : 0;
    x->gen_separate = rc[FF_ROLE_ACTOR].rollout_workers > 0;
    if (add_ranks(x, POOL_ACTOR, (int)rc[FF_ROLE_ACTOR].layout.workers, actor_bits | (x->gen_separate ? 0 : FF_RL_GEN))) return -1;
    if (x->gen_separate) {
        if (!actor_bits)
            return ff_error_set(rc[FF_ROLE_ACTOR].where, "drop roles.actor.rollout.workers", "a separate rollout pool needs a trained actor");
        if (add_ranks(x, POOL_GEN, (int)rc[FF_ROLE_ACTOR].rollout_workers, FF_RL_GEN)) return -1;
        x->sync_group = true;
    } else {
        share_ranks(x, POOL_GEN, POOL_ACTOR, FF_RL_GEN);
    }
    const struct {
        ff_role role;
        unsigned bit;
    } others[] = {{FF_ROLE_CRITIC, FF_RL_CRITIC}, {FF_ROLE_REF, FF_RL_REF}, {FF_ROLE_REWARD, FF_RL_REWARD}};
    /* roles on their own ranks first, then the colocated ones (their target is placed) */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 3; k++) {
            ff_role r = others[k].role;
            if (!rc[r].present || !ex_role_used(x, r)) continue;
            bool colo = rc[r].colocate_with != FF_ROLE_NONE;
            if (colo != (pass == 1)) continue;
            int pool = pool_of_role(r);
            if (colo) share_ranks(x, pool, pool_of_role(rc[r].colocate_with), others[k].bit);
            else if (add_ranks(x, pool, (int)rc[r].layout.workers, others[k].bit)) return -1;
        }
    static const ff_role pool_role[POOL_COUNT] = {FF_ROLE_ACTOR, FF_ROLE_ACTOR, FF_ROLE_CRITIC, FF_ROLE_REF, FF_ROLE_REWARD};
    for (int p = 0; p < POOL_COUNT; p++)
        if (x->pool_n[p] && pool_layout(x, p, pool_role[p], p == POOL_GEN, p == POOL_GEN && x->gen_relaid) != 0) return -1;
    if (x->gen_relaid) hybrid_layout(x);
    return 0;
}

void ex_target_replica(ex_run *x, ex_job *j, int pool, int r, ff_subtask_spec *spec) {
    const ex_layout *L = &x->lay[pool];
    if (L->mp > 1) {
        spec->target = FF_TARGET_GROUP;
        spec->group = L->rep_group[r];
        j->pool = pool, j->replica = r;
        x->lay[pool].load[r]++;
    } else {
        spec->target = FF_TARGET_RANK;
        spec->rank = L->rep_ranks[r];
        spec->group = ex_pool_names[pool];
    }
}

int ex_pick_replica(ex_run *x, int pool) {
    ex_layout *L = &x->lay[pool];
    int best = -1;
    unsigned rr = L->rr++;
    for (int k = 0; k < L->dp; k++) {
        int r = (int)((k + rr) % (unsigned)L->dp);
        if (best < 0 || L->load[r] < L->load[best]) best = r;
    }
    return best;
}

/* ---- workers -------------------------------------------------------------------------------------- */
/* Each pool's group; a trained pool of several ranks gets a communicator for the gradient
 * all-reduce, and so does a TP pool that owns its ranks (its workers split it into TP and DP
 * groups); each replica of a TP pool gets a group of its TP ranks (shared by the pools on the
 * same ranks), without a communicator: a job to it reaches all of them. */
static int make_groups(ex_run *x) {
    for (int p = 0; p < POOL_COUNT; p++) {
        if (!x->pool_n[p]) continue;
        const ex_layout *L = &x->lay[p];
        bool trained = (p == POOL_ACTOR && ex_has_node(x, FF_OP_TRAIN, FF_ROLE_ACTOR)) ||
                       (p == POOL_CRITIC && ex_has_node(x, FF_OP_TRAIN, FF_ROLE_CRITIC));
        bool owner = x->rank_pool[x->pool_ranks[p][0]] == p;
        /* the owner's communicator is split on the workers (model parallelism, a generation
         * layout of its own) or carries the gradient all-reduce */
        bool split = L->mp > 1 || (p == POOL_ACTOR && x->gen_relaid && x->lay[POOL_GEN].mp > 1);
        bool comm = split || (p == POOL_ACTOR && x->gen_relaid) ? owner : trained && x->pool_n[p] > 1;
        ff_group_opts go = {.backend = comm ? "cpu" : "none", .timeout_s = GROUP_S, .dp_rank = L->dp_idx};
        if (ff_controller_group_create(x->c, ex_pool_names[p], x->pool_ranks[p], x->pool_n[p], &go) != 0)
            return ff_error_wrap("worker group '%s'", ex_pool_names[p]);
        for (int r = 0; L->mp > 1 && r < L->dp; r++) {
            int n = 0;
            if (ff_controller_group_ranks(x->c, L->rep_group[r], &n)) continue; /* a pool before on the same ranks */
            ff_error_clear();
            ff_group_opts ro = {.backend = "none", .timeout_s = GROUP_S};
            if (ff_controller_group_create(x->c, L->rep_group[r], &L->rep_ranks[r * L->mp], L->mp, &ro) != 0)
                return ff_error_wrap("worker group '%s' (replica %d of the %s)", L->rep_group[r], r, ex_pool_names[p]);
        }
    }
    return 0;
}

/* The "sync" group: the actor's replica 0 (its ranks send the pieces of their shards that
 * the generation ranks need) and the live generation ranks. */
int ex_sync_group(ex_run *x) {
    int ranks[EX_MAX_RANKS + 1], n = 0;
    for (int t = 0; t < x->lay[POOL_ACTOR].mp; t++) ranks[n++] = x->lay[POOL_ACTOR].rep_ranks[t];
    for (int i = 0; i < x->pool_n[POOL_GEN]; i++) {
        ff_worker_info wi;
        if (ff_controller_worker_info(x->c, x->pool_ranks[POOL_GEN][i], &wi) == 0 && wi.state == FF_WORKER_LIVE)
            ranks[n++] = x->pool_ranks[POOL_GEN][i];
    }
    int cur_n = 0;
    const int *cur = ff_controller_group_ranks(x->c, "sync", &cur_n);
    if (!cur) ff_error_clear();
    if (cur && cur_n == n && !memcmp(cur, ranks, (size_t)n * sizeof *ranks)) return 0;
    ff_group_opts go = {.backend = "cpu", .timeout_s = GROUP_S};
    if (ff_controller_group_create(x->c, "sync", ranks, n, &go) != 0) return ff_error_wrap("weight-sync group");
    return 0;
}

/* ---- memory after loading -------------------------------------------------------------------- */
void ex_init_done(ex_run *x, const ff_result *r) {
    if (r->status != FF_STATUS_OK) {
        ex_subtask_failed(x, "worker %d: %s: %s", r->rank, ff_status_name(r->status), r->error);
        return;
    }
    const ff_tensor *mem = ex_out_named(r, FF_RL_T_MEMORY), *rb = ex_out_named(r, FF_RL_T_ROLE_BYTES);
    if (r->rank < 0 || r->rank >= x->nranks || !mem || mem->dtype != FF_DTYPE_I64 || mem->ndim != 1 ||
        mem->shape[0] != FF_RL_MEM_N || !rb || rb->dtype != FF_DTYPE_I64 || rb->ndim != 2 || rb->shape[0] != FF_RL_NROLES ||
        rb->shape[1] != FF_RL_RB_N) {
        ex_fail(x, "rl.init: worker %d sent no memory report of the expected shape (%s [%d], %s [%d, %d])", r->rank,
                FF_RL_T_MEMORY, FF_RL_MEM_N, FF_RL_T_ROLE_BYTES, FF_RL_NROLES, FF_RL_RB_N);
        return;
    }
    x->loaded[r->rank].has = true;
    memcpy(x->loaded[r->rank].mem, mem->data, sizeof x->loaded[r->rank].mem);
    memcpy(x->loaded[r->rank].role, rb->data, sizeof x->loaded[r->rank].role);
}

/* One line per rank: what the process holds beside what its roles' shards need. */
static void print_memory(ex_run *x) {
    char b[4][32];
    for (int r = 0; r < x->nranks; r++) {
        if (!x->loaded[r].has) continue;
        int64_t need = 0;
        for (int i = 0; i < FF_RL_NROLES; i++)
            for (int k = 0; k < FF_RL_RB_N; k++) need += k == FF_RL_RB_VIEWED ? -x->loaded[r].role[i][k] : x->loaded[r].role[i][k];
        fprintf(x->out, "run: rank %d holds %s after loading (peak %s)", r, ff_fmt_bytes((uint64_t)x->loaded[r].mem[FF_RL_MEM_RSS], b[0], sizeof b[0]),
                ff_fmt_bytes((uint64_t)x->loaded[r].mem[FF_RL_MEM_PEAK], b[1], sizeof b[1]));
        if (x->loaded[r].mem[FF_RL_MEM_DEV_CAP] > 0) /* a device: its buffers and workspace there */
            fprintf(x->out, ", cuda:%d %s of its %s (%s free)", x->rank_gpu[r], ff_fmt_bytes((uint64_t)x->loaded[r].mem[FF_RL_MEM_DEV], b[0], sizeof b[0]),
                    ff_fmt_bytes((uint64_t)x->loaded[r].mem[FF_RL_MEM_DEV_CAP], b[1], sizeof b[1]),
                    x->loaded[r].mem[FF_RL_MEM_DEV_FREE] >= 0 ? ff_fmt_bytes((uint64_t)x->loaded[r].mem[FF_RL_MEM_DEV_FREE], b[2], sizeof b[2]) : "unknown");
        fprintf(x->out, "; its roles need %s:", ff_fmt_bytes((uint64_t)need, b[2], sizeof b[2]));
        const char *sep = " ";
        for (int i = 0; i < FF_RL_NROLES; i++) {
            const int64_t *v = x->loaded[r].role[i];
            if (!(x->rank_roles[r] & (1u << i))) continue;
            fprintf(x->out, "%s%s %s weights", sep, ff_rl_role_names[i], ff_fmt_bytes((uint64_t)v[FF_RL_RB_PARAMS], b[0], sizeof b[0]));
            if (v[FF_RL_RB_VIEWED]) fprintf(x->out, " (%s of them the actor's, in place)", ff_fmt_bytes((uint64_t)v[FF_RL_RB_VIEWED], b[3], sizeof b[3]));
            if (v[FF_RL_RB_GRADS] || v[FF_RL_RB_OPTIM])
                fprintf(x->out, " + %s gradients + %s optimizer", ff_fmt_bytes((uint64_t)v[FF_RL_RB_GRADS], b[1], sizeof b[1]),
                        ff_fmt_bytes((uint64_t)v[FF_RL_RB_OPTIM], b[2], sizeof b[2]));
            sep = ", ";
        }
        fprintf(x->out, "\n");
    }
    fflush(x->out);
}

/* "memory": [{"rank", "resident_bytes", "peak_bytes", "roles": {"actor": {"params_bytes",
 * "grads_bytes", "optimizer_bytes"}, ...}}, ...]; a generating copy that reads the actor's
 * training shard in place also "in_place_bytes" (of its params_bytes); a rank on a device also
 * "device_bytes" (what its backend holds there after loading) and "device_capacity_bytes" */
static json_t *memory_json(const ex_run *x) {
    json_t *a = json_array();
    for (int r = 0; r < x->nranks && a; r++) {
        if (!x->loaded[r].has) continue;
        json_t *roles = json_object();
        for (int i = 0; i < FF_RL_NROLES; i++) {
            const int64_t *v = x->loaded[r].role[i];
            if (!(x->rank_roles[r] & (1u << i))) continue;
            json_t *o = json_pack("{s:I, s:I, s:I}", "params_bytes", (json_int_t)v[FF_RL_RB_PARAMS], "grads_bytes",
                                  (json_int_t)v[FF_RL_RB_GRADS], "optimizer_bytes", (json_int_t)v[FF_RL_RB_OPTIM]);
            if (o && v[FF_RL_RB_VIEWED]) json_object_set_new(o, "in_place_bytes", json_integer((json_int_t)v[FF_RL_RB_VIEWED]));
            json_object_set_new(roles, ff_rl_role_names[i], o);
        }
        json_t *o = json_pack("{s:i, s:I, s:I, s:o}", "rank", r, "resident_bytes", (json_int_t)x->loaded[r].mem[FF_RL_MEM_RSS],
                              "peak_bytes", (json_int_t)x->loaded[r].mem[FF_RL_MEM_PEAK], "roles", roles);
        if (o && x->loaded[r].mem[FF_RL_MEM_DEV_CAP] > 0) {
            json_object_set_new(o, "device_bytes", json_integer((json_int_t)x->loaded[r].mem[FF_RL_MEM_DEV]));
            json_object_set_new(o, "device_capacity_bytes", json_integer((json_int_t)x->loaded[r].mem[FF_RL_MEM_DEV_CAP]));
            json_object_set_new(o, "device_free_bytes", json_integer((json_int_t)x->loaded[r].mem[FF_RL_MEM_DEV_FREE]));
        }
        json_array_append_new(a, o);
    }
    return a;
}

/* Append a metrics line; the first one after the workers started carries their memory. */
static int write_metrics(ex_run *x, json_t *m) {
    if (x->memory_pending) {
        json_object_set_new(m, "memory", memory_json(x));
        x->memory_pending = false;
    }
    return ff_train_dir_metrics(&x->td, m);
}

static int init_workers(ex_run *x, const char *resume_dir) {
    const int64_t slots = ex_gen_slots(x);
    /* what a survivor of a migration has room for: its slots, or the full-length sequences
     * its KV pool holds (ex_check_limits saw that one group fits) */
    int32_t bs;
    int64_t per;
    const int64_t pool = ex_gen_kv_pool(x, &bs, &per), held = pool / per;
    x->gen_slots = held < slots ? held : slots;
    size_t clen = strlen(x->config_text), olen = strlen(x->overrides_text);
    uint64_t load[EX_MAX_RANKS]; /* each rank's job: it loads the weights of every role there */
    for (int r = 0; r < x->nranks; r++) {
        char backend[32];
        if (x->rank_gpu[r] >= 0) snprintf(backend, sizeof backend, "cuda:%d", x->rank_gpu[r]);
        else snprintf(backend, sizeof backend, "cpu:%d", x->threads);
        char *cfg = ff_strdup(x->config_text), *ov = ff_strdup(x->overrides_text);
        if (!cfg || !ov) {
            free(cfg), free(ov);
            return -1;
        }
        int64_t cl = (int64_t)clen, ol = (int64_t)olen;
        ff_input in[2] = {{.name = "config", .dtype = FF_DTYPE_U8, .ndim = 1, .shape = &cl, .data = cfg, .free_fn = ex_free_buf},
                          {.name = "overrides", .dtype = FF_DTYPE_U8, .ndim = 1, .shape = &ol, .data = ov, .free_fn = ex_free_buf}};
        /* its place in the layout of the pool that owns it (the roles sharing it share that) */
        int pool = x->rank_pool[r], k = 0;
        while (x->pool_ranks[pool][k] != r) k++;
        const ex_layout *L = &x->lay[pool];
        const ex_layout *G = x->gen_relaid && (x->rank_roles[r] & FF_RL_GEN) ? &x->lay[POOL_GEN] : NULL;
        int gk = 0;
        while (G && x->pool_ranks[POOL_GEN][gk] != r) gk++;
        ff_arg args[] = {ff_arg_int("roles", x->rank_roles[r]),     ff_arg_str("backend", backend),
                          ff_arg_str("resume", resume_dir ? resume_dir : ""), ff_arg_int("updates_actor", x->updates[0]),
                          ff_arg_int("updates_critic", x->updates[1]), ff_arg_int("slots", slots),
                          ff_arg_int("max_seq", x->max_seq),            ff_arg_str("name", x->o.config),
                          ff_arg_int("tp", L->tp),                      ff_arg_int("tp_rank", L->tp_idx[k]),
                          ff_arg_int("pp", L->pp),                      ff_arg_int("pp_rank", L->pp_idx[k]),
                          ff_arg_int("dp", L->dp),                      ff_arg_int("dp_rank", L->dp_idx[k]),
                          /* the generating copy's place when it has a layout of its own here */
                          ff_arg_int("gen_tp", G ? G->tp : 0),          ff_arg_int("gen_tp_rank", G ? G->tp_idx[gk] : 0),
                          ff_arg_int("gen_pp", G ? G->pp : 1),          ff_arg_int("gen_pp_rank", G ? G->pp_idx[gk] : 0),
                          ff_arg_int("gen_dp", G ? G->dp : 1),          ff_arg_int("gen_dp_rank", G ? G->dp_idx[gk] : 0)};
        ex_job *j = ex_job_new(x, JOB_INIT, -1);
        if (!j) return -1;
        /* the pool's group: with tp > 1 the worker splits its communicator into TP and DP groups */
        ff_subtask_spec spec = {.kind = FF_RL_INIT, .target = FF_TARGET_RANK, .rank = r, .group = ex_pool_names[pool], .args = args,
                                .nargs = (int)(sizeof args / sizeof *args), .inputs = in,
                                .ninputs = 2, .label = "load models"};
        if (!(load[r] = ex_submit(x, j, &spec))) return -1;
    }
    for (int p = 0; p < POOL_COUNT; p++) {
        uint64_t w[EX_MAX_RANKS];
        for (int i = 0; i < x->pool_n[p]; i++) w[i] = load[x->pool_ranks[p][i]];
        ex_trace_weights(x, p, w, x->pool_n[p]);
    }
    if (ex_wait_jobs(x) != 0) return -1;
    print_memory(x);
    x->memory_pending = true;
    return 0;
}

/* ---- held-out evaluation ---------------------------------------------------------------------- */
void ex_eval_done(ex_run *x, ex_job *j, const ff_result *rs, int n) {
    const ff_result *r = ex_result_of(rs, n);
    if (r->status != FF_STATUS_OK) {
        ex_subtask_failed(x, "evaluation on worker %d: %s: %s", r->rank, ff_status_name(r->status), r->error);
        return;
    }
    const ff_tensor *rlen = ex_out_named(r, FF_RL_T_RLEN), *resp = ex_out_named(r, FF_RL_T_RESP);
    if (!rlen || !resp || rlen->shape[0] != j->nsamples) {
        ex_fail(x, "evaluation: worker %d sent a malformed result", r->rank);
        return;
    }
    const int32_t *rl = rlen->data, *tok = resp->data;
    int64_t off = 0;
    for (int64_t k = 0; k < j->nsamples; k++) {
        int64_t row = j->samples[k];
        char *text = NULL;
        size_t len;
        float hit = 0;
        if (ex_decode(x->tok, tok + off, rl[k], &text, &len) == 0 && x->val.answer[row]) {
            ff_reward_item it = {x->val.prompt[row], text, x->val.answer[row], NULL};
            if (ff_reward_score(x->exact, &it, 1, &hit) != 0) hit = 0;
        }
        free(text);
        x->eval_hits += hit >= 1.0f; /* a perfect answer */
        x->eval_done++;
        off += rl[k];
    }
}

static int evaluate(ex_run *x, double *acc) {
    int64_t n = x->val.n;
    if (x->o.val_limit > 0 && x->o.val_limit < n) n = x->o.val_limit;
    int64_t chunk = x->run->data.val_batch_size;
    ff_node_sampling sp;
    ff_node_sampling_of(x->run, node_of(x, x->gen_node), &sp);
    x->eval_hits = x->eval_done = 0;
    x->eval_total = n;
    int64_t t0 = ff_now_ns();
    for (int64_t a = 0; a < n; a += chunk) {
        int64_t k = n - a < chunk ? n - a : chunk, P = 0;
        for (int64_t i = 0; i < k; i++) P += x->val.len[a + i];
        int32_t *p = ff_malloc((size_t)P * 4), *pl = ff_malloc((size_t)k * 4);
        int64_t *sd = ff_calloc((size_t)k, 8);
        ex_job *j = ex_job_new(x, JOB_EVAL, -1);
        if (j) j->samples = ff_malloc((size_t)k * sizeof *j->samples);
        if (!p || !pl || !sd || !j || !j->samples) {
            free(p), free(pl), free(sd);
            if (j) free(j->samples);
            free(j);
            return -1;
        }
        j->nsamples = k;
        int64_t off = 0;
        for (int64_t i = 0; i < k; i++) {
            memcpy(p + off, x->val.ids[a + i], (size_t)x->val.len[a + i] * 4);
            off += x->val.len[a + i];
            pl[i] = x->val.len[a + i];
            j->samples[i] = a + i;
        }
        int64_t shp[3] = {P, k, k};
        ff_input in[3] = {{.name = FF_RL_T_PROMPT, .dtype = FF_DTYPE_I32, .ndim = 1, .shape = &shp[0], .data = p, .free_fn = ex_free_buf},
                          {.name = FF_RL_T_PLEN, .dtype = FF_DTYPE_I32, .ndim = 1, .shape = &shp[1], .data = pl, .free_fn = ex_free_buf},
                          {.name = "seed", .dtype = FF_DTYPE_I64, .ndim = 1, .shape = &shp[2], .data = sd, .free_fn = ex_free_buf}};
        ff_arg args[3] = {ff_arg_int("n", 1), ff_arg_float("temperature", 0.0), ff_arg_int("max_new", sp.max_new)};
        char label[64];
        snprintf(label, sizeof label, "eval %" PRId64 "-%" PRId64, a, a + k - 1);
        int nafter;
        const uint64_t *after = ex_trace_deps(x, -1, NULL, 0, POOL_GEN, NULL, 0, &nafter);
        ff_subtask_spec spec = {.kind = FF_RL_GENERATE, .target = FF_TARGET_ANY, .group = ex_pool_names[POOL_GEN], .args = args,
                                .nargs = 3, .inputs = in, .ninputs = 3, .idempotent = true, .after = after, .nafter = nafter,
                                .label = label};
        if (ex_pool_grouped(x, POOL_GEN)) ex_target_replica(x, j, POOL_GEN, ex_pick_replica(x, POOL_GEN), &spec);
        if (!ex_submit(x, j, &spec)) return -1;
    }
    int rc = ex_wait_jobs(x);
    x->eval_total = 0;
    if (rc != 0) return -1;
    x->eval_time_s = (double)(ff_now_ns() - t0) * 1e-9;
    *acc = x->eval_done ? (double)x->eval_hits / (double)x->eval_done : 0;
    return 0;
}

/* ---- console ------------------------------------------------------------------------------------- */
static void clear_line(ex_run *x) {
    if (x->tty && x->o.progress != 0) fputs("\r\033[K", x->out);
}

static double num(json_t *m, const char *k) { return json_number_value(json_object_get(m, k)); }

static void print_metrics(ex_run *x, json_t *m) {
    clear_line(x);
    char line[1024];
    int off = snprintf(line, sizeof line, "iter %" PRId64 "/%" PRId64, (int64_t)json_integer_value(json_object_get(m, "iteration")),
                       x->run->trainer.steps);
    static const struct {
        const char *key, *label, *fmt;
    } show[] = {{"reward_mean", "reward", "%.3f"}, {"acc", "acc", "%.3f"},        {"response_length", "len", "%.1f"},
                {"kl", "kl", "%.4f"},              {"entropy", "ent", "%.3f"},    {"clipfrac", "clip", "%.3f"},
                {"grad_norm", "gnorm", "%.3f"},    {"value_loss", "vloss", "%.4f"}, {"eval_acc", "EVAL acc", "%.3f"}};
    for (size_t i = 0; i < sizeof show / sizeof *show; i++) {
        json_t *v = json_object_get(m, show[i].key);
        if (!v) continue;
        off += snprintf(line + off, sizeof line - (size_t)off, " | %s ", show[i].label);
        off += snprintf(line + off, sizeof line - (size_t)off, show[i].fmt, json_number_value(v));
    }
    json_t *t = json_object_get(m, "time");
    off += snprintf(line + off, sizeof line - (size_t)off, " | %.2fs", num(t, "iteration"));
    json_t *gt = json_object_get(t, "gen_tokens_per_s");
    if (gt) off += snprintf(line + off, sizeof line - (size_t)off, " | %.0f tok/s", json_number_value(gt));
    json_t *dm = json_object_get(m, "device_memory"), *e;
    size_t i;
    int64_t peak = 0, cap = 0, least = -1;
    json_array_foreach(dm, i, e) { /* the fullest device: its peak of its capacity; the least free of any */
        const int64_t p = (int64_t)json_integer_value(json_object_get(e, "peak_bytes")), c = (int64_t)json_integer_value(json_object_get(e, "capacity_bytes"));
        if (c > 0 && (!cap || (double)p / (double)c > (double)peak / (double)cap)) peak = p, cap = c;
        json_t *mf = json_object_get(e, "min_free_bytes");
        if (mf && (least < 0 || json_integer_value(mf) < least)) least = (int64_t)json_integer_value(mf);
    }
    char b[3][32];
    if (cap) off += snprintf(line + off, sizeof line - (size_t)off, " | gpu %s/%s", ff_fmt_bytes((uint64_t)peak, b[0], sizeof b[0]), ff_fmt_bytes((uint64_t)cap, b[1], sizeof b[1]));
    if (cap && least >= 0) snprintf(line + off, sizeof line - (size_t)off, " (%s free at least)", ff_fmt_bytes((uint64_t)least, b[2], sizeof b[2]));
    fprintf(x->out, "%s\n", line);
    fflush(x->out);
}

static void event(ex_run *x, const char *what, int64_t it, int64_t count) {
    if (!x->o.on_event) return;
    ff_exec_event e = {what, it, count, x->c};
    x->o.on_event(x->o.event_ud, &e);
}

/* Times of the iteration: per node (first dispatch to last result), tokens per second. */
static void time_metrics(ex_run *x, json_t *m, int64_t t_end) {
    ex_iter *I = x->cur;
    json_t *t = json_object();
    double total = (double)(t_end - I->t0_ns) * 1e-9;
    json_object_set_new(t, "iteration", json_real(total));
    int64_t all_tokens = 0;
    for (int k = 0; k < x->n_nodes; k++) {
        const ex_node_stat *s = &I->st[k];
        if (!s->t_first_ns) continue;
        double d = (double)((s->t_last_ns > s->t_first_ns ? s->t_last_ns : s->t_first_ns) - s->t_first_ns) * 1e-9;
        json_object_set_new(t, node_of(x, k)->name, json_real(d));
        if (k == x->gen_node && d > 0) json_object_set_new(t, "gen_tokens_per_s", json_real((double)s->tokens / d));
        all_tokens += s->tokens;
        if (x->tr) {
            char name[128];
            snprintf(name, sizeof name, "%s (iteration %" PRId64 ")", node_of(x, k)->name, I->it);
            ex_trace_span(x, k, name, s->t_first_ns, s->t_last_ns);
        }
    }
    if (total > 0) json_object_set_new(t, "tokens_per_s", json_real((double)all_tokens / total));
    /* the generation + inference stage: the generation's first dispatch to the last inference
     * result, beside the simulation of it from the costs measured before the iteration */
    if (x->gen_node >= 0 && I->st[x->gen_node].t_first_ns) {
        int64_t last = I->st[x->gen_node].t_last_ns;
        for (int k = 0; k < x->n_nodes; k++) {
            ff_op op = node_of(x, k)->op;
            if ((op == FF_OP_LOGPROB || op == FF_OP_VALUE || op == FF_OP_SCORE) && I->st[k].t_last_ns > last) last = I->st[k].t_last_ns;
        }
        json_object_set_new(t, "rollout_stage", json_real((double)(last - I->st[x->gen_node].t_first_ns) * 1e-9));
        const ex_rollout_plan *p = &I->plan;
        if (p->valid)
            json_object_set_new(t, "rollout_sim", json_pack("{s:f,s:f,s:f,s:f,s:i,s:I}", "serial_s", p->serial_s, "fused_s", p->fused_s,
                                                            "migrate_s", p->migrate_s, "rt", p->rt, "survivors", p->survivors,
                                                            "step_jobs", (json_int_t)p->step_jobs));
    }
    json_object_set_new(m, "time", t);
    if (x->tr) {
        char name[64];
        snprintf(name, sizeof name, "iteration %" PRId64, I->it);
        ex_trace_span(x, -1, name, I->t0_ns, t_end);
    }
}

/* ---- the run ------------------------------------------------------------------------------------ */
static char *join_overrides(int n, char *const *v) {
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(v[i]) + 1;
    char *s = ff_malloc(len), *p = s;
    if (!s) return NULL;
    for (int i = 0; i < n; i++) {
        if (strchr(v[i], '\n')) {
            free(s);
            ff_error_set(v[i], NULL, "an override cannot span lines");
            return NULL;
        }
        p += sprintf(p, "%s\n", v[i]);
    }
    *p = 0;
    return s;
}

/* Keys whose change on --resume keeps the run's meaning: when it evaluates and saves, where
 * it writes, how its roles are spread over processes (the same samples; float metrics agree
 * to rounding, docs/run.md "Determinism"). docs/run.md lists them. */
static const char *const harmless_keys[] = {"trainer.test_freq", "trainer.save_freq", "trainer.out_dir", "trainer.logger", "trainer.schedule",
                                            "trainer.acc_reward", "data.val_files", "data.val_batch_size", "roles.*.workers", "roles.*.colocate_with",
                                            "roles.*.layout", "roles.actor.rollout.workers", "roles.actor.rollout.layout",
                                            "graph.*.fuse" /* the same steps, fused or not */,
                                            "roles.actor.offload" /* where AdamW waits while generating */,
                                            "roles.*.weights" /* where frozen weights wait between uses */, NULL};
/* curves.png: `fuseflow run` draws it (cli/cmd_plot.c) from metrics.jsonl at the end */
static const char *const samples_file[] = {"samples.jsonl", "curves.png", NULL}, *const run_files[] = {"curves.png", NULL};

static int setup(ex_run *x, char ***over_out, int *n_over_out) {
    const ff_exec_opts *o = &x->o;
    if (!o->config) return ff_error_set("run", "fuseflow run CONFIG.yaml", "no run config");
    int n_over = o->n_overrides;
    char **over = ff_calloc((size_t)n_over + 2, sizeof *over);
    if (!over) return -1;
    for (int i = 0; i < o->n_overrides; i++) over[i] = o->overrides[i];
    char wbuf[64];
    if (o->workers > 0) {
        snprintf(wbuf, sizeof wbuf, "roles.actor.workers=%d", o->workers);
        over[n_over++] = wbuf;
    }
    *over_out = over;
    *n_over_out = n_over;
    if (!(x->config_text = ff_read_file(o->config, NULL))) return -1;
    if (!(x->reg = ff_registry_new()) || ff_reward_remote_register(x->reg) != 0) return -1;
    if (!(x->run = ff_run_config_load(o->config, n_over, over, x->reg))) return -1;
    if (!(x->overrides_text = join_overrides(n_over, over))) return -1;
    if (ff_run_config_check_files(x->run) != 0 || ff_run_config_check_layouts(x->run) != 0) return -1;
    if (graph_facts(x) != 0 || place(x) != 0 || ex_check_limits(x) != 0) return -1;
    if (ex_fuse_init(x) != 0) return -1;
    /* everything the run will write, before any work: the timeline, the output folder */
    if (o->trace_path && ff_check_writable(o->trace_path) != 0) return ff_error_wrap("--trace");
    ff_train_dir_spec spec = {.cmd = "run", .out = x->run->trainer.out_dir, .out_key = "trainer.out_dir", .step_key = "iteration",
                              .resume = o->resume, .files = o->dump_samples ? samples_file : run_files, .harmless = harmless_keys,
                              .loggers = x->run->trainer.loggers};
    if (o->out_dir) snprintf(o->out_dir, FF_PATH_MAX, "%s", x->run->trainer.out_dir);
    if (ff_train_dir_open(&x->td, &spec) != 0) return -1;
    if (o->resume && ff_train_dir_check_config(&x->td, x->run->cfg, o->resume_with_changes) != 0) return -1;
    const ff_role_cfg *actor = &x->run->roles[FF_ROLE_ACTOR];
    if (!(x->tok = ff_tokenizer_load_dir(actor->model)))
        return ff_error_wrap("roles.actor.model: the prompts are encoded with the actor's tokenizer");
    bool need_answer = false;
    for (int m = 0; m < x->n_nodes; m++) need_answer |= x->answer_col >= 0 && node_of(x, m)->in[FF_SLOT_ANSWER] == x->answer_col;
    if (ex_dataset_load(&x->train, x->run->data.train_files, x->run, x->tok, need_answer) != 0)
        return ff_error_wrap("data.train_files");
    if (ex_check_dataset(x) != 0) return -1;
    if (x->run->data.val_files && x->run->trainer.test_freq > 0 &&
        ex_dataset_load(&x->val, x->run->data.val_files, x->run, x->tok, true) != 0)
        return ff_error_wrap("data.val_files");
    if (!(x->exact = ff_reward_new(x->reg, x->run->trainer.acc_reward, NULL))) return ff_error_wrap("trainer.acc_reward");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    x->threads = o->threads > 0 ? o->threads : (int)(cores / x->nranks > 0 ? cores / x->nranks : 1);
    if (o->resume) {
        if (ex_ckpt_load_state(x, x->td.checkpoint) != 0) return -1;
        if (x->iteration >= x->run->trainer.steps)
            return ff_error_set(x->td.checkpoint, "raise trainer.steps to train further (with --resume-with-changes)",
                                "the checkpoint is at iteration %" PRId64 ", trainer.steps is %" PRId64, x->iteration,
                                x->run->trainer.steps);
    } else if (ff_data_order_init(&x->order, x->train.n, (uint64_t)x->run->trainer.seed, x->run->data.shuffle, 0, 0) != 0) {
        return -1;
    }
    if (ff_train_dir_start(&x->td, x->run->cfg) != 0) return -1;
    if (o->dump_samples && !o->resume) {
        char path[FF_PATH_MAX];
        snprintf(path, sizeof path, "%s/samples.jsonl", x->run->trainer.out_dir);
        if (unlink(path) != 0 && errno != ENOENT) return ff_error_set(path, NULL, "cannot remove the earlier run's samples: %s", strerror(errno));
    }
    return 0;
}

/* Append the iteration's samples to OUT/samples.jsonl (--dump-samples). */
static int dump_samples(ex_run *x) {
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/samples.jsonl", x->run->trainer.out_dir);
    FILE *f = fopen(path, "a");
    if (!f) return ff_error_set(path, NULL, "cannot open for appending: %s", strerror(errno));
    ex_dump_samples(x, f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return ff_error_set(path, NULL, "cannot write the samples: %s", strerror(errno));
    return 0;
}

/* ---- workers from other hosts -------------------------------------------------------------- */
/* The endpoint as a remote host must name it: a wildcard bind replaced by this host's name. */
static void join_endpoint(const ex_run *x, char *buf, size_t cap) {
    const char *ep = ff_controller_endpoint(x->c);
    const char *wild = strstr(ep, "://0.0.0.0:") ? "0.0.0.0" : strstr(ep, "://*:") ? "*" : NULL;
    char host[256];
    if (!wild || gethostname(host, sizeof host) != 0) {
        snprintf(buf, cap, "%s", ep);
        return;
    }
    host[sizeof host - 1] = 0;
    const char *at = strstr(ep, wild);
    snprintf(buf, cap, "%.*s%s%s", (int)(at - ep), ep, host, at + strlen(wild));
}

/* Wait until the run's nranks workers are live: the local ones started, the rest joining
 * from other hosts, a line each as they join. A timeout names how many are missing and the
 * command that brings them. */
static int join_workers(ex_run *x, int local) {
    int remote = x->nranks - local;
    double limit = x->o.expect_timeout_s > 0 ? x->o.expect_timeout_s : remote > 0 ? WORKER_JOIN_S : WORKER_START_S;
    if (remote == 0) /* all local: the controller's error names the ranks missing and why */
        return ff_controller_wait_workers(x->c, x->nranks, limit) == 0 ? 0 : ff_error_wrap("starting %d workers", x->nranks);
    char ep[512], cmd[1024];
    join_endpoint(x, ep, sizeof ep);
    snprintf(cmd, sizeof cmd, "fuseflow worker --connect %s%s", ep, x->o.curve_key_file ? " --curve worker.key" : "");
    fprintf(x->out, "run: listening on %s for %d worker%s from other hosts (%d started here; waiting up to %.0f s): on each host "
            "run `%s`\n", ff_controller_endpoint(x->c), remote, remote == 1 ? "" : "s", local, limit, cmd);
    fflush(x->out);
    bool shown[EX_MAX_RANKS] = {false};
    int nshown = 0;
    int64_t deadline = ff_now_ns() + (int64_t)(limit * 1e9);
    for (;;) {
        int live = ff_controller_count_workers(x->c, FF_WORKER_LIVE);
        for (int r = 0; r < ff_controller_nranks(x->c) && r < EX_MAX_RANKS; r++) {
            ff_worker_info wi;
            if (shown[r] || ff_controller_worker_info(x->c, r, &wi) != 0 || wi.state != FF_WORKER_LIVE) continue;
            shown[r] = true;
            char dev[512];
            ff_devices_describe(&wi.devices, dev, sizeof dev);
            fprintf(x->out, "run: worker joined: rank %d from %s (%s; %s%s), %d of %d\n", r, wi.host, wi.device, dev,
                    wi.local ? "; local" : "", ++nshown, x->nranks);
            fflush(x->out);
        }
        if (live >= x->nranks) return 0;
        double left = (double)(deadline - ff_now_ns()) * 1e-9;
        if (left > 0 && ff_controller_wait_workers(x->c, live + 1, left) == 0) continue;
        if (ff_now_ns() < deadline) return ff_error_wrap("starting %d workers", x->nranks); /* a local one exited */
        ff_error_clear();
        live = ff_controller_count_workers(x->c, FF_WORKER_LIVE);
        return ff_error_set(x->o.listen, NULL, "%d of the run's %d workers joined within %.0f s: %d missing (start each on its host "
                            "with `%s`, or raise --expect-timeout)", live, x->nranks, limit, x->nranks - live, cmd);
    }
}

/* A worker's cores and GPUs (its hello's); none for a rank no longer known. */
static ff_devices devices_of(const ex_run *x, int rank) {
    ff_worker_info wi;
    if (ff_controller_worker_info(x->c, rank, &wi) != 0) {
        ff_error_clear();
        memset(&wi.devices, 0, sizeof wi.devices);
    }
    return wi.devices;
}

/* Host h's devices as the worker seeing the most GPUs there reports them (tasks bound to GPUs
 * each see their own; the join lines have every worker's view). */
static void host_devices(const ex_run *x, const int *host_of, int h, char *buf, size_t cap) {
    ff_devices best = {0};
    bool any = false;
    for (int r = 0; r < x->nranks; r++) {
        if (host_of[r] != h) continue;
        ff_devices d = devices_of(x, r);
        if (!any || d.ngpus > best.ngpus) best = d;
        any = true;
    }
    ff_devices_describe(&best, buf, cap);
}

/* Whether rank r's roles compute on a GPU (colocated roles agree: dataflow/run_config.c; the
 * generation pool follows the actor). */
static bool rank_on_cuda(const ex_run *x, int r) {
    static const ff_role of_bit[FF_RL_NROLES] = {FF_ROLE_ACTOR, FF_ROLE_ACTOR, FF_ROLE_CRITIC, FF_ROLE_REF, FF_ROLE_REWARD};
    for (int i = 0; i < FF_RL_NROLES; i++)
        if ((x->rank_roles[r] & (1u << i)) && x->run->roles[of_bit[i]].cuda) return true;
    return false;
}

/* One GPU per rank whose roles say `backend: cuda`: on each host, the k-th such worker takes
 * device k of those it sees (CUDA_VISIBLE_DEVICES applied), or device 0 when its launcher bound
 * it to one GPU of its own (a local index given, one GPU seen: a Slurm task with
 * --gpus-per-task=1). Too few GPUs on a host is an error naming the roles' keys, before any
 * model loads. */
static int assign_gpus(ex_run *x, const int *host_of, const int *local_index, char hosts[][FF_MSG_NAME_MAX]) {
    int next[EX_MAX_RANKS] = {0}; /* per host: the cuda ranks placed so far */
    int need[EX_MAX_RANKS] = {0};
    for (int r = 0; r < x->nranks; r++) need[host_of[r]] += rank_on_cuda(x, r);
    for (int r = 0; r < x->nranks; r++) {
        x->rank_gpu[r] = -1;
        if (!rank_on_cuda(x, r)) continue;
        const ff_devices d = devices_of(x, r);
        const int h = host_of[r], k = next[h]++;
        char keys[200] = "";
        for (int i = FF_ROLE_ACTOR; i < FF_ROLE_COUNT; i++)
            if (x->run->roles[i].present && x->run->roles[i].cuda)
                snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%sroles.%s.backend", keys[0] ? ", " : "", role_keys[i]);
        if (d.ngpus >= need[h]) {
            x->rank_gpu[r] = k;
        } else if (d.ngpus == 1 && local_index[r] >= 0) {
            x->rank_gpu[r] = 0;
        } else {
            char hint[300];
            snprintf(hint, sizeof hint, "give the host a GPU per such worker, fewer workers (or roles) on cuda, or %s: cpu", keys);
            return ff_error_set(keys, hint,
                                "host %s runs %d worker%s on cuda (%s); worker %d there sees %d GPU%s (CUDA_VISIBLE_DEVICES applied)",
                                hosts[h], need[h], need[h] == 1 ? "" : "s", keys, r, d.ngpus, d.ngpus == 1 ? "" : "s");
        }
        fprintf(x->out, "run: rank %d computes on cuda:%d (host %s, %d GPU%s seen there)\n", r, x->rank_gpu[r], hosts[h], d.ngpus,
                d.ngpus == 1 ? "" : "s");
        char dev[32];
        snprintf(dev, sizeof dev, "cuda:%d", x->rank_gpu[r]);
        if (ff_controller_set_worker_device(x->c, r, dev) != 0) ff_error_clear(); /* a label of the trace only */
    }
    /* how the cuda workers multiply: each reads FF_CUDA_MATH, which the workers this run starts
     * inherit; a word their backend would refuse is refused here, before any model loads */
    bool any_cuda = false;
    for (int r = 0; r < x->nranks; r++) any_cuda = any_cuda || x->rank_gpu[r] >= 0;
    const char *math = getenv("FF_CUDA_MATH");
    if (any_cuda && (!math || !*math))
        fprintf(x->out, "run: the cuda workers multiply in bf16 (FF_CUDA_MATH unset: the default; tf32 or fp32 for fp32 "
                        "operands, docs/run.md \"Backends\")\n");
    else if (any_cuda && strcmp(math, "bf16") && strcmp(math, "tf32") && strcmp(math, "fp32"))
        return ff_error_set("FF_CUDA_MATH", "use bf16 (the default), tf32 or fp32, or unset it",
                            "unknown value '%s' for the run's cuda workers", math);
    else if (any_cuda)
        fprintf(x->out, "run: the cuda workers multiply in %s (FF_CUDA_MATH)\n", math);
    /* a frozen role on cuda holds bf16 weights by default (docs/run.md "bf16 weights"): say so */
    for (int i = FF_ROLE_ACTOR; i < FF_ROLE_COUNT; i++)
        if (x->run->roles[i].present && x->run->roles[i].cuda && x->run->roles[i].w16)
            fprintf(x->out, "run: the %s holds bf16 weights on cuda (roles.%s.dtype; fp32 keeps fp32)\n", role_keys[i],
                    role_keys[i]);
    const ff_role_cfg *ac = &x->run->roles[FF_ROLE_ACTOR];
    if (ac->present && ac->cuda && ac->rollout_workers > 0 && ac->rollout_w16)
        fprintf(x->out, "run: the generation pool holds bf16 weights on cuda (roles.actor.rollout.dtype; fp32 keeps fp32)\n");
    fflush(x->out);
    return 0;
}

/* Ranks by host: the run's ranks in the planner's order (each pool's TP ranks innermost, then
 * PP, then DP) go to the workers sorted by host (hosts in the order of their lowest rank,
 * the controller's own first), so that a host with a multiple of tp x pp workers holds whole
 * replicas and only DP (and PP where a host holds less) crosses hosts. With every worker on
 * one host this keeps the order as it is. */
static int place_by_host(ex_run *x) {
    int n = x->nranks, order[EX_MAX_RANKS], host_of[EX_MAX_RANKS], local_index[EX_MAX_RANKS], nhosts = 0;
    char hosts[EX_MAX_RANKS][FF_MSG_NAME_MAX];
    bool rails = false; /* some worker gave its local index */
    for (int r = 0; r < n; r++) {
        ff_worker_info wi;
        if (ff_controller_worker_info(x->c, r, &wi) != 0 || wi.state != FF_WORKER_LIVE)
            return ff_error_set("workers", "start the run again", "rank %d is not live after %d workers joined (one left and another "
                                "came back under a new rank)", r, n);
        int h = 0;
        while (h < nhosts && strcmp(hosts[h], wi.host)) h++;
        if (h == nhosts) snprintf(hosts[nhosts++], sizeof hosts[0], "%s", wi.host);
        host_of[r] = h;
        local_index[r] = wi.devices.local_index;
        rails |= local_index[r] >= 0;
    }
    ex_place_order(n, host_of, local_index, order);
    /* logical rank l becomes worker order[l] */
    unsigned roles[EX_MAX_RANKS];
    int pool[EX_MAX_RANKS];
    for (int l = 0; l < n; l++) roles[order[l]] = x->rank_roles[l], pool[order[l]] = x->rank_pool[l];
    memcpy(x->rank_roles, roles, sizeof roles);
    memcpy(x->rank_pool, pool, sizeof pool);
    for (int p = 0; p < POOL_COUNT; p++) {
        ex_layout *L = &x->lay[p];
        for (int i = 0; i < x->pool_n[p]; i++) x->pool_ranks[p][i] = order[x->pool_ranks[p][i]], L->rep_ranks[i] = order[L->rep_ranks[i]];
        for (int r = 0; x->pool_n[p] && r < L->dp; r++) {
            char *at = strrchr(L->rep_group[r], '@');
            if (at) snprintf(at + 1, sizeof L->rep_group[r] - (size_t)(at + 1 - L->rep_group[r]), "%d", L->rep_ranks[r * L->mp]);
        }
    }
    if (assign_gpus(x, host_of, local_index, hosts) != 0) return -1;
    if (!x->o.listen) return 0;
    /* threads per worker: its host's cores over the workers there, or the cores its affinity
     * allows (a Slurm task's binding) where fewer; the fewest of any worker, as every rank
     * gets one backend (ranks in lockstep wait for the slowest anyway) */
    int on_host[EX_MAX_RANKS] = {0}, fewest = 0;
    for (int r = 0; r < n; r++) on_host[host_of[r]]++;
    for (int r = 0; r < n; r++) {
        ff_devices d = devices_of(x, r);
        int t = (int)d.cores / on_host[host_of[r]];
        if ((int)d.cpus < t) t = (int)d.cpus;
        if (t < 1) t = 1;
        if (r == 0 || t < fewest) fewest = t;
    }
    if (x->o.threads <= 0) x->threads = fewest;
    fprintf(x->out, "run: %d worker%s on %d host%s, %d threads each (%s)\n", n, n == 1 ? "" : "s", nhosts, nhosts == 1 ? "" : "s",
            x->threads, x->o.threads > 0 ? "--threads" : "each host's cores over its workers, or a worker's own CPUs where fewer");
    for (int h = 0; h < nhosts; h++) {
        char d[512];
        host_devices(x, host_of, h, d, sizeof d);
        fprintf(x->out, "run: host %s: %d worker%s; %s\n", hosts[h], on_host[h], on_host[h] == 1 ? "" : "s", d);
    }
    for (int r = 0; r < n; r++) {
        fprintf(x->out, "run: rank %d: host %s", r, hosts[host_of[r]]);
        if (local_index[r] >= 0) fprintf(x->out, " index %d", local_index[r]);
        fprintf(x->out, " (");
        const char *sep = "";
        for (int i = 0; i < FF_RL_NROLES; i++)
            if (x->rank_roles[r] & (1u << i)) fprintf(x->out, "%s%s", sep, ff_rl_role_names[i]), sep = " ";
        int p = x->rank_pool[r], k = 0;
        while (k < x->pool_n[p] && x->pool_ranks[p][k] != r) k++;
        const ex_layout *L = &x->lay[p];
        if (k < x->pool_n[p]) fprintf(x->out, "; %s dp %d tp %d pp %d", ex_pool_names[p], L->dp_idx[k], L->tp_idx[k], L->pp_idx[k]);
        fprintf(x->out, ")\n");
    }
    for (int p = 0; p < POOL_COUNT; p++) {
        const ex_layout *L = &x->lay[p];
        for (int r = 0; x->pool_n[p] && L->mp > 1 && r < L->dp; r++)
            for (int t = 1; t < L->mp; t++)
                if (host_of[L->rep_ranks[r * L->mp + t]] != host_of[L->rep_ranks[r * L->mp]]) {
                    fprintf(x->out, "run: warning: replica %d of the %s spans hosts %s and %s: its tensor- and pipeline-parallel "
                            "traffic crosses the network (give each host a multiple of %d workers)\n", r, ex_pool_names[p],
                            hosts[host_of[L->rep_ranks[r * L->mp]]], hosts[host_of[L->rep_ranks[r * L->mp + t]]], L->mp);
                    break;
                }
    }
    for (int p = 0; rails && nhosts > 1 && p < POOL_COUNT; p++) { /* DP across hosts on rails */
        const ex_layout *L = &x->lay[p];
        if (!x->pool_n[p] || L->dp < 2 || (p != POOL_ACTOR && p != POOL_CRITIC)) continue; /* who all-reduces */
        ex_rail_gap gap;
        if (ex_rail_aligned(L->dp, L->mp, L->rep_ranks, host_of, local_index, &gap))
            fprintf(x->out, "run: the %s's DP groups are rail-aligned: where one crosses hosts, its members there have the same "
                    "local indices\n", ex_pool_names[p]);
        else
            fprintf(x->out, "run: warning: the %s's DP group at tp %d pp %d is not rail-aligned: local indices %s on %s, %s on %s "
                    "(its traffic between hosts changes rails; give every host the same number of workers, a multiple of %d, "
                    "with --local-index 0..N-1)\n", ex_pool_names[p], gap.group % L->tp, gap.group / L->tp, gap.on_a,
                    hosts[gap.host_a], gap.on_b, hosts[gap.host_b], L->mp);
    }
    for (int h = 0; x->tr && h < nhosts; h++) { /* a track per host, its ranks at the start */
        char name[FF_MSG_NAME_MAX + 16], what[1024];
        size_t off = (size_t)snprintf(what, sizeof what, "ranks");
        for (int r = 0; r < n && off < sizeof what; r++)
            if (host_of[r] == h) off += (size_t)snprintf(what + off, sizeof what - off, " %d", r);
        if (off < sizeof what) off += (size_t)snprintf(what + off, sizeof what - off, "; ");
        if (off < sizeof what) host_devices(x, host_of, h, what + off, sizeof what - off);
        snprintf(name, sizeof name, "host %s", hosts[h]);
        int track = ff_controller_trace_track(x->c, name);
        if (track < 0 || !ff_controller_trace_instant(x->c, track, what, ff_now_ns())) return -1;
    }
    fflush(x->out);
    return 0;
}

static int start_workers(ex_run *x, const char *resume_dir) {
    ff_controller_opts co;
    ff_controller_opts_default(&co);
    co.worker_bin = x->o.worker_bin;
    co.worker_pgroup = true; /* Ctrl-C reaches us only; we save, then stop the workers */
    co.timeout_s = x->o.worker_timeout_s > 0 ? x->o.worker_timeout_s : WORKER_SILENT_S;
    co.trace = x->o.trace_path != NULL;
    co.worker_log = ff_log_get_level() <= FF_LOG_DEBUG ? "debug" : "warn";
    co.endpoint = x->o.listen;
    co.curve_key_file = x->o.curve_key_file;
    int local = x->o.local_workers >= 0 ? x->o.local_workers : x->o.listen ? 0 : x->nranks;
    if (local > x->nranks)
        return ff_error_set("--local", "give at most the run's workers", "%d local workers, the run has %d", local, x->nranks);
    char wkey[FF_PATH_MAX];
    if (x->o.curve_key_file && local > 0) {
        const char *slash = strrchr(x->o.curve_key_file, '/');
        snprintf(wkey, sizeof wkey, "%.*sworker.key", slash ? (int)(slash + 1 - x->o.curve_key_file) : 0, x->o.curve_key_file);
        co.worker_key_file = x->o.worker_key_file ? x->o.worker_key_file : wkey;
    }
    if (!(x->c = ff_controller_new(&co))) return -1;
    if (co.trace && !(x->tr = ex_trace_new(x->c))) return -1;
    if (local > 0 && ff_controller_spawn(x->c, local) < 0) return -1;
    if (join_workers(x, local) != 0 || place_by_host(x) != 0) return -1;
    if (make_groups(x) != 0) return -1;
    if (x->sync_group && ex_sync_group(x) != 0) return -1;
    if (ex_migrate_group(x) != 0) return -1;
    if (init_workers(x, resume_dir[0] ? resume_dir : NULL) != 0) return -1;
    return 0;
}

static void describe(ex_run *x, const char *resume_dir) {
    if (x->o.listen && x->o.threads <= 0) /* the threads follow the hosts' cores, known once the workers join */
        fprintf(x->out, "run: %s: %d workers (threads: once they join)", x->o.config, x->nranks);
    else
        fprintf(x->out, "run: %s: %d workers (%d threads each)", x->o.config, x->nranks, x->threads);
    for (int p = 0; p < POOL_COUNT; p++) {
        if (!x->pool_n[p] || (p == POOL_GEN && !x->gen_separate && !x->gen_relaid)) continue;
        fprintf(x->out, "%s %s", p ? "," : ":", ex_pool_names[p]);
        fprintf(x->out, " [");
        for (int i = 0; i < x->pool_n[p]; i++) fprintf(x->out, "%s%d", i ? " " : "", x->pool_ranks[p][i]);
        fprintf(x->out, "]");
        if (x->lay[p].mp > 1) fprintf(x->out, " tp %d x pp %d x dp %d", x->lay[p].tp, x->lay[p].pp, x->lay[p].dp);
    }
    fprintf(x->out, "; %" PRId64 " prompts x %" PRId64 " responses per iteration, %s schedule", x->batch, x->group_size,
            x->run->trainer.schedule == FF_SCHED_SERIAL ? "serial" : "fused");
    if (resume_dir[0]) fprintf(x->out, "; resuming from %s (iteration %" PRId64 ")", resume_dir, x->iteration);
    fprintf(x->out, "\n");
    ex_fuse_describe(x);
    if (x->train.skipped)
        fprintf(x->out, "run: %" PRId64 " training prompts longer than data.max_prompt_length were skipped\n", x->train.skipped);
    fflush(x->out);
}

/* ---- where to continue ------------------------------------------------------------------------- */
/* Append arg to buf (at *off, cap bytes), quoted when the shell would split or expand it. */
static void shell_arg(char *buf, size_t cap, size_t *off, const char *arg) {
    bool plain = arg[0] != 0;
    for (const char *p = arg; *p && plain; p++)
        plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("_-./=:,+@%", *p);
    int n;
    if (plain) {
        n = snprintf(buf + *off, cap - *off, " %s", arg);
    } else {
        n = snprintf(buf + *off, cap - *off, " '");
        for (const char *p = arg; *p && n >= 0 && *off + (size_t)n < cap; p++)
            n += snprintf(buf + *off + n, cap - *off - (size_t)n, *p == '\'' ? "'\\''" : "%c", *p);
        if (n >= 0 && *off + (size_t)n < cap) n += snprintf(buf + *off + n, cap - *off - (size_t)n, "'");
    }
    if (n > 0) *off = *off + (size_t)n < cap ? *off + (size_t)n : cap - 1;
}

/* The command that continues this run: the same config, overrides and --workers, and
 * --resume (the newest checkpoint); without one saved, the command that starts it again. */
static void continue_command(const ex_run *x, bool resume, char *buf, size_t cap) {
    size_t off = (size_t)snprintf(buf, cap, "fuseflow run");
    shell_arg(buf, cap, &off, x->o.config);
    for (int i = 0; i < x->o.n_overrides; i++) shell_arg(buf, cap, &off, x->o.overrides[i]);
    if (x->o.workers > 0) {
        char w[32];
        snprintf(w, sizeof w, "%d", x->o.workers);
        shell_arg(buf, cap, &off, "--workers");
        shell_arg(buf, cap, &off, w);
    }
    const char *keys[] = {"--listen", x->o.listen, "--curve", x->o.curve_key_file, "--worker-key", x->o.worker_key_file};
    for (int i = 0; i < 6; i += 2)
        if (keys[i + 1]) shell_arg(buf, cap, &off, keys[i]), shell_arg(buf, cap, &off, keys[i + 1]);
    if (x->o.listen && x->o.local_workers > 0) {
        char k[32];
        snprintf(k, sizeof k, "%d", x->o.local_workers);
        shell_arg(buf, cap, &off, "--local");
        shell_arg(buf, cap, &off, k);
    }
    if (resume) shell_arg(buf, cap, &off, "--resume");
}

/* Every way a started run stops names where to continue: the newest checkpoint by path with
 * the exact command (--resume takes the newest, which is that one), or the command that
 * starts it again. */
static void resume_hint(const ex_run *x, char *hint, size_t cap) {
    char cmd[8192];
    if (x->td.checkpoint[0]) {
        continue_command(x, true, cmd, sizeof cmd);
        snprintf(hint, cap, "resume from the checkpoint %s (iteration %" PRId64 "): `%s`", x->td.checkpoint,
                 x->td.checkpoint_step, cmd);
    } else {
        continue_command(x, false, cmd, sizeof cmd);
        snprintf(hint, cap, "no checkpoint was saved yet (trainer.save_freq %" PRId64 "): start again with `%s`",
                 (int64_t)x->run->trainer.save_freq, cmd);
    }
}

static int loop(ex_run *x) {
    const ff_trainer_cfg *tc = &x->run->trainer;
    char cmd[8192];
    if (tc->test_freq > 0 && x->val.n && x->iteration == 0) {
        double acc;
        if (evaluate(x, &acc) != 0) return -1;
        json_t *m = json_pack("{s:i, s:f, s:f}", "iteration", 0, "eval_acc", acc, "eval_time_s", x->eval_time_s);
        if (tc->loggers & FF_LOGGER_CONSOLE) {
            clear_line(x);
            fprintf(x->out, "iter 0 | EVAL acc %.3f (%" PRId64 " held-out prompts, greedy)\n", acc, x->eval_done);
            fflush(x->out);
        }
        int rc = write_metrics(x, m);
        json_decref(m);
        if (rc != 0) return -1;
    }
    for (int64_t it = x->iteration + 1; it <= tc->steps; it++) {
        /* the data position a checkpoint of iteration it - 1 records */
        int64_t epoch0 = x->order.epoch, cursor0 = x->order.cursor;
        int rc = ex_iteration(x, it);
        if (rc < 0) return -1;
        if (rc == 1) { /* interrupted before anything trained: save the state of it - 1 */
            clear_line(x);
            ff_data_order_seek(&x->order, epoch0, cursor0);
            if (x->td.checkpoint_step != it - 1 && ex_ckpt_save(x, it - 1, &x->order) != 0) return -1;
            continue_command(x, true, cmd, sizeof cmd);
            fprintf(x->out, "run: interrupted during iteration %" PRId64 "; saved %s (continue with `%s`)\n", it, x->td.checkpoint, cmd);
            return FF_EXEC_INTERRUPTED;
        }
        int64_t t_end = ff_now_ns();
        json_t *m = json_object();
        ex_iter_metrics(x, m);
        time_metrics(x, m, t_end);
        ex_iter_finish(x);
        if (x->o.dump_samples && dump_samples(x) != 0) {
            json_decref(m);
            return -1;
        }
        double it_time = (double)(t_end - x->cur->t0_ns) * 1e-9;
        x->iter_time_avg = x->iter_time_avg > 0 ? 0.8 * x->iter_time_avg + 0.2 * it_time : it_time;
        ex_iter_free(x, &x->cur);
        x->iteration = it;
        bool last = it == tc->steps || (x->o.stop_after > 0 && it >= x->o.stop_after);
        bool interrupted = x->o.interrupt && *x->o.interrupt;
        if (tc->test_freq > 0 && x->val.n && (it % tc->test_freq == 0 || it == tc->steps)) {
            double acc;
            if (evaluate(x, &acc) != 0) {
                json_decref(m);
                return -1;
            }
            json_object_set_new(m, "eval_acc", json_real(acc));
            json_object_set_new(json_object_get(m, "time"), "eval", json_real(x->eval_time_s));
        }
        if (x->run->trainer.loggers & FF_LOGGER_CONSOLE) print_metrics(x, m);
        rc = write_metrics(x, m);
        json_decref(m);
        if (rc != 0) return -1;
        event(x, "iteration", it, 0);
        if ((tc->save_freq > 0 && it % tc->save_freq == 0) || last || interrupted) {
            if (ex_ckpt_save(x, it, &x->order) != 0) return -1;
            event(x, "checkpoint", it, 0);
        }
        if (interrupted) {
            continue_command(x, true, cmd, sizeof cmd);
            fprintf(x->out, "run: interrupted after iteration %" PRId64 "; saved %s (continue with `%s`)\n", it, x->td.checkpoint, cmd);
            return FF_EXEC_INTERRUPTED;
        }
        if (last) {
            if (it < tc->steps) {
                continue_command(x, true, cmd, sizeof cmd);
                fprintf(x->out, "run: stopped after iteration %" PRId64 "; saved %s (continue with `%s`)\n", it, x->td.checkpoint, cmd);
            }
            return FF_EXEC_DONE;
        }
    }
    return FF_EXEC_DONE;
}

int ff_exec_run(const ff_exec_opts *o) {
    ex_run *x = ff_calloc(1, sizeof *x);
    if (!x) return -1;
    x->o = *o;
    x->td.checkpoint_step = -1;
    for (int r = 0; r < EX_MAX_RANKS; r++) x->device_min_free[r] = -1;
    x->out = o->out ? o->out : stdout;
    x->tty = o->progress == 1 || (o->progress < 0 && isatty(fileno(x->out)));
    char **over = NULL;
    int n_over = 0;
    char resume_dir[FF_PATH_MAX] = "", err[8192] = "", hint[12288] = "";
    bool started = false;
    int rc = -1;
    if (setup(x, &over, &n_over) != 0) goto out;
    started = true;
    if (o->resume) snprintf(resume_dir, sizeof resume_dir, "%s", x->td.checkpoint);
    describe(x, resume_dir);
    if (start_workers(x, resume_dir) != 0) {
        if (x->failed[0]) ff_error_set(NULL, NULL, "%s", x->failed);
        goto out;
    }
    event(x, "started", x->iteration, 0);
    rc = loop(x);
    if (rc < 0 && x->failed[0]) ff_error_set(NULL, NULL, "%s", x->failed);
out:
    if (rc < 0) snprintf(err, sizeof err, "%s", ff_error_message());
    clear_line(x);
    if (x->cur) ex_iter_free(x, &x->cur);
    if (x->c) {
        if (ff_controller_shutdown(x->c, WORKER_STOP_S) != 0 && rc >= 0) fprintf(x->out, "run: %s\n", ff_error_message());
        while (x->jobs) ex_job_release(x, x->jobs);
        if (x->tr && o->trace_path) {
            if (ff_controller_trace_write(x->c, o->trace_path) == 0) {
                fprintf(x->out, "run: timeline written to %s\n", o->trace_path);
            } else if (rc >= 0) { /* the run's result stands; the timeline asked for is lost */
                snprintf(err, sizeof err, "--trace %s: the timeline was not written: %s", o->trace_path, ff_error_message());
                rc = -1;
                started = false; /* the training is not what failed: nothing to resume */
            } else {
                fprintf(x->out, "run: the timeline was not written: %s\n", ff_error_message());
            }
        }
        ff_controller_destroy(&x->c);
    }
    if (rc < 0 && started) resume_hint(x, hint, sizeof hint);
    ex_trace_free(&x->tr);
    ex_rollout_free(&x->ro);
    ff_reward_destroy(&x->exact);
    ex_dataset_free(&x->train);
    ex_dataset_free(&x->val);
    ff_data_order_free(&x->order);
    ff_train_dir_close(&x->td);
    ff_tokenizer_destroy(&x->tok);
    ff_run_config_destroy(&x->run);
    ff_registry_destroy(&x->reg);
    ex_fuse_free(x);
    free(x->config_text);
    free(x->overrides_text);
    free(over);
    free(x);
    if (rc < 0) ff_error_set(NULL, hint[0] ? hint : NULL, "%s%s", err, hint[0] ? "; the run stopped" : "");
    return rc;
}

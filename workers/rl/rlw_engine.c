/* The engines a worker of `fuseflow run` hosts (workers/rl/rlw.h): the models of the roles it
 * serves, loaded from the run config the controller sends, and what they do: generation jobs
 * on one rollout engine (continuous batching across jobs), scoring, training steps with the
 * DP gradient all-reduce, weight sync, checkpoints.
 *
 * The run config is parsed here as on the controller (same text, same overrides, same
 * plugins), so a loss or estimator from a plugin trains the same way on every worker.
 *
 * Tensor parallelism: every role of a worker shares one layout (the executor's rule), so a
 * worker has one TP group, split from its pool's communicator at rl.init, which backs every
 * model's ff_model_comm (ff_model may not use ff_coll itself), and one DP group of the ranks
 * with its TP rank for the gradient all-reduce. Each model reads only its shards.
 *
 * Not here: messages (rlw_kinds.c), what runs where (the executor). */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/migrate.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/pipe_exec.h"
#include "fuseflow/plan.h"
#include "fuseflow/registry.h"
#include "fuseflow/reshard.h"
#include "fuseflow/roles.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"
#include "workers/rl/rlw.h"


/* A frozen role whose weights wait in host memory (roles.<ref|reward>.weights: on_demand,
 * docs/run.md "Weights on demand"): its model keeps a host copy (ff_model_params_to_host) and
 * holds its backend buffer only from a load to the next release. A prefetch loads on a helper
 * thread of its own, on a stream of its own, while the compute thread goes on; nothing touches
 * the model until the thread is joined (by the role's next inference, a release or unload). */
typedef struct od_role {
    ff_model *m;       /* s->ref or s->rm; NULL: resident (or not hosted) */
    ff_stream *st;     /* the loads' copies */
    pthread_t th;
    bool loading;      /* th runs ff_model_params_load */
    bool prefetched;   /* the load in progress or last done was a prefetch */
    int rc;            /* the load's status, and its error text (the thread's message) */
    char err[512];
    ff_offload_stats done; /* the last load's bytes and seconds */
    int64_t t0_ns, t1_ns;  /* its start and end (ff_now_ns) */
    rlw_load last;         /* what the role's last inference subtask needed */
} od_role;
enum { OD_REF = 0, OD_REWARD, OD_N };

typedef struct gen_job {
    void *owner;
    uint64_t first_req; /* requests first_req .. first_req + k - 1 */
    int32_t k, n, remaining;
    ff_gen_output *outs; /* [k n] */
    bool *filled;        /* [k n]: outs[i] came out of the rollout */
} gen_job;

/* One layout's groups on this worker: the place, the communicators split from the pool's
 * (NULL where a dimension is 1; dp_comm only with tp x pp > 1, else the subtask's group is the
 * DP group), what the models run their collectives on (mcomm: TP; pipe: PP, with the stage
 * models' gradient-norm sum in norm). Lives inside struct rlw: the pointers into it stay. */
typedef struct rlw_lay {
    rlw_place at;
    ff_coll_comm *tp_comm, *pp_comm, *dp_comm;
    struct tp_ctx {
        rlw *s;
        ff_coll_comm *c; /* tp_comm */
    } tpc;
    ff_model_comm mcomm; /* ctx: &tpc */
    ff_pipe_transport pt;
    ff_pipe_coll_dev ptd; /* pt's state when it moves the models' memory (dev_coll) */
    bool ptd_on;
    ff_roles_pipe pipe;
    ff_model_comm norm;
    bool sp; /* sequence parallelism in the TP group (training and scoring; generation decodes replicated) */
    ff_gen_pipe gpipe; /* generation over the pipeline group (ff_rollout_config.pipe) */
    struct tp_ctx ppc; /* its device calls' context (dev_coll): pp_comm */
} rlw_lay;

struct rlw {
    ff_registry *reg;
    ff_run_config *run;
    ff_backend *be;
    ff_model *actor, *gen, *critic, *ref, *rm;
    ff_trainer *t_actor, *t_critic;
    ff_rollout *ro;
    ff_tokenizer *tok; /* the actor's, written into checkpoints */
    /* generation jobs */
    gen_job *jobs;
    int njobs, jobs_cap;
    uint64_t next_req;
    /* the DP group of the step (or checkpoint) in progress: the hook's all-reduce, or the
     * collectives of a ZeRO-1 optimizer */
    ff_coll_comm *comm;
    float *gbuf;
    int64_t gcap;
    int64_t sync_received; /* bytes the last weight sync brought from other ranks */
    int64_t sync_delta[3];  /* ... a delta sync's elements compared, changed, bytes saved */
    /* the generating copy beside the trained actor on this worker: its parameters and its
     * rollout (KV cache) exist only from a weight sync to the next actor step (gen_release);
     * in a layout of its own its transition runs in xfer (the micro-DP group of HybridFlow's
     * mapping, else the training replica) by a plan made once (xplan) */
    bool gen_transient;
    /* roles.actor.offload beside that copy: from the sync to the next actor step the actor's
     * gradients are released and its AdamW state waits in host memory (actor_away); the last
     * move each way, {AdamW bytes, gradient bytes, seconds} (rlw_offload) */
    bool actor_away;
    double off_out[3], off_in[3];
    ff_rollout_config ro_cfg;
    ff_coll_comm *xfer;
    ff_reshard_plan *xplan;
    /* a pool of its own: the plan of the last sync and the group it was made on (the group
     * only ever loses dead ranks, so the same communicator of the same size has the same
     * members) */
    ff_reshard_plan *pplan;
    const ff_coll_comm *pplan_comm;
    int pplan_size;
    double *timeline; /* rlw_train_timeline: [ntimeline * 5] */
    double stage_fwd[FF_FUSE_MAX_NODES], stage_bwd[FF_FUSE_MAX_NODES]; /* rlw_train_stage_times */
    int32_t n_stage_times;
    int64_t ntimeline, timeline_cap;
    /* the layout of every role here but the generating copy's, and that copy's (glay: &lay,
     * or &lay_gen when it differs) */
    rlw_lay lay, lay_gen, *glay;
    /* the critic's: &lay, or lay_critic where it nests in the actor's pipelines
     * (ff_run_config_critic_place: r replicas in each, on blocks of its pp neighbouring ranks;
     * reversed inside its block when the actor's train node fuses, RLHFuse's bidirectional
     * layout), with pipeline and DP groups of its own */
    rlw_lay lay_critic, *clay;
    ff_coll_comm *ccomm; /* a fused step's: the critic's DP group (the hook's, beside s->comm) */
    struct dp_ctx {
        rlw *s;
        int size;
    } dpc;                    /* a ZeRO-1 optimizer's collectives (ff_model_comm) */
    od_role od[OD_N];         /* the ref's and the reward model's weights on demand */
    /* collectives on the models' device buffers (dev_coll): on a device backend their own
     * stream, ordered after the model's by cq_ready and before its next work by cq_done */
    bool dev_coll;
    ff_stream *cq;
    ff_event *cq_ready, *cq_done;
};

static void lay_clear(rlw_lay *y);
static int actor_away(rlw *s);
static int gen_release(rlw *s);

rlw *rlw_new(void) {
    rlw *s = ff_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->next_req = 1;
    lay_clear(&s->lay);
    lay_clear(&s->lay_gen);
    lay_clear(&s->lay_critic);
    s->glay = s->clay = &s->lay;
    return s;
}

/* ---- collectives on the models' device buffers (ff_model_comm's dev_ calls) ----------------
 * The group's library must read the backend's memory: the group itself beside the cpu backend
 * (the cpu ff_coll reads host memory), its NCCL twin beside a cuda one (ff_coll_comm_twin,
 * made at the first call, every rank of the group there together). On a device backend the
 * collective runs on a stream of its own (cq), after the model's queued work and before its
 * next. FF_DEVICE_COLL=0 keeps every model collective copied through host memory (the host
 * calls), for comparison or as a way around a fault; so does a cuda backend without NCCL. */
static bool dev_coll_wanted(const ff_backend *be) {
    const char *e = getenv("FF_DEVICE_COLL");
    if (e && !strcmp(e, "0")) return false;
    return ff_backend_shares_memory_with(be, "cpu") ||
           (ff_backend_shares_memory_with(be, "nccl") && ff_coll_backend_available("nccl", NULL));
}

enum { DC_SUM, DC_GATHER_V, DC_SCATTER_V, DC_SEND, DC_RECV, DC_BCAST };

/* group g's library that reads the backend's memory: g itself, or its NCCL twin */
static ff_coll_comm *dev_group(rlw *s, ff_coll_comm *g) {
    ff_coll_comm *d;
    return ff_coll_comm_twin(g, ff_backend_shares_memory_with(s->be, "cpu") ? "cpu" : "nccl", &d) ? NULL : d;
}

/* The stream a collective goes on: st itself on a backend whose work is done when queued, or
 * while st captures a graph (a decode step's: the collective is recorded in its place, where
 * events to another stream would fail the capture), else cq, after st's queued work (NULL +
 * error: cq could not be made). */
static ff_stream *dev_begin(rlw *s, ff_stream *st) {
    if (!ff_stream_native(st) || ff_stream_capturing(st)) return st;
    if (!s->cq) {
        s->cq = ff_stream_new(s->be);
        s->cq_ready = s->cq ? ff_event_new(s->be) : NULL;
        s->cq_done = s->cq_ready ? ff_event_new(s->be) : NULL;
        if (!s->cq_done) {
            ff_event_destroy(&s->cq_ready);
            ff_stream_destroy(&s->cq);
            return ff_error_wrap("worker: the collectives' stream"), NULL;
        }
    }
    ff_event_record(s->cq_ready, st);
    ff_stream_wait(s->cq, s->cq_ready);
    return s->cq;
}
/* st's later work after what went on q */
static void dev_end(rlw *s, ff_stream *st, ff_stream *q) {
    if (q == st) return;
    ff_event_record(s->cq_done, q);
    ff_stream_wait(st, s->cq_done);
}

/* op on group g's device library: in place (DC_SUM: out ignored), or as ff_model_comm says;
 * DC_SEND, DC_RECV, DC_BCAST: n floats of in with peer (the root for DC_BCAST) */
static int dev_coll(rlw *s, ff_coll_comm *g, int op, ff_stream *st, ff_dptr in, ff_dptr out, size_t n, const size_t *counts,
                    int peer) {
    /* a capture that already failed gets no collective: NCCL's enqueue on it would fail and
     * take the communicator down, when the generator only wants to run the step again eagerly */
    if (ff_stream_capture_failed(st))
        return ff_error_set("worker", NULL, "a collective left out of a graph capture that had already failed");
    ff_coll_comm *d = dev_group(s, g);
    ff_stream *q = d ? dev_begin(s, st) : NULL;
    if (!q) return -1;
    void *a = ff_dptr_addr(in), *b = op == DC_GATHER_V || op == DC_SCATTER_V ? ff_dptr_addr(out) : a, *ns = ff_stream_native(q);
    int rc;
    switch (op) {
    case DC_SUM: rc = ff_coll_all_reduce(a, a, n, FF_DTYPE_F32, FF_COLL_SUM, d, ns); break;
    case DC_GATHER_V: rc = ff_coll_all_gather_v(a, b, counts, FF_DTYPE_F32, d, ns); break;
    case DC_SCATTER_V: rc = ff_coll_reduce_scatter_v(a, b, counts, FF_DTYPE_F32, FF_COLL_SUM, d, ns); break;
    case DC_SEND: rc = ff_coll_send(a, n, FF_DTYPE_F32, peer, d, ns); break;
    case DC_RECV: rc = ff_coll_recv(a, n, FF_DTYPE_F32, peer, d, ns); break;
    default: rc = ff_coll_broadcast(a, a, n, FF_DTYPE_F32, peer, d, ns); break;
    }
    dev_end(s, st, q);
    return rc;
}

/* ---- ff_model_comm on ff_coll (the model may not use ff_coll itself) --------------------- */
#define TPC(ctx) (((struct tp_ctx *)(ctx))->c)
static int tp_sum(void *ctx, float *buf, size_t n) { return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F32, FF_COLL_SUM, TPC(ctx), NULL); }
static int tp_max(void *ctx, float *buf, size_t n) { return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F32, FF_COLL_MAX, TPC(ctx), NULL); }
static int tp_sum64(void *ctx, double *buf, size_t n) {
    return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F64, FF_COLL_SUM, TPC(ctx), NULL);
}
static int tp_gather(void *ctx, const float *in, float *out, size_t n) { return ff_coll_all_gather(in, out, n, FF_DTYPE_F32, TPC(ctx), NULL); }
/* sequence parallelism's: rows of [T, H] split over the TP group */
static int tp_reduce_scatter_v(void *ctx, const float *in, float *out, const size_t *counts) {
    return ff_coll_reduce_scatter_v(in, out, counts, FF_DTYPE_F32, FF_COLL_SUM, TPC(ctx), NULL);
}
static int tp_gather_v(void *ctx, const float *in, float *out, const size_t *counts) {
    return ff_coll_all_gather_v(in, out, counts, FF_DTYPE_F32, TPC(ctx), NULL);
}
static int tp_dev_sum(void *ctx, ff_stream *st, ff_dptr buf, size_t n) {
    struct tp_ctx *t = ctx;
    return dev_coll(t->s, t->c, DC_SUM, st, buf, buf, n, NULL, 0);
}
static int tp_dev_gather_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    struct tp_ctx *t = ctx;
    return dev_coll(t->s, t->c, DC_GATHER_V, st, in, out, 0, counts, 0);
}
static int tp_dev_scatter_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    struct tp_ctx *t = ctx;
    return dev_coll(t->s, t->c, DC_SCATTER_V, st, in, out, 0, counts, 0);
}

/* generation's transfers on the pipeline group (ff_gen_pipe) */
static int gp_send(void *ctx, int peer, const float *buf, size_t n) { return ff_coll_send(buf, n, FF_DTYPE_F32, peer, TPC(ctx), NULL); }
static int gp_recv(void *ctx, int peer, float *buf, size_t n) { return ff_coll_recv(buf, n, FF_DTYPE_F32, peer, TPC(ctx), NULL); }
static int gp_bcast(void *ctx, int root, float *buf, size_t n) { return ff_coll_broadcast(buf, buf, n, FF_DTYPE_F32, root, TPC(ctx), NULL); }
/* ... and on the generator's buffers (dev_coll); ctx: the layout's ppc */
static int gp_dsend(void *ctx, ff_stream *st, int peer, ff_dptr buf, size_t n) {
    struct tp_ctx *t = ctx;
    return dev_coll(t->s, t->c, DC_SEND, st, buf, buf, n, NULL, peer);
}
static int gp_drecv(void *ctx, ff_stream *st, int peer, ff_dptr buf, size_t n) {
    struct tp_ctx *t = ctx;
    return dev_coll(t->s, t->c, DC_RECV, st, buf, buf, n, NULL, peer);
}
static int gp_dbcast(void *ctx, ff_stream *st, int root, ff_dptr buf, size_t n) {
    struct tp_ctx *t = ctx;
    return dev_coll(t->s, t->c, DC_BCAST, st, buf, buf, n, NULL, root);
}

static ff_pipe_kind pipe_kind(int plan_schedule) {
    switch (plan_schedule) {
    case FF_PLAN_GPIPE:
    case FF_PLAN_AFAB: return FF_PIPE_GPIPE;
    case FF_PLAN_INTERLEAVED: return FF_PIPE_INTERLEAVED;
    default: return FF_PIPE_1F1B;
    }
}

static int split(ff_coll_comm *group, int color, int key, int size, int rank, const char *what, ff_coll_comm **out) {
    if (ff_coll_comm_split(group, color, key, out) != 0) return ff_error_wrap("worker: the %s group", what);
    if (ff_coll_comm_size(*out) != size || ff_coll_comm_rank(*out) != rank)
        return ff_error_set("worker", "every rank of a pool must have the same layout", "%s group of %d ranks (rank %d), expected %d (rank %d)",
                            what, ff_coll_comm_size(*out), ff_coll_comm_rank(*out), size, rank);
    return 0;
}

/* Split the pool's communicator into this layout's TP, pipeline and DP groups: collectives
 * every rank of the pool calls in this order (the same layouts everywhere). L: the config's
 * layout of the role (the pipeline's schedule and chunks). */
static int lay_setup(rlw *s, rlw_lay *y, const rlw_place *at, const ff_layout *L, ff_coll_comm *group) {
    y->at = *at;
    if (y->at.tp < 1) y->at.tp = 1;
    if (y->at.pp < 1) y->at.pp = 1;
    if (y->at.dp < 1) y->at.dp = 1;
    const rlw_place *p = &y->at;
    if (p->tp_rank < 0 || p->tp_rank >= p->tp || p->pp_rank < 0 || p->pp_rank >= p->pp || p->dp_rank < 0 || p->dp_rank >= p->dp)
        return ff_error_set("worker", NULL, "TP rank %d of %d, stage %d of %d, replica %d of %d", p->tp_rank, p->tp, p->pp_rank, p->pp,
                            p->dp_rank, p->dp);
    if (p->tp * p->pp == 1) return 0;
    if (!group)
        return ff_error_set("worker", "the executor sends rl.init with the pool's group", "tp %d x pp %d without a group communicator",
                            p->tp, p->pp);
    if (p->tp > 1) {
        if (split(group, p->dp_rank * p->pp + p->pp_rank, p->tp_rank, p->tp, p->tp_rank, "TP", &y->tp_comm) != 0) return -1;
        y->tpc = (struct tp_ctx){s, y->tp_comm};
        y->mcomm = (ff_model_comm){.rank = p->tp_rank, .size = p->tp, .ctx = &y->tpc, .all_reduce_sum = tp_sum,
                                   .all_reduce_max = tp_max, .all_reduce_sum_f64 = tp_sum64, .all_gather = tp_gather,
                                   .reduce_scatter_sum_v = tp_reduce_scatter_v, .all_gather_v = tp_gather_v};
        ff_coll_comm *twin; /* a device backend's NCCL twin now, every rank of the pool here together */
        if (s->dev_coll && ff_stream_native(ff_backend_stream(s->be)) && ff_coll_comm_twin(y->tp_comm, "nccl", &twin) != 0)
            return ff_error_wrap("worker: the TP group's NCCL communicator");
        if (s->dev_coll) {
            y->mcomm.dev_all_reduce_sum = tp_dev_sum;
            y->mcomm.dev_all_gather_v = tp_dev_gather_v;
            y->mcomm.dev_reduce_scatter_sum_v = tp_dev_scatter_v;
        }
        y->sp = L->sp;
    }
    if (p->pp > 1) {
        if (split(group, p->dp_rank * p->tp + p->tp_rank, p->pp_rank, p->pp, p->pp_rank, "pipeline", &y->pp_comm) != 0) return -1;
        if (s->dev_coll) { /* the stages' activations and gradients stay in the backend's memory */
            if (ff_pipe_transport_coll_dev(&y->ptd, y->pp_comm, s->be, &y->pt) != 0) return ff_error_wrap("worker: the pipeline transport");
            y->ptd_on = true;
        } else {
            ff_pipe_transport_coll(y->pp_comm, &y->pt);
        }
        y->pipe = (ff_roles_pipe){.transport = &y->pt, .kind = pipe_kind(L->schedule), .vpp = L->vpp > 1 ? (int32_t)L->vpp : 1};
        y->ppc = (struct tp_ctx){s, y->pp_comm};
        y->gpipe = (ff_gen_pipe){.rank = p->pp_rank, .size = p->pp, .ctx = &y->ppc, .send = gp_send, .recv = gp_recv, .broadcast = gp_bcast};
        if (s->dev_coll) /* the hidden states and logits stay in the generator's buffers */
            y->gpipe.dev_send = gp_dsend, y->gpipe.dev_recv = gp_drecv, y->gpipe.dev_broadcast = gp_dbcast;
    }
    return split(group, p->pp_rank * p->tp + p->tp_rank, p->dp_rank, p->dp, p->dp_rank, "DP", &y->dp_comm);
}

static void lay_clear(rlw_lay *y) {
    if (y->ptd_on) ff_pipe_coll_dev_fini(&y->ptd);
    ff_coll_comm_destroy(&y->tp_comm);
    ff_coll_comm_destroy(&y->pp_comm);
    ff_coll_comm_destroy(&y->dp_comm);
    memset(y, 0, sizeof *y);
    y->at = (rlw_place){.tp = 1, .pp = 1, .dp = 1};
}

bool rlw_gen_lockstep(const rlw *s) { return s->glay->at.tp > 1 || s->glay->at.pp > 1; }

static const rlw_lay *lay_of(const rlw *s, unsigned role) {
    return role == FF_RL_GEN ? s->glay : role == FF_RL_CRITIC ? s->clay : &s->lay;
}

/* The first rank of the replica in the controller's order (its pipeline rank 0 in the layout
 * of the roles here: a reversed critic's scoring hands every stage the outputs alike). */
bool rlw_returns_outputs(const rlw *s, unsigned role) {
    const rlw_lay *y = lay_of(s, role);
    return y->at.tp_rank == 0 && y->at.pp_rank == 0;
}

static void job_free(gen_job *j) {
    for (int32_t i = 0; i < j->k * j->n; i++) ff_gen_output_free(&j->outs[i]);
    free(j->outs);
    free(j->filled);
    j->outs = NULL;
    j->filled = NULL;
}

static void od_join(od_role *o);

static void unload(rlw *s) {
    for (int i = 0; i < OD_N; i++) { /* a load in flight finishes before its model goes */
        od_join(&s->od[i]);
        ff_stream_destroy(&s->od[i].st);
        s->od[i] = (od_role){0};
    }
    for (int i = 0; i < s->njobs; i++) job_free(&s->jobs[i]);
    s->njobs = 0;
    ff_rollout_destroy(&s->ro);
    ff_trainer_destroy(&s->t_actor);
    ff_trainer_destroy(&s->t_critic);
    ff_model_destroy(&s->gen); /* before the actor it may view */
    ff_model_destroy(&s->actor);
    ff_model_destroy(&s->critic);
    ff_model_destroy(&s->ref);
    ff_model_destroy(&s->rm);
    ff_tokenizer_destroy(&s->tok);
    ff_reshard_plan_destroy(&s->xplan);
    ff_reshard_plan_destroy(&s->pplan);
    s->pplan_comm = NULL;
    ff_coll_comm_destroy(&s->xfer);
    s->gen_transient = false;
    /* after the models that ran their collectives on them */
    lay_clear(&s->lay_critic);
    lay_clear(&s->lay);
    lay_clear(&s->lay_gen);
    s->glay = s->clay = &s->lay;
    ff_event_destroy(&s->cq_ready);
    ff_event_destroy(&s->cq_done);
    ff_stream_destroy(&s->cq);
    ff_backend_destroy(&s->be);
    ff_run_config_destroy(&s->run);
    ff_registry_destroy(&s->reg);
}

void rlw_destroy(rlw **ps) {
    if (!ps || !*ps) return;
    rlw *s = *ps;
    unload(s);
    free(s->jobs);
    free(s->gbuf);
    free(s->timeline);
    free(s);
    *ps = NULL;
}

static const ff_node *train_node(const ff_run_config *run, ff_role role) {
    for (size_t i = 0; i < ff_graph_n_nodes(run->graph); i++) {
        const ff_node *n = ff_graph_node(run->graph, i);
        if (n->op == FF_OP_TRAIN && n->role == role) return n;
    }
    return NULL;
}

static bool sync_node(const ff_run_config *run) {
    for (size_t i = 0; i < ff_graph_n_nodes(run->graph); i++)
        if (ff_graph_node(run->graph, i)->op == FF_OP_SYNC_WEIGHTS) return true;
    return false;
}

/* ---- loading --------------------------------------------------------------------------------- */
/* A role's model in layout y; train: it gets gradients (a role with a train node), else it
 * only infers and holds its parameters alone (ff_model_opts.inference). It reads its weights
 * straight from the folder into the model (ff_model_load_dir: under TP only this rank's block
 * of each tensor, a pipeline stage only its layers' tensors, no fp32 copy of the checkpoint);
 * a view, or a critic or reward model whose checkpoint has no value head yet (one is added
 * to the host tensors, ff_roles_add_value_head), reads them into host tensors first. */
static ff_model *load_model(rlw *s, rlw_lay *y, const char *dir, bool value_head, bool train, const ff_model *view_of,
                            bool w16, const char *role) {
    ff_model_config cfg;
    ff_tensor_set *w = NULL;
    const rlw_place *at = &y->at;
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_stage st;
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    /* the norm communicator is the layout's: every stage model of it shares the one group */
    if (ff_hf_config_load(path, &cfg) != 0 ||
        (at->pp > 1 && ff_roles_pipe_stage(&cfg, &y->pipe, at->pp_rank, first, count, &y->norm, &st) != 0)) {
        ff_error_wrap("role %s (TP rank %d of %d, stage %d of %d)", role, at->tp_rank, at->tp, at->pp_rank, at->pp);
        return NULL;
    }
    ff_model_opts mo = {.inference = !train, .comm = at->tp > 1 ? &y->mcomm : NULL, .sequence_parallel = at->tp > 1 && y->sp,
                        .stage = at->pp > 1 ? &st : NULL, .view_of = view_of, .bf16_weights = w16};
    if (!view_of && !(value_head && !cfg.value_head)) {
        ff_model *m = ff_model_load_dir(s->be, dir, &mo, &cfg);
        if (!m) ff_error_wrap("role %s (TP rank %d of %d, stage %d of %d)", role, at->tp_rank, at->tp, at->pp_rank, at->pp);
        return m;
    }
    if (at->tp > 1 || at->pp > 1) { /* this rank's shards of its stage's tensors only */
        if (!(w = ff_tensor_set_new()) || ff_model_read_shards(dir, &cfg, at->tp_rank, at->tp, at->pp > 1 ? &st : NULL, w) != 0) {
            ff_tensor_set_destroy(&w);
            ff_error_wrap("role %s (TP rank %d of %d, stage %d of %d)", role, at->tp_rank, at->tp, at->pp_rank, at->pp);
            return NULL;
        }
    } else if (ff_model_dir_load(dir, &cfg, &w) != 0) {
        ff_error_wrap("role %s", role);
        return NULL;
    }
    if (value_head && !cfg.value_head && ff_roles_add_value_head(&cfg, w, 0.0, 7) != 0) {
        ff_tensor_set_destroy(&w);
        ff_error_wrap("role %s: %s", role, dir);
        return NULL;
    }
    ff_model *m = ff_model_new_from(s->be, &cfg, &w, &mo);
    if (!m) ff_error_wrap("role %s: %s", role, dir);
    return m;
}

/* The temperature of the sample-level generate node (the one that writes the response). */
static float sampling_temperature(const ff_run_config *run) {
    int resp = ff_graph_response_column(run->graph);
    for (size_t i = 0; i < ff_graph_n_nodes(run->graph); i++) {
        const ff_node *n = ff_graph_node(run->graph, i);
        if (n->op == FF_OP_GENERATE && n->out[FF_SLOT_RESPONSE] == resp) return n->gen.greedy ? 1.0f : (float)n->gen.temperature;
    }
    return 1.0f;
}

static int grad_hook(void *user, ff_model *m, ff_buffer *grads, int64_t n) {
    rlw *s = user;
    ff_coll_comm *g = m == s->critic && s->ccomm ? s->ccomm : s->comm;
    if (!g || ff_coll_comm_size(g) < 2) return 0;
    /* SUM: every rank's loss already carries the mini-batch's global normaliser (roles.h) */
    if (s->dev_coll) return dev_coll(s, g, DC_SUM, ff_backend_stream(s->be), ff_dptr_of(grads, 0), ff_dptr_of(grads, 0), (size_t)n, NULL, 0);
    if (n > s->gcap) {
        float *b = ff_realloc(s->gbuf, (size_t)n * sizeof *b);
        if (!b) return -1;
        s->gbuf = b;
        s->gcap = n;
    }
    ff_model_read_grads(m, s->gbuf);
    if (ff_coll_all_reduce(s->gbuf, s->gbuf, (size_t)n, FF_DTYPE_F32, FF_COLL_SUM, g, NULL) != 0) return -1;
    ff_model_write_grads(m, s->gbuf);
    return 0;
}

/* ZeRO-1's collectives on the DP group of the step in progress (ff_model_comm, model.h). */
static ff_coll_comm *dp_group(struct dp_ctx *c) {
    ff_coll_comm *g = c->s->comm;
    if (!g)
        return ff_error_set("ZeRO-1", "the controller sends a trained role's steps and saves with its group",
                            "no communicator for the data-parallel group"),
               NULL;
    if (ff_coll_comm_size(g) != c->size)
        return ff_error_set("ZeRO-1", NULL, "the group has %d ranks, the optimizer was split over %d", ff_coll_comm_size(g),
                            c->size),
               NULL;
    return g;
}
static int dp_sum64(void *ctx, double *buf, size_t n) {
    ff_coll_comm *g = dp_group(ctx);
    return g ? ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F64, FF_COLL_SUM, g, NULL) : -1;
}
static int dp_reduce_scatter(void *ctx, const float *in, float *out, const size_t *counts) {
    ff_coll_comm *g = dp_group(ctx);
    return g ? ff_coll_reduce_scatter_v(in, out, counts, FF_DTYPE_F32, FF_COLL_SUM, g, NULL) : -1;
}
static int dp_all_gather(void *ctx, const float *in, float *out, const size_t *counts) {
    ff_coll_comm *g = dp_group(ctx);
    return g ? ff_coll_all_gather_v(in, out, counts, FF_DTYPE_F32, g, NULL) : -1;
}
static int dp_dev_sum(void *ctx, ff_stream *st, ff_dptr buf, size_t n) {
    ff_coll_comm *g = dp_group(ctx);
    return g ? dev_coll(((struct dp_ctx *)ctx)->s, g, DC_SUM, st, buf, buf, n, NULL, 0) : -1;
}
static int dp_dev_scatter_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    ff_coll_comm *g = dp_group(ctx);
    return g ? dev_coll(((struct dp_ctx *)ctx)->s, g, DC_SCATTER_V, st, in, out, 0, counts, 0) : -1;
}
static int dp_dev_gather_v(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    ff_coll_comm *g = dp_group(ctx);
    return g ? dev_coll(((struct dp_ctx *)ctx)->s, g, DC_GATHER_V, st, in, out, 0, counts, 0) : -1;
}

/* How a trained role's gradients meet over DP: the hook's all-reduce (zero 0) or the
 * optimizer's reduce-scatter (zero 1, the run config's roles.<role>.layout.zero); over the
 * DP group of the step in progress (s->comm: the pool's group, or dp_comm under TP). */
static void set_dp(rlw *s, ff_role role, ff_trainer_config *tc) {
    tc->zero = (int)s->run->roles[role].layout.zero;
    if (!tc->zero) {
        tc->grad_hook = grad_hook;
        tc->grad_hook_user = s;
        return;
    }
    s->dpc = (struct dp_ctx){s, s->lay.at.dp};
    tc->dp = (ff_model_comm){.rank = s->lay.at.dp_rank, .size = s->lay.at.dp, .ctx = &s->dpc, .all_reduce_sum_f64 = dp_sum64,
                             .reduce_scatter_sum_v = dp_reduce_scatter, .all_gather_v = dp_all_gather};
    if (s->dev_coll) {
        tc->dp.dev_all_reduce_sum = dp_dev_sum;
        tc->dp.dev_reduce_scatter_sum_v = dp_dev_scatter_v;
        tc->dp.dev_all_gather_v = dp_dev_gather_v;
    }
}

static ff_trainer *make_trainer(rlw *s, ff_model *m, ff_role role, int64_t updates, const char *resume_dir, const char *name) {
    const ff_node *n = train_node(s->run, role);
    if (!n) return NULL; /* hosted but never trained: no optimizer */
    ff_trainer_config tc;
    if (ff_roles_trainer_config_from_node(s->run, n, updates, &tc) != 0) return NULL;
    set_dp(s, role, &tc);
    const rlw_lay *y = role == FF_ROLE_CRITIC ? s->clay : &s->lay;
    if (y->at.pp > 1) tc.pipe = y->pipe;
    ff_trainer *t = ff_trainer_new(m, &tc);
    if (!t) return NULL;
    if (resume_dir) {
        char path[FF_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s.optim.safetensors", resume_dir, name);
        ff_tensor_set *st = ff_tensor_set_new();
        int rc = st ? ff_safetensors_load(path, st) : -1;
        if (rc == 0) rc = ff_optimizer_import_state(ff_trainer_optimizer(t), st);
        ff_tensor_set_destroy(&st);
        if (rc != 0) {
            ff_trainer_destroy(&t);
            ff_error_wrap("resuming the %s's optimizer", name);
            return NULL;
        }
    }
    return t;
}

static void free_lines(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* The non-empty lines of text, or NULL with *n == -1 when out of memory (a run parsed
 * without some of its overrides would silently differ from the controller's). */
static char **split_lines(const char *text, int *n) {
    *n = 0;
    if (!text || !*text) return NULL;
    int cap = 1;
    for (const char *p = text; *p; p++) cap += *p == '\n';
    char **v = ff_calloc((size_t)cap, sizeof *v);
    if (!v) {
        *n = -1;
        return NULL;
    }
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len) {
            v[*n] = ff_malloc(len + 1);
            if (!v[*n]) {
                free_lines(v, *n);
                *n = -1;
                return NULL;
            }
            memcpy(v[*n], p, len);
            v[(*n)++][len] = 0;
        }
        p += len + (e ? 1 : 0);
    }
    return v;
}

/* The config's layout of the roles this worker hosts (they share one; a generating copy of
 * its own on these workers has the actor's generation layout), then the groups. */
static const ff_layout *hosted_layout(const rlw *s, unsigned roles) {
    const ff_role_cfg *rc = s->run->roles;
    if (roles & FF_RL_ACTOR) return &rc[FF_ROLE_ACTOR].layout;
    if (roles & FF_RL_GEN) return &rc[FF_ROLE_ACTOR].rollout;
    if (roles & FF_RL_CRITIC) return &rc[FF_ROLE_CRITIC].layout;
    if (roles & FF_RL_REF) return &rc[FF_ROLE_REF].layout;
    return &rc[FF_ROLE_REWARD].layout;
}

static int layouts_setup(rlw *s, const rlw_init_args *a) {
    if (lay_setup(s, &s->lay, &a->main, hosted_layout(s, a->roles), a->group) != 0) return -1;
    s->glay = s->clay = &s->lay;
    int64_t cp, cd;
    /* a critic nested in the actor's pipelines (reversed when fused): groups of its own */
    if ((a->roles & FF_RL_CRITIC) && (a->roles & FF_RL_ACTOR) &&
        ff_run_config_critic_place(s->run, s->lay.at.pp_rank, s->lay.at.dp_rank, &cp, &cd)) {
        const ff_layout *C = &s->run->roles[FF_ROLE_CRITIC].layout;
        const rlw_place at = {.tp = 1, .pp = (int)C->pp, .pp_rank = (int)cp, .dp = (int)C->dp, .dp_rank = (int)cd};
        if (lay_setup(s, &s->lay_critic, &at, C, a->group) != 0) return -1;
        s->clay = &s->lay_critic;
    }
    if (a->gen.tp < 1 || !(a->roles & FF_RL_GEN)) return 0;
    if (lay_setup(s, &s->lay_gen, &a->gen, &s->run->roles[FF_ROLE_ACTOR].rollout, a->group) != 0) return -1;
    s->glay = &s->lay_gen;
    if (!(a->roles & FF_RL_ACTOR)) return 0;
    /* the transition's group, split from the pool's communicator by every rank of it: the
     * micro-DP group when the controller placed the copy by HybridFlow's mapping (generation
     * TP index i / (t/tg), stage s / (p/pg), replica k dg + (i mod t/tg) + (t/tg)(s mod p/pg)),
     * else the training replica, which holds the whole model */
    if (!a->group)
        return ff_error_set("worker", "the executor sends rl.init with the pool's group",
                            "a generation layout of its own without a communicator");
    const rlw_place *t = &s->lay.at, *g = &s->lay_gen.at;
    int color = t->dp_rank, key = t->pp_rank * t->tp + t->tp_rank;
    if (t->tp % g->tp == 0 && t->pp % g->pp == 0) {
        const int ta = t->tp / g->tp, pb = t->pp / g->pp, dg = ta * pb, md = t->tp_rank % ta + ta * (t->pp_rank % pb);
        if (g->tp_rank == t->tp_rank / ta && g->pp_rank == t->pp_rank / pb && g->dp_rank == t->dp_rank * dg + md)
            color = t->dp * (1 + g->pp_rank * g->tp + g->tp_rank) + t->dp_rank, key = md; /* apart from the replicas' colours */
    }
    if (ff_coll_comm_split(a->group, color, key, &s->xfer) != 0) return ff_error_wrap("worker: the weight transition's group");
    return 0;
}

/* ---- frozen weights on demand ------------------------------------------------------------ */
static const char *const od_names[OD_N] = {"ref", "reward"};

static int od_setup(rlw *s, int i, ff_model *m) {
    od_role *o = &s->od[i];
    if (!(o->st = ff_stream_new(s->be)) || ff_model_params_to_host(m, NULL) != 0)
        return ff_error_wrap("worker: roles.%s.weights: on_demand: keeping its weights in host memory", od_names[i]);
    o->m = m;
    return 0;
}

static void *od_thread(void *arg) {
    od_role *o = arg;
    o->rc = ff_model_params_load(o->m, o->st, &o->done);
    if (o->rc) snprintf(o->err, sizeof o->err, "%s", ff_error_message()); /* the message is per thread */
    o->t1_ns = ff_now_ns();
    return NULL;
}

static void od_join(od_role *o) {
    if (!o->loading) return;
    pthread_join(o->th, NULL);
    o->loading = false;
}

static int od_index(unsigned role) { return role == FF_RL_REF ? OD_REF : role == FF_RL_REWARD ? OD_REWARD : -1; }

void rlw_weights_prefetch(rlw *s, unsigned roles) {
    for (int i = 0; i < OD_N; i++) {
        od_role *o = &s->od[i];
        if (!o->m || !(roles & (i == OD_REF ? FF_RL_REF : FF_RL_REWARD)) || o->loading || ff_model_params_held(o->m)) continue;
        o->prefetched = true, o->rc = 0, o->err[0] = 0;
        o->t0_ns = ff_now_ns();
        /* without a thread the role's inference loads it itself */
        o->loading = pthread_create(&o->th, NULL, od_thread, o) == 0;
    }
}

/* The role's weights onto the backend before its inference: what a prefetch left (waiting for
 * its thread), or the whole load here. Fills o->last. 0 / -1 + error naming role and bytes. */
static int od_acquire(rlw *s, unsigned role) {
    const int i = od_index(role);
    od_role *o = i >= 0 ? &s->od[i] : NULL;
    if (!o || !o->m) return 0;
    const int64_t want = ff_now_ns();
    o->last = (rlw_load){0};
    if (o->loading) {
        od_join(o);
    } else if (!ff_model_params_held(o->m)) {
        o->prefetched = false, o->t0_ns = want;
        o->rc = ff_model_params_load(o->m, o->st, &o->done);
        if (o->rc) snprintf(o->err, sizeof o->err, "%s", ff_error_message());
        o->t1_ns = ff_now_ns();
    } else {
        o->last.held = ff_model_params_host_bytes(o->m); /* still here from its last load */
        return 0;
    }
    const int64_t now = ff_now_ns();
    if (o->rc) {
        o->rc = 0; /* the host copy stays: the next subtask tries again */
        return ff_error_set("worker", "give the worker's device more free memory, or set the role's weights: resident",
                            "roles.%s.weights: on_demand: loading its %" PRId64 " bytes of weights failed: %s", od_names[i],
                            ff_model_params_host_bytes(o->m), o->err);
    }
    o->last = (rlw_load){.bytes = o->done.bytes, .load_s = o->done.seconds, .waited_s = (double)(now - want) * 1e-9,
                         .held = ff_model_params_host_bytes(o->m), .start_ns = o->t0_ns, .end_ns = o->t1_ns,
                         .prefetched = o->prefetched};
    return 0;
}

void rlw_weights_release(rlw *s) {
    for (int i = 0; i < OD_N; i++) {
        od_role *o = &s->od[i];
        if (!o->m) continue;
        od_join(o);
        if (ff_model_params_held(o->m)) ff_model_release_params(o->m); /* the host copy holds them */
    }
}

bool rlw_weights_on_demand(const rlw *s, unsigned role) {
    const int i = od_index(role);
    return i >= 0 && s->od[i].m != NULL;
}

const rlw_load *rlw_weights_last(const rlw *s, unsigned role) {
    const int i = od_index(role);
    return i >= 0 && s->od[i].m ? &s->od[i].last : NULL;
}

int64_t rlw_weights_held(const rlw *s) {
    int64_t n = 0;
    for (int i = 0; i < OD_N; i++) {
        const od_role *o = &s->od[i];
        if (o->m && !o->loading && ff_model_params_held(o->m)) n += ff_model_params_host_bytes(o->m);
    }
    return n;
}

/* Before any work, on a device (a backend with a capacity): what must be on it at once at a
 * trained role's optimizer step, if that alone is over the device's memory, the run cannot
 * train, so it stops now, not after its first generation. A floor, never an estimate: every
 * trained role's weights, the stepping role's gradients, AdamW moments (at ZeRO-1 its range;
 * offloaded ones come back for the step) and bf16 copy for the products, and the frozen roles'
 * weights that stay on the device (not roles.<role>.weights: on_demand). Not counted (so a run
 * may still run out later, with the allocation's own error): activations, the KV cache, the
 * generating copy's own weights (given back for training when transient), workspace. Over
 * what fuseflow can have of the device: what it holds and what is free, not what other
 * processes, the CUDA context and NCCL hold. */
static int check_device_memory(const rlw *s) {
    ff_backend_memory bm;
    ff_backend_memory_of(s->be, &bm);
    ff_model *trained[2] = {s->t_actor ? s->actor : NULL, s->t_critic ? s->critic : NULL};
    ff_trainer *tr[2] = {s->t_actor, s->t_critic};
    if (bm.capacity <= 0 || (!trained[0] && !trained[1])) return 0;
    static const char *const tname[2] = {"actor", "critic"};
    int64_t weights[2] = {0, 0}, step[2][3] = {{0}}; /* per trained role: gradients, moments, bf16 copy */
    int64_t base = 0, frozen[2] = {0, 0};
    int worst = -1;
    for (int i = 0; i < 2; i++) {
        if (!trained[i]) continue;
        ff_model_memory mm;
        ff_model_memory_of(trained[i], &mm);
        const int64_t n = ff_model_param_count(trained[i]);
        weights[i] = mm.params;
        ff_optimizer *o = ff_trainer_optimizer(tr[i]);
        step[i][0] = 4 * n;
        step[i][1] = ff_optimizer_state_bytes(o) + ff_optimizer_host_bytes(o);
        step[i][2] = ff_model_bf16_products(trained[i]) ? 2 * n : 0;
        base += weights[i];
        if (worst < 0 || step[i][0] + step[i][1] + step[i][2] > step[worst][0] + step[worst][1] + step[worst][2]) worst = i;
    }
    ff_model *fz[2] = {s->ref, s->rm};
    for (int i = 0; i < 2; i++) {
        if (!fz[i]) continue;
        ff_model_memory mm;
        ff_model_memory_of(fz[i], &mm);
        frozen[i] = mm.params; /* 0 on demand: in host memory between its uses */
        base += frozen[i];
    }
    const int64_t need = base + step[worst][0] + step[worst][1] + step[worst][2];
    /* the most fuseflow can hold: what it holds and what is free (other processes, the CUDA
     * context and NCCL's buffers keep the rest) */
    const int64_t free_now = ff_backend_device_free(s->be);
    const int64_t room = free_now >= 0 && bm.in_use + free_now < bm.capacity ? bm.in_use + free_now : bm.capacity;
    if (need <= room) return 0;
    char b[12][32], over[256];
    if (room < bm.capacity)
        snprintf(over, sizeof over, "the %s it can have of the device's %s (it holds %s and %s is free; other processes, the CUDA context "
                 "and NCCL hold the rest, nvidia-smi lists them)", ff_fmt_bytes((uint64_t)room, b[9], sizeof b[9]),
                 ff_fmt_bytes((uint64_t)bm.capacity, b[8], sizeof b[8]), ff_fmt_bytes((uint64_t)bm.in_use, b[10], sizeof b[10]),
                 ff_fmt_bytes((uint64_t)free_now, b[11], sizeof b[11]));
    else
        snprintf(over, sizeof over, "the device's %s", ff_fmt_bytes((uint64_t)bm.capacity, b[8], sizeof b[8]));
    ff_strbuf what = {0};
    ff_strbuf_printf(&what, "the %s's weights %s, gradients %s, AdamW moments %s", tname[worst],
                     ff_fmt_bytes((uint64_t)weights[worst], b[0], sizeof b[0]), ff_fmt_bytes((uint64_t)step[worst][0], b[1], sizeof b[1]),
                     ff_fmt_bytes((uint64_t)step[worst][1], b[2], sizeof b[2]));
    if (step[worst][2]) ff_strbuf_printf(&what, ", its bf16 copy for the products %s", ff_fmt_bytes((uint64_t)step[worst][2], b[3], sizeof b[3]));
    if (trained[1 - worst])
        ff_strbuf_printf(&what, ", the %s's weights %s", tname[1 - worst], ff_fmt_bytes((uint64_t)weights[1 - worst], b[4], sizeof b[4]));
    static const char *const fname[2] = {"ref", "reward"};
    for (int i = 0; i < 2; i++)
        if (frozen[i]) ff_strbuf_printf(&what, ", the %s's weights %s", fname[i], ff_fmt_bytes((uint64_t)frozen[i], b[5 + i], sizeof b[5 + i]));
    ff_error_set("worker", "give the trained roles more GPUs (roles.<role>.workers with layout: {tp: N} or {pp: N}; zero: 1 shards the "
                           "AdamW moments over the data-parallel ranks), keep frozen roles in host memory between their uses "
                           "(roles.ref.weights: on_demand), or use GPUs with more memory, free of other processes",
                 "%s cannot train the %s: its optimizer step needs on the device at once %s: %s in all, over %s "
                 "(activations, the KV cache and workspace come on top)",
                 ff_backend_name(s->be), tname[worst], what.failed || !what.p ? "(out of host memory)" : what.p, ff_fmt_bytes((uint64_t)need, b[7], sizeof b[7]),
                 over);
    free(what.p);
    return -1;
}

int rlw_init(rlw *s, const rlw_init_args *a) {
    unload(s);
    int n_over = 0;
    char **over = split_lines(a->overrides, &n_over);
    if (n_over < 0) return ff_error_wrap("worker: the run config's overrides");
    s->reg = ff_registry_new();
    if (s->reg) ff_registry_skip_rewards(s->reg); /* the controller scores */
    if (s->reg) s->run = ff_run_config_parse(a->config, a->config_name, n_over, over, s->reg);
    free_lines(over, n_over);
    if (!s->run) return ff_error_wrap("worker: the run config");
    const char *backend = a->backend && a->backend[0] ? a->backend : "cpu";
    s->be = ff_backend_new(backend);
    if (!s->be)
        return ff_error_wrap("worker: backend %s%s", backend,
                             strncmp(backend, "cuda", 4) ? "" : " (its roles' backend: cuda in the run config; cpu runs them without a GPU)");
    const ff_role_cfg *roles = s->run->roles;
    s->dev_coll = dev_coll_wanted(s->be);
    if (layouts_setup(s, a) != 0) return -1;
    char dir[FF_PATH_MAX];
    const char *actor_dir = roles[FF_ROLE_ACTOR].model;
    if (a->resume_dir) {
        snprintf(dir, sizeof dir, "%s/actor", a->resume_dir);
        actor_dir = dir;
    }
    if (a->roles & (FF_RL_ACTOR | FF_RL_GEN)) {
        if (!actor_dir) return ff_error_set("worker", "add roles.actor.model", "the run has no actor model");
        s->tok = ff_tokenizer_load_dir(actor_dir); /* optional: checkpoints carry it when present */
        if (!s->tok) ff_error_clear();
    }
    if (a->roles & FF_RL_ACTOR) {
        if (!(s->actor = load_model(s, &s->lay, actor_dir, false, train_node(s->run, FF_ROLE_ACTOR) != NULL, NULL, false, "actor"))) return -1;
        s->t_actor = make_trainer(s, s->actor, FF_ROLE_ACTOR, a->total_updates[0], a->resume_dir, "actor");
        if (!s->t_actor && train_node(s->run, FF_ROLE_ACTOR)) return -1;
    }
    if (a->roles & FF_RL_GEN) {
        /* beside a trained actor whose weights a sync brings over */
        s->gen_transient = s->t_actor && sync_node(s->run);
        /* the first generation comes before any sync: the actor is away from the start */
        if (actor_away(s) != 0) return -1;
        /* fp32 beside the trained actor: a view of the training shard (HybridFlow's 3D-HybridEngine),
         * whose own memory is only the part of the generation shard that the training shard lacks:
         * in a layout of its own the gathered part, in the actor's layout nothing (the sync then
         * copies nothing). A copy synced in bf16, or stored in bf16, stays a copy of its own */
        const ff_role_cfg *ac = &roles[FF_ROLE_ACTOR];
        const ff_model *view_of = s->gen_transient && !ac->rollout_bf16 && !ac->rollout_w16 ? s->actor : NULL;
        if (!(s->gen = load_model(s, s->glay, actor_dir, false, false, view_of, ac->rollout_w16, "actor (generation)"))) return -1;
        ff_rollout_config rc;
        ff_rollout_config_default(&rc);
        rc.max_slots = a->slots > 0 ? a->slots : 64;
        rc.max_seq_len = a->max_seq_len > 0 ? a->max_seq_len : 256;
        rc.pipe = s->glay->at.pp > 1 ? &s->glay->gpipe : NULL; /* every stage decodes the same batch */
        /* the paged KV cache: its block size, and its pool as a share of every slot at full
         * length (ff_rollout_kv_blocks; the controller checked that one group fits) */
        rc.kv_block_rows = (int32_t)roles[FF_ROLE_ACTOR].rollout_kv_block;
        if (rc.kv_block_rows > rc.max_seq_len) rc.kv_block_rows = rc.max_seq_len;
        rc.kv_blocks = ff_rollout_kv_blocks(rc.max_slots, rc.max_seq_len, rc.kv_block_rows, roles[FF_ROLE_ACTOR].rollout_kv_memory);
        rc.kv_bf16 = roles[FF_ROLE_ACTOR].rollout_kv16;
        rc.eager = roles[FF_ROLE_ACTOR].rollout_eager;
        s->ro_cfg = rc;
        if (!(s->ro = ff_rollout_new(s->gen, &rc)))
            return ff_error_wrap("worker: the actor's generation engine, whose KV cache is roles.actor.rollout.kv_memory %g of its %d "
                                 "slots at %d positions (lower kv_memory, down to one group of n at full length%s)",
                                 roles[FF_ROLE_ACTOR].rollout_kv_memory, rc.max_slots, rc.max_seq_len,
                                 rc.kv_bf16 ? "" : "; kv_dtype: bf16 halves it");
    }
    if (a->roles & FF_RL_CRITIC) {
        const char *cdir = roles[FF_ROLE_CRITIC].model;
        char cbuf[FF_PATH_MAX];
        if (a->resume_dir && train_node(s->run, FF_ROLE_CRITIC)) {
            snprintf(cbuf, sizeof cbuf, "%s/critic", a->resume_dir);
            cdir = cbuf;
        }
        if (!cdir) return ff_error_set("worker", "add roles.critic.model", "the run has no critic model");
        if (!(s->critic = load_model(s, s->clay, cdir, true, train_node(s->run, FF_ROLE_CRITIC) != NULL, NULL, false, "critic"))) return -1;
        s->t_critic = make_trainer(s, s->critic, FF_ROLE_CRITIC, a->total_updates[1], a->resume_dir, "critic");
        if (!s->t_critic && train_node(s->run, FF_ROLE_CRITIC)) return -1;
    }
    if (a->roles & FF_RL_REF) {
        if (!roles[FF_ROLE_REF].model) return ff_error_set("worker", "add roles.ref.model", "the run has no reference model");
        if (!(s->ref = load_model(s, &s->lay, roles[FF_ROLE_REF].model, false, false, NULL, roles[FF_ROLE_REF].w16, "ref"))) return -1;
        if (roles[FF_ROLE_REF].on_demand && od_setup(s, OD_REF, s->ref) != 0) return -1;
    }
    if (a->roles & FF_RL_REWARD) {
        if (!roles[FF_ROLE_REWARD].model) return ff_error_set("worker", "add roles.reward.model", "the run has no reward model");
        if (!(s->rm = load_model(s, &s->lay, roles[FF_ROLE_REWARD].model, true, false, NULL, roles[FF_ROLE_REWARD].w16, "reward"))) return -1;
        if (roles[FF_ROLE_REWARD].on_demand && od_setup(s, OD_REWARD, s->rm) != 0) return -1;
    }
    return check_device_memory(s);
}

static ff_model *model_of(const rlw *s, unsigned role) {
    switch (role) {
    case FF_RL_ACTOR: return s->actor;
    case FF_RL_GEN: return s->gen;
    case FF_RL_CRITIC: return s->critic;
    case FF_RL_REF: return s->ref;
    case FF_RL_REWARD: return s->rm;
    default: return NULL;
    }
}

static const char *role_name(unsigned role) {
    switch (role) {
    case FF_RL_ACTOR: return "actor";
    case FF_RL_GEN: return "actor (generation)";
    case FF_RL_CRITIC: return "critic";
    case FF_RL_REF: return "ref";
    case FF_RL_REWARD: return "reward";
    default: return "?";
    }
}

int64_t rlw_param_count(const rlw *s, unsigned role) {
    ff_model *m = model_of(s, role);
    return m ? ff_model_param_count(m) : 0;
}

void rlw_role_bytes(const rlw *s, unsigned role, int64_t out[FF_RL_RB_N]) {
    memset(out, 0, FF_RL_RB_N * sizeof *out);
    ff_model *m = model_of(s, role);
    if (!m) return;
    ff_model_memory mm;
    ff_model_memory_of(m, &mm);
    /* its shard, of which the viewed part is the actor's; on demand, what its inference loads */
    out[FF_RL_RB_PARAMS] = mm.params + mm.viewed ? mm.params + mm.viewed : ff_model_params_host_bytes(m);
    out[FF_RL_RB_VIEWED] = mm.viewed;
    /* what the role needs to train: its gradients and AdamW state count while they are away
     * for generation (roles.actor.offload) */
    out[FF_RL_RB_GRADS] = ff_model_is_inference(m) ? 0 : 4 * ff_model_param_count(m);
    ff_trainer *t = role == FF_RL_ACTOR ? s->t_actor : role == FF_RL_CRITIC ? s->t_critic : NULL;
    if (t) out[FF_RL_RB_OPTIM] = ff_optimizer_state_bytes(ff_trainer_optimizer(t)) + ff_optimizer_host_bytes(ff_trainer_optimizer(t));
}

void rlw_backend_memory(const rlw *s, ff_backend_memory *out) {
    memset(out, 0, sizeof *out);
    if (s->be) ff_backend_memory_of(s->be, out);
}

int64_t rlw_device_free(const rlw *s) { return s->be ? ff_backend_device_free(s->be) : -1; }

void rlw_backend_reset_peak(rlw *s) {
    if (s->be) ff_backend_memory_reset_peak(s->be);
}

static int need(const rlw *s, unsigned role) {
    if (model_of(s, role)) return 0;
    return ff_error_set("worker", "the controller sends each role's subtasks to the workers that host it",
                        "this worker does not host the %s", role_name(role));
}

/* ---- generation ------------------------------------------------------------------------------- */
int rlw_gen_add(rlw *s, void *owner, const int32_t *prompts, const int32_t *plens, const int64_t *seeds, int32_t k, int32_t n,
                const rlw_sampling *sp) {
    if (need(s, FF_RL_GEN)) return -1;
    if (!s->ro)
        return ff_error_set("rl.generate", "the controller syncs the weights after training, before generating",
                            "the generating copy gave its weights back for the actor's training");
    if (k < 1 || n < 1) return ff_error_set("rl.generate", NULL, "%d prompts x %d samples", k, n);
    if (s->njobs == s->jobs_cap) {
        int cap = s->jobs_cap ? 2 * s->jobs_cap : 16;
        gen_job *v = ff_realloc(s->jobs, (size_t)cap * sizeof *v);
        if (!v) return -1;
        s->jobs = v;
        s->jobs_cap = cap;
    }
    gen_job *j = &s->jobs[s->njobs];
    *j = (gen_job){owner, s->next_req, k, n, k * n, ff_calloc((size_t)(k * n), sizeof(ff_gen_output)),
                   ff_calloc((size_t)(k * n), sizeof(bool))};
    if (!j->outs || !j->filled) {
        job_free(j);
        return -1;
    }
    ff_sampling samp;
    ff_sampling_default(&samp);
    samp.temperature = sp->temperature;
    samp.top_p = sp->top_p > 0 ? sp->top_p : 1.0f;
    samp.top_k = sp->top_k;
    samp.max_new_tokens = sp->max_new > 0 ? sp->max_new : 1;
    samp.len_median = sp->len_median;
    samp.len_p99_ratio = sp->len_p99_ratio;
    samp.len_max = sp->len_max;
    int64_t off = 0;
    for (int32_t i = 0; i < k; i++) {
        ff_rollout_request q = {.id = s->next_req + (uint64_t)i, .prompt = prompts + off, .prompt_len = plens[i], .n = n,
                                .sampling = samp, .seed = (uint64_t)seeds[i]};
        if (ff_rollout_add(s->ro, &q) != 0) {
            for (int32_t b = 0; b < i; b++) ff_rollout_abort(s->ro, s->next_req + (uint64_t)b);
            job_free(j);
            return -1;
        }
        off += plens[i];
    }
    s->next_req += (uint64_t)k;
    s->njobs++;
    return 0;
}

int rlw_gen_run(rlw *s, void *owner, const int32_t *prompts, const int32_t *plens, const int64_t *seeds, int32_t k, int32_t n,
                const rlw_sampling *sp, rlw_gen_cb cb, void *ctx) {
    if (s->njobs) return ff_error_set("rl.generate", NULL, "%d generation jobs are open", s->njobs);
    if (rlw_gen_add(s, owner, prompts, plens, seeds, k, n, sp) != 0) return -1;
    while (s->njobs)
        if (rlw_gen_step(s, cb, ctx) != 0) {
            rlw_gen_clear(s);
            return -1;
        }
    return 0;
}

static int find_job(const rlw *s, uint64_t req) {
    for (int i = 0; i < s->njobs; i++)
        if (req >= s->jobs[i].first_req && req < s->jobs[i].first_req + (uint64_t)s->jobs[i].k) return i;
    return -1;
}

static int deliver(rlw *s, int ji, rlw_gen_cb cb, void *ctx, const int64_t *moved) {
    gen_job *j = &s->jobs[ji];
    int32_t kn = j->k * j->n;
    int64_t total = 0;
    for (int32_t i = 0; i < kn; i++) total += j->outs[i].n_tokens;
    int32_t *rlen = ff_malloc((size_t)kn * sizeof *rlen), *fin = ff_malloc((size_t)kn * sizeof *fin);
    int32_t *tok = ff_malloc((size_t)(total ? total : 1) * sizeof *tok);
    float *lp = ff_malloc((size_t)(total ? total : 1) * sizeof *lp);
    int rc = -1;
    if (rlen && fin && tok && lp) {
        int64_t off = 0;
        for (int32_t i = 0; i < kn; i++) {
            ff_gen_output *o = &j->outs[i];
            rlen[i] = o->n_tokens;
            fin[i] = (int32_t)o->finish;
            if (o->n_tokens) {
                memcpy(tok + off, o->tokens, (size_t)o->n_tokens * sizeof *tok);
                memcpy(lp + off, o->logprobs, (size_t)o->n_tokens * sizeof *lp);
            }
            off += o->n_tokens;
        }
        rlw_gen_done d = {j->owner, j->k, j->n, rlen, fin, tok, lp, total, moved};
        cb(ctx, &d);
        rc = 0;
    }
    free(rlen), free(fin), free(tok), free(lp);
    job_free(j);
    s->jobs[ji] = s->jobs[--s->njobs];
    return rc;
}

int rlw_gen_step(rlw *s, rlw_gen_cb cb, void *ctx) {
    if (!s->ro) return 0;
    if (ff_rollout_pending(s->ro) > 0 && ff_rollout_step(s->ro) < 0) return ff_error_wrap("rl.generate");
    ff_gen_output o;
    while (ff_rollout_take(s->ro, &o) == 1) {
        int ji = find_job(s, o.id);
        if (ji < 0) { /* a dropped job's sequence */
            ff_gen_output_free(&o);
            continue;
        }
        gen_job *j = &s->jobs[ji];
        int32_t slot = (int32_t)(o.id - j->first_req) * j->n + o.sample;
        ff_gen_output_free(&j->outs[slot]); /* never filled twice, but be safe */
        j->outs[slot] = o;
        j->filled[slot] = true;
        if (--j->remaining == 0 && deliver(s, ji, cb, ctx, NULL) != 0) return -1;
    }
    return 0;
}

void rlw_gen_abort(rlw *s, void *owner) {
    for (int i = 0; i < s->njobs; i++) {
        gen_job *j = &s->jobs[i];
        if (j->owner != owner) continue;
        for (int32_t p = 0; p < j->k; p++) ff_rollout_abort(s->ro, j->first_req + (uint64_t)p);
        job_free(j);
        s->jobs[i] = s->jobs[--s->njobs];
        return;
    }
}

void rlw_gen_clear(rlw *s) {
    while (s->njobs) rlw_gen_abort(s, s->jobs[0].owner);
}

int rlw_gen_open(const rlw *s) { return s->njobs; }
bool rlw_gen_waiting(const rlw *s) { return s->ro && ff_rollout_pending(s->ro) != ff_rollout_running(s->ro); }
void rlw_gen_prefill_rate(const rlw *s, int64_t *tokens, double *seconds) {
    *tokens = 0, *seconds = 0;
    if (!s->ro) return;
    const ff_rollout_stats *st = ff_rollout_stats_of(s->ro);
    *tokens = st->prefilled_tokens + st->recomputed_tokens;
    *seconds = st->prefill_s + st->recompute_s;
}
void rlw_gen_kv_take(rlw *s, int64_t out[5]) {
    out[0] = out[1] = out[2] = out[3] = out[4] = 0;
    if (!s->ro) return;
    int32_t pool, rows;
    out[0] = ff_rollout_kv_peak_take(s->ro, &pool, &rows);
    out[1] = pool, out[2] = rows;
    ff_rollout_decode_steps_take(s->ro, &out[3], &out[4]);
}
int32_t rlw_gen_free_slots(const rlw *s) { return s->ro ? ff_rollout_room(s->ro) : 0; }

/* ---- long-tail migration ------------------------------------------------------------------- */
/* Every open job's unfinished sequences out of the rollout (the waiting ones have no state:
 * the caller waits for none), in job order, each job's in [k n] order. with_kv false drops
 * nothing here: the rows are exported so that auto can count positions, and cut before writing. */
typedef struct mig_seq {
    ff_rollout_seq_state st;
    void *owner;
    int32_t index;
} mig_seq;

static void mig_free(mig_seq *q, int32_t m) {
    for (int32_t i = 0; i < m; i++) ff_gen_seq_state_free(&q[i].st);
    free(q);
}

/* The sequences back into the rollout under their own ids (a failed send): the jobs go on here
 * as if nothing had moved (bitwise with the rows; a recompute otherwise). */
static void mig_restore(rlw *s, mig_seq *q, int32_t m) {
    for (int32_t i = 0; i < m; i++)
        if (ff_rollout_import(s->ro, &q[i].st) != 0) /* its slot was just freed: only memory can fail */
            ff_warn("rl.migrate_out: sequence %d could not be put back: %s", i, ff_error_message());
}

int rlw_gen_migrate_out(rlw *s, const rlw_mig_costs *how, rlw_mig_send_fn send, void *send_ctx, rlw_gen_cb cb, void *ctx,
                        rlw_mig_report *rep) {
    memset(rep, 0, sizeof *rep);
    if (rlw_gen_lockstep(s))
        return ff_error_set("rl.migrate_out", "migrate with data-parallel generation workers (tp 1, pp 1)",
                            "a TP or PP generation replica does not migrate its samples");
    if (s->ro && rlw_gen_waiting(s)) return ff_error_set("rl.migrate_out", "migrate once every sample decodes", "samples wait for a slot");
    int32_t m = 0;
    for (int ji = 0; s->ro && ji < s->njobs; ji++) m += s->jobs[ji].remaining;
    mig_seq *q = ff_calloc((size_t)(m ? m : 1), sizeof *q);
    if (!q) return -1;
    /* auto exports the rows, then counts: the cost model needs the positions */
    const bool export_kv = how->how != RLW_MIG_RECOMPUTE;
    int32_t got = 0;
    for (int ji = 0; s->ro && ji < s->njobs; ji++) {
        gen_job *j = &s->jobs[ji];
        for (int32_t i = 0; i < j->k * j->n; i++) {
            if (j->filled[i]) continue;
            if (got == m || ff_rollout_export(s->ro, j->first_req + (uint64_t)(i / j->n), i % j->n, export_kv, &q[got].st) != 0) {
                mig_restore(s, q, got);
                mig_free(q, got);
                return got == m ? ff_error_set("rl.migrate_out", NULL, "more open sequences than the jobs count")
                                : ff_error_wrap("rl.migrate_out");
            }
            q[got].owner = j->owner, q[got].index = i;
            rep->positions += q[got].st.prompt_len + q[got].st.n_gen - 1;
            got++;
        }
    }
    rep->how = how->how == RLW_MIG_RECOMPUTE ? RLW_MIG_RECOMPUTE : RLW_MIG_KV;
    if (how->how == RLW_MIG_AUTO && m && how->link_bytes_per_s > 0 && how->prefill_tokens_per_s > 0 && q[0].st.kv.data) {
        const ff_gen_kv *kv = &q[0].st.kv; /* the same model: the same bytes per position for every sequence */
        ff_migrate_costs c = {.kv_bytes_per_token = 2.0 * kv->layers * kv->kv_heads * kv->head_dim * 4.0,
                              .link_bytes_per_s = how->link_bytes_per_s,
                              .prefill_tokens_per_s = how->prefill_tokens_per_s};
        rep->how = ff_migrate_choose(&c, rep->positions) == FF_MIGRATE_RECOMPUTE ? RLW_MIG_RECOMPUTE : RLW_MIG_KV;
    }
    /* the wire: one buffer of states, their lengths, each one's job and response */
    size_t cap = 0;
    for (int32_t i = 0; i < m; i++) {
        if (rep->how == RLW_MIG_RECOMPUTE && q[i].st.kv.data) {
            free(q[i].st.kv.data);
            q[i].st.kv.data = NULL;
        }
        cap += ff_gen_seq_state_size(&q[i].st);
    }
    uint8_t *buf = ff_malloc(cap ? cap : 1);
    int64_t *lens = ff_malloc((size_t)(m ? m : 1) * sizeof *lens);
    void **owners = ff_malloc((size_t)(m ? m : 1) * sizeof *owners);
    int32_t *index = ff_malloc((size_t)(m ? m : 1) * sizeof *index);
    int rc = buf && lens && owners && index ? 0 : -1;
    size_t used = 0;
    for (int32_t i = 0; rc == 0 && i < m; i++) {
        size_t w = ff_gen_seq_state_write(&q[i].st, buf + used, cap - used);
        if (!w) rc = ff_error_wrap("rl.migrate_out");
        lens[i] = (int64_t)w, owners[i] = q[i].owner, index[i] = q[i].index;
        used += w;
    }
    rep->moved = m, rep->bytes = (int64_t)used;
    if (rc == 0) {
        rlw_mig_batch b = {m, buf, lens, owners, index, (int64_t)used};
        rc = send(send_ctx, &b);
    }
    if (rc != 0) { /* nothing left: the sequences go on here */
        mig_restore(s, q, m);
        rep->moved = rep->bytes = 0;
    }
    mig_free(q, m);
    free(buf);
    /* each job out as migrated: its finished samples, the others' marks (their bytes) */
    while (rc == 0 && s->njobs) {
        gen_job *j = &s->jobs[0];
        int64_t *mark = ff_calloc((size_t)(j->k * j->n), sizeof *mark);
        if (!mark) {
            rc = -1;
            break;
        }
        for (int32_t i = 0; i < m; i++)
            if (owners[i] == j->owner) mark[index[i]] = lens[i];
        rc = deliver(s, 0, cb, ctx, mark); /* removes the job */
        free(mark);
    }
    free(lens), free(owners), free(index);
    return rc;
}

int rlw_gen_import(rlw *s, void *owner, const uint8_t *states, const int64_t *lens, int32_t m) {
    if (need(s, FF_RL_GEN)) return -1;
    if (rlw_gen_lockstep(s))
        return ff_error_set("rl.migrate_in", "migrate with data-parallel generation workers (tp 1, pp 1)",
                            "a TP or PP generation replica does not take migrated samples");
    if (!s->ro)
        return ff_error_set("rl.migrate_in", "the controller syncs the weights after training, before generating",
                            "the generating copy gave its weights back for the actor's training");
    if (m < 1) return ff_error_set("rl.migrate_in", NULL, "no sequence states");
    if (s->njobs == s->jobs_cap) {
        int cap = s->jobs_cap ? 2 * s->jobs_cap : 16;
        gen_job *v = ff_realloc(s->jobs, (size_t)cap * sizeof *v);
        if (!v) return -1;
        s->jobs = v;
        s->jobs_cap = cap;
    }
    gen_job *j = &s->jobs[s->njobs];
    *j = (gen_job){owner, s->next_req, m, 1, m, ff_calloc((size_t)m, sizeof(ff_gen_output)), ff_calloc((size_t)m, sizeof(bool))};
    if (!j->outs || !j->filled) {
        job_free(j);
        return -1;
    }
    int64_t off = 0;
    for (int32_t i = 0; i < m; i++) {
        ff_rollout_seq_state st;
        /* a request id of this engine's (the sender's would collide with ours), sample 0 of it */
        int rc = lens[i] < 1 ? ff_error_set("rl.migrate_in", NULL, "state %d has %lld bytes", i, (long long)lens[i])
                             : ff_gen_seq_state_read(states + off, (size_t)lens[i], &st);
        if (rc == 0) {
            st.id = s->next_req + (uint64_t)i;
            st.sample = 0;
            rc = ff_rollout_import(s->ro, &st);
            ff_gen_seq_state_free(&st);
        }
        if (rc != 0) {
            for (int32_t b = 0; b < i; b++) ff_rollout_abort(s->ro, s->next_req + (uint64_t)b);
            job_free(j);
            return ff_error_wrap("rl.migrate_in: sequence %d of %d", i, m);
        }
        off += lens[i];
    }
    s->next_req += (uint64_t)m;
    s->njobs++;
    return 0;
}

/* ---- scoring ----------------------------------------------------------------------------- */
/* ff_rl_sample views of packed samples; per-sample output pointers into out [sum rlen]. */
static ff_rl_sample *views(const rlw_samples *in, float *out, float ***outp, float *out2, float ***outp2) {
    ff_rl_sample *v = ff_calloc((size_t)(in->n ? in->n : 1), sizeof *v);
    float **p = out ? ff_calloc((size_t)(in->n ? in->n : 1), sizeof *p) : NULL;
    float **p2 = out2 ? ff_calloc((size_t)(in->n ? in->n : 1), sizeof *p2) : NULL;
    if (!v || (out && !p) || (out2 && !p2)) {
        free(v), free(p), free(p2);
        return NULL;
    }
    int64_t po = 0, ro = 0;
    for (int32_t i = 0; i < in->n; i++) {
        v[i].prompt = in->prompt + po;
        v[i].prompt_len = in->plen[i];
        v[i].response = in->resp + ro;
        v[i].response_len = in->rlen[i];
        const float *c[FF_RL_NCOL];
        for (int k = 0; k < FF_RL_NCOL; k++) c[k] = in->col[k] ? in->col[k] + ro : NULL;
        v[i].old_logprob = c[FF_RL_COL_OLD_LOGPROB];
        v[i].advantages = c[FF_RL_COL_ADVANTAGES];
        v[i].ref_logprob = c[FF_RL_COL_REF_LOGPROB];
        v[i].old_values = c[FF_RL_COL_OLD_VALUES];
        v[i].returns = c[FF_RL_COL_RETURNS];
        if (p) p[i] = out + ro;
        if (p2) p2[i] = out2 + ro;
        po += in->plen[i];
        ro += in->rlen[i];
    }
    if (outp) *outp = p;
    if (outp2) *outp2 = p2;
    return v;
}

/* The pipeline a role's scoring runs over (every stage of the replica gets the outputs), or NULL. */
static const ff_roles_pipe *pipe_of(const rlw *s, unsigned role) {
    const rlw_lay *y = lay_of(s, role);
    return y->at.pp > 1 ? &y->pipe : NULL;
}

int rlw_logprob(rlw *s, unsigned role, const rlw_samples *in, int32_t micro_batch, float *logp, float *ent) {
    if (need(s, role) || od_acquire(s, role)) return -1;
    if (!ff_model_params_held(model_of(s, role)))
        return ff_error_set("rl.logprob", "score with the generating copy after a weight sync, or with the actor",
                            "the %s gave its weights back for the actor's training", role_name(role));
    float **pl = NULL, **pe = NULL;
    ff_rl_sample *v = views(in, logp, &pl, ent, &pe);
    if (!v) return -1;
    /* at the rollout's sampling temperature, as the rollout's own log-probs (verl does the same) */
    ff_score_opts o = {.micro_batch_size = micro_batch, .temperature = sampling_temperature(s->run), .pipe = pipe_of(s, role)};
    int rc = ff_score_logprobs(model_of(s, role), v, in->n, &o, pl, pe);
    free(v), free(pl), free(pe);
    return rc ? ff_error_wrap("%s log-probs", role_name(role)) : 0;
}

int rlw_values(rlw *s, const rlw_samples *in, int32_t micro_batch, float *values) {
    if (need(s, FF_RL_CRITIC)) return -1;
    float **pv = NULL;
    ff_rl_sample *v = views(in, values, &pv, NULL, NULL);
    if (!v) return -1;
    ff_score_opts o = {.micro_batch_size = micro_batch, .pipe = pipe_of(s, FF_RL_CRITIC)};
    int rc = ff_score_values(s->critic, v, in->n, &o, pv);
    free(v), free(pv);
    return rc ? ff_error_wrap("critic values") : 0;
}

int rlw_reward_model(rlw *s, const rlw_samples *in, int32_t micro_batch, float *scores) {
    if (need(s, FF_RL_REWARD) || od_acquire(s, FF_RL_REWARD)) return -1;
    ff_rl_sample *v = views(in, NULL, NULL, NULL, NULL);
    if (!v) return -1;
    ff_score_opts o = {.micro_batch_size = micro_batch, .pipe = pipe_of(s, FF_RL_REWARD)};
    int rc = ff_score_reward_model(s->rm, v, in->n, &o, scores);
    free(v);
    return rc ? ff_error_wrap("reward model") : 0;
}

/* ---- training ------------------------------------------------------------------------------- */
/* The trainer's last pipelined step into s->timeline, its times shifted by `at` (when the
 * step began after the handler did). */
static int keep_timeline(rlw *s, const ff_trainer *t, int32_t pp_rank, double at) {
    s->ntimeline = 0;
    const ff_pipe_schedule *sc;
    double t0;
    const ff_pipe_exec *e = ff_trainer_last_pipe(t, &sc, &t0);
    if (!e) return 0;
    const double *st, *en;
    int64_t n;
    ff_pipe_exec_times(e, &st, &en, &n);
    if (n > s->timeline_cap) {
        double *b = ff_realloc(s->timeline, (size_t)n * 5 * sizeof *b);
        if (!b) return -1;
        s->timeline = b, s->timeline_cap = n;
    }
    const ff_pipe_instr *in = sc->streams[pp_rank].instr;
    for (int64_t i = 0; i < n; i++) {
        double *r = s->timeline + i * 5;
        r[0] = in[i].op, r[1] = in[i].micro, r[2] = in[i].chunk, r[3] = at + t0 + st[i], r[4] = at + t0 + en[i];
    }
    s->ntimeline = n;
    return 0;
}

int64_t rlw_train_timeline(const rlw *s, const double **rows) {
    *rows = s->timeline;
    return s->ntimeline;
}

static void metrics_row(const ff_train_metrics *tm, double *m) {
    const double vals[FF_RL_NM] = {
        [FF_RL_M_STEPS] = (double)tm->steps,     [FF_RL_M_SKIPPED] = (double)tm->skipped, [FF_RL_M_MICRO] = (double)tm->micro_batches,
        [FF_RL_M_TOKENS] = (double)tm->tokens,   [FF_RL_M_SAMPLES] = (double)tm->samples, [FF_RL_M_LOSS] = tm->loss,
        [FF_RL_M_PG] = tm->pg_loss,              [FF_RL_M_KL] = tm->kl_loss,              [FF_RL_M_ENT_AGG] = tm->entropy,
        [FF_RL_M_CLIP] = tm->clipfrac,           [FF_RL_M_APPROX_KL] = tm->approx_kl,     [FF_RL_M_RATIO_MAX] = tm->ratio_max,
        [FF_RL_M_ENT_MEAN] = tm->entropy_mean,   [FF_RL_M_VLOSS] = tm->value_loss,        [FF_RL_M_VCLIP] = tm->vf_clipfrac,
        [FF_RL_M_VMEAN] = tm->value_mean,        [FF_RL_M_GNORM] = tm->grad_norm,         [FF_RL_M_LR] = tm->lr,
        [FF_RL_M_TIME] = tm->time_s,             [FF_RL_M_BUBBLE] = tm->pipe_bubble,
    };
    memcpy(m, vals, sizeof vals);
}

int rlw_train(rlw *s, unsigned role, const rlw_samples *in, const int32_t *mb, int32_t n_micro, double denom, ff_coll_comm *comm,
              double *m) {
    const int64_t entry_ns = ff_now_ns(); /* the handler calls this first */
    rlw_weights_release(s); /* the rollout stage is over here: training needs the memory */
    ff_trainer *t = role == FF_RL_ACTOR ? s->t_actor : role == FF_RL_CRITIC ? s->t_critic : NULL;
    if (!t)
        return ff_error_set("rl.train", "the graph needs a train node for the role, and the worker must host it",
                            "this worker has no %s trainer", role_name(role));
    if (role == FF_RL_ACTOR && gen_release(s) != 0) return -1;
    ff_rl_sample *v = views(in, NULL, NULL, NULL, NULL);
    if (!v) return -1;
    ff_train_metrics tm = {0}; /* a step that fails its checks leaves it untouched */
    const rlw_lay *y = lay_of(s, role);
    s->comm = y->dp_comm ? y->dp_comm : comm;
    int64_t t0 = ff_now_ns();
    int rc = ff_trainer_step(t, v, in->n, mb, n_micro, denom, &tm);
    s->comm = NULL;
    free(v);
    if (keep_timeline(s, t, y->at.pp_rank, (double)(t0 - entry_ns) * 1e-9) != 0) rc = -1;
    const ff_pipe_exec *e = ff_trainer_last_pipe(t, NULL, NULL);
    s->n_stage_times = e && y->at.pp <= FF_FUSE_MAX_NODES ? y->at.pp : 0;
    if (s->n_stage_times) ff_pipe_exec_stage_times(e, 0, s->stage_fwd, s->stage_bwd);
    metrics_row(&tm, m);
    return rc;
}

int32_t rlw_train_stage_times(const rlw *s, const double **fwd, const double **bwd) {
    *fwd = s->stage_fwd, *bwd = s->stage_bwd;
    return s->n_stage_times;
}

int rlw_train_fused(rlw *s, const rlw_samples in[2], const int32_t *const mb[2], const int32_t n_micro[2], const rlw_split *split,
                    const double denom[2], const ff_fuse_instance *inst, const ff_fuse_schedule *sched, ff_coll_comm *comm, double *m) {
    const int64_t entry_ns = ff_now_ns();
    const char *w = "rl.train_fused";
    rlw_weights_release(s);
    if (!s->t_actor || !s->t_critic)
        return ff_error_set(w, "the graph needs train nodes for the actor and the critic, both hosted here",
                            "this worker has no %s trainer", s->t_actor ? "critic" : "actor");
    /* this rank's critic replica: its block of the actor's pipeline (ff_run_config_critic_place) */
    const int32_t cpp = s->clay->at.pp, reps = cpp > 0 && s->lay.at.pp % cpp == 0 ? s->lay.at.pp / cpp : 0, b = reps ? s->lay.at.pp_rank / cpp : 0;
    if (split->n != reps)
        return ff_error_set(w, "split the critic's share into one part per critic replica of the actor's pipeline",
                            "the share has %d critic replica(s); this worker's actor pipeline (pp %d) holds %d of critic pp %d", (int)split->n,
                            (int)s->lay.at.pp, (int)reps, (int)cpp);
    const int32_t q0 = split->at[b], q1 = split->at[b + 1];
    if (q0 < 0 || q1 < q0 || q1 > n_micro[1])
        return ff_error_set(w, NULL, "critic replica %d's micro-batches [%d, %d) of %d", (int)b, (int)q0, (int)q1, (int)n_micro[1]);
    if (gen_release(s) != 0) return -1;
    ff_rl_sample *va = views(&in[0], NULL, NULL, NULL, NULL), *vc = va ? views(&in[1], NULL, NULL, NULL, NULL) : NULL;
    int32_t *cmb = vc ? ff_malloc((size_t)(q1 - q0 + 1) * sizeof *cmb) : NULL; /* [q1 - q0 + 1] the replica's offsets from 0 */
    if (!cmb) {
        free(va), free(vc);
        return -1;
    }
    const int32_t s0 = mb[1][q0];
    for (int32_t q = q0; q <= q1; q++) cmb[q - q0] = mb[1][q] - s0;
    ff_train_metrics tm[2] = {{0}, {0}};
    /* each model's DP sum on its own group (the critic's replicas span the actor's pipelines),
     * where the fused streams place its step: at the same point on every rank of the model */
    s->comm = s->lay.dp_comm ? s->lay.dp_comm : comm;
    s->ccomm = s->clay->dp_comm ? s->clay->dp_comm : s->comm;
    const ff_trainer_share sa = {va, in[0].n, mb[0], n_micro[0], denom[0]}, sc = {vc + s0, cmb[q1 - q0], cmb, q1 - q0, denom[1]};
    const int64_t t0 = ff_now_ns();
    int rc = ff_trainer_step_fused(s->t_actor, s->t_critic, inst, sched, &sa, &sc, &tm[0], &tm[1]);
    s->comm = s->ccomm = NULL;
    free(va), free(vc), free(cmb);
    if (keep_timeline(s, s->t_actor, s->lay.at.pp_rank, (double)(t0 - entry_ns) * 1e-9) != 0) rc = -1;
    metrics_row(&tm[0], m);
    metrics_row(&tm[1], m + FF_RL_NM);
    return rc;
}

/* ---- weight sync ------------------------------------------------------------------------------ */
int64_t rlw_sync_received(const rlw *s) { return s->sync_received; }
bool rlw_sync_delta(const rlw *s, int64_t out[3]) {
    memcpy(out, s->sync_delta, sizeof s->sync_delta);
    return s->run->roles[FF_ROLE_ACTOR].rollout_delta && !s->xfer;
}

/* train -> generate, before the copy takes its memory: the actor's gradients (zero after its
 * step) given back and its AdamW state to host memory (roles.actor.offload), so that the
 * rank holds the generation shard and the KV cache, not those beside them. Marked away first:
 * a half-done move is finished by actor_back. */
static int actor_away(rlw *s) {
    memset(s->off_out, 0, sizeof s->off_out);
    if (!s->gen_transient || !s->run->roles[FF_ROLE_ACTOR].offload || !s->t_actor || s->actor_away) return 0;
    s->actor_away = true;
    ff_offload_stats os;
    const int64_t t0 = ff_now_ns();
    const bool had = ff_model_grads_held(s->actor);
    if (ff_model_release_grads(s->actor) != 0 || ff_optimizer_offload(ff_trainer_optimizer(s->t_actor), &os) != 0)
        return ff_error_wrap("offloading the actor for generation");
    s->off_out[0] = (double)os.bytes;
    s->off_out[1] = had ? 4.0 * (double)ff_model_param_count(s->actor) : 0;
    s->off_out[2] = (double)(ff_now_ns() - t0) * 1e-9;
    return 0;
}

/* generate -> train, once the copy gave its memory back: zeroed gradients and AdamW again */
static int actor_back(rlw *s) {
    memset(s->off_in, 0, sizeof s->off_in);
    if (!s->actor_away) return 0;
    ff_offload_stats os;
    const int64_t t0 = ff_now_ns();
    if (ff_model_restore_grads(s->actor) != 0 || ff_optimizer_reload(ff_trainer_optimizer(s->t_actor), &os) != 0)
        return ff_error_wrap("restoring the actor for training");
    s->actor_away = false;
    s->off_in[0] = (double)os.bytes;
    s->off_in[1] = 4.0 * (double)ff_model_param_count(s->actor);
    s->off_in[2] = (double)(ff_now_ns() - t0) * 1e-9;
    return 0;
}

bool rlw_offload(const rlw *s, bool reload, double out[3]) {
    memcpy(out, reload ? s->off_in : s->off_out, 3 * sizeof *out);
    return out[0] > 0 || out[1] > 0;
}

/* generate -> train: the generating copy gives back its parameters and its rollout (the KV
 * cache, the decode workspace) until the next sync; the trained shard never moved; then the
 * actor's gradients and AdamW state come back (actor_back) */
static int gen_release(rlw *s) {
    memset(s->off_in, 0, sizeof s->off_in);
    if (!s->gen_transient || !ff_model_params_held(s->gen)) return actor_back(s);
    if (s->njobs || (s->ro && ff_rollout_running(s->ro) > 0))
        return ff_error_set("rl.train", "the controller trains after generation ends", "%d generation jobs are open", s->njobs);
    ff_rollout_destroy(&s->ro);
    return ff_model_release_params(s->gen) != 0 ? -1 : actor_back(s);
}

/* train -> generate, first half: the copy's parameter memory back (filled by the caller) */
static int gen_restore(rlw *s) { return ff_model_restore_params(s->gen) ? ff_error_wrap("weight sync") : 0; }

/* ... second half: its rollout again */
static int gen_ready(rlw *s) {
    if (s->ro) return 0;
    return (s->ro = ff_rollout_new(s->gen, &s->ro_cfg)) ? 0 : ff_error_wrap("weight sync");
}

int rlw_sync_local(rlw *s) {
    s->sync_received = 0;
    rlw_weights_release(s);
    if (need(s, FF_RL_ACTOR) || need(s, FF_RL_GEN)) return -1;
    if (s->ro && ff_rollout_running(s->ro) > 0) return ff_error_set("weight sync", NULL, "sequences are still decoding");
    if (actor_away(s) != 0 || gen_restore(s) != 0) return ff_error_wrap("weight sync");
    /* a view in the actor's layout reads every weight where the actor keeps it */
    if (ff_model_viewed(s->gen) != s->actor && ff_model_copy_params(s->gen, s->actor) != 0) return ff_error_wrap("weight sync");
    return gen_ready(s);
}

int rlw_sync_reshard(rlw *s, ff_coll_comm *comm) {
    s->sync_received = 0;
    rlw_weights_release(s);
    /* colocated: the group split at rl.init and a plan made once; a pool of its own: the sync
     * group (the actor's replica 0 and the live generation ranks), planned again when it
     * changed */
    const bool colocated = s->xfer != NULL;
    ff_coll_comm *group = colocated ? s->xfer : comm;
    if (!group) return ff_error_set("weight sync", "the executor makes a sync group with a communicator", "no communicator");
    ff_model *src = s->actor && (colocated || s->lay.at.dp_rank == 0) ? s->actor : NULL, *dst = s->gen;
    if (!src && !dst) return need(s, FF_RL_GEN);
    if (dst && s->ro && ff_rollout_running(s->ro) > 0) return ff_error_set("weight sync", NULL, "sequences are still decoding");
    if (dst && (actor_away(s) != 0 || gen_restore(s) != 0)) return -1;
    ff_reshard_plan **plan = colocated ? &s->xplan : &s->pplan;
    if (!colocated && (s->pplan_comm != group || s->pplan_size != ff_coll_comm_size(group))) ff_reshard_plan_destroy(plan);
    if (!*plan) {
        /* a delta only into a pool (its copy keeps the weights between syncs) */
        /* on the models' buffers (dev_coll) unless a delta (hashed on the host) or into a view */
        const bool delta = s->run->roles[FF_ROLE_ACTOR].rollout_delta && !colocated;
        const ff_reshard_opts ro = {.bf16 = s->run->roles[FF_ROLE_ACTOR].rollout_bf16, .delta = delta,
                                    .device = s->dev_coll && !delta && !(dst && ff_model_viewed(dst))};
        if (!(*plan = ff_reshard_plan_new(group, src, dst, &ro)))
            return ff_error_wrap("weight sync");
        if (!colocated) s->pplan_comm = group, s->pplan_size = ff_coll_comm_size(group);
    }
    ff_reshard_stats st;
    int rc = ff_reshard_run(*plan, src, dst, &st);
    if (rc) ff_reshard_plan_destroy(plan); /* a broken group: plan again on the next */
    if (rc) return ff_error_wrap("weight sync");
    s->sync_received = st.received;
    s->sync_delta[0] = st.delta_elems, s->sync_delta[1] = st.delta_changed, s->sync_delta[2] = st.bytes_saved;
    return dst ? gen_ready(s) : 0;
}

/* The other stages' tensors into `set` on the pipeline's first stage (pp rank 0): each sends
 * its count, then per tensor a header (name length, ndim, shape), the name and the data,
 * in the order of its set; stage 0 takes them from stage 1, 2, ... in turn. */
static int gather_stages(ff_coll_comm *pp, ff_tensor_set *set) {
    enum { HDR = 2 + FF_MAX_DIMS };
    const int me = ff_coll_comm_rank(pp), n = ff_coll_comm_size(pp);
    char name[256];
    if (me != 0) {
        int64_t count = (int64_t)set->n;
        if (ff_coll_send(&count, 1, FF_DTYPE_I64, 0, pp, NULL) != 0) return -1;
        for (size_t i = 0; i < set->n; i++) {
            const ff_host_tensor *t = &set->items[i];
            int64_t h[HDR] = {(int64_t)strlen(t->name), t->ndim};
            for (int d = 0; d < t->ndim; d++) h[2 + d] = t->shape[d];
            if (ff_coll_send(h, HDR, FF_DTYPE_I64, 0, pp, NULL) != 0 ||
                ff_coll_send(t->name, (size_t)h[0], FF_DTYPE_U8, 0, pp, NULL) != 0 ||
                ff_coll_send(t->data, (size_t)ff_host_tensor_numel(t), FF_DTYPE_F32, 0, pp, NULL) != 0)
                return -1;
        }
        return 0;
    }
    for (int r = 1; r < n; r++) {
        int64_t count;
        if (ff_coll_recv(&count, 1, FF_DTYPE_I64, r, pp, NULL) != 0) return -1;
        for (int64_t i = 0; i < count; i++) {
            int64_t h[HDR];
            if (ff_coll_recv(h, HDR, FF_DTYPE_I64, r, pp, NULL) != 0) return -1;
            if (h[0] < 1 || h[0] >= (int64_t)sizeof name || h[1] < 0 || h[1] > FF_MAX_DIMS)
                return ff_error_set("checkpoint", NULL, "stage %d sent a tensor header of name length %" PRId64 ", %" PRId64 " dims", r,
                                    h[0], h[1]);
            if (ff_coll_recv(name, (size_t)h[0], FF_DTYPE_U8, r, pp, NULL) != 0) return -1;
            name[h[0]] = 0;
            /* a tensor every stage holds (the optimizer's step count): the first stage's stays */
            const ff_host_tensor *have = ff_tensor_set_find(set, name);
            ff_host_tensor *t = have ? NULL : ff_tensor_set_add(set, name, (int)h[1], h + 2);
            if (!have && !t) return ff_error_wrap("checkpoint: stage %d's tensor", r);
            int64_t numel = 1;
            for (int d = 0; d < (int)h[1]; d++) numel *= h[2 + d];
            if (have && ff_host_tensor_numel(have) != numel)
                return ff_error_set("checkpoint", NULL, "stage %d's '%s' has %" PRId64 " elements, stage 0's %" PRId64, r, name, numel,
                                    ff_host_tensor_numel(have));
            float *dst = t ? t->data : ff_malloc((size_t)(numel ? numel : 1) * sizeof *dst);
            if (!dst) return -1;
            int rrc = ff_coll_recv(dst, (size_t)numel, FF_DTYPE_F32, r, pp, NULL);
            if (!t) free(dst);
            if (rrc != 0) return -1;
        }
    }
    return 0;
}

/* ---- checkpoints --------------------------------------------------------------------------- */
static int save_role(rlw *s, unsigned role, const char *dir, ff_coll_comm *comm);

/* A checkpoint while the actor is away (it comes after the sync): its state back for the
 * export, and away again for the generation that follows. */
int rlw_save(rlw *s, unsigned role, const char *dir, ff_coll_comm *comm) {
    rlw_weights_release(s);
    const bool away = role == FF_RL_ACTOR && s->actor_away;
    if (away && actor_back(s) != 0) return -1;
    int rc = save_role(s, role, dir, comm);
    if (away && actor_away(s) != 0) rc = -1;
    return rc;
}

static int save_role(rlw *s, unsigned role, const char *dir, ff_coll_comm *comm) {
    if (role != FF_RL_ACTOR && role != FF_RL_CRITIC) return ff_error_set("rl.save", NULL, "only trained roles are saved");
    if (need(s, role)) return -1;
    ff_model *m = model_of(s, role);
    ff_trainer *t = role == FF_RL_ACTOR ? s->t_actor : s->t_critic;
    const char *name = role_name(role);
    /* a sharded optimizer's state is gathered by every replica first (so that a failure of
     * the writer cannot leave the others waiting in the gather); the weights are gathered
     * over the TP groups of replica 0, whose stages hand theirs to the first stage, whose TP
     * rank 0 writes */
    const rlw_lay *y = lay_of(s, role);
    const rlw_place *at = &y->at;
    const bool sharded = t && s->run->roles[role == FF_RL_ACTOR ? FF_ROLE_ACTOR : FF_ROLE_CRITIC].layout.zero && at->dp > 1;
    ff_tensor_set *o = NULL;
    int rc = 0;
    if (t) {
        o = ff_tensor_set_new();
        s->comm = y->dp_comm ? y->dp_comm : comm;
        rc = o ? ff_optimizer_export_state(ff_trainer_optimizer(t), o) : -1;
        s->comm = NULL;
    }
    const bool writer = at->tp_rank == 0 && at->pp_rank == 0;
    if (rc == 0 && (!sharded || at->dp_rank == 0)) {
        char path[FF_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        ff_tensor_set *w = !writer || ff_mkdirs(path) == 0 ? ff_tensor_set_new() : NULL;
        rc = w ? ff_model_export_weights(m, w) : -1;
        if (rc == 0 && at->pp > 1 && at->tp_rank == 0) rc = gather_stages(y->pp_comm, w);
        if (rc == 0 && o && at->pp > 1 && at->tp_rank == 0) rc = gather_stages(y->pp_comm, o);
        if (rc == 0 && writer) rc = ff_model_files_write(path, ff_model_config_of(m), w, role == FF_RL_ACTOR ? s->tok : NULL, FF_DTYPE_F32);
        ff_tensor_set_destroy(&w);
        snprintf(path, sizeof path, "%s/%s.optim.safetensors", dir, name);
        if (rc == 0 && writer && o) rc = ff_safetensors_save(path, o, FF_DTYPE_F32, NULL);
    }
    ff_tensor_set_destroy(&o);
    return rc ? ff_error_wrap("saving the %s into %s", name, dir) : 0;
}

int rlw_digest(rlw *s, unsigned role, uint64_t *hash, double *sum) {
    if (need(s, role) || od_acquire(s, role)) return -1;
    ff_model *m = model_of(s, role);
    if (!ff_model_params_held(m))
        return ff_error_set("rl.digest", "ask after a weight sync", "the %s holds no weights between its syncs", role_name(role));
    int64_t n = ff_model_param_count(m);
    float *buf = ff_malloc((size_t)n * sizeof *buf);
    if (!buf) return -1;
    ff_model_read_params(m, buf);
    uint64_t h = ff_hash_fnv1a(buf, (size_t)n * sizeof *buf, FF_HASH_FNV1A_INIT);
    double acc = 0;
    for (int64_t i = 0; i < n; i++) acc += buf[i];
    free(buf);
    *hash = h;
    *sum = acc;
    return 0;
}

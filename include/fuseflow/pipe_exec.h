/* fuseflow: the pipeline executor. It follows one rank's instruction stream of a pipeline
 * schedule (fuseflow/pipeline.h: GPipe, 1F1B, interleaved 1F1B, forward-only, or another
 * generator's, such as RLHFuse's fused actor+critic pipeline) on that rank's stage models
 * (fuseflow/model.h, ff_model_stage): forwards and backwards of micro-batches through its
 * chunks, the activations and gradients sent and received through a transport one grouped call
 * at a time, the sum of the tied embeddings' gradients between the first and the last stage,
 * and the optimizer step, whose gradient norm the stage models sum over the group. It records
 * when every instruction ran, and with that the bubble of the step.
 *
 * Use (every rank of the pipeline group, the same schedule and micro-batches everywhere):
 *     ff_pipe_config c = {.pp = 2, .micro = 8, .kind = FF_PIPE_1F1B, .layers = cfg.num_hidden_layers};
 *     ff_pipe_schedule s;        ff_pipe_generate(&c, &s);
 *     ff_pipe_transport t;       ff_pipe_transport_coll(pp_comm, &t);  // or the host's own
 *     int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
 *     ff_model_comm norm;        ff_pipe_model_comm(&t, &norm);
 *     ff_model_stage st;         ff_pipe_stage_layers(&s, 0, rank, first, count, &st);
 *     st.comm = &norm;
 *     ff_model *m = ff_model_new_opts(be, &cfg, whole_weights, &(ff_model_opts){.stage = &st});
 *     ff_pipe_exec_model em = {.model = m, .opt = ff_optimizer_new(m, &adamw), .logprobs = true,
 *                              .loss = my_loss, .loss_ctx = ...};
 *     ff_pipe_exec *e = ff_pipe_exec_new(&s, rank, &t, &em);
 *     ff_pipe_run r = {.micro = {batches}};     // [8] ff_batch, the same on every rank
 *     ff_pipe_exec_stats stats;
 *     ff_pipe_exec_run(e, &r, &stats);          // one training step
 *
 * Buffers: activations and gradients cross as fp32 [T, H] per micro-batch (T its tokens), in
 * host memory, or in the models' backend's memory when the transport moves device memory
 * (ff_pipe_transport.device); the executor keeps a pool of them sized by the largest
 * micro-batch, so a step allocates nothing once one step has run with micro-batches as large.
 *
 * Sends: over a transport with send_post a send instruction posts its transfer and the rank goes
 * on (Megatron's and NCCL's asynchronous sends); the buffer goes back to the pool once the send
 * is done, and the run waits for all of its sends before each optimizer step (whose hook and
 * sums may block on other groups while a send moves only with this rank's calls) and before
 * its closing sum. Receives block.
 *
 * Failure: a rank whose run fails (a bad batch, a broken transport) returns -1 + error naming
 * the instruction, drops its stages' forwards in flight (a later run starts clean) and leaves
 * the other ranks waiting in their next transfer; the host breaks the group
 * (ff_coll_comm_abort), as with any collective. Buffers of sends still in flight stay out of
 * the pool until the transport says they are done (a later run waits for them first); destroy
 * the executor after its group is broken or destroyed.
 *
 * Not here: choosing the layout (the planner, fuseflow/plan.h), data parallelism across
 * pipelines (the trainer's all-reduce), overlapping receives with compute, zero-bubble
 * schedules. docs/pipeline.md ("Execution") has the whole story.
 */
#ifndef FUSEFLOW_PIPE_EXEC_H
#define FUSEFLOW_PIPE_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/coll.h"
#include "fuseflow/fuse.h"
#include "fuseflow/model.h"
#include "fuseflow/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- transport ------------------------------------------------------------------------- */

typedef enum { FF_PIPE_XFER_SEND = 0, FF_PIPE_XFER_RECV } ff_pipe_xfer_kind;

typedef struct ff_pipe_xfer {
    ff_pipe_xfer_kind kind;
    int32_t peer;   /* rank in the pipeline group */
    float *buf;     /* [count]: read (send) or written (receive); host memory, or with the
                     * transport's device a device address of that backend (never dereferenced
                     * on the host there) */
    size_t count;   /* floats */
} ff_pipe_xfer;

/* What the executor needs of the pipeline group (ranks are the schedule's ranks). Functions
 * return 0, or -1 + error when the group is broken. The struct is copied; ctx must outlive the
 * executor (and the stage models given ff_pipe_model_comm). */
typedef struct ff_pipe_transport {
    int32_t rank, size;
    void *ctx;
    /* One grouped call: every transfer posted together (ncclGroupStart ... End), returning when
     * all are done. The k-th send from rank a to rank b carries the k-th receive of b from a. */
    int (*call)(void *ctx, const ff_pipe_xfer *x, int n);
    /* Optional (both or neither): sends that do not block. send_post posts one send (x->buf is
     * left unchanged until it is done), in the channel's order with the calls' transfers;
     * sends_done moves them and says how many of the transport's posted sends are done counted
     * from its first (wait: until all are). With them the executor posts a call's sends and
     * waits in the call for its receives only, and returns a sent buffer to its pool once the
     * send is done (at the latest at the end of the run). */
    int (*send_post)(void *ctx, const ff_pipe_xfer *x);
    int (*sends_done)(void *ctx, bool wait, uint64_t *done);
    /* buf [n] = its sum over the group, in place, the same bits on every rank */
    int (*all_reduce_sum_f64)(void *ctx, double *buf, size_t n);
    /* NULL: transfers move host memory, and the executor keeps the activations and gradients
     * it sends and receives in host buffers. Else the stage models' backend: the transfers
     * move its memory (ff_dptr_addr addresses), and the executor keeps them in buffers there
     * (ff_model_stage_forward_dev), so they never cross host memory. The transport orders its
     * transfers after the work queued on that backend's stream and before the work queued
     * after them. */
    ff_backend *device;
} ff_pipe_transport;

/* A transport over comm, an ff_coll communicator of the pipeline group whose rank r is the
 * schedule's rank r: a call is ff_coll_send / ff_coll_recv of F32 inside ff_coll_group_start /
 * ff_coll_group_end, send_post ff_coll_send_post, sends_done ff_coll_sends_done. comm must
 * outlive the transport's users. */
void ff_pipe_transport_coll(ff_coll_comm *comm, ff_pipe_transport *out);

/* A transport over comm that moves device memory of `be` (ff_pipe_transport.device): on the
 * cpu backend ff_pipe_transport_coll's calls (its memory is host memory, which the cpu ff_coll
 * reads); on a cuda backend each call's sends and receives on comm's NCCL twin
 * (ff_coll_comm_twin, made here: a collective of comm, every rank calls this together) on a stream of
 * its own, ordered after be's stream by an event and before its next work by another; no
 * send_post there. d holds that state: it must outlive the transport's users, then
 * ff_pipe_coll_dev_fini. 0 or -1 + error. */
typedef struct ff_pipe_coll_dev {
    ff_coll_comm *comm;
    ff_backend *be;
    ff_stream *q;
    ff_event *ready, *done;
} ff_pipe_coll_dev;
int ff_pipe_transport_coll_dev(ff_pipe_coll_dev *d, ff_coll_comm *comm, ff_backend *be, ff_pipe_transport *out);
void ff_pipe_coll_dev_fini(ff_pipe_coll_dev *d);

/* The communicator a stage model takes for its gradient norm (ff_model_stage.comm): the
 * transport's sum. */
void ff_pipe_model_comm(const ff_pipe_transport *t, ff_model_comm *out);

/* The stage rank `rank` holds of model `model` (a placed schedule: stage_layers set): its
 * chunks' first layers and counts into first, count ([FF_MODEL_MAX_CHUNKS] each), and *out
 * pointing at them (comm NULL: set it). 0 or -1 + error (no layer placement, a rank without
 * that model, more chunks than a model takes). */
int ff_pipe_stage_layers(const ff_pipe_schedule *s, int model, int32_t rank, int32_t *first, int32_t *count,
                         ff_model_stage *out);

/* ---- the executor ---------------------------------------------------------------------- */

/* What the loss of a micro-batch returns: d(loss)/d(output) [T] into the arrays the executor
 * gives (zeroed; one for each output the model computes: logprobs, entropy, values), and the
 * micro-batch's term of the step's loss. Set a pointer to NULL to give no gradient for it. */
typedef struct ff_pipe_loss_out {
    float *d_logprobs, *d_entropy, *d_values;
    double loss;
} ff_pipe_loss_out;

/* The loss on the rank of the last virtual stage, called after micro-batch `micro`'s forward
 * with its outputs (the fields the model asks for, [T]). 0 or -1 + error. */
typedef int (*ff_pipe_loss_fn)(void *ctx, int32_t micro, const ff_batch *b, const ff_forward_out *out,
                               ff_pipe_loss_out *d);

/* One model of the schedule on this rank. */
typedef struct ff_pipe_exec_model {
    ff_model *model;      /* the rank's stage: its chunks are the rank's chunks of the model, in order */
    ff_optimizer *opt;    /* training: OPTIMIZER_STEP steps it; NULL for a forward-only model */
    float temperature;    /* of log-probs and entropy (0: 1) */
    bool logprobs, entropy, values; /* the head's outputs to compute (for the loss and ff_pipe_run.outs) */
    ff_pipe_loss_fn loss; /* training, on the rank of the last virtual stage */
    void *loss_ctx;
    /* Training, optional: called at OPTIMIZER_STEP once every backward of the step has run,
     * before the tied embeddings' sum and the step: the data-parallel all-reduce of the
     * stage's gradients (ff_model_grad_buffer) goes here. 0 or -1 + error. */
    int (*before_step)(void *ctx, ff_model *model);
    void *step_ctx;
} ff_pipe_exec_model;

typedef struct ff_pipe_exec ff_pipe_exec;

/* An executor of rank `rank`'s stream of s (which it borrows: s must outlive it) over t, for
 * models [s->n_models] (borrowed too; a model without instructions on this rank may be left
 * zero). Checks that each model's chunks hold the layers the schedule places on them, that
 * training models have an optimizer and (on the last virtual stage) a loss. NULL + error. */
ff_pipe_exec *ff_pipe_exec_new(const ff_pipe_schedule *s, int32_t rank, const ff_pipe_transport *t,
                               const ff_pipe_exec_model *models);
void ff_pipe_exec_destroy(ff_pipe_exec **e);

typedef struct ff_pipe_run {
    const ff_batch *micro[FF_PIPE_MAX_MODELS]; /* model i's micro-batches [s->models[i].micro], the same on every rank */
    /* NULL, or [micro]: the caller's arrays [T] for the outputs it wants (of those the model
     * computes; a NULL field is kept inside), filled on the last virtual stage's rank */
    ff_forward_out *outs[FF_PIPE_MAX_MODELS];
    bool measure;                              /* start with a barrier, so the ranks' clocks start together */
} ff_pipe_run;

typedef struct ff_pipe_exec_stats {
    double loss[FF_PIPE_MAX_MODELS];          /* sum of the micro-batches' loss terms (every rank) */
    ff_optim_stats optim[FF_PIPE_MAX_MODELS]; /* each training model's step (every rank that holds it) */
    double wall_s;     /* this rank's run, up to the closing sum */
    double compute_s;  /* its forwards and backwards */
    double transfer_s; /* its calls, waiting included */
    double step_s;     /* its optimizer steps, the tied gradients' exchange included */
    /* over the group */
    double makespan_s;      /* the latest end of any rank's last forward or backward, from the start */
    double bubble_fraction; /* 1 - sum of compute_s / (ranks x makespan_s): the simulator's bubble */
} ff_pipe_exec_stats;

/* Run this rank's stream once: zero the training models' gradients, follow every instruction,
 * then one sum over the group (the loss, the timings). 0 or -1 + error naming the rank and the
 * instruction. */
int ff_pipe_exec_run(ff_pipe_exec *e, const ff_pipe_run *r, ff_pipe_exec_stats *stats);

/* The most training forwards chunk `chunk` of model `model` holds at once in this rank's stream
 * (what the executor reserves activation room for: 1F1B min(p - s, m) at stage s, GPipe m). */
int32_t ff_pipe_exec_in_flight(const ff_pipe_exec *e, int model, int32_t chunk);

/* When each instruction of this rank's stream began and ended in the last run, in seconds from
 * its start ([*n] each, owned by e; the instructions of a call share the call's times). */
void ff_pipe_exec_times(const ff_pipe_exec *e, const double **start_s, const double **end_s, int64_t *n);
/* Mean seconds of one micro-batch's forward and backward through each virtual stage of model
 * `model` in the last run, over the group: fwd_s, bwd_s [n_stages] (bwd 0 when forward-only). */
void ff_pipe_exec_stage_times(const ff_pipe_exec *e, int model, double *fwd_s, double *bwd_s);
/* The schedule the executor follows (the one given to ff_pipe_exec_new). */
const ff_pipe_schedule *ff_pipe_exec_schedule(const ff_pipe_exec *e);
/* The simulator (ff_pipe_simulate) on the schedule with the last run's stage times, no transfer
 * latency and no step time, sends as the transport makes them (eager with send_post): the
 * bubble the schedule has with the measured compute alone.
 * 0 or -1 + error; clear *out either way. */
int ff_pipe_exec_simulate(const ff_pipe_exec *e, ff_pipe_sim *out);

/* ---- RLHFuse's fused actor and critic (fuseflow/fuse.h) ---------------------------------- */

/* What ff_pipe_fuse_instance needs of model i of a schedule besides its measured times. */
typedef struct ff_pipe_fuse_model {
    const char *name;            /* its name in the instance ("actor", "critic0", ...) */
    const char *family;          /* replicas share one; NULL: the name less its trailing digits */
    const ff_model_config *cfg;  /* hidden size and layers, for the activation bytes */
    double tokens;               /* tokens of one micro-batch (their mean over the step) */
} ff_pipe_fuse_model;

/* The fused problem of the models of e's schedule, from e's last run (on any rank: the stage
 * times are the group's): nodes = ranks; model i's stages on the ranks of its virtual stages
 * (one per rank: no interleaving), its micro-batches; fwd and bwd the mean over its stages of
 * one micro-batch's measured forward and backward seconds (ff_pipe_exec_stage_times); act the
 * activation bytes one micro-batch keeps on a stage, its mean over the stages of layers x
 * ff_plan_layer_activation_bytes(34, tokens, hidden): Megatron's count of a layer's saved
 * 16-bit activations (34 bytes per token per hidden unit, no attention scores: a fused kernel),
 * not fuseflow's fp32 workspace; what the solver weighs is the models' ratio. Layers come from
 * the schedule's placement (or the config's layers over the stages). models [n_models]. 0 or
 * -1 + error (a forward-only model, a model with two virtual stages on one rank, no run yet). */
int ff_pipe_fuse_instance(const ff_pipe_exec *e, const ff_pipe_fuse_model *models, ff_fuse_instance *out);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

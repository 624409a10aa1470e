/* fuseflow: pipeline-parallel schedules as data. Layers are split over p stages (v model chunks
 * per stage, "virtual stages") by the planner's rule; a generator writes one instruction stream
 * per rank (forward, backward, send/receive of activations and gradients in grouped calls, the
 * optimizer step) for GPipe, 1F1B and Megatron's interleaved 1F1B, training or forward-only;
 * a simulator runs the streams against each other with given stage times and checks them
 * (deadlock, data order), measuring makespan, idle time, bubble and activations in flight.
 *
 * The streams are the contract with an executor: plain structs, followed in order. A call
 * (instructions of one rank with the same `call`, always consecutive) is posted as one group
 * (ncclGroupStart ... ncclGroupEnd) and completes when all its sends and receives have; the
 * k-th send of rank a to rank b carries the tensor of the k-th receive of rank b from rank a
 * (NCCL's order matching: there are no tags). Other generators (RLHFuse's fused actor+critic
 * pipeline) build schedules of several models through ff_pipe_schedule_init, ff_pipe_model_set
 * and ff_pipe_push, and the same simulator and executor run them.
 *
 * Use:
 *     ff_pipe_config c = {.pp = 4, .vpp = 2, .micro = 8, .kind = FF_PIPE_INTERLEAVED};
 *     ff_pipe_schedule s;
 *     if (ff_pipe_generate(&c, &s) != 0) puts(ff_error_message());   // names the bad value
 *     ff_pipe_sim_opts o = {.fwd_s = 1, .bwd_s = 2};
 *     ff_pipe_sim sim;
 *     if (ff_pipe_simulate(&s, &o, &sim) != 0) puts(ff_error_message()); // deadlock: who waits
 *     ... sim.makespan_s, sim.bubble_fraction, sim.ranks[r].peak_in_flight ...
 *     ff_pipe_sim_clear(&sim);
 *     ff_pipe_schedule_clear(&s);
 *
 * Not here: running anything (no tensors, no transport), tensor parallelism, memory in bytes
 * (the planner's, fuseflow/plan.h). docs/pipeline.md describes the schedules and the formulas.
 */
#ifndef FUSEFLOW_PIPELINE_H
#define FUSEFLOW_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- instructions ---------------------------------------------------------------------- */

typedef enum {
    FF_PIPE_FORWARD = 0,    /* run the chunk's forward on the micro-batch */
    FF_PIPE_BACKWARD,       /* its backward (the forward ran before, on this rank) */
    FF_PIPE_SEND_ACT,       /* the chunk's output activation, to the next virtual stage's rank (peer) */
    FF_PIPE_RECV_ACT,       /* the chunk's input activation, from the previous virtual stage's rank */
    FF_PIPE_SEND_GRAD,      /* the gradient of the chunk's input, to the previous virtual stage's rank */
    FF_PIPE_RECV_GRAD,      /* the gradient of the chunk's output, from the next virtual stage's rank */
    FF_PIPE_OPTIMIZER_STEP, /* the model's step on this rank, after all its backwards */
    FF_PIPE_NOPS
} ff_pipe_op;

typedef struct ff_pipe_instr {
    uint8_t op;     /* ff_pipe_op */
    uint8_t model;  /* which pipeline of the schedule (0; a fused schedule numbers its models) */
    uint16_t chunk; /* the model's chunk on this rank, 0 .. chunks on the rank - 1 */
    int32_t micro;  /* micro-batch 0 .. m-1; -1 for OPTIMIZER_STEP */
    int32_t peer;   /* rank at the other end of a send or receive; -1 otherwise */
    int32_t call;   /* grouped call of a send or receive (ids ascend along the stream); -1 otherwise */
} ff_pipe_instr;

#define FF_PIPE_MAX_MODELS 4
/* The most instructions a schedule may hold (16 bytes each): bigger inputs are refused. */
#define FF_PIPE_MAX_INSTR (1 << 24)

/* One model's pipeline over the schedule's ranks: which rank holds each virtual stage. */
typedef struct ff_pipe_model {
    int32_t micro;          /* micro-batches m */
    int32_t n_stages;       /* virtual stages, p v for Megatron's layouts */
    int32_t *stage_rank;    /* [n_stages] rank of each (Megatron: k mod p), owned */
    int32_t *stage_chunk;   /* [n_stages] its chunk on that rank: the rank's stages in order (k / p) */
    int64_t *stage_layers;  /* [n_stages] transformer layers of each; NULL when not placed */
    bool forward_only;      /* inference (log-probs, values): no backward, no step */
} ff_pipe_model;

typedef struct ff_pipe_stream {
    ff_pipe_instr *instr;   /* [n], owned */
    int64_t n, cap;
} ff_pipe_stream;

typedef enum { FF_PIPE_GPIPE = 0, FF_PIPE_1F1B, FF_PIPE_INTERLEAVED, FF_PIPE_CUSTOM, FF_PIPE_NKINDS } ff_pipe_kind;

/* What ff_pipe_generate builds. */
typedef struct ff_pipe_config {
    int32_t pp;             /* stages (ranks) p >= 1 */
    int32_t vpp;            /* chunks per stage v (0 or 1: one; more only with FF_PIPE_INTERLEAVED) */
    int32_t micro;          /* micro-batches m >= 1 (a multiple of p for FF_PIPE_INTERLEAVED) */
    ff_pipe_kind kind;
    bool forward_only;
    int64_t layers;         /* transformer layers to place (0: none placed) */
    int64_t layers_first, layers_last; /* Megatron's uneven first and last stages (0: balanced) */
} ff_pipe_config;

typedef struct ff_pipe_schedule {
    ff_pipe_config config;  /* kind FF_PIPE_CUSTOM when another generator built it */
    int32_t n_ranks;
    int32_t n_models;
    /* The streams rely on sends that do not block (ff_pipe_sim_opts.eager_sends, which
     * ff_pipe_simulate then sets whatever the options say): with blocking calls they may
     * deadlock. The executor then needs a transport with send_post. */
    bool eager_sends;
    ff_pipe_model models[FF_PIPE_MAX_MODELS];
    ff_pipe_stream *streams; /* [n_ranks], owned */
} ff_pipe_schedule;

/* ---- building ------------------------------------------------------------------------- */

/* An empty schedule of n_ranks streams and n_models models (set each with ff_pipe_model_set).
 * 0 or -1 + error. */
int ff_pipe_schedule_init(ff_pipe_schedule *s, int32_t n_ranks, int32_t n_models);
/* Model `model`: m micro-batches, n_stages virtual stages on the ranks stage_rank [n_stages]
 * (copied; each rank's chunks are its stages in order), layers [n_stages] or NULL. */
int ff_pipe_model_set(ff_pipe_schedule *s, int model, int32_t micro, int32_t n_stages, const int32_t *stage_rank,
                      const int64_t *layers, bool forward_only);
/* Append one instruction to rank's stream. 0 or -1 + error (allocation, FF_PIPE_MAX_INSTR). */
int ff_pipe_push(ff_pipe_schedule *s, int32_t rank, ff_pipe_instr in);
void ff_pipe_schedule_clear(ff_pipe_schedule *s);
/* The virtual stage that chunk `chunk` of model `model` is on rank `rank`; -1 when none. */
int32_t ff_pipe_stage_of(const ff_pipe_schedule *s, int model, int32_t rank, int32_t chunk);

/* ---- the standard schedules ----------------------------------------------------------- */

/* Layers of each of the p v virtual stages (virtual stage k on stage k mod p): the planner's
 * split (ff_plan_place_layers), balanced with the shorter stages at both ends, or first and
 * last given with the rest even. 0 or -1 + error. */
int ff_pipe_place_layers(int64_t layers, int32_t pp, int32_t vpp, int64_t layers_first, int64_t layers_last,
                         int64_t *per_virtual_stage);

/* One rank per stage, one stream per rank, Megatron's orders (docs/pipeline.md):
 * GPipe: every forward, then every backward. 1F1B: min(p - s - 1, m) warm-up forwards on stage
 * s, then one forward and one backward in turn, then the rest of the backwards; each forward's
 * send is one call with the receive of the next backward's gradient, each backward's send one
 * with the receive of the next forward's input. Interleaved: virtual stage k = c p + s is chunk
 * c of stage s; micro-batches in groups of p through chunk 0, then chunk 1, ...; warm-up
 * 2 (p - s - 1) + (v - 1) p chunk forwards (all of them when m = p), steady state a forward, a
 * backward and one call of up to four transfers. Forward-only: every forward. Training ends
 * with the optimizer step. 0 or -1 + error naming the bad value (p, v, m, layers). */
int ff_pipe_generate(const ff_pipe_config *c, ff_pipe_schedule *out);

const char *ff_pipe_kind_name(ff_pipe_kind k); /* "gpipe", "1f1b", "interleaved", "custom" */
int ff_pipe_kind_parse(const char *name, ff_pipe_kind *out); /* -1 + error listing the names */
const char *ff_pipe_op_name(ff_pipe_op op);   /* "forward", "send_act", ... */
/* The planner's bubble formula for the schedule's layout (ff_plan_bubble_fraction): GPipe and
 * 1F1B (p - 1)/(m + p - 1), interleaved (p - 1)/(v m + p - 1); -1 for a custom schedule. */
double ff_pipe_bubble_formula(const ff_pipe_config *c);

/* ---- simulation and checking ---------------------------------------------------------- */

typedef struct ff_pipe_sim_opts {
    /* Seconds of one micro-batch through one virtual stage of model i, [n_stages]; NULL: a
     * rank's chunks split fwd_s (bwd_s) evenly, so a whole stage takes fwd_s (bwd_s). */
    const double *fwd_stage_s[FF_PIPE_MAX_MODELS];
    const double *bwd_stage_s[FF_PIPE_MAX_MODELS];
    double fwd_s, bwd_s;
    double hop_s;           /* blocking: from the later of a send and its receive being posted to both
                               done; eager: from the send's post to the data being there */
    double optimizer_s;
    /* Sends do not block (the executor over a transport with send_post): a send is done for its
     * rank when posted, its receive at max(send posted + hop_s, receive posted). Else a call
     * waits until each of its transfers has met its partner (rendezvous). */
    bool eager_sends;
} ff_pipe_sim_opts;

typedef struct ff_pipe_rank_stats {
    double busy_s;          /* forwards, backwards and the step */
    double idle_s;          /* makespan - busy */
    double end_s;           /* when the rank's last instruction finished */
    int32_t peak_in_flight; /* micro-batch chunks whose forward started and backward did not end
                               (forward-only: whose forward runs), at the peak */
    int64_t peak_layers;    /* layers x micro-batches of activations held at the layer peak (0 when
                               the schedule has no layer placement) */
    int32_t forwards_before_backward; /* forwards before the first backward (all when none) */
} ff_pipe_rank_stats;

typedef struct ff_pipe_sim {
    double makespan_s;
    double bubble_fraction;  /* sum of idle / (ranks x makespan) */
    int32_t n_ranks;
    ff_pipe_rank_stats *ranks; /* [n_ranks] */
    double **start_s, **end_s; /* [n_ranks][stream length]: when each instruction began and ended
                                  (a transfer: posted and done) */
    /* Set when the streams deadlock (ff_pipe_simulate returned -1): the ranks that wait and the
     * instruction each waits in; other failures leave n_stuck 0. */
    int32_t n_stuck;
    int32_t *stuck_rank;
    int64_t *stuck_instr;
} ff_pipe_sim;

/* Times proportional to the layers of each virtual stage of model `model` (which must have
 * stage_layers): a stage with the mean layer count (L / ranks) takes fwd_s and bwd_s per
 * micro-batch. fwd, bwd [n_stages] for fwd_stage_s / bwd_stage_s. 0 or -1 + error. */
int ff_pipe_times_by_layers(const ff_pipe_schedule *s, int model, double fwd_s, double bwd_s, double *fwd, double *bwd);

/* Run every rank's stream in order against the others: compute takes its time; a call waits
 * until every transfer in it has met its partner (rendezvous: a send ends only when the
 * receive is posted), or with eager_sends for its receives only. Checks as it goes that each forward has its input (received, or the
 * previous virtual stage's output on this rank), each backward its forward and its output's
 * gradient, each send the data it sends, that the k-th send of a channel and its k-th receive
 * name the same tensor (model, kind, micro-batch, consecutive virtual stages), that peers are
 * the stages' ranks, and at the end that every micro-batch ran forward through every virtual
 * stage once and backward once, and that each training model's step came after the rank's
 * backwards. 0, or -1 + error naming the rank, the instruction and what is wrong; a deadlock
 * names every waiting rank and the transfers it waits for (out->stuck_*). *out is usable (and
 * must be cleared) either way. */
int ff_pipe_simulate(const ff_pipe_schedule *s, const ff_pipe_sim_opts *o, ff_pipe_sim *out);
void ff_pipe_sim_clear(ff_pipe_sim *sim);

/* ---- output --------------------------------------------------------------------------- */

/* One instruction in the compact form of `fuseflow schedule show`: F3 (forward, micro-batch 3),
 * F3.1 (chunk 1), B3, sa3>1 (send activation to rank 1), ra3<0, sg3>0, rg3<2, step; "1:F3"
 * when the schedule has several models. */
void ff_pipe_instr_format(const ff_pipe_schedule *s, const ff_pipe_instr *in, char *buf, size_t cap);
/* The streams, one line per rank, calls in brackets; with sim (may be NULL) the makespan, the
 * bubble beside the formula, and busy, idle and peak in-flight per rank. */
void ff_pipe_write_text(const ff_pipe_schedule *s, const ff_pipe_sim *sim, FILE *out);
/* The same as one JSON object (docs/pipeline.md lists the keys); malloc'd, NULL + error. */
char *ff_pipe_json(const ff_pipe_schedule *s, const ff_pipe_sim *sim);
/* A timeline picture: one row per rank, one rectangle per forward, backward and step (colour
 * by kind, shade by chunk, the micro-batch written inside), written atomically. */
int ff_pipe_write_svg(const ff_pipe_schedule *s, const ff_pipe_sim *sim, const char *path);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

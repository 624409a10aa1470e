/* fuseflow planner: the memory, traffic, bubbles and iteration time of a parallel layout of one
 * training job on a real cluster, and a search over layouts.
 *
 * The model is analytic (no simulation, no profiling): the formulas of the textbook chapter
 * "five parallelisms and the traffic they make" (seeds/001) for memory, collectives and bubbles,
 * and the rail-only paper (seeds/004) for HB domains, rails, hierarchical collectives, the
 * iteration-time decomposition and the network cost. docs/planner.md lists every formula with its
 * source, the assumptions, and what is not modelled.
 *
 * Units: bytes, seconds, FLOPs, bytes per second. "Per step" means per optimizer step; "per
 * GPU" is one GPU of the busiest pipeline stage unless a field says "mean".
 *
 * Use:
 *     ff_plan_input in;
 *     ff_plan_input_defaults(&in);
 *     ff_plan_model_preset("llama3-405b", &in.model);
 *     ff_plan_cluster_preset("dgx-h100", &in.cluster);
 *     in.cluster.gpus = 16384; in.layout.tp = 8; in.layout.pp = 16; in.layout.dp = 128; ...
 *     ff_plan_result r;
 *     if (ff_plan_evaluate(&in, &r) != 0) puts(ff_error_message());   // names the failed constraint
 *     ... r.memory.total_bytes, r.traffic[FF_PLAN_TP].bytes, r.time.iteration_s ...
 *     ff_plan_result_clear(&r);
 *
 * Not here: running anything. The planner never touches a GPU or the network.
 */
#ifndef FUSEFLOW_PLAN_H
#define FUSEFLOW_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fuseflow/config.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- inputs ---------------------------------------------------------------------------- */

typedef struct ff_plan_model {
    char name[64];
    int64_t layers;            /* L */
    int64_t hidden;            /* h */
    int64_t heads;             /* query heads */
    int64_t kv_heads;          /* key-value heads n_kv (GQA); = heads for multi-head attention */
    int64_t head_dim;          /* d */
    int64_t ffn;               /* inner size of a dense MLP */
    int64_t vocab;
    bool tied_embeddings;      /* the LM head shares the input embedding */
    bool gated_mlp;            /* SwiGLU, three matrices (Llama); false: GeLU MLP, two (GPT) */
    bool linear_bias;          /* biases on the linear layers (GPT) */
    bool layernorm;            /* LayerNorm with bias (GPT); false: RMSNorm (Llama) */
    int64_t pos_embeddings;    /* learned position rows (GPT-3: 2048); 0 with RoPE */
    /* mixture of experts; experts == 0 is a dense model */
    int64_t experts;           /* routed experts per MoE layer, E */
    int64_t experts_per_token; /* k of top-k */
    int64_t moe_layers;        /* L_e, spread evenly over the L layers */
    int64_t expert_ffn;        /* inner size of one expert (0: ffn) */
    bool vocab_unpadded;       /* the vocabulary is split over TP as it is, so TP must divide it
                                  (fuseflow's model engine); false: padded to a multiple of TP,
                                  as Megatron does (its make-vocab-size-divisible-by) */
} ff_plan_model;

typedef struct ff_plan_workload {
    int64_t seq;               /* s, tokens per sequence */
    int64_t micro_batch;       /* b, sequences per micro-batch */
    int64_t micro_batches;     /* G, micro-batches per step per replica; 0: from global_batch */
    int64_t global_batch;      /* sequences per step (G b D); 0: from micro_batches */
    int grad_reduce_bytes;     /* bytes per gradient on the wire: 4 (FP32, Llama 3) or 2 (BF16) */
    int grad_bytes;            /* bytes per gradient in memory: 2 (BF16, the 16-byte recipe) or 4 */
    double act_coeff;          /* activation bytes per token per hidden unit of one layer (34) */
} ff_plan_workload;

typedef enum {
    FF_PLAN_1F1B = 0,
    FF_PLAN_GPIPE,
    FF_PLAN_INTERLEAVED,       /* Megatron's interleaved 1F1B with vpp chunks per stage */
    FF_PLAN_AFAB,              /* all forwards, then all backwards (GPipe's order) */
    FF_PLAN_NSCHEDULES
} ff_plan_schedule;

/* How ZeRO reduces the gradients of G micro-batches (the chapter's section 3.5 table). */
typedef enum {
    FF_PLAN_ZS_DEFAULT = 0,    /* the usual one for the stage (below) */
    FF_PLAN_ZS_ALLREDUCE,      /* ZeRO-0: accumulate, all-reduce once (DDP no_sync) */
    FF_PLAN_ZS_RS_ONCE,        /* ZeRO-1: accumulate, reduce-scatter once, all-gather weights */
    FF_PLAN_ZS_RS_EACH,        /* ZeRO-2: reduce-scatter after every micro-batch (DeepSpeed) */
    FF_PLAN_ZS_AFAB_ONCE,      /* ZeRO-2 with all-forward-all-backward: one reduce-scatter */
    FF_PLAN_ZS_LOCAL_ONCE,     /* ZeRO-2 accumulating full gradients locally (coalesced) */
    FF_PLAN_ZS_GATHER_EACH,    /* ZeRO-3: gather weights for forward and again for backward */
    FF_PLAN_ZS_KEEP_FWD_BWD,   /* ZeRO-3 keeping gathered weights from forward to backward */
    FF_PLAN_ZS_KEEP_STEP,      /* ZeRO-3 keeping gathered weights for the whole step */
    FF_PLAN_NZS
} ff_plan_zero_schedule;

typedef enum { FF_PLAN_TP = 0, FF_PLAN_CP, FF_PLAN_PP, FF_PLAN_DP, FF_PLAN_EP, FF_PLAN_NDIMS } ff_plan_dim;

typedef struct ff_plan_layout {
    int64_t tp, cp, pp, dp, ep; /* degrees; tp*cp*pp*dp = GPUs; ep divides dp (experts only) */
    int64_t vpp;               /* interleaved chunks per stage, v (1 unless interleaved) */
    bool sequence_parallel;    /* Megatron SP inside the TP group */
    int zero;                  /* 0..3 */
    ff_plan_zero_schedule zero_schedule;
    ff_plan_schedule schedule;
    bool checkpoint;           /* full activation recomputation */
    /* Rank order, innermost first: a permutation of TP, CP, PP, DP; EP may be listed too (it
     * then sits there and DP keeps only DP/EP), otherwise it is the inner part of DP. */
    int order[FF_PLAN_NDIMS];
    int n_order;
    int64_t layers_first, layers_last; /* explicit layers of the first/last stage; 0: balanced */
} ff_plan_layout;

typedef enum { FF_PLAN_CLOS = 0, FF_PLAN_RAIL_ONLY } ff_plan_topology;

typedef struct ff_plan_cluster {
    char name[64];
    int64_t gpus;
    int64_t domain;            /* GPUs per HB domain (server), x */
    double hbm_bytes;          /* per GPU */
    double nvlink_bps;         /* bytes/s per GPU per direction inside the HB domain */
    double nic_bps;            /* bytes/s per GPU to the scale-out network */
    double flops;              /* achieved FLOP/s per GPU (not peak) */
    double nvlink_latency_s;   /* per step of a collective (or per send) inside the domain */
    double nic_latency_s;      /* per step over the network */
    ff_plan_topology topology;
    double oversubscription;   /* Clos: 1 is non-blocking; r > 1 divides cross-domain bandwidth */
    int64_t radix;             /* switch ports, for the network count */
    double hbm_bps;            /* HBM bytes/s per GPU (decoding reads the weights and the KV cache
                                  every step; 0: the rollout simulator refuses) */
} ff_plan_cluster;

typedef struct ff_plan_input {
    ff_plan_model model;
    ff_plan_workload workload;
    ff_plan_layout layout;
    ff_plan_cluster cluster;
} ff_plan_input;

/* ---- outputs --------------------------------------------------------------------------- */

typedef enum { FF_PLAN_LINK_NONE = 0, FF_PLAN_LINK_NVLINK, FF_PLAN_LINK_NIC, FF_PLAN_LINK_BOTH } ff_plan_link;

/* Where the groups of one dimension sit: members per HB domain and domains per group. */
typedef struct ff_plan_group {
    int64_t size;              /* members */
    int64_t per_domain;        /* members in one HB domain (a) */
    int64_t domains;           /* HB domains the group spans (y); size = a y when regular */
    bool regular;              /* every group has the same shape, a x y grid */
    bool rail_aligned;         /* every cross-domain byte joins GPUs of the same local rank */
} ff_plan_group;

typedef struct ff_plan_traffic {
    double bytes;              /* sent per step by one GPU of the busiest stage */
    double bytes_mean;         /* mean over all GPUs */
    double nvlink_bytes;       /* of bytes, inside the HB domain */
    double nic_bytes;          /* of bytes, over the NIC */
    double messages;           /* collectives (or sends) per step, busiest stage */
    double message_bytes;      /* payload of one: the tensor a collective combines, or one send */
    double wire_s;             /* nvlink_bytes / NVLink + nic_bytes / NIC (effective) bandwidth */
    bool compute_waits;        /* on the critical path (TP, CP, EP) or overlapped (PP, DP) */
    ff_plan_link link;         /* which link carries the bytes, given rank order and domain size */
    const char *collective;    /* "all-reduce", "send/recv", ... */
    ff_plan_group group;
} ff_plan_traffic;

typedef struct ff_plan_stage {
    int64_t layers;            /* transformer layers on one GPU of this stage (all its chunks) */
    int64_t moe_layers;
    double params;             /* parameters on one GPU (dense + its experts) */
    double expert_params;
    double state_bytes;        /* weights + gradients + optimizer state, resident */
    double state_peak_bytes;   /* during gradient accumulation */
    double in_flight;          /* micro-batches whose activations are held at the peak */
    double activation_bytes;
    double buffer_bytes;       /* ZeRO-3 gathered layers, FP32 logits on the last stage */
    double total_bytes;        /* state_peak + activations + buffers */
    double flops_mb;           /* per micro-batch on one GPU (with recomputation) */
    double time_mb;            /* compute + exposed TP/CP/EP/DP time per micro-batch */
    double traffic[FF_PLAN_NDIMS]; /* bytes per step sent by one GPU */
    double nvlink_bytes, nic_bytes;
} ff_plan_stage;

typedef struct ff_plan_memory {
    double state_bytes;        /* max over stages, resident */
    double state_peak_bytes;   /* max over stages */
    double activation_bytes;   /* first stage */
    double total_bytes;        /* max over stages */
    int64_t worst_stage;       /* the stage with the largest total */
    double hbm_bytes;
    bool fits;
} ff_plan_memory;

typedef struct ff_plan_time {
    double compute_s;          /* per step, busiest stage, at the achieved FLOP/s */
    double flops_dense_mean;   /* 6 x active matmul parameters x tokens / GPUs, per step */
    double nvlink_bytes, nic_bytes;           /* per step, busiest GPU, all dimensions */
    double nvlink_bytes_mean, nic_bytes_mean;
    double nvlink_s, nic_s;    /* those bytes at full link rate */
    double bubble_fraction;    /* formula: bubble / total for the schedule */
    double bubble_of_compute;  /* formula: bubble / compute */
    double bubble_s;           /* rail-only decomposition: T_bubble */
    double last_s;             /* T_last: G micro-batches of the slowest stage */
    double sync_s;             /* T_sync: gradient sync after the last micro-batch */
    double iteration_s;        /* T_bubble + T_last + T_sync */
    double tokens_per_s;
    double compute_fraction;   /* compute_s / iteration_s */
} ff_plan_time;

typedef struct ff_plan_result {
    int64_t gpus;
    int64_t micro_batches;     /* G */
    int64_t global_batch;      /* sequences per step */
    double tokens_per_step;
    double params_total;       /* whole model */
    double params_active;      /* used by one token (MoE) */
    int64_t n_stages;
    ff_plan_stage *stages;     /* n_stages entries, owned; ff_plan_result_clear frees */
    ff_plan_memory memory;
    ff_plan_traffic traffic[FF_PLAN_NDIMS];
    ff_plan_time time;
    bool cross_domain_on_rails;   /* every byte leaving an HB domain stays on its rail */
} ff_plan_result;

/* ---- presets and inputs ---------------------------------------------------------------- */

/* Defaults: no model, a workload of one 4096-token sequence, TP=CP=PP=DP=EP=1, ZeRO-1, 1F1B,
 * order TP,CP,PP,DP, the dgx-h100 cluster with 8 GPUs. */
void ff_plan_input_defaults(ff_plan_input *in);

/* Named presets. Unknown name: -1 + error listing the known ones. */
int ff_plan_model_preset(const char *name, ff_plan_model *out);
int ff_plan_cluster_preset(const char *name, ff_plan_cluster *out);
const char *const *ff_plan_model_preset_names(void);   /* NULL-terminated */
const char *const *ff_plan_cluster_preset_names(void);

/* A Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, GPT-2 key names). */
int ff_plan_model_from_hf_config(const char *path, ff_plan_model *out);
int ff_plan_model_from_hf_json(const char *text, size_t len, const char *where, ff_plan_model *out);

/* Read the sections model, workload, layout, cluster of a configuration tree (YAML file plus
 * dotted overrides; keys in docs/planner.md) on top of the defaults. base_dir resolves a
 * relative model.config path (NULL: the working directory). Unknown keys are errors. */
int ff_plan_input_from_config(ff_config *c, const char *base_dir, ff_plan_input *out);

/* Parse "80GB", "141 GiB", "450GB/s", "400Gb/s", "400T" (FLOP/s). A bare number is in
 * default_unit ("GB", "GB/s", "Gb/s", "TFLOP/s"). */
int ff_plan_parse_quantity(const char *text, const char *default_unit, double *out);

/* "tp,cp,pp,dp" or "tp-cp-pp-dp" (innermost first) into layout->order. */
int ff_plan_parse_order(const char *text, ff_plan_layout *layout);
/* "TP8-CP1-PP16-DP128" (any order, any subset, EP and VPP too) into the degrees. */
int ff_plan_parse_layout(const char *text, ff_plan_layout *layout);

const char *ff_plan_schedule_name(ff_plan_schedule s);
const char *ff_plan_zero_schedule_name(ff_plan_zero_schedule z);
const char *ff_plan_dim_name(ff_plan_dim d);    /* "tp", "cp", ... */
const char *ff_plan_link_name(ff_plan_link l);  /* "none", "nvlink", "nic", "nvlink+nic" */
/* The schedule FF_PLAN_ZS_DEFAULT stands for at this ZeRO stage and pipeline schedule. */
ff_plan_zero_schedule ff_plan_zero_schedule_resolve(int zero, ff_plan_zero_schedule z, ff_plan_schedule s);

/* ---- evaluation ------------------------------------------------------------------------ */

/* Fill in derived values (dp from the GPU count, G from the global batch, ...) and check every
 * constraint; -1 + an error naming the one that fails. ff_plan_evaluate calls it on a copy. */
int ff_plan_resolve(ff_plan_input *in);
/* The degrees against a GPU count, the first checks of ff_plan_resolve (which calls it): all
 * positive, dp (0: inferred) such that TP x CP x PP x DP = gpus. -1 + error naming the one
 * that fails. */
int ff_plan_layout_fit(ff_plan_layout *l, int64_t gpus);
int ff_plan_evaluate(const ff_plan_input *in, ff_plan_result *out);
void ff_plan_result_clear(ff_plan_result *r);

/* Layers of each virtual stage (v*pp entries, virtual stage k runs on stage k mod pp): balanced
 * with the shorter stages first and last (Llama 3 405B: 7, 8 x 14, 7), or layers_first and
 * layers_last with the rest even (Megatron's uneven option). -1 + error when impossible. */
int ff_plan_place_layers(const ff_plan_model *m, const ff_plan_layout *l, int64_t *per_virtual_stage);

/* Parameters: whole model, used per token, and of the pieces of one layer. */
double ff_plan_params_total(const ff_plan_model *m);
double ff_plan_params_active(const ff_plan_model *m);
double ff_plan_params_attention(const ff_plan_model *m); /* one layer: Q, K, V, O (+ biases) */
double ff_plan_params_mlp(const ff_plan_model *m);       /* one dense MLP */
double ff_plan_params_expert(const ff_plan_model *m);    /* one expert */
double ff_plan_params_embedding(const ff_plan_model *m); /* the input embedding (vocab x h) */

/* ---- ranks, rails and traffic matrices ------------------------------------------------- */

typedef struct ff_plan_rank {
    int64_t rank, server, local_rank, rail, stage;
    int64_t idx[FF_PLAN_NDIMS]; /* tp, cp, pp, dp (all of DP, EP included), ep */
} ff_plan_rank;

/* Coordinates of a rank of a resolved input. */
void ff_plan_rank_coords(const ff_plan_input *in, int64_t rank, ff_plan_rank *out);

/* Every (sender, receiver) pair with traffic, once per dimension, with the bytes per step that
 * the sender sends to that receiver. Collectives follow the hierarchical algorithm (HB domain
 * plus rail) when the group is a regular grid, else an even spread over the partners. */
typedef void (*ff_plan_edge_fn)(int64_t src, int64_t dst, ff_plan_dim dim, double bytes, void *ctx);
int ff_plan_traffic_edges(const ff_plan_input *in, const ff_plan_result *r, ff_plan_edge_fn fn, void *ctx);

/* Write PREFIX.gpu.csv, PREFIX.server.csv (bytes per step, row sends to column), PREFIX.ranks.csv
 * (each GPU's server, local rank, rail, stage, coordinates) and the heatmaps PREFIX.gpu.svg and
 * PREFIX.server.svg. The GPU (server) matrix covers the first `limit` GPUs (servers) when there
 * are more. A prefix ending in .csv or .svg loses that ending. Prints each file it writes to `log`
 * when not NULL. */
int ff_plan_write_matrices(const ff_plan_input *in, const ff_plan_result *r, const char *prefix, int64_t limit,
                           FILE *log);

/* ---- network --------------------------------------------------------------------------- */

typedef struct ff_plan_fabric {
    int tiers;
    int64_t switches;
    int64_t links;             /* GPU-to-switch and switch-to-switch cables */
    int64_t transceivers;      /* two per link */
} ff_plan_fabric;

typedef struct ff_plan_network {
    ff_plan_fabric clos;       /* non-blocking folded Clos over all GPUs */
    ff_plan_fabric rail_only;  /* one non-blocking Clos per rail, over one GPU per domain */
} ff_plan_network;

int ff_plan_network_cost(int64_t gpus, int64_t domain, int64_t radix, ff_plan_network *out);
/* The network section of the report, and the same as JSON (malloc'd; NULL + error). */
int ff_plan_network_write(const ff_plan_cluster *c, FILE *out);
char *ff_plan_network_json(const ff_plan_cluster *c);
int ff_plan_fabric_clos(int64_t endpoints, int64_t radix, ff_plan_fabric *out);

/* ---- the chapter's formulas, in its symbols -------------------------------------------- */

/* Bytes one GPU sends in a ring collective of N GPUs over data of S bytes (the whole tensor). */
double ff_plan_ring_allreduce_bytes(int64_t n, double s);  /* 2 (N-1)/N S */
double ff_plan_ring_allgather_bytes(int64_t n, double s);  /* (N-1)/N S, also reduce-scatter */

/* Rail-only hierarchical all-gather on x GPUs per HB domain times y domains: each GPU first
 * exchanges its shard of D bytes along its rail, then the y D it holds inside the domain:
 *   T = (y-1) D / B_nic + (x-1) (y D) / B_hb. */
double ff_plan_hier_allgather_s(int64_t x, int64_t y, double shard_bytes, double b_hb, double b_nic);

/* Bubble for p stages, G micro-batches, v chunks (v = 1 except interleaved). */
double ff_plan_bubble_fraction(ff_plan_schedule s, int64_t p, int64_t g, int64_t v);   /* of total */
double ff_plan_bubble_of_compute(ff_plan_schedule s, int64_t p, int64_t g, int64_t v); /* of compute */
/* Micro-batches whose activations stage i (0-based) holds at its peak. */
double ff_plan_in_flight(ff_plan_schedule s, int64_t p, int64_t g, int64_t v, int64_t stage);

/* Model-state bytes per parameter with a DP (sharding) degree D, gradient bytes g in memory. */
double ff_plan_state_bytes_per_param(int zero, ff_plan_zero_schedule z, int64_t d, int grad_bytes, bool peak);
/* DP bytes one GPU sends per step for psi parameters: g_r gradient bytes on the wire, 2-byte
 * weights. zero 0: 2 f psi g_r; 1: f psi (g_r + 2); ... (docs/planner.md). */
double ff_plan_dp_bytes(int zero, ff_plan_zero_schedule z, int64_t d, double psi, int64_t g, int grad_reduce_bytes);

/* Per GPU per step, the chapter's section 3.7 (layers_per_stage may be fractional, L/p). */
double ff_plan_tp_bytes(double layers_per_stage, int64_t g, int64_t t, double tokens, int64_t h);
/* Key/value heads on one TP rank: n_kv / t, or 1 when t > n_kv (each head replicated on
 * t / n_kv ranks, as fuseflow's model engine does; t must then be a multiple of n_kv). */
double ff_plan_kv_heads_per_rank(int64_t kv_heads, int64_t t);
double ff_plan_cp_bytes(double layers_per_stage, int64_t g, int64_t c, int64_t seq, int64_t kv_heads, int64_t t,
                        int64_t head_dim);
double ff_plan_pp_bytes(int64_t v, int64_t g, double tokens, int64_t h, int64_t t); /* middle stage */
double ff_plan_ep_bytes(double moe_layers_per_stage, int64_t g, int64_t e, double tokens, int64_t k, int64_t h);
/* Activation bytes of one layer for one micro-batch on one GPU (34 s b h / t with SP). */
double ff_plan_layer_activation_bytes(double coeff, double tokens, int64_t h, int64_t t, bool sp);

/* ---- search ---------------------------------------------------------------------------- */

typedef struct ff_plan_search_opts {
    int64_t global_batch;      /* sequences per step (required) */
    int64_t max_tp, max_cp, max_pp, max_vpp, max_mbs, max_ep; /* 0: no limit beyond validity */
    bool try_checkpoint;       /* also try full recomputation */
    unsigned zero_mask;        /* bit z: try ZeRO-z (0: stages 0..3) */
    size_t top;                /* how many to keep (default 10) */
    int64_t min_tokens;        /* skip layouts whose GPUs hold fewer tokens per micro-batch (b s / CP) */
    size_t max_candidates;     /* stop after this many (0: all), for benchmarks */
    bool naive;                /* evaluate each candidate from scratch (the benchmark's baseline) */
} ff_plan_search_opts;

typedef struct ff_plan_candidate {
    ff_plan_layout layout;
    int64_t micro_batch, micro_batches;
    double iteration_s, total_bytes, bubble_fraction, tokens_per_s, compute_fraction;
} ff_plan_candidate;

typedef struct ff_plan_search_result {
    ff_plan_candidate *best;   /* fastest first, n_best entries, owned */
    size_t n_best;
    size_t evaluated;          /* candidates that passed every constraint and were evaluated */
    size_t fitting;            /* of those, within HBM */
    double elapsed_s;
} ff_plan_search_result;

/* Rank the layouts of base's model, cluster (GPU count, HBM) and sequence length that fit, by
 * estimated iteration time. base's layout supplies the rank order and sequence parallelism. */
int ff_plan_search(const ff_plan_input *base, const ff_plan_search_opts *opts, ff_plan_search_result *out);
void ff_plan_search_result_clear(ff_plan_search_result *r);

/* ---- resharding (3D-HybridEngine) ----------------------------------------------------- */

/* An actor that trains in layout (p, t, d) and generates in (pg, tg): on the same GPUs
 * (gen_workers 0; tg must divide t and pg divide p, micro-DP dg = t p / (tg pg)) or on a separate
 * pool of gen_workers GPUs. docs/planner.md, "Resharding (3D-HybridEngine)". */
typedef struct ff_plan_reshard_input {
    ff_plan_model model;
    ff_plan_cluster cluster;   /* gpus 0: t p d */
    ff_plan_layout train;      /* tp, pp, dp (0: from the GPUs) and the rank order; CP, EP, VPP 1 */
    int64_t gen_tp, gen_pp;    /* tg, pg */
    int dtype_bytes;           /* bytes per weight: 2 (bf16) or 4 (fp32) */
    int64_t gen_workers;       /* 0: generate on the training GPUs; N: a separate pool of N GPUs */
} ff_plan_reshard_input;

/* One way of resharding, seen from its busiest rank. */
typedef struct ff_plan_reshard_path {
    double recv_bytes;         /* bytes one rank receives */
    double nvlink_bytes, nic_bytes; /* of recv_bytes, inside the HB domain / over the NIC */
    double peak_bytes;         /* weights resident on one rank at the peak */
    double time_s;             /* those bytes at the links' rates (bandwidth only) */
} ff_plan_reshard_path;

typedef struct ff_plan_reshard {
    int64_t gpus, train_dp;
    double model_bytes;        /* M = parameters x dtype bytes */
    double train_shard_bytes;  /* M / (t p) */
    double gen_shard_bytes;    /* M / (tg pg) */
    int64_t micro_dp;          /* dg (same GPUs) */
    int64_t group_per_domain, group_domains; /* where the slowest micro-DP group sits */
    ff_plan_reshard_path hybrid; /* 3D-HybridEngine: all-gather inside micro-DP groups */
    ff_plan_reshard_path naive;  /* every rank gathers the whole model, then slices */
    ff_plan_reshard_path rank0;  /* rank 0 gathers the model and broadcasts it */
    ff_plan_reshard_path pool;   /* separate pool: each generation rank receives its shard */
    int64_t pool_senders;      /* training ranks one generation rank receives from */
    int64_t pool_replicas;     /* generation replicas, gen_workers / (tg pg) */
    double pool_send_bytes;    /* bytes one training rank sends to the pool */
} ff_plan_reshard;

/* Defaults: bf16, TP1-PP1 generation, dp and gpus from each other, the dgx-h100 cluster. */
void ff_plan_reshard_input_defaults(ff_plan_reshard_input *in);
/* -1 + error naming the bad value: generation's TP x PP not dividing training's, a layout the
 * model cannot take (heads, FFN, layers), a pool that is not whole replicas. */
int ff_plan_reshard_evaluate(const ff_plan_reshard_input *in, ff_plan_reshard *out);
void ff_plan_reshard_write(const ff_plan_reshard_input *in, const ff_plan_reshard *r, FILE *out);
char *ff_plan_reshard_json(const ff_plan_reshard_input *in, const ff_plan_reshard *r); /* malloc'd; NULL + error */


/* ---- generation + inference with long-tail migration (RLHFuse's inter-stage fusion) ----- */

#define FF_PLAN_ROLLOUT_MAX_INFER 4
#define FF_PLAN_ROLLOUT_SWEEP 12
#define FF_PLAN_ROLLOUT_MAX_SURVIVORS 16

/* One iteration's generation and inference stage on `cluster.gpus` GPUs: the actor decodes
 * `samples` responses on gpus / gen_tp instances (continuous batching), and every finished
 * sample needs one forward of each inference model (reference, reward, critic) on its prompt
 * and response. docs/planner.md, "Generation and inference (RLHFuse)", gives the model. */
typedef struct ff_plan_rollout_input {
    ff_plan_model actor;
    ff_plan_model infer[FF_PLAN_ROLLOUT_MAX_INFER];
    int n_infer;
    ff_plan_cluster cluster;    /* gpus: the stage's GPUs; hbm_bps and flops are used */
    int64_t gen_tp;             /* GPUs per generation instance */
    int64_t samples;            /* responses per iteration */
    int64_t prompt_len;         /* tokens per prompt */
    int64_t max_len;            /* response cap, tokens */
    double median_len;          /* response lengths: log-normal with this median (tokens) ... */
    double p99_ratio;           /* ... and p99 / median (> 1), capped at max_len */
    const int64_t *lengths;     /* or the lengths themselves [samples] (NULL: drawn) */
    uint64_t seed;
    double migrate;             /* R_t: migrate once at most migrate x samples still decode;
                                   0: never; < 0: the best of a sweep (auto) */
    int64_t survivors;          /* instances the tail moves onto: 0: the fewest whose decode batch
                                   stays within the saturation size; > 0: that many (fewer than the
                                   instances); < 0: the best of that rule and of 1 ..
                                   FF_PLAN_ROLLOUT_MAX_SURVIVORS (the runtime's auto, where a step
                                   costs in proportion to its batch and freeing an instance for
                                   inference may pay even so) */
    double dtype_bytes;         /* weights and KV cache (2: bf16) */
    /* Optional measured costs instead of the roofline (the runtime's, or a test's): seconds of
     * one decode step of an instance at `batch` sequences holding `context` tokens of KV cache;
     * GPU-seconds of all inference models' forwards over `tokens` tokens; seconds to move the KV
     * cache of `tokens` tokens to another instance. All three or none. */
    double (*step_s)(void *ctx, int64_t batch, int64_t context);
    double (*infer_gpu_s)(void *ctx, int64_t tokens);
    double (*move_s)(void *ctx, int64_t tokens);
    void *cost_ctx;
    double move_latency_s;      /* a sending instance's fixed cost before its first sample arrives
                                   (the runtime's round trip of the decision), seconds; 0: none */
} ff_plan_rollout_input;

typedef struct ff_plan_rollout_run {
    double gen_s;               /* the last sample's end */
    double total_s;             /* the last inference forward's end */
    double rt;                  /* threshold (fraction of samples; 0: none) */
    double migrate_at_s;        /* when the migration happened (0: never) */
    int64_t moved;              /* samples moved */
    int64_t survivors;          /* instances still generating after it */
    double moved_tokens;        /* KV cache moved, tokens */
    double move_s;              /* its transfer time (the slowest receiver) */
} ff_plan_rollout_run;

typedef struct ff_plan_rollout {
    int64_t instances;
    int64_t batch_cap;          /* sequences an instance's KV memory holds at prompt + max_len */
    int64_t batch_saturation;   /* the largest decode batch whose step costs at most 1.25 x one sequence's */
    double median_len, p99_len, longest; /* of the lengths simulated, tokens */
    double infer_gpu_s;         /* all inference work, GPU-seconds */
    double serial_s;            /* generation, then inference on every GPU */
    ff_plan_rollout_run overlap; /* each instance starts inference when its own samples are done */
    ff_plan_rollout_run migrate; /* and the long tail moves onto survivors at R_t */
    int n_sweep;                /* auto: the thresholds tried and their totals (the best survivor count's) */
    double sweep_rt[FF_PLAN_ROLLOUT_SWEEP], sweep_s[FF_PLAN_ROLLOUT_SWEEP];
} ff_plan_rollout;

/* Defaults: dgx-h100, gen_tp 1, 512 samples, prompts of 512, max 1024, median 128, p99 10x,
 * migrate auto, bf16. */
void ff_plan_rollout_input_defaults(ff_plan_rollout_input *in);
/* -1 + error naming the bad value (no GPUs, gen_tp not dividing them, a model TP cannot split,
 * a batch that does not fit, lengths out of range). */
int ff_plan_rollout_simulate(const ff_plan_rollout_input *in, ff_plan_rollout *out);
void ff_plan_rollout_write(const ff_plan_rollout_input *in, const ff_plan_rollout *r, FILE *out);
char *ff_plan_rollout_json(const ff_plan_rollout_input *in, const ff_plan_rollout *r); /* malloc'd; NULL + error */

/* ---- reports --------------------------------------------------------------------------- */

/* The readable report (memory per stage, traffic per dimension, time, network). */
void ff_plan_report_write(const ff_plan_input *in, const ff_plan_result *r, FILE *out);
/* One JSON object (docs/planner.md lists the keys); a malloc'd string, NULL + error. */
char *ff_plan_report_json(const ff_plan_input *in, const ff_plan_result *r);
void ff_plan_search_write(const ff_plan_input *base, const ff_plan_search_result *r, FILE *out);
char *ff_plan_search_json(const ff_plan_input *base, const ff_plan_search_result *r);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

/* fuseflow: the Llama-family decoder (Llama 2/3, Qwen2/2.5, Mistral without sliding window)
 * on a compute backend: forward over packed variable-length batches, backward into every
 * parameter, AdamW, and batched generation with a KV cache.
 *
 * Host <-> model: weights come in and go out as named host fp32 tensor sets (Hugging Face
 * names, include/fuseflow/model_config.h; checkpoint files are model/io's business). Batches
 * are host arrays of token ids; per-token results (log-probs, entropy, values) come back as
 * host arrays, and their gradients go in as host arrays: the RLHF losses are plain C on
 * those (DESIGN.md). Everything else stays in backend buffers.
 *
 * Parameters live in one flat fp32 buffer of ff_model_param_count() floats, gradients (of a
 * trainable model; see ff_model_opts) in another of the same layout, so a data-parallel
 * all-reduce or a weight sync is one call on one buffer. The layout is fixed by the config (two models of the same config share it),
 * not by Hugging Face's tensor order; use the tensor-set functions for named access.
 *
 * Threads: a model (and its generators) is used by one thread at a time.
 */
#ifndef FUSEFLOW_MODEL_H
#define FUSEFLOW_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/backend.h"
#include "fuseflow/dtype.h"
#include "fuseflow/model_config.h"
#include "fuseflow/tensor_set.h"
#include "fuseflow/util.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef struct ff_model ff_model;

/* ---- configuration and weights ---------------------------------------------------------- */

/* Check that a config describes a model this engine runs: positive sizes, heads divisible
 * by kv heads, an even head_dim, rms_norm_eps > 0, rope_theta > 0, a supported rope scaling
 * (none or llama3) with sane factors. 0, or -1 + error naming the field. `where` (e.g. the
 * config.json path) prefixes the message; may be NULL. */
int ff_model_config_check(const ff_model_config *cfg, const char *where);

/* The names and shapes of every tensor the model expects, in a fixed order (embeddings,
 * layers 0..L-1 as in model_config.h, final norm, lm_head unless tied, score when
 * value_head). Fills `out` (an empty set) with zero tensors. 0 or -1 + error. */
int ff_model_expected_tensors(const ff_model_config *cfg, ff_tensor_set *out);

/* Random initialisation as Hugging Face's _init_weights: every linear and embedding weight
 * ~ Normal(0, std = initializer_range) (0.02 when initializer_range <= 0), biases 0, norm
 * weights 1, the embedding row of pad_token_id (when >= 0) zero. Deterministic for a seed
 * (the draws come from ff_rng in the fixed tensor order above). Fills `out` (an empty set).
 * 0 or -1 + error. */
int ff_model_init_weights(const ff_model_config *cfg, uint64_t seed, double initializer_range, ff_tensor_set *out);

/* ---- tensor parallelism ------------------------------------------------------------------ */

/* What a tensor-parallel model (or a sharded optimizer, ff_optimizer_opts) needs of its
 * group, supplied by its host (a worker backs it with ff_coll, tests with threads):
 * collectives on host memory, called by every rank of the group in the same order with the
 * same n (SPMD). Each returns 0, or -1 + error (the group is broken; the model call that ran
 * it fails). The model copies device data through the host around each call. The struct is
 * copied; ctx must outlive the model (the optimizer). */
typedef struct ff_model_comm {
    int rank, size; /* this rank in the TP group, 0 <= rank < size */
    void *ctx;      /* the host's, passed to every call */
    /* in place: buf[i] = sum (max) over the group of buf[i], the same bits on every rank */
    int (*all_reduce_sum)(void *ctx, float *buf, size_t n);
    int (*all_reduce_max)(void *ctx, float *buf, size_t n);
    int (*all_reduce_sum_f64)(void *ctx, double *buf, size_t n);
    /* out[r * n + i] = in[i] of rank r; out holds size * n floats */
    int (*all_gather)(void *ctx, const float *in, float *out, size_t n);
    /* The sharded optimizer's and sequence parallelism's. counts [size], the
     * same array on every rank; displ r = counts[0] + ... + counts[r - 1], N = the sum.
     * reduce-scatter: out [counts[rank]] = sum over the group of in [displ rank ..], in
     * holds N floats. all-gather: out [N] holds every rank's in [counts[r]] at displ r. */
    int (*reduce_scatter_sum_v)(void *ctx, const float *in, float *out, const size_t *counts);
    int (*all_gather_v)(void *ctx, const float *in, float *out, const size_t *counts);
    /* Optional (all three or none): the same collectives on the model's device buffers, for a
     * group whose library reads the backend's memory (NCCL beside a cuda backend, the cpu
     * ff_coll beside the cpu backend: ff_backend_shares_memory_with). `st` is the model's
     * stream: the collective comes after the work queued on it so far and before the work
     * queued after it (enqueue it on st, or on a stream of the host's ordered with events,
     * ff_event_record / ff_stream_wait; but on st itself while st captures a graph,
     * ff_stream_capturing: a generator's decode graphs record them); it may still be running
     * when the call returns. Where
     * these are set, the collectives that move activations and gradients (the row-parallel
     * all-reduces, sequence parallelism's gathers and scatters, the k/v gradient sums, the
     * sharded optimizer's gradient reduce-scatter and parameter all-gather) run on device
     * buffers and nothing is copied through host memory; the rest (a few floats a token:
     * the vocabulary's log-sum-exp, the gradient norm; exports) keep the host calls above,
     * which stay required. In place: all_gather_v's in may be out + displ rank, and
     * reduce_scatter_sum_v's out in + displ rank. */
    int (*dev_all_reduce_sum)(void *ctx, ff_stream *st, ff_dptr buf, size_t n);
    int (*dev_all_gather_v)(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts);
    int (*dev_reduce_scatter_sum_v)(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts);
} ff_model_comm;

/* Whether comm supplies the device-buffer collectives (all three; checked where a model or
 * optimizer takes the group: one or two of them is an error). */
static inline bool ff_model_comm_on_device(const ff_model_comm *comm) {
    return comm && comm->dev_all_reduce_sum && comm->dev_all_gather_v && comm->dev_reduce_scatter_sum_v;
}

/* Can `cfg` be split over tp_size ranks (Megatron-style, docs/model.md "Tensor
 * parallelism")? num_attention_heads, intermediate_size and vocab_size must be multiples of
 * tp_size, and num_key_value_heads a multiple or a divisor of it (when tp_size is larger,
 * each key/value head is replicated on tp_size / num_key_value_heads ranks). 0 or -1 + error
 * naming the field. */
int ff_model_tp_check(const ff_model_config *cfg, int tp_size, const char *where);

/* Rank comm->rank of a tensor-parallel model of comm->size ranks (comm NULL or size 1: the
 * same as ff_model_new). It holds only its shards: the q/k/v rows of its query heads and of
 * the key/value heads they read, the gate/up rows and down_proj columns of its slice of
 * intermediate_size, the o_proj columns of its heads, the embedding and LM head rows of its
 * vocabulary slice (tied too); norms and the value head whole. `weights` are the whole
 * Hugging Face tensors (checked as ff_model_new does), of which each rank copies its
 * slices, or, tensor by tensor, already this rank's shards (ff_model_tp_read_weights). Every
 * rank of the group calls every model function that runs the model or moves weights in the
 * same order (forward, backward, optimizer step, export, generation): they run
 * collectives. Parameter and gradient buffers, ff_model_param_count and the read/write
 * functions are this rank's shard; the export functions give whole tensors. Not
 * available under TP: the logits output of ff_model_forward (the [T, V] logits are never
 * gathered). A failure on one rank (a bad batch, out of memory) leaves the others waiting
 * in their next collective: the host breaks the group (ff_coll_comm_abort). NULL + error. */
ff_model *ff_model_new_tp(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *weights,
                          const ff_model_comm *comm);
typedef struct ff_model_stage ff_model_stage; /* a pipeline stage: below */

/* Read rank tp_rank of tp_size's shards of the whole-tensor checkpoint in dir
 * (model.safetensors, or model.safetensors.index.json and its shards) into `out` (an empty
 * set), as fp32 tensors of the shard's shape, which ff_model_new_tp and
 * ff_model_load_weights take as they take whole ones. The files are mapped and only the
 * shard's bytes are read: one range per tensor split by rows, one per row for o_proj and
 * down_proj (split by columns; the pages around those ranges are read too). Tensors the
 * model does not split (norms, score) and those it does not know come whole. 0 or -1 +
 * error. */
int ff_model_tp_read_weights(const char *dir, const ff_model_config *cfg, int tp_rank, int tp_size, ff_tensor_set *out);
/* The same for a pipeline stage (stage NULL: the whole model): only the tensors of its layers,
 * and the embedding only on the stage with layer 0 (tied: also on the one with the last
 * layer, its LM head's copy); the final norm and the heads come to every stage (what the
 * stage does not hold it ignores, as with whole tensors). tp_size 1 reads whole tensors. */
int ff_model_read_shards(const char *dir, const ff_model_config *cfg, int tp_rank, int tp_size, const ff_model_stage *stage,
                         ff_tensor_set *out);

/* The TP degree and this rank (1 and 0 without TP). */
int ff_model_tp_size(const ff_model *m);
int ff_model_tp_rank(const ff_model *m);

/* A model on `be` with the given weights (copied; `weights` may be freed afterwards).
 * Checks the config (ff_model_config_check) and every expected tensor: a missing name, a
 * wrong shape or a non-finite value is an error naming the tensor. Tensors the model does
 * not use are ignored, except lm_head.weight beside tie_word_embeddings, which is an error
 * (the checkpoint and config disagree). When value_head is set and the weights have no
 * lm_head.weight (and embeddings are not tied), the model is a critic without an LM head:
 * it returns values, and asking it for log-probs, entropy or logits is an error.
 * NULL + error. */
ff_model *ff_model_new(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *weights);

/* What a model is made for. A model that only infers (a reference or reward model, the
 * generating copy of an actor, `fuseflow generate` and `logprobs`) has no gradient buffer,
 * keeps no activations for a backward, and costs its parameters' bytes and a forward
 * workspace; asking it for a training forward, a backward, gradients or an optimizer is an
 * error naming the mode. */
typedef struct ff_model_opts {
    bool inference;             /* false (the default, and ff_model_new's): trainable */
    const ff_model_comm *comm;  /* a tensor-parallel group (as ff_model_new_tp), or NULL */
    const ff_model_stage *stage; /* a pipeline stage: some of the layers (below), or NULL: all */
    /* Sequence parallelism inside the TP group (Megatron-style, docs/model.md "Sequence
     * parallelism"; no effect without comm or at size 1): the training and scoring forward
     * and backward keep the residual stream, the norms and the value head on this rank's
     * rows of the batch's tokens (T split over the ranks, T % size need not be 0, but T >=
     * size), an all-gather before each column-parallel block and a reduce-scatter after each
     * row-parallel one instead of the all-reduces. The results (log-probs, entropy, values,
     * gradients, a stage's hidden states [T, H] in and out) are the same as without it. comm
     * must supply reduce_scatter_sum_v and all_gather_v. Generation (ff_generator, the KV
     * cache) keeps the replicated path. */
    bool sequence_parallel;
    /* A view model (docs/run.md "Memory of the colocated copy"): an inference model (needs
     * inference) of the same config on the same backend whose tensors are made of pieces.
     * Where view_of holds units of a tensor along its TP axis (rows, columns, or all of a
     * whole tensor; ff_model_tensor_info), this model reads them in place from view_of's
     * parameter buffer; only the rest is its own (ff_model_memory_of: params, those bytes;
     * viewed, the others), so the generation shard over the training shard stores no weight
     * twice. view_of must outlive this model and keep its parameter buffer (a trainable model
     * does); its updates show here at once. ff_model_write_tensor, ff_model_write_params and
     * the weights given at creation write the own pieces only (the viewed ones are
     * view_of's); reading gives every piece. Not for a view: exporting weights and
     * ff_model_copy_params (errors: use view_of, or a model of its own). */
    const ff_model *view_of;
    /* bf16 weights (needs inference, not with view_of): the weight matrices (embedding, LM
     * head, score, and every layer's projections) are stored as bf16, half their fp32 bytes;
     * norms and biases stay fp32, and so does every product's accumulation (ff_gemm_bf16w);
     * activations are fp32, except on a backend whose products are bf16, where any inference
     * model's forwards (not generation's) hold the layers' activations in bf16 as a trainable
     * model's with bf16 products do, so that the two score alike (docs/model.md "bf16
     * products"). Weights given or written in fp32 are rounded to nearest even; reading
     * them gives the rounded values back, widened. On the CPU the products are the batch
     * invariant fixed-order ones, so log-probs and generated tokens are those of an fp32
     * model holding the rounded weights (docs/model.md "bf16 weights"). */
    bool bf16_weights;
} ff_model_opts;

/* As ff_model_new, with options (NULL: as ff_model_new). The weights are copied. */
ff_model *ff_model_new_opts(ff_backend *be, const ff_model_config *cfg, const ff_tensor_set *weights,
                            const ff_model_opts *opts);

/* As ff_model_new, with options (NULL: trainable), taking the weights: *weights is destroyed
 * and NULLed whatever the outcome, and each tensor's host memory is given back while it is
 * copied onto the backend, so the host copy and the model's parameters never both exist
 * whole (the peak of loading is the parameters and a few MiB, not twice the parameters). */
ff_model *ff_model_new_from(ff_backend *be, const ff_model_config *cfg, ff_tensor_set **weights, const ff_model_opts *opts);

/* A model straight from a model folder (config.json into *cfg, then model.safetensors or the
 * sharded index): the checkpoint's headers are checked as ff_model_dir_load checks its
 * tensors (ff_hf_check_dir), the model's buffers are made (opts as ff_model_new_from takes
 * them: inference, bf16 weights, a TP group, a pipeline stage; not a view), and each tensor
 * it holds (under TP only this rank's block) is read from the mapped files a few rows at a
 * time, checked for non-finite values, and stored, bf16 where the model keeps bf16. So
 * loading holds the model's own bytes and 4 MiB of staging: no fp32 copy of the checkpoint
 * (ff_model_dir_load's set, 4 bytes a parameter, held whole before ff_model_new_from gives it
 * back). Tensors the model does not hold (another stage's, a tied checkpoint's copy of the
 * embedding as lm_head.weight) are not read. NULL + error naming the folder and the tensor. */
ff_model *ff_model_load_dir(ff_backend *be, const char *dir, const ff_model_opts *opts, ff_model_config *cfg);
void ff_model_destroy(ff_model **m);

const ff_model_config *ff_model_config_of(const ff_model *m);
ff_backend *ff_model_backend(const ff_model *m);
bool ff_model_has_lm_head(const ff_model *m);
/* Number of trainable fp32 parameters (tied embeddings counted once; under TP this rank's,
 * replicated tensors included; a pipeline stage's, its tied copy included). */
int64_t ff_model_param_count(const ff_model *m);
/* Created with ff_model_opts.inference. */
bool ff_model_is_inference(const ff_model *m);

/* The bytes a model holds on its backend: parameters (ff_model_param_count() x 4; a view
 * model's own pieces only; with bf16 weights 2 bytes a weight-matrix element, 4 a norm or bias
 * element), gradients (ff_model_param_count() x 4, 0 for an inference model)
 * and the forward/backward workspace (grown by the largest batch so far; a training forward
 * keeps every layer's activations there: `activations`, the part of workspace that the sets
 * of activations hold; with bf16 products the inputs of the products they keep are bf16).
 * viewed: a view model's parameter bytes read in place from the model it views (allocated
 * there, not here; 0 for others). */
typedef struct ff_model_memory {
    int64_t params, grads, workspace;
    int64_t activations;
    int64_t viewed;
} ff_model_memory;
void ff_model_memory_of(const ff_model *m, ff_model_memory *out);

/* Current weights into `out` (an empty set) under Hugging Face names, e.g. for a
 * checkpoint; whole tensors under TP too (gathered: every rank calls, every rank gets them);
 * a pipeline stage's own tensors (not the last stage's tied copy). 0 or -1 + error. */
int ff_model_export_weights(ff_model *m, ff_tensor_set *out);
/* The gradient buffer the same way (names and shapes of the weights). 0 or -1 + error. */
int ff_model_export_grads(ff_model *m, ff_tensor_set *out);
/* Replace the weights from a set of whole tensors (same checks as ff_model_new; under TP
 * each rank takes its slices). 0 or -1 + error. */
int ff_model_load_weights(ff_model *m, const ff_tensor_set *weights);

/* The flat parameter and gradient buffers: ff_model_param_count() floats each, same
 * layout. For all-reduce of gradients and weight sync between models of one config. An
 * inference model has no gradient buffer (NULL); a view model's parameter buffer holds its
 * own pieces only (use ff_model_read_params for its flat layout). Asking for the parameter
 * buffer counts as writing the weights (bf16 products: the next forward makes its copy again);
 * write through a buffer kept from an earlier call only after asking again. */
ff_buffer *ff_model_param_buffer(ff_model *m); /* bf16 weights: not the fp32 layout (ff_model_read_params is) */
ff_buffer *ff_model_grad_buffer(ff_model *m);
/* Flat copies to and from host memory (n = ff_model_param_count() floats). The gradient
 * copies return 0, or -1 + error on an inference model. */
void ff_model_read_params(ff_model *m, float *host);
void ff_model_write_params(ff_model *m, const float *host);
int ff_model_read_grads(ff_model *m, float *host);
int ff_model_write_grads(ff_model *m, const float *host);
/* Copy all parameters from src into dst (same config; may be on different backends). 0 or
 * -1 + error. */
int ff_model_copy_params(ff_model *dst, ff_model *src);

/* ---- forward and backward ---------------------------------------------------------------- */

/* A packed batch of S variable-length sequences, T tokens in all. Sequence s is tokens
 * [seq_start[s], seq_start[s+1]); positions restart at 0 for each sequence and no token
 * attends across sequences, so a padded batch is a packed batch whose sequences have the
 * padded lengths (or, better, the unpadded ones). */
typedef struct ff_batch {
    int32_t n_tokens;          /* T >= 1 */
    int32_t n_seqs;            /* S >= 1 */
    const int32_t *tokens;     /* [T] input ids, each in [0, vocab_size) */
    const int32_t *seq_start;  /* [S + 1]: 0 = seq_start[0] <= ... <= seq_start[S] = T */
    const int32_t *targets;    /* [T] or NULL: the token whose log-prob position t predicts
                                  (normally tokens[t + 1] in the same sequence); -1 = none */
} ff_batch;

/* targets[t] = tokens[t + 1] inside each sequence, -1 at each sequence's last token. */
void ff_batch_shift_targets(const int32_t *tokens, const int32_t *seq_start, int32_t n_seqs, int32_t *targets);

typedef struct ff_forward_opts {
    bool train;        /* keep activations for ff_model_backward */
    float temperature; /* log-probs and entropy of softmax(logits / temperature); 0 means 1 */
} ff_forward_opts;

/* Host outputs; NULL fields are not computed. */
typedef struct ff_forward_out {
    float *logprobs; /* [T] log p(targets[t]) (0 where targets[t] == -1); needs targets */
    float *entropy;  /* [T] entropy of the next-token distribution at t (nats) */
    float *values;   /* [T] value head output at t (needs value_head) */
    float *logits;   /* [T, V] raw logits (before temperature) */
} ff_forward_out;

/* Run the (whole: ff_model_is_whole) model over a batch. With opts->train the activations
 * stay for one backward (ff_model_backward must then get gradients only for outputs computed
 * here; an error on an inference model); a later training forward replaces them, a forward
 * without train leaves them. Training or not, the forward computes the same numbers. The first
 * batch with more tokens than any before grows the workspace (allocation); batches up to
 * that size allocate nothing (see ff_model_reserve). 0, or -1 + error: bad batch (a token
 * id out of range, offsets that do not cover [0, T), a sequence longer than
 * max_position_embeddings), an output the model lacks (log-probs on a critic). */
int ff_model_forward(ff_model *m, const ff_batch *b, const ff_forward_opts *opts, ff_forward_out *out);

/* Backward through the last training forward. Inputs are d(loss)/d(output) per token, host
 * arrays [T] or NULL (zero): d_logprobs, d_entropy, d_values. Parameter gradients are
 * accumulated (+=) into the gradient buffer, so micro-batches accumulate until
 * ff_model_zero_grad. 0 or -1 + error (an inference model, no training forward before, a
 * gradient for an output that forward did not compute). */
int ff_model_backward(ff_model *m, const float *d_logprobs, const float *d_entropy, const float *d_values);
int ff_model_zero_grad(ff_model *m); /* 0, or -1 + error on an inference model */

/* Size the workspace for batches of up to max_tokens tokens now (0 or -1 + error when out
 * of memory), so that the first forward does not allocate: a trainable model's for a
 * training forward (every layer's activations, and with bf16 products the weights' bf16
 * copy), an inference model's for a forward. (A
 * scoring forward while a training forward waits for its backward takes room of its own.) */
int ff_model_reserve(ff_model *m, int32_t max_tokens);

/* bf16 products (docs/model.md "bf16 products"): every product of a forward's layers and heads
 * multiplies by a bf16 copy of the weight matrices that a forward makes from the fp32 masters
 * after they change (2 bytes an element, counted in ff_model_memory_of's workspace;
 * ff_model_bf16_copies below); a forward, training or scoring alike (so the two give the same
 * log-probs and values bit for bit), holds the
 * layers' normed rows, q|k|v (rounded after RoPE), the attention output, gate|up's output and
 * SwiGLU's output as bf16 only, and a training forward keeps them so (attention and SwiGLU on bf16: half their bytes in
 * ff_model_memory_of's activations); the backward's products and attention read those, the
 * weights' copy and each output gradient rounded to bf16 once (ff_gemm_bf16, fp32
 * accumulation). The masters, gradients, the residual stream and the gradients between
 * kernels stay fp32. On by default for a trainable model on a backend whose products are bf16
 * (ff_backend_bf16_products: cuda, unless FF_CUDA_MATH says tf32 or fp32). Against rounding every operand per
 * product (off there) the numbers differ in the MLP (gate|up rounded before SwiGLU) and in
 * attention (on bf16 q|k|v, its output rounded), as autocast does. Off: every product
 * is ff_gemm. 0 or -1 + error: setting it on an inference model, or changing it while a
 * training forward waits for its backward. Takes effect at the next forward. Generation never
 * uses the copy. */
int ff_model_set_bf16_products(ff_model *m, bool on);
bool ff_model_bf16_products(const ff_model *m);
/* bf16 products: how many times a forward has made the weights' bf16 copy. A forward makes it
 * only where the weights changed since the last one was made (an optimizer step, a load or a
 * write of them, a weight sync into them) or the copy was given back (ff_model_release_grads,
 * turning the products off): forwards between two optimizer steps (micro-batches, a pipeline's
 * chunks, scoring) share one copy. */
int64_t ff_model_bf16_copies(const ff_model *m);

/* The LM head runs over chunks of at most max_tokens tokens, so the logits of a batch never
 * take more than max_tokens * vocab_size floats; with more than one chunk the backward
 * recomputes each chunk's logits. 0 (the default): chunks of 256 MiB of logits, or for a
 * trainable model on a device (a backend whose ff_backend_memory has a capacity: cuda) of
 * 1/32 of the device's memory where that is more (2.5 GB at 80 GB), so that a GPU micro-batch
 * keeps its logits for the backward. */
void ff_model_set_logits_chunk(ff_model *m, int32_t max_tokens);
/* The chunk, in tokens, the LM head of a forward of `tokens` tokens takes (at most tokens):
 * the batch's logits are kept for the backward when it is `tokens`. */
int32_t ff_model_logits_chunk_of(const ff_model *m, int32_t tokens);

/* Supervised loss helper: loss = -sum_t mask[t] * logprobs[t] / max(1, sum_t mask[t]) over
 * T tokens (token-mean cross-entropy), d_logprobs[t] = -mask[t] / max(1, sum mask) scaled by
 * `scale` (e.g. 1 / number of micro-batches). mask NULL = all ones. Returns the loss. */
double ff_sft_loss(const float *logprobs, const float *mask, int32_t T, float scale, float *d_logprobs);

/* ---- pipeline stages --------------------------------------------------------------------- */

/* A pipeline-parallel stage (docs/model.md "Pipeline stages"): a model that holds some
 * contiguous ranges of the decoder's layers, its chunks (one per virtual stage on this rank:
 * several with interleaving), in ascending order. The chunk that starts at layer 0 also holds
 * the embedding, the one that ends at the last layer the final norm, the LM head and the value
 * head. With tied embeddings the last stage keeps a copy of model.embed_tokens.weight as its
 * LM head (Megatron's way): the host sums the two copies' gradients before the optimizer step
 * (ff_model_read_tensor / ff_model_write_tensor_grad; fuseflow/pipe_exec.h does it), so both
 * take the same update; the copy's gradient is left out of the gradient norm, and the export
 * functions leave the copy out (the first stage exports the tensor).
 *
 * Weights come in as whole Hugging Face tensors (any set holding at least the stage's: the
 * stage copies its own and ignores the rest) and go out as the stage's own tensors, whole
 * (the union over the stages is the model's set). Tensor parallelism composes: each TP rank
 * of a stage is a stage model with ff_model_opts.comm as well.
 *
 * A chunk's forward takes a micro-batch's hidden states [T, H] from the previous chunk (or
 * its token ids, on the chunk with the embedding) and gives its output hidden states (or
 * log-probs, entropy, values, on the chunk with the heads); its backward takes the gradient
 * of that output and gives the gradient of its input, accumulating the parameter gradients.
 * Several micro-batches may be in flight through each chunk (1F1B holds up to p - s): a
 * training forward keeps its activations under (chunk, micro) until that backward. */
#define FF_MODEL_MAX_CHUNKS 64
struct ff_model_stage {
    int32_t n_chunks;            /* 1 .. FF_MODEL_MAX_CHUNKS */
    const int32_t *first_layer;  /* [n_chunks] chunk c holds layers [first_layer[c], + n_layers[c]) */
    const int32_t *n_layers;     /* [n_chunks] each >= 1; the ranges ascend and do not overlap */
    /* The pipeline group, for the optimizer's gradient norm (the sum of squares of every
     * stage's gradients: all_reduce_sum_f64 alone is used, the other functions may be NULL);
     * NULL or of size 1: this stage is all of the model's parameters. Copied. */
    const ff_model_comm *comm;
};

typedef struct ff_model_chunk_info {
    int32_t first_layer, n_layers;
    bool embedding;  /* holds the embedding: its forward takes token ids */
    bool head;       /* holds the final norm and the heads: its forward gives log-probs, values */
} ff_model_chunk_info;

/* Chunks of a model (1 for a whole model, which is one chunk with the embedding and the head)
 * and what chunk c holds. */
int ff_model_n_chunks(const ff_model *m);
void ff_model_chunk_of(const ff_model *m, int chunk, ff_model_chunk_info *out);
/* Holds every layer, the embedding and the head in one chunk (ff_model_forward and generation
 * run only such models). */
bool ff_model_is_whole(const ff_model *m);

/* Micro-batch `micro` (>= 0) through chunk `chunk`. b: the micro-batch (every stage needs its
 * sequence offsets; tokens are embedded on the embedding chunk, targets read on the head
 * chunk). hidden_in [T, H]: the previous chunk's output (NULL on the embedding chunk).
 * hidden_out [T, H]: this chunk's output (ignored, may be NULL, on the head chunk, which fills
 * `out` as ff_model_forward does). With opts->train the activations stay for
 * ff_model_stage_backward of the same (chunk, micro), and a second training forward of a
 * (chunk, micro) in flight is an error. 0 or -1 + error. */
int ff_model_stage_forward(ff_model *m, int chunk, int32_t micro, const ff_batch *b, const float *hidden_in,
                           const ff_forward_opts *opts, ff_forward_out *out, float *hidden_out);
/* The backward of (chunk, micro)'s training forward: d_hidden_out [T, H] the gradient of its
 * output (not on the head chunk, which takes d_logprobs, d_entropy, d_values as
 * ff_model_backward), d_hidden_in [T, H] gets the gradient of its input (not on the embedding
 * chunk: may be NULL). Parameter gradients accumulate (+=). 0 or -1 + error. */
int ff_model_stage_backward(ff_model *m, int chunk, int32_t micro, const float *d_hidden_out, const float *d_logprobs,
                            const float *d_entropy, const float *d_values, float *d_hidden_in);
/* The same with the hidden states and their gradients in buffers of the model's backend
 * ([T, H] floats each; {NULL, 0} where the host forms take NULL): what a pipeline executor
 * whose transport moves device memory gives (ff_pipe_transport.device), so that a stage's
 * input and output never cross host memory. 0 or -1 + error (a buffer of another backend). */
int ff_model_stage_forward_dev(ff_model *m, int chunk, int32_t micro, const ff_batch *b, ff_dptr hidden_in,
                               const ff_forward_opts *opts, ff_forward_out *out, ff_dptr hidden_out);
int ff_model_stage_backward_dev(ff_model *m, int chunk, int32_t micro, ff_dptr d_hidden_out, const float *d_logprobs,
                                const float *d_entropy, const float *d_values, ff_dptr d_hidden_in);
/* Room for in_flight[c] training forwards of up to max_tokens tokens through each chunk c
 * (in_flight NULL: one each; an inference model: one forward), so that a step allocates
 * nothing. 0 or -1 + error. */
int ff_model_stage_reserve(ff_model *m, int32_t max_tokens, const int32_t *in_flight);
/* Training forwards of chunk c whose backward has not run. */
int32_t ff_model_stage_in_flight(const ff_model *m, int chunk);
/* Forget every training forward in flight (a pipeline step that failed half-way), keeping
 * their room. */
void ff_model_stage_drop(ff_model *m);

/* One tensor by its Hugging Face name: elements this model holds (this rank's shard under
 * TP; 0 when it holds none), a copy of its parameters (grad false) or gradients into host
 * [numel], and its gradient replaced from host [numel]. -1 + error for a tensor it does not
 * hold or a gradient of an inference model. */
int64_t ff_model_tensor_numel(const ff_model *m, const char *name);
int ff_model_read_tensor(ff_model *m, const char *name, bool grad, float *host);
int ff_model_write_tensor_grad(ff_model *m, const char *name, const float *host);
/* Replace one tensor's parameters (this rank's shard) from host [numel]. No checks of the
 * values (ff_model_load_weights checks). -1 + error for a tensor it does not hold. */
int ff_model_write_tensor(ff_model *m, const char *name, const float *host);
/* Where one tensor's parameters (this rank's shard, row-major, numel elements) live on the
 * model's backend, and in which type (FF_DTYPE_F32, or FF_DTYPE_BF16 for a weight matrix of
 * a bf16-weight model): for moving weights between models on device memory (the weight sync,
 * fuseflow/reshard.h) without a host copy. The address stays valid while the parameters do
 * (not across ff_model_release_params). Asking counts as writing the weights, as
 * ff_model_param_buffer. -1 + error: a tensor it does not hold, a view's tensor (its pieces are
 * not one range), parameters released. */
int ff_model_tensor_storage(ff_model *m, const char *name, ff_dptr *out, ff_dtype *dtype);

/* Where tensor i (0 <= i < ff_model_n_tensors) of this model sits in the Hugging Face tensor
 * it is part of, for moving weights between layouts (workers/reshard): the whole tensor is
 * full[0] x full[1] (a vector: full[1] = 1), row-major; tensor parallelism splits it along
 * `axis` (0: rows, 1: columns, -1: never, whole on every rank: norms, score), and this model
 * holds [start, start + len) along it (axis -1: all of it, start 0, len 1). index: its place
 * in the whole model's order (the same on every rank and stage of one config, < the count
 * ff_model_tensor_slots gives). copy: a pipeline stage's copy of a tensor another stage
 * owns (the last stage's tied LM head; it takes the same update). */
typedef struct ff_model_tensor_info {
    const char *name; /* valid while the model lives */
    int index;
    int64_t full[2];
    int axis;
    int64_t start, len;
    bool copy;
    /* a view model (ff_model_opts.view_of): the units [view_lo, view_hi) along axis, in the
     * whole tensor's coordinates as start (axis -1: [0, 1)), that it reads in place from the
     * model it views; view_lo == view_hi: none */
    int64_t view_lo, view_hi;
} ff_model_tensor_info;
int ff_model_n_tensors(const ff_model *m);
/* The model a view model views (ff_model_opts.view_of), or NULL. */
const ff_model *ff_model_viewed(const ff_model *m);
void ff_model_tensor_info_of(const ff_model *m, int i, ff_model_tensor_info *out);
int ff_model_tensor_slots(const ff_model_config *cfg);

/* Give back the parameter buffer and the workspace of an inference model (a generating copy
 * between its weight syncs), keeping its layout; ff_model_restore_params allocates the
 * buffer again, its values undefined until written (ff_model_write_tensor). A view model
 * gives back and gets again its own pieces only (the gathered part of a generation shard). In between the
 * model holds no parameter bytes (ff_model_memory_of) and must not run: running it asserts.
 * Both 0 or -1 + error (a trainable model, which keeps its parameters with its gradients
 * and optimizer; out of memory). */
int ff_model_release_params(ff_model *m);
int ff_model_restore_params(ff_model *m);
bool ff_model_params_held(const ff_model *m);

/* The gradient buffer of a trainable model, for the phases of a colocated actor
 * (docs/run.md "Memory of the colocated copy"): after an optimizer step (and the trainer's
 * ff_model_zero_grad) the gradients are zero and not needed until the next backward, so
 * the generation phase gives them back (ff_model_release_grads: ff_model_memory_of's grads
 * and the backend's counters drop by 4 ff_model_param_count() bytes) and training gets them
 * again zeroed (ff_model_restore_grads; 0 at once when held). In between, ff_model_zero_grad
 * does nothing and succeeds (they come back zero), and what needs them (a training forward, a
 * backward, ff_optimizer_step, reading, writing or exporting gradients) fails with an error
 * that names ff_model_restore_grads. Scoring forwards run. Releasing also gives back the bf16
 * copy of the weights that bf16 products keep (ff_model_set_bf16_products), which the next
 * forward, or the first generation step of a view of the model on a bf16-products backend
 * (ff_model_opts.view_of: the colocated generating copy decodes on it), makes again. Both 0 or -1 + error (an inference model, which has none; out of
 * memory). */
int ff_model_release_grads(ff_model *m);
int ff_model_restore_grads(ff_model *m);
bool ff_model_grads_held(const ff_model *m);

/* ---- optimizer ---------------------------------------------------------------------------- */

/* AdamW with decoupled weight decay (torch.optim.AdamW semantics). Weight decay applies to
 * the 2-D weights (projections, embeddings, lm_head, score) and not to biases and norm
 * weights (Hugging Face Trainer's rule). The learning rate of update k (k = 1, 2, ...):
 *   k <= warmup_steps:  lr * k / warmup_steps
 *   otherwise, with total_steps > warmup_steps and progress = (k - warmup_steps) /
 *   (total_steps - warmup_steps) clamped to [0, 1]:
 *     lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(pi * progress)))
 *   total_steps <= warmup_steps: lr (constant after warmup). */
typedef struct ff_adamw_config {
    double lr;            /* peak learning rate */
    double beta1, beta2;  /* 0.9, 0.999 */
    double eps;           /* 1e-8 */
    double weight_decay;  /* 0.01 */
    double max_grad_norm; /* global L2 norm clip; <= 0: no clipping */
    int64_t warmup_steps; /* 0 */
    int64_t total_steps;  /* 0: no decay */
    double min_lr_ratio;  /* 0 */
} ff_adamw_config;

void ff_adamw_config_default(ff_adamw_config *c); /* the values in the comments, lr 1e-5 */
double ff_adamw_lr_at(const ff_adamw_config *c, int64_t k);

typedef struct ff_optimizer ff_optimizer;
typedef struct ff_optim_stats {
    int64_t step;     /* the update just made, 1-based */
    double lr;        /* the learning rate it used */
    double grad_norm; /* the global gradient L2 norm before clipping */
    bool clipped;
} ff_optim_stats;

/* An optimizer for m's parameters (state buffers on m's backend, zero). NULL + error (an
 * inference model has nothing to optimize). The same as ff_optimizer_new_opts with NULL. */
ff_optimizer *ff_optimizer_new(ff_model *m, const ff_adamw_config *c);

/* Sharded data parallelism (ZeRO, docs/model.md "ZeRO"). zero 0: the optimizer holds the
 * state of every parameter and steps on gradients already summed over the data-parallel
 * ranks (the trainer's hook all-reduces them). zero 1: rank r of the d ranks of dp owns one
 * range of the flat parameter buffer (under TP: of this rank's TP-local buffer; the d ranks
 * are the ones holding the same TP shard) and holds exp_avg and exp_avg_sq for it alone.
 * The ranges are an equal split of ff_model_param_count() floats: ceil(n / d) rounded up to
 * FF_ZERO_ALIGN floats each, the last ones shorter (or empty). Its step (every rank of dp
 * calls it, with its own unreduced gradients): reduce-scatter (sum, fp32) the gradient
 * buffer in buckets of `bucket` floats, so each rank gets the summed gradients of its range;
 * the global norm from the sum of squares of each rank's range, all-reduced over dp (in
 * double) and then over TP; clip; AdamW on the range; all-gather the updated range into
 * every rank's full parameter buffer, bucket by bucket. The non-owned part of the gradient
 * buffer is left unreduced. The result equals zero 0's (the sums of the reduction are the
 * same; the norm's partial sums are associated differently, within double rounding). */
#define FF_ZERO_ALIGN 4096           /* floats: a multiple of the CPU sum-of-squares block */
#define FF_ZERO_BUCKET_DEFAULT 25000000 /* floats per collective (100 MB) */
typedef struct ff_optimizer_opts {
    int zero;                /* 0 or 1 (2 and 3 are not built: an error) */
    const ff_model_comm *dp; /* zero 1: the data-parallel group (copied; NULL or size 1: one
                                rank, which owns everything); needs all_reduce_sum_f64,
                                reduce_scatter_sum_v and all_gather_v */
    int64_t bucket;          /* floats per reduce-scatter / all-gather; 0: FF_ZERO_BUCKET_DEFAULT */
} ff_optimizer_opts;
ff_optimizer *ff_optimizer_new_opts(ff_model *m, const ff_adamw_config *c, const ff_optimizer_opts *o);
void ff_optimizer_destroy(ff_optimizer **o);
/* The range [*lo, *hi) of the flat buffer whose state this rank holds ([0, n) at zero 0). */
void ff_optimizer_shard(const ff_optimizer *o, int64_t *lo, int64_t *hi);
/* The bytes of its state on the backend: exp_avg and exp_avg_sq, 2 x 4 bytes a parameter
 * of its range (the sizes of the two allocations); 0 while offloaded (ff_optimizer_offload). */
int64_t ff_optimizer_state_bytes(const ff_optimizer *o);
/* Clip the gradients to max_grad_norm (global norm; under TP the whole model's, each
 * replicated parameter counted once; a pipeline stage's summed over its pipeline group,
 * ff_model_stage.comm, without the tied copy), update the parameters, count the step. At
 * zero 1 this is the whole sharded step above (a collective over dp). Does not zero the
 * gradients. A non-finite gradient norm skips the update on every rank and returns -1 +
 * error (stats still filled). A failed collective returns -1 + error with the parameters
 * possibly half gathered: the group is broken and the run must stop (or resume from a
 * checkpoint). */
int ff_optimizer_step(ff_optimizer *o, ff_optim_stats *stats);
int64_t ff_optimizer_steps_done(const ff_optimizer *o);
/* State to and from a tensor set: "exp_avg.<param name>", "exp_avg_sq.<param name>" (the
 * parameter's shape) and "step" ([1], the count of updates done). Import checks names and
 * shapes. The tensors are whole whatever the layout, so a state saved at one TP or ZeRO
 * layout loads at another: under TP export gathers and import takes whole tensors or this
 * rank's shards, like the weights; at zero 1 export gathers the ranges over dp (every rank
 * of dp calls it and gets the whole state) and import takes this rank's range of each
 * tensor (no communication). 0 or -1 + error. */
int ff_optimizer_export_state(ff_optimizer *o, ff_tensor_set *out);
int ff_optimizer_import_state(ff_optimizer *o, const ff_tensor_set *in);

/* Offloading the state (exp_avg, exp_avg_sq) to host memory for a colocated actor's
 * generation phase (docs/run.md "Memory of the colocated copy"): offload copies it from the
 * backend into one host allocation of its own and frees the two backend buffers
 * (ff_optimizer_state_bytes and the backend's counters drop by its bytes; it is then counted
 * in ff_optimizer_host_bytes); reload allocates them again and copies it back, bit for bit,
 * and frees the host copy. Either is a no-op (0, stats zero) when already done. While
 * offloaded, step, export and import fail with an error naming ff_optimizer_reload. stats
 * (may be NULL): the bytes moved and the seconds the call took. 0 or -1 + error (out of
 * memory: a failed reload keeps the host copy, a failed offload the backend's). */
typedef struct ff_offload_stats {
    int64_t bytes;
    double seconds;
} ff_offload_stats;
int ff_optimizer_offload(ff_optimizer *o, ff_offload_stats *stats);
int ff_optimizer_reload(ff_optimizer *o, ff_offload_stats *stats);
bool ff_optimizer_offloaded(const ff_optimizer *o);
int64_t ff_optimizer_host_bytes(const ff_optimizer *o); /* the offloaded state's bytes, 0 when on the backend */

/* A frozen inference model's weights kept in host memory between its uses (a reference or
 * reward model loaded on demand, docs/run.md "Weights on demand"). ff_model_params_to_host
 * copies the parameters from the backend into a host allocation of the model's own (the
 * backend's d2h) and gives the backend buffer back (ff_model_release_params: the backend's
 * counters drop by ff_model_params_host_bytes); the host copy then stays until the model is
 * destroyed, the weights being frozen. ff_model_params_load allocates the backend buffer again
 * and copies the host copy into it on stream st (the backend's h2d: a PCIe copy on a GPU, a
 * memcpy between two allocations on the CPU backend), bit for bit, and waits for it; st may be
 * a stream of the model's backend other than the model's, and the call may run on another
 * thread than the model's as long as nothing uses the model meanwhile. After a load,
 * ff_model_release_params gives the buffer back again (no copy: the host holds it). Loading
 * held parameters does nothing (stats zero). stats (may be NULL): the bytes copied and the
 * seconds the call took. 0 or -1 + error (a trainable or view model; out of memory, naming the
 * bytes: the host copy stays and a later load may succeed). */
int ff_model_params_to_host(ff_model *m, ff_offload_stats *stats);
int ff_model_params_load(ff_model *m, ff_stream *st, ff_offload_stats *stats);
int64_t ff_model_params_host_bytes(const ff_model *m); /* the host copy's bytes, 0 without one */

/* ---- generation ---------------------------------------------------------------------------- */

/* Which log-prob a generated token reports:
 *   FF_LOGPROB_MODEL:       log softmax(logits)[token], the policy at temperature 1, no
 *                           top-k/top-p: what RLHF losses compare against (the default)
 *   FF_LOGPROB_TEMPERATURE: log softmax(logits / temperature)[token] (matches a training
 *                           forward with ff_forward_opts.temperature; greedy: as MODEL)
 *   FF_LOGPROB_SAMPLER:     the log-prob under the distribution actually sampled from
 *                           (temperature, top-k, top-p, renormalised; greedy: 0) */
typedef enum { FF_LOGPROB_MODEL = 0, FF_LOGPROB_TEMPERATURE = 1, FF_LOGPROB_SAMPLER = 2 } ff_logprob_mode;

typedef struct ff_sampling {
    float temperature;        /* 0: greedy */
    int32_t top_k;            /* 0: off */
    float top_p;              /* 1: off; in (0, 1] */
    int32_t max_new_tokens;   /* >= 1 */
    const int32_t *stop_tokens; /* [n_stop]; a sampled stop token ends the sequence and is
                                   included in the output. NULL/0: the config's eos ids */
    int32_t n_stop;
    ff_logprob_mode logprob_mode;
    /* A user-set response length (a long-tail workload, docs/run.md "Response lengths"):
     * len_median > 0 draws, per sequence when it is admitted, L = round(len_median x
     * exp(sigma z)) clamped to [1, len_max] (0: max_new_tokens), sigma = ln(len_p99_ratio) /
     * 2.326 so that the 99th percentile is len_p99_ratio x the median, z a standard normal
     * from the sequence's own length stream (the request's seed and the sample's index, apart
     * from its token draws). The sequence then generates min(L, max_new_tokens) tokens: its
     * min_new_tokens and max_new_tokens both become that. 0: off. */
    float len_median, len_p99_ratio;
    int32_t len_max;
    /* Stop tokens cannot be sampled before the sequence has this many tokens (0: no floor):
     * their logits are masked for the draw. The log-prob stays the logprob_mode's: MODEL and
     * TEMPERATURE are of the unmasked logits (what a training forward computes), SAMPLER of
     * the masked distribution actually drawn from. */
    int32_t min_new_tokens;
} ff_sampling;
void ff_sampling_default(ff_sampling *s); /* temperature 1, top_k 0, top_p 1, 64 tokens, eos, no length draw */

typedef struct ff_gen_request {
    uint64_t id;            /* the caller's, returned with each output */
    const int32_t *prompt;  /* [prompt_len], copied at submit */
    int32_t prompt_len;     /* >= 1 */
    int32_t n_samples;      /* responses to this prompt (>= 1), sharing one prefill */
    ff_sampling sampling;
    uint64_t seed;          /* sample j draws from its own ff_rng seeded by (seed, j), so
                               results do not depend on what else is in the batch */
} ff_gen_request;

typedef enum { FF_FINISH_STOP = 0, FF_FINISH_LENGTH, FF_FINISH_ABORTED } ff_finish_reason;

typedef struct ff_gen_output {
    uint64_t id;        /* request id */
    int32_t sample;     /* 0 .. n_samples-1 */
    int32_t n_tokens;
    int32_t *tokens;    /* [n_tokens] generated ids (stop token included), malloc'd */
    float *logprobs;    /* [n_tokens] per ff_sampling.logprob_mode, malloc'd */
    ff_finish_reason finish; /* LENGTH: max_new_tokens or the slot's capacity was reached */
} ff_gen_output;
void ff_gen_output_free(ff_gen_output *o); /* frees the arrays, zeroes *o */

/* A continuous-batching generator: up to max_slots sequences decode together, each of up to
 * max_seq_len positions (prompt + response) in a paged KV cache (blocks of kv_block_rows
 * positions from a pool of kv_blocks). Requests wait in a FIFO; each step admits waiting
 * requests while free slots remain (a request needs n_samples slots) and the pool can promise
 * the blocks they may fill, prefills their prompts (packed, up to max_prefill_tokens tokens per
 * step; one prefill per prompt, whose full blocks the n samples share; a longer prompt is
 * prefilled alone, in chunks of max_prefill_tokens), then decodes one token for every running
 * sequence. A finished sequence frees its slot and blocks at once for the next request.
 * Sequences can also leave early (ff_generator_abort), e.g. to migrate them. */
/* Generation over a pipeline: every stage of it runs a generator on its stage model (one
 * chunk each: the stage of rank r holds the layers after rank r - 1's) with the same requests
 * in the same order, and each forward passes the hidden states [T, H] down the stages; the
 * last stage's logits [R, V] go to every stage, so every stage samples the same tokens
 * (each sequence's own RNG stream) and keeps the same state. One forward at a time through
 * the stages (no micro-batches in flight: a pipeline of p stages is busy 1/p of a step).
 * Functions return 0, or -1 + error when the group is broken. */
typedef struct ff_gen_pipe {
    int rank, size; /* this stage, of size */
    void *ctx;
    int (*send)(void *ctx, int peer, const float *buf, size_t n);
    int (*recv)(void *ctx, int peer, float *buf, size_t n);
    int (*broadcast)(void *ctx, int root, float *buf, size_t n); /* root's buf to every rank's */
    /* Optional (all three or none): the same on buffers of the model's backend, ordered after
     * the work queued on st and before the work queued after it (as ff_model_comm's dev_
     * calls, on st itself while it captures): the hidden states and logits then never cross
     * host memory, and the decode steps run as graphs. */
    int (*dev_send)(void *ctx, ff_stream *st, int peer, ff_dptr buf, size_t n);
    int (*dev_recv)(void *ctx, ff_stream *st, int peer, ff_dptr buf, size_t n);
    int (*dev_broadcast)(void *ctx, ff_stream *st, int root, ff_dptr buf, size_t n);
} ff_gen_pipe;

typedef struct ff_generator_config {
    int32_t max_slots;          /* concurrent sequences, >= 1 */
    int32_t max_seq_len;        /* KV positions per sequence at most; <= max_position_embeddings */
    int32_t max_prefill_tokens; /* prompt tokens per forward (0: max_seq_len); a longer prompt in chunks */
    const ff_gen_pipe *pipe;    /* a pipeline stage's (copied; its ctx outlives the generator), or NULL */
    int32_t kv_block_rows;      /* positions per KV-cache block, 1..max_seq_len (0: 16, or max_seq_len if less) */
    int32_t kv_blocks;          /* blocks in the pool (0: max_slots x ceil(max_seq_len / kv_block_rows),
                                   enough for every slot at full length) */
    bool kv_bf16;               /* the KV cache in bf16 (false: fp32): half its bytes, each key and
                                   value rounded when it is written (ff_scatter_rows_bf16) and
                                   widened when attention reads it; moved rows travel as F32 */
    bool eager;                 /* decode steps launch kernel by kernel, never as graphs (below) */
} ff_generator_config;

/* Graphs of decode steps: on a backend with graphs (ff_backend_has_stream_graphs: cuda), a
 * model (not a view whose embedding is in pieces; under tensor parallelism only where its comm
 * has the device calls, ff_model_comm_on_device, and a pipeline stage only where ff_gen_pipe
 * has them: those collectives and transfers are then enqueued on the model's stream while it
 * captures, and recorded in the graph) runs each decode step's forward as one replayed graph instead of hundreds of kernel
 * launches. The batch is
 * padded to a size of 1, 2, 4, 8, then a multiple of 8 (at most max_slots, up to 512; larger
 * batches run eagerly), with rows that write a KV block of their own and are not sampled;
 * the first step at a size runs eagerly (the kernels' scratch takes its size), the second
 * captures its graph, the later ones replay it. Prefills, sampling and the host's work stay
 * outside. Graphs are captured again when the model's weights (or the viewed model's, or its
 * bf16 copy) are made anew or given back (ff_model_restore_params), wherever the new buffer
 * lands. A failed capture turns them off for the generator, which goes on eagerly; under
 * tensor or pipeline parallelism the ranks agree after each capture (the host calls), and a
 * capture that failed on one turns them off on all; ff_generator_graph_stats says why. */
typedef struct ff_generator_graph_stats {
    bool on;              /* graphs are used (false: eager, the backend has none, or off_why) */
    int32_t captures;     /* graphs captured (sizes, and again after the weights moved) */
    int64_t replays;      /* decode steps run as a replay */
    int64_t eager_steps;  /* decode steps launched kernel by kernel */
    char off_why[256];    /* why they are off ("" when on) */
} ff_generator_graph_stats;

typedef struct ff_generator ff_generator;

/* A generator on m (which must have an LM head and must outlive it; a pipeline stage of one
 * chunk with c->pipe, whose rank is the stage's place: the embedding on rank 0, the head on
 * the last). The KV cache and the
 * workspaces are allocated here; steps do not allocate except for outputs. NULL + error. */
ff_generator *ff_generator_new(ff_model *m, const ff_generator_config *c);
void ff_generator_destroy(ff_generator **g);
/* Queue a request. Checks it (token ids in range, prompt_len + 1 <= max_seq_len,
 * n_samples <= max_slots, sampling values, the KV blocks it may fill <= kv_blocks). 0 or -1 +
 * error. */
int ff_generator_submit(ff_generator *g, const ff_gen_request *r);
/* The prompt prefills of admissions so far: their tokens and the time of their forwards (with
 * the sampling of each prompt's first token), the rate a recompute of moved rows runs at. */
void ff_generator_prefill_stats(const ff_generator *g, int64_t *tokens, double *seconds);
/* Its decode graphs so far (ff_generator_config.eager). */
void ff_generator_graph_stats_of(const ff_generator *g, ff_generator_graph_stats *out);
/* Admit, prefill, and decode one token for every running sequence. 0 or -1 + error. */
int ff_generator_step(ff_generator *g);
/* Sequences waiting or running (0: nothing to do). */
int32_t ff_generator_pending(const ff_generator *g);
int32_t ff_generator_running(const ff_generator *g);
/* Sequences of max_seq_len positions it could take in now: free slots, and KV blocks that are
 * free and not promised to running sequences, whichever is fewer. */
int32_t ff_generator_room(const ff_generator *g);
/* The bytes of its KV cache (allocated at ff_generator_new: 2 x layers x kv_blocks x
 * kv_block_rows x kv_heads (this rank's) x head_dim x 4, or x 2 with kv_bf16; with decode
 * graphs, kv_blocks + 1 blocks: the sink that padding rows write). */
int64_t ff_generator_kv_bytes(const ff_generator *g);
/* Its KV blocks: held by running sequences now, the most held at once (since it was made or
 * the last ff_generator_kv_peak_reset), and the pool; and the positions per block. */
void ff_generator_kv_blocks(const ff_generator *g, int32_t *used, int32_t *peak, int32_t *total);
int32_t ff_generator_kv_block_rows(const ff_generator *g);
void ff_generator_kv_peak_reset(ff_generator *g); /* the peak starts over from what is held now */
/* The bytes of its decode workspace on the backend (the batch's activations, logits and
 * sampling scratch for max_slots sequences and max_prefill_tokens; allocated with the KV cache).
 * A generator holds these two on its backend and nothing else. */
int64_t ff_generator_workspace_bytes(const ff_generator *g);
/* Take one finished output (1), or 0 when none is ready. The caller owns out's arrays. */
int ff_generator_pop(ff_generator *g, ff_gen_output *out);
/* End every waiting and running sequence of request `id` now; running ones are returned
 * by ff_generator_pop with what they have and FF_FINISH_ABORTED, waiting ones vanish.
 * Returns the number of sequences ended. */
int32_t ff_generator_abort(ff_generator *g, uint64_t id);

/* ---- moving a running sequence to another generator (docs/roles.md "Moving a sequence") --- */

/* One sequence's KV-cache rows as a flat host buffer: its positions 0..positions-1 of every
 * layer this model holds (a pipeline stage: its own layers), with this rank's key/value heads
 * under tensor parallelism. data [layers, 2 (K then V), positions, kv_heads * head_dim]. */
typedef struct ff_gen_kv {
    int32_t layers, kv_heads, head_dim, positions;
    int32_t first_layer;      /* the whole model's index of the first of them (a pipeline stage's place) */
    int32_t tp_rank, tp_size; /* the shard: written only into the same rank of the same TP size */
    ff_dtype dtype;           /* the cache's element type (FF_DTYPE_F32) */
    float *data;              /* malloc'd; NULL: no rows (the receiver recomputes them) */
} ff_gen_kv;

/* Everything a running sequence needs to continue in another generator of the same model and
 * produce exactly the tokens and log-probs it would have produced where it was. */
typedef struct ff_gen_seq_state {
    uint64_t id;            /* its request's id (the generator's caller's) */
    int32_t sample;         /* its index in the request */
    uint64_t seed;          /* the request's seed (a record: the stream continues from rng) */
    int32_t prompt_len;     /* >= 1 */
    int32_t n_gen;          /* tokens generated so far, >= 1 (the first comes with the prefill) */
    int32_t *tokens;        /* [prompt_len + n_gen] the prompt, then the generated tokens */
    float *logprobs;        /* [n_gen] per sampling.logprob_mode */
    ff_sampling sampling;   /* its settings. max_new_tokens: the whole budget (n_gen of it spent),
                               already capped by the source slot's capacity so that it stops
                               where it would have; min_new_tokens: its floor (a drawn length
                               sets both; len_median is then 0: the draw is spent and is not
                               drawn again where it lands); stop_tokens points at stop, n_stop
                               its count (resolved: the model's eos when the request named none) */
    int32_t *stop;          /* [n_stop], owned by the state */
    ff_rng rng;             /* its stream's position: the next token's draw comes from here */
    ff_gen_kv kv;           /* rows 0..prompt_len+n_gen-2 (the last token is fed by the next
                               step), or kv.data NULL: the receiver recomputes them */
} ff_gen_seq_state;
void ff_gen_seq_state_free(ff_gen_seq_state *s); /* frees the arrays, zeroes *s */

/* Take running sequence (id, sample) out of g: it stops decoding here, its slot is free, and
 * no output of it comes out of ff_generator_pop. with_kv: its KV rows are copied into out->kv
 * (2 layers kv_heads head_dim 4 bytes per position); else out->kv.data is NULL. Under tensor
 * parallelism (and over a pipeline) every rank calls it for the same sequence and gets its own
 * shard of the rows. 0, or -1 + error (no such running sequence: waiting, finished or
 * unknown; out of memory, the sequence then stays). */
int ff_generator_export(ff_generator *g, uint64_t id, int32_t sample, bool with_kv, ff_gen_seq_state *out);
/* Continue s in a free slot of g (a generator of a model with the same config): its KV rows
 * are written from s->kv, or, without them, recomputed by a prefill of its tokens (prompt and
 * generated, the last aside) in forwards of up to max_prefill_tokens tokens. The next
 * ff_generator_step decodes it with the others; its output comes out of ff_generator_pop with
 * s->id and s->sample, holding every token (those made before the move included). Checked:
 * a free slot, the shapes of s->kv against this model (layers and the first one's index, kv
 * heads, head dim, TP shard, dtype), its positions, room for its whole budget (prompt_len + max_new_tokens <=
 * max_seq_len), token ids, sampling values. Under tensor parallelism every rank imports the
 * same sequences in the same order (a recompute runs the group's collectives); over a
 * pipeline every stage does (a recompute's forward crosses the stages). The recompute's
 * rows equal the sent ones up to float rounding (a prefill is a matrix product of more rows
 * than a decode step's; docs/roles.md has the measured difference). 0 or -1 + error (g
 * unchanged, except after a failed collective of a recompute). */
int ff_generator_import(ff_generator *g, const ff_gen_seq_state *s);

/* Bytes of s as ff_gen_seq_state_write writes them. */
size_t ff_gen_seq_state_size(const ff_gen_seq_state *s);
/* Serialise s into buf [cap >= ff_gen_seq_state_size(s)] (native byte order: the two ends are
 * the same build; a magic, a version, the total length and a checksum of the rest lead).
 * Returns the bytes written, or 0 + error when cap is short. */
size_t ff_gen_seq_state_write(const ff_gen_seq_state *s, void *buf, size_t cap);
/* Parse n bytes of ff_gen_seq_state_write into *out (arrays malloc'd; free with
 * ff_gen_seq_state_free). Refuses, -1 + error naming the problem, a buffer that is short,
 * truncated or longer than its header says, of another format or version, whose checksum
 * does not match, or whose fields are out of range (counts, positions, dtype). */
int ff_gen_seq_state_read(const void *buf, size_t n, ff_gen_seq_state *out);

/* Convenience: run requests to completion on a fresh generator of config c (NULL: sized
 * from the requests: slots for all samples up to 64, max_seq_len the longest prompt +
 * max_new_tokens within max_position_embeddings). *outs (malloc'd, free each with
 * ff_gen_output_free then free(*outs)) holds sum(n_samples) outputs ordered by request then
 * sample. 0 or -1 + error. */
int ff_model_generate(ff_model *m, const ff_generator_config *c, const ff_gen_request *reqs, int32_t n_reqs,
                      ff_gen_output **outs, int32_t *n_outs);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

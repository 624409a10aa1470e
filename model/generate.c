/* Generation: a continuous-batching decoder with a paged KV cache.
 *
 * The cache is a pool of blocks of kv_block_rows rows per layer ([blocks * block_rows, Hkv D]
 * for K and for V). Each running sequence holds a slot (its tokens, RNG, settings) and a
 * block table: position p of it lives in row table[p / rows] * rows + p % rows. A step (1)
 * admits waiting requests in FIFO order while a slot is free for each sample and the pool
 * can promise every block the request may fill, (2) prefills their prompts as one packed
 * batch (each token writes its K/V row into the first sample's blocks and attends to its
 * positions 0..pos); the other samples of the request share the prompt's full blocks (one
 * prefill and one copy of the prompt for n samples) and copy only its last, partial block;
 * each sequence's first token is sampled, then (3) every running sequence's last token is fed
 * (one row each; a sequence takes a new block when it crosses into one) and the next sampled.
 * A finished sequence frees its slot and its blocks (a shared block when its last holder
 * ends) at once, so the next waiting request joins on the following step.
 *
 * Promises: a request is admitted only when the free blocks, less those promised to running
 * sequences, cover its need: the prompt's full blocks once, and per sample the blocks of
 * min(prompt + its budget, max_seq_len) positions beyond them. So a running sequence never
 * waits for a block, and nothing is preempted. The default pool (max_slots x blocks of
 * max_seq_len) can always keep its promises to full slots; a smaller kv_blocks trades waiting
 * requests for memory. One block of max_seq_len rows per sequence is the contiguous
 * slot-per-sequence cache, with the prompt copied to every sample.
 *
 * Randomness: sequence j of a request draws from its own ff_rng seeded from (seed, j), one
 * uniform per token, so the tokens do not depend on batch composition or slot order. A drawn
 * response length (ff_sampling.len_median) comes from another stream of (seed, j), once at
 * admission, and becomes the sequence's own floor and budget (gen_seq.min_new, max_new), which
 * a moved sequence carries in its sampling settings. Stop tokens under the floor are masked in
 * the logits before the draw; the MODEL/TEMPERATURE log-prob is then corrected back to the
 * unmasked softmax from the masked logits' raw values (sample_rows).
 *
 * Tensor parallelism: every rank of the group runs the same generator on the same requests.
 * Its KV cache holds the rank's key/value heads only; the last positions' logits (this rank's
 * vocabulary rows, [R, V/tp]) are all-gathered into [R, V] and every rank samples them with
 * the same draws, so all ranks pick the same tokens, and the ones one rank alone would.
 *
 * Pipeline parallelism (ff_generator_config.pipe): every stage runs the same generator over
 * its layers' KV cache; a forward receives the previous stage's hidden states [T, H] (the
 * first stage embeds), sends its own to the next, and the last stage's logits [R, V] are
 * broadcast to every stage, which samples them as above. One forward crosses the stages at a
 * time: simple and exact, but each stage idles (p - 1) / p of a step.
 *
 * Moving a sequence (ff_generator_export / ff_generator_import): a running sequence leaves
 * with its tokens, log-probs, RNG state, sampling settings and, optionally, its KV rows
 * (gathered block by block), and joins a free slot of another generator, in blocks of its
 * own there, its rows written or recomputed by prefills of its tokens; model/gen_seq.c turns
 * the state into bytes and back.
 *
 * Chunked prefill: a prompt longer than max_prefill_tokens is admitted only as a step's first
 * request; its chunks but the last are prefilled on their own (prefill_rows, as a moved
 * sequence's rows are), and the last joins the step's packed forward.
 *
 * Not here: prefix sharing across requests (a cache of prompt blocks by content), preemption
 * of running sequences, prefill chunks interleaved with decode steps, speculative decoding,
 * repetition penalties. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/dtype.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "model/model_internal.h"

typedef struct gen_req {
    uint64_t id;
    int32_t *prompt; /* [prompt_len] */
    int32_t prompt_len;
    int32_t n_samples;
    ff_sampling sp;
    int32_t *stop; /* [n_stop] */
    int32_t n_stop;
    uint64_t seed;
    int32_t refs; /* sequences not yet finished (waiting ones included) */
    int32_t need; /* KV blocks it may fill, its samples' together (the prompt's full blocks once) */
    struct gen_req *next;
} gen_req;

typedef struct gen_seq {
    gen_req *req; /* NULL: the slot is free */
    int32_t sample;
    int32_t n_gen;
    int32_t *tokens;  /* [max_seq_len], the slot's own, allocated with the generator */
    float *logprobs;  /* [max_seq_len] */
    ff_rng rng;
    int32_t min_new, max_new; /* stop tokens masked while n_gen + 1 < min_new; done at max_new */
    int32_t *table;           /* [table_ld] its KV blocks in position order, the slot's own */
    int32_t n_blocks;         /* entries of table held */
    int32_t promise;          /* blocks it may still take from the pool */
} gen_seq;

struct ff_generator {
    ff_model *m;
    ff_generator_config c;
    int32_t Tcap, Rcap; /* tokens per forward, logit rows per forward */
    ff_buffer *kv;      /* per layer: K [kv_rows, Hkv D], then V */
    size_t kv_rows;     /* rows of K (and of V) per layer: the pool's blocks x block_rows, and with
                           graphs one more block, the sink that padding rows write */
    size_t kv_layer;    /* elements per layer (K and V) */
    size_t kv_esz;      /* bytes per element: 4, or 2 (ff_generator_config.kv_bf16) */
    uint16_t *h_kv16;   /* kv_bf16: [block_rows, Hkv D] host staging of moved rows */
    int32_t block_rows, table_ld, n_blocks; /* positions per block, blocks per sequence at most, the pool */
    int32_t *blk_ref;   /* [n_blocks] holders of each block (0: free) */
    int32_t *blk_free;  /* [n_blocks] a stack of the free ones */
    int32_t n_free, promised, peak_used; /* promised: blocks running sequences may still take */
    int32_t *slot_tables; /* [max_slots, table_ld] backing gen_seq.table */
    ff_buffer *ws;
    int32_t V; /* the whole vocabulary */
    size_t x, xn, qkv, att, gu, hm, rstd, xr, xrn, rstdr, logits_loc, logits, logits_rep, sws, sparams, stok, slp;
    size_t i_tok, i_pos, i_wrow, i_seq, i_nkeys, i_rows, i_rowmap, i_table, i_perm;
    /* host mirrors */
    int32_t *h_tok, *h_pos, *h_wrow, *h_seq, *h_nkeys, *h_rows, *h_rowmap; /* [Tcap] / [Rcap] */
    int32_t *h_table; /* [Rcap, table_ld] the block tables of a forward's sequences */
    int32_t *h_tok_tp; /* [Tcap] TP: token ids in this rank's vocabulary rows */
    float *h_lg;       /* TP: [R, V/tp] this rank's logits, then [tp, R, V/tp] gathered, then [R, V] */
    /* TP with the comm's device calls instead: the gather's counts [tp] and the rows [R tp]
     * that put the gathered [tp, R, V/tp] in [R, V] order (gather_logits) */
    size_t *lg_counts;
    int32_t *h_perm;
    /* over a pipeline: the hidden states [Tcap, H] between the stages, the logits [Rcap, V] from the last */
    bool piped;
    ff_gen_pipe pipe;
    bool pipe_dev; /* the pipe's device calls: h_px, h_plg unused */
    float *h_px, *h_plg;
    ff_sample_params *h_sp;                                                /* [Rcap] */
    int32_t *h_stok;
    float *h_slp;
    float *h_ban;      /* [ban_cap] raw logits of the masked stop tokens, row by row */
    int32_t ban_cap;
    int32_t *batch; /* [Rcap] slots in the current batch */
    gen_seq *seqs;  /* [max_slots] by slot */
    int32_t *slot_tokens; /* [max_slots, max_seq_len] backing gen_seq.tokens */
    float *slot_logprobs; /* [max_slots, max_seq_len] */
    int32_t n_running;
    gen_req *q_head, *q_tail; /* waiting requests */
    int32_t n_waiting;        /* sequences waiting */
    ff_gen_output *done;      /* finished FIFO */
    int32_t d_head, d_len, d_cap;
    int64_t prefill_tokens;   /* prompt tokens prefilled by admit, and the time of those forwards */
    double prefill_s;
    /* decode graphs (ff_generator_graph_stats): graph[P] replays the forward of a batch padded to
     * P rows; seen[P], an eager step of that size ran (its scratch sized); graph_made, the
     * model's and the viewed model's buffers_moved when the graphs were captured: when either
     * moved (weights, a view's viewed weights or their bf16 copy made anew or given back),
     * captured again;
     * graph_key, the device addresses they hold (weights, bf16 copy, RoPE tables), which move
     * only with it */
    bool graphs_on;
    int32_t graph_cap; /* padded sizes 1..graph_cap have graphs */
    ff_stream_graph **graph; /* [graph_cap + 1] */
    bool *seen;              /* [graph_cap + 1] */
    uint64_t graph_made[2];
    void *graph_key[5];
    int32_t graph_captures;
    int64_t graph_replays, eager_steps;
    char graph_off_why[256];
};

enum { GRAPH_MAX_BATCH = 512 };

#define GW(g, f) ff_dptr_of((g)->ws, (g)->f)
/* element e of the KV cache, whatever its type */
static ff_dptr kv_at(const ff_generator *g, size_t e) { return ff_dptr_of(g->kv, e * g->kv_esz); }

static size_t take(size_t *o, size_t bytes) {
    size_t at = *o;
    *o += (bytes + 63) & ~(size_t)63;
    return at;
}

void ff_sampling_default(ff_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
    s->max_new_tokens = 64;
    s->logprob_mode = FF_LOGPROB_MODEL;
}

void ff_gen_output_free(ff_gen_output *o) {
    if (!o) return;
    free(o->tokens);
    free(o->logprobs);
    memset(o, 0, sizeof *o);
}

/* A stage generates over a pipeline of stages in order: one chunk each, the embedding on the
 * first, the head on the last. */
static int check_pipe(const ff_model *m, const ff_gen_pipe *pp) {
    const char *w = "generator";
    if (!pp || pp->size <= 1) {
        if (ffm_whole(m)) return 0;
        return ff_error_set(w, "give the stage's pipeline (ff_generator_config.pipe), or generate with the whole model",
                            "the model is a pipeline stage");
    }
    if (pp->rank < 0 || pp->rank >= pp->size || !pp->send || !pp->recv || !pp->broadcast)
        return ff_error_set(w, NULL, "pipeline rank %d of %d, or a missing send, receive or broadcast", pp->rank, pp->size);
    if (m->n_chunks != 1)
        return ff_error_set(w, "generate with one chunk per stage (vpp 1)", "the stage has %d chunks", m->n_chunks);
    if (m->has_embed != (pp->rank == 0) || m->has_final != (pp->rank == pp->size - 1))
        return ff_error_set(w, "rank r of the pipeline holds its r-th stage", "stage rank %d of %d %s the embedding and %s the head",
                            pp->rank, pp->size, m->has_embed ? "holds" : "lacks", m->has_final ? "holds" : "lacks");
    return 0;
}

ff_generator *ff_generator_new(ff_model *m, const ff_generator_config *cin) {
    if (check_pipe(m, cin->pipe)) return NULL;
    if (!m->lm_head) {
        ff_error_set("generator", "generate with an actor (a model with an LM head)", "the model has no LM head");
        return NULL;
    }
    ff_generator_config c = *cin;
    if (c.max_prefill_tokens <= 0) c.max_prefill_tokens = c.max_seq_len;
    if (c.max_slots < 1 || c.max_slots > 1 << 20) {
        ff_error_set("generator", NULL, "max_slots %d must be in [1, 1048576]", c.max_slots);
        return NULL;
    }
    if (c.max_seq_len < 2 || c.max_seq_len > m->max_pos) {
        ff_error_set("generator", "max_seq_len holds prompt + response",
                     "max_seq_len %d must be in [2, max_position_embeddings = %d]", c.max_seq_len, m->max_pos);
        return NULL;
    }
    if (c.kv_block_rows == 0) c.kv_block_rows = c.max_seq_len < 16 ? c.max_seq_len : 16;
    if (c.kv_block_rows < 1 || c.kv_block_rows > c.max_seq_len) {
        ff_error_set("generator", "0 picks 16 positions a block", "kv_block_rows %d must be in [1, max_seq_len = %d]",
                     c.kv_block_rows, c.max_seq_len);
        return NULL;
    }
    const int32_t table_ld = (c.max_seq_len + c.kv_block_rows - 1) / c.kv_block_rows;
    const int64_t full = (int64_t)c.max_slots * table_ld; /* every slot at max_seq_len */
    if (c.kv_blocks == 0) c.kv_blocks = full > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)full;
    if (c.kv_blocks < 1 || (int64_t)c.kv_blocks * c.kv_block_rows > INT32_MAX) {
        ff_error_set("generator", "0 sizes the pool for every slot at max_seq_len",
                     "kv_blocks %d must be >= 1, and blocks x kv_block_rows (%d) < 2^31 rows", c.kv_blocks, c.kv_block_rows);
        return NULL;
    }
    ff_generator *g = ff_calloc(1, sizeof *g);
    if (!g) return NULL;
    g->m = m;
    g->c = c;
    g->block_rows = c.kv_block_rows;
    g->table_ld = table_ld;
    g->n_blocks = c.kv_blocks;
    g->piped = c.pipe && c.pipe->size > 1;
    if (g->piped) g->pipe = *c.pipe;
    g->pipe_dev = g->piped && g->pipe.dev_send && g->pipe.dev_recv && g->pipe.dev_broadcast;
    g->c.pipe = NULL; /* the copy above */
    g->Tcap = c.max_prefill_tokens > c.max_slots ? c.max_prefill_tokens : c.max_slots;
    g->Rcap = c.max_slots;
    g->V = m->cfg.vocab_size;
    const size_t f = 4, T = (size_t)g->Tcap, R = (size_t)g->Rcap, H = (size_t)m->H, V = (size_t)g->V;
    /* graphs: a whole model of one rank on a backend that has them (ff_generator_graph_stats) */
    /* graphs: on a backend that has them (ff_generator_graph_stats); under TP or PP when the
     * collectives and the stages' transfers run on device buffers (ff_model_comm_on_device,
     * ff_gen_pipe's device calls: they are captured with the kernels; through host memory they
     * could not be) */
    const bool comm_ok = (m->tp == 1 || ff_model_comm_on_device(&m->comm)) && (!g->piped || g->pipe_dev);
    g->graphs_on = !c.eager && ff_backend_has_stream_graphs(m->be) && comm_ok && ffm_embed_on_device(m) &&
                   (g->piped || (m->has_embed && m->has_final));
    if (!g->graphs_on)
        snprintf(g->graph_off_why, sizeof g->graph_off_why, "%s",
                 c.eager                                ? "eager steps asked for (ff_generator_config.eager)"
                 : !ff_backend_has_stream_graphs(m->be) ? "the backend has no graphs"
                 : !comm_ok                             ? "tensor or pipeline parallelism through host memory"
                                                        : "a view whose embedding is in pieces");
    g->graph_cap = c.max_slots < GRAPH_MAX_BATCH ? c.max_slots : GRAPH_MAX_BATCH;
    const size_t KD = (size_t)m->Hkv * m->D, rows = ((size_t)c.kv_blocks + g->graphs_on) * (size_t)c.kv_block_rows;
    g->kv_rows = rows;
    g->kv_layer = 2 * rows * KD;
    g->kv_esz = c.kv_bf16 ? 2 : 4;
    if (c.kv_bf16) g->h_kv16 = ff_malloc((size_t)c.kv_block_rows * KD * 2);
    g->kv = ff_buffer_new(m->be, g->kv_layer * (size_t)m->L * g->kv_esz);
    size_t o = 0;
    g->x = take(&o, T * H * f);
    g->xn = take(&o, T * H * f);
    g->qkv = take(&o, T * (size_t)m->QKV * f);
    g->att = take(&o, T * (size_t)m->Hq * m->D * f);
    g->gu = take(&o, T * 2 * (size_t)m->I * f);
    g->hm = take(&o, T * (size_t)m->I * f);
    g->rstd = take(&o, T * f);
    g->xr = take(&o, R * H * f);
    g->xrn = take(&o, R * H * f);
    g->rstdr = take(&o, R * f);
    g->logits = take(&o, R * V * f);
    g->logits_loc = m->tp > 1 ? take(&o, R * (size_t)m->V * f) : g->logits;
    g->logits_rep = take(&o, R * V * f);
    g->sws = take(&o, R * V * 8);
    g->sparams = take(&o, R * sizeof(ff_sample_params));
    g->stok = take(&o, R * 4);
    g->slp = take(&o, R * 4);
    g->i_tok = take(&o, T * 4);
    g->i_pos = take(&o, T * 4);
    g->i_wrow = take(&o, T * 4);
    g->i_seq = take(&o, T * 4);
    g->i_nkeys = take(&o, T * 4);
    g->i_rows = take(&o, R * 4);
    g->i_rowmap = take(&o, R * 4);
    g->i_table = take(&o, R * (size_t)table_ld * 4);
    g->i_perm = take(&o, R * (size_t)m->tp * 4);
    g->ws = ff_buffer_new(m->be, o);
    g->h_tok = ff_malloc(T * 4);
    g->h_pos = ff_malloc(T * 4);
    g->h_wrow = ff_malloc(T * 4);
    g->h_seq = ff_malloc(T * 4);
    g->h_table = ff_calloc(R * (size_t)table_ld, 4);
    g->slot_tables = ff_malloc(R * (size_t)table_ld * 4);
    g->blk_ref = ff_calloc((size_t)c.kv_blocks, 4);
    g->blk_free = ff_malloc((size_t)c.kv_blocks * 4);
    g->h_nkeys = ff_malloc(T * 4);
    g->h_rows = ff_malloc(R * 4);
    g->h_rowmap = ff_malloc(R * 4);
    g->h_sp = ff_malloc(R * sizeof(ff_sample_params));
    g->h_stok = ff_malloc(R * 4);
    g->h_slp = ff_malloc(R * 4);
    g->batch = ff_malloc(R * 4);
    g->seqs = ff_calloc(R, sizeof(gen_seq));
    g->slot_tokens = ff_malloc(R * (size_t)c.max_seq_len * 4);
    g->slot_logprobs = ff_malloc(R * (size_t)c.max_seq_len * 4);
    bool tp_ok = true;
    if (g->graphs_on) {
        g->graph = ff_calloc((size_t)g->graph_cap + 1, sizeof *g->graph);
        g->seen = ff_calloc((size_t)g->graph_cap + 1, sizeof *g->seen);
        tp_ok = g->graph && g->seen;
        g->graph_made[0] = UINT64_MAX; /* the first step takes the model's count */
    }
    if (g->piped && !g->pipe_dev) {
        g->h_px = ff_malloc(T * H * 4);
        g->h_plg = ff_malloc(R * V * 4);
        tp_ok = g->h_px && g->h_plg;
    }
    if (tp_ok && m->tp > 1) { /* host staging now, so that steps do not allocate */
        g->h_tok_tp = ff_malloc(T * 4);
        if (ff_model_comm_on_device(&m->comm)) {
            g->lg_counts = ff_malloc((size_t)m->tp * sizeof *g->lg_counts);
            g->h_perm = ff_malloc(R * (size_t)m->tp * 4);
            tp_ok = g->h_tok_tp && g->lg_counts && g->h_perm;
        } else {
            g->h_lg = ff_malloc((R * (size_t)m->V + 2 * R * V) * 4);
            tp_ok = g->h_tok_tp && g->h_lg && ffm_tp_host(m, T * H);
        }
    }
    if (!tp_ok || !g->kv || (c.kv_bf16 && !g->h_kv16) || !g->ws || !g->h_tok || !g->h_pos || !g->h_wrow || !g->h_seq || !g->h_nkeys || !g->h_rows ||
        !g->h_rowmap || !g->h_sp || !g->h_stok || !g->h_slp || !g->batch || !g->seqs || !g->slot_tokens ||
        !g->slot_logprobs || !g->h_table || !g->slot_tables || !g->blk_ref || !g->blk_free) {
        ff_error_wrap("generator with %d slots of %d positions, a KV cache of %d blocks of %d", c.max_slots,
                      c.max_seq_len, c.kv_blocks, c.kv_block_rows);
        ff_generator_destroy(&g);
        return NULL;
    }
    for (int32_t b = 0; b < c.kv_blocks; b++) g->blk_free[b] = c.kv_blocks - 1 - b; /* block 0 on top */
    g->n_free = c.kv_blocks;
    for (int32_t s = 0; s < c.max_slots; s++) g->seqs[s].table = g->slot_tables + (size_t)s * (size_t)table_ld;
    return g;
}

static void req_release(gen_req *r) {
    if (--r->refs > 0) return;
    free(r->prompt);
    free(r->stop);
    free(r);
}

void ff_generator_destroy(ff_generator **pg) {
    if (!pg || !*pg) return;
    ff_generator *g = *pg;
    if (g->seqs)
        for (int32_t s = 0; s < g->c.max_slots; s++)
            if (g->seqs[s].req) req_release(g->seqs[s].req);
    for (gen_req *r = g->q_head, *n; r; r = n) {
        n = r->next;
        free(r->prompt);
        free(r->stop);
        free(r);
    }
    for (int32_t i = 0; i < g->d_len; i++) ff_gen_output_free(&g->done[(g->d_head + i) % g->d_cap]);
    free(g->done);
    for (int32_t p = 0; g->graph && p <= g->graph_cap; p++) ff_stream_graph_destroy(&g->graph[p]);
    free(g->graph);
    free(g->seen);
    ff_buffer_destroy(&g->kv);
    free(g->h_kv16);
    ff_buffer_destroy(&g->ws);
    free(g->h_tok);
    free(g->h_pos);
    free(g->h_wrow);
    free(g->h_seq);
    free(g->h_table);
    free(g->slot_tables);
    free(g->blk_ref);
    free(g->blk_free);
    free(g->h_nkeys);
    free(g->h_rows);
    free(g->h_rowmap);
    free(g->h_sp);
    free(g->h_stok);
    free(g->h_slp);
    free(g->h_ban);
    free(g->h_tok_tp);
    free(g->h_lg);
    free(g->lg_counts);
    free(g->h_perm);
    free(g->h_px);
    free(g->h_plg);
    free(g->batch);
    free(g->seqs);
    free(g->slot_tokens);
    free(g->slot_logprobs);
    free(g);
    *pg = NULL;
}

int32_t ff_generator_pending(const ff_generator *g) { return g->n_waiting + g->n_running; }
int32_t ff_generator_running(const ff_generator *g) { return g->n_running; }
int32_t ff_generator_room(const ff_generator *g) {
    int32_t slots = g->c.max_slots - g->n_running, blocks = (g->n_free - g->promised) / g->table_ld;
    return slots < blocks ? slots : blocks;
}
int64_t ff_generator_kv_bytes(const ff_generator *g) { return (int64_t)ff_buffer_size(g->kv); }
int64_t ff_generator_workspace_bytes(const ff_generator *g) { return (int64_t)ff_buffer_size(g->ws); }
void ff_generator_kv_blocks(const ff_generator *g, int32_t *used, int32_t *peak, int32_t *total) {
    *used = g->n_blocks - g->n_free;
    *peak = g->peak_used;
    *total = g->n_blocks;
}
int32_t ff_generator_kv_block_rows(const ff_generator *g) { return g->block_rows; }
void ff_generator_kv_peak_reset(ff_generator *g) { g->peak_used = g->n_blocks - g->n_free; }

/* ---- the block pool ------------------------------------------------------------------------ */

static int32_t blocks_of(const ff_generator *g, int64_t positions) {
    return (int32_t)((positions + g->block_rows - 1) / g->block_rows);
}

/* The blocks a sequence of this prompt and budget may fill. */
static int32_t seq_blocks(const ff_generator *g, int32_t prompt_len, int32_t max_new) {
    int64_t n = (int64_t)prompt_len + max_new;
    return blocks_of(g, n < g->c.max_seq_len ? n : g->c.max_seq_len);
}

/* A block from the pool onto the end of the sequence's table, out of its promise. */
static void blk_take(ff_generator *g, gen_seq *q) {
    assert(g->n_free > 0 && q->promise > 0 && q->n_blocks < g->table_ld);
    int32_t b = g->blk_free[--g->n_free];
    g->blk_ref[b] = 1;
    q->table[q->n_blocks++] = b;
    q->promise--;
    g->promised--;
    if (g->n_blocks - g->n_free > g->peak_used) g->peak_used = g->n_blocks - g->n_free;
}

/* Another holder of block b (a shared prompt block) onto the end of q's table. */
static void blk_share(ff_generator *g, gen_seq *q, int32_t b) {
    assert(g->blk_ref[b] > 0 && q->n_blocks < g->table_ld);
    g->blk_ref[b]++;
    q->table[q->n_blocks++] = b;
}

/* The sequence lets go of its blocks (each back to the pool when it was the last holder) and
 * of what remains of its promise. */
static void seq_release(ff_generator *g, gen_seq *q) {
    for (int32_t i = 0; i < q->n_blocks; i++) {
        int32_t b = q->table[i];
        assert(g->blk_ref[b] > 0);
        if (--g->blk_ref[b] == 0) g->blk_free[g->n_free++] = b;
    }
    g->promised -= q->promise;
    q->n_blocks = q->promise = 0;
}

/* The cache row of position p of q. */
static int32_t seq_row(const ff_generator *g, const gen_seq *q, int32_t p) {
    assert(p / g->block_rows < q->n_blocks);
    return q->table[p / g->block_rows] * g->block_rows + p % g->block_rows;
}

/* Row s of the forward's block tables: q's. */
static void put_table(ff_generator *g, int32_t s, const gen_seq *q) {
    memcpy(g->h_table + (size_t)s * (size_t)g->table_ld, q->table, (size_t)q->n_blocks * 4);
}

static int check_sampling(const ff_model *m, const ff_sampling *s) {
    const char *w = "sampling";
    if (!(s->temperature >= 0 && isfinite(s->temperature)))
        return ff_error_set(w, "use 0 for greedy", "temperature %g must be >= 0", (double)s->temperature);
    if (s->top_k < 0) return ff_error_set(w, "use 0 to turn top-k off", "top_k %d must be >= 0", s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1))
        return ff_error_set(w, "use 1 to turn top-p off", "top_p %g must be in (0, 1]", (double)s->top_p);
    if (s->max_new_tokens < 1) return ff_error_set(w, NULL, "max_new_tokens %d must be >= 1", s->max_new_tokens);
    if (s->n_stop < 0 || (s->n_stop > 0 && !s->stop_tokens))
        return ff_error_set(w, NULL, "%d stop tokens but no array", s->n_stop);
    if (s->n_stop > 0 && ffm_check_tokens(m, s->stop_tokens, s->n_stop, "stop tokens", false)) return -1;
    if ((int)s->logprob_mode < 0 || (int)s->logprob_mode > 2)
        return ff_error_set(w, NULL, "unknown logprob_mode %d", (int)s->logprob_mode);
    if (s->min_new_tokens < 0 || s->min_new_tokens > s->max_new_tokens)
        return ff_error_set(w, "a floor between 0 (none) and max_new_tokens", "min_new_tokens %d is outside [0, %d]",
                            s->min_new_tokens, s->max_new_tokens);
    if (s->len_median != 0) {
        if (!(s->len_median >= 1 && s->len_median <= 1e6))
            return ff_error_set(w, "a median length of at least 1 token (0 turns the length draw off)",
                                "len_median %g is outside [1, 1e6]", (double)s->len_median);
        if (!(s->len_p99_ratio >= 1 && s->len_p99_ratio <= 1e4))
            return ff_error_set(w, "p99 / median, at least 1 (1: every length the median)", "len_p99_ratio %g is outside [1, 1e4]",
                                (double)s->len_p99_ratio);
        if (s->len_max < 0) return ff_error_set(w, "0 caps the lengths at max_new_tokens", "len_max %d must be >= 0", s->len_max);
    }
    return 0;
}

/* The response length of sample j of a request (ff_sampling.len_median), from its own stream. */
static int32_t draw_length(const ff_sampling *sp, uint64_t seed, int32_t j) {
    ff_rng r;
    ff_rng_seed(&r, ff_seed_stream(seed, 0x4c454e47u /* "LENG" */, (uint64_t)j)); /* seed + j would collide across adjacent seeds */
    const double sigma = log((double)sp->len_p99_ratio) / 2.3263478740408408; /* z of the 99th percentile */
    double L = round((double)sp->len_median * exp(sigma * ff_rng_normal(&r)));
    const int32_t cap = sp->len_max > 0 && sp->len_max < sp->max_new_tokens ? sp->len_max : sp->max_new_tokens;
    return L < 1 ? 1 : L > cap ? cap : (int32_t)L;
}

int ff_generator_submit(ff_generator *g, const ff_gen_request *r) {
    const ff_model *m = g->m;
    if (!r->prompt || r->prompt_len < 1)
        return ff_error_set("generate request", "give at least one prompt token (e.g. BOS)", "empty prompt");
    if (r->prompt_len + 1 > g->c.max_seq_len)
        return ff_error_set("generate request", "shorten the prompt or raise max_seq_len",
                            "prompt of %d tokens leaves no room in max_seq_len = %d", r->prompt_len, g->c.max_seq_len);
    if (r->n_samples < 1 || r->n_samples > g->c.max_slots)
        return ff_error_set("generate request", "raise max_slots or lower n_samples",
                            "n_samples %d must be in [1, max_slots = %d]", r->n_samples, g->c.max_slots);
    if (ffm_check_tokens(m, r->prompt, r->prompt_len, "prompt", false)) return -1;
    if (check_sampling(m, &r->sampling)) return -1;
    /* the prompt's full blocks once (shared), then each sample's own */
    const int32_t shared = r->prompt_len / g->block_rows;
    int64_t need = shared;
    for (int32_t j = 0; j < r->n_samples; j++) {
        int32_t max_new = r->sampling.len_median > 0 ? draw_length(&r->sampling, r->seed, j) : r->sampling.max_new_tokens;
        need += seq_blocks(g, r->prompt_len, max_new) - shared;
    }
    if (need > g->n_blocks)
        return ff_error_set("generate request", "raise kv_blocks, or lower n_samples or max_new_tokens",
                            "the request may fill %lld KV blocks of %d positions (prompt %d, %d samples of up to %d new "
                            "tokens); the cache holds %d",
                            (long long)need, g->block_rows, r->prompt_len, r->n_samples, r->sampling.max_new_tokens,
                            g->n_blocks);
    gen_req *q = ff_calloc(1, sizeof *q);
    if (!q) return -1;
    q->id = r->id;
    q->prompt_len = r->prompt_len;
    q->n_samples = r->n_samples;
    q->sp = r->sampling;
    q->seed = r->seed;
    q->refs = r->n_samples;
    q->need = (int32_t)need;
    const int32_t *stop = r->sampling.stop_tokens;
    int32_t n_stop = r->sampling.n_stop;
    if (n_stop == 0) { /* the config's end-of-sequence ids */
        stop = m->cfg.eos_token_ids;
        n_stop = m->cfg.n_eos;
        for (int32_t i = 0; i < n_stop; i++)
            if (stop[i] < 0 || stop[i] >= m->cfg.vocab_size) n_stop = 0; /* a bad eos id in the config stops nothing */
    }
    q->prompt = ff_malloc((size_t)r->prompt_len * 4);
    q->stop = ff_malloc((size_t)(n_stop > 0 ? n_stop : 1) * 4);
    if (!q->prompt || !q->stop) {
        free(q->prompt);
        free(q->stop);
        free(q);
        return -1;
    }
    memcpy(q->prompt, r->prompt, (size_t)r->prompt_len * 4);
    if (n_stop > 0) memcpy(q->stop, stop, (size_t)n_stop * 4);
    q->n_stop = n_stop;
    q->sp.stop_tokens = NULL;
    if (g->q_tail) g->q_tail->next = q;
    else g->q_head = q;
    g->q_tail = q;
    g->n_waiting += r->n_samples;
    return 0;
}

/* TP: this rank's logits [R, V/tp] into the whole [R, V] on every rank. With the comm's
 * device calls: gathered as [tp, R, V/tp] into logits_rep (free until sampling), whose rows of
 * V/tp are then put in [R, V] order by one row gather (row b tp + r of the result is row
 * r R + b of the gathered); else through host memory. */
static int gather_logits(ff_generator *g, int32_t R) {
    ff_model *m = g->m;
    const size_t Vl = (size_t)m->V, n = (size_t)R * Vl, tp = (size_t)m->tp;
    if (ff_model_comm_on_device(&m->comm)) {
        for (size_t r = 0; r < tp; r++) g->lg_counts[r] = n;
        if (m->comm.dev_all_gather_v(m->comm.ctx, m->st, GW(g, logits_loc), GW(g, logits_rep), g->lg_counts))
            return ff_error_wrap("tensor parallelism: all-gather of %d rows of logits", R);
        ff_gather_rows(m->st, GW(g, logits_rep), GW(g, i_perm), GW(g, logits), R * (int)tp, (int)Vl); /* i_perm: step_inputs */
        return 0;
    }
    float *mine = g->h_lg, *all = mine + n, *whole = all + tp * n; /* [R, Vl], [tp, R, Vl], [R, V] */
    ff_memcpy_d2h(m->st, mine, GW(g, logits_loc), n * 4);
    if (m->comm.all_gather(m->comm.ctx, mine, all, n))
        return ff_error_wrap("tensor parallelism: all-gather of %d rows of logits", R);
    for (size_t r = 0; r < tp; r++)
        for (int32_t b = 0; b < R; b++)
            memcpy(whole + (size_t)b * (size_t)g->V + r * Vl, all + r * n + (size_t)b * Vl, Vl * 4);
    ff_memcpy_h2d(m->st, GW(g, logits), whole, (size_t)R * (size_t)g->V * 4);
    return 0;
}

/* Run the model over g->h_* inputs already uploaded for T tokens of S sequences (block
 * tables); logits of the R rows listed in i_rows land in g->logits [R, V]. 0 or -1 + error
 * (a failed collective). */
static int infer(ff_generator *g, int32_t T, int32_t R, int32_t S) {
    ff_model *m = g->m;
    ff_stream *st = m->st;
    const int H = m->H;
    const float eps = (float)m->cfg.rms_norm_eps;
    const size_t KD = (size_t)m->Hkv * m->D, rows = g->kv_rows;
    ff_dptr x = GW(g, x);
    /* one set of activations for every layer, the residual x updated in place */
    const ffm_layer_acts a = {.x = x, .xn1 = GW(g, xn), .rstd1 = GW(g, rstd), .qkv = GW(g, qkv), .att = GW(g, att),
                              .mid = x, .xn2 = GW(g, xn), .rstd2 = GW(g, rstd), .gu = GW(g, gu), .hm = GW(g, hm),
                              .y = x};
    ffm_layer_tokens tk = {.T = T, .pos = GW(g, i_pos), .kv_wrow = GW(g, i_wrow), .kv_table = GW(g, i_table),
                           .kv_S = S, .kv_table_ld = g->table_ld, .kv_block_rows = g->block_rows,
                           .kv_seq = GW(g, i_seq), .kv_nkeys = GW(g, i_nkeys)};
    const ff_gen_pipe *pp = g->piped ? &g->pipe : NULL;
    const size_t TH = (size_t)T * H;
    if (m->has_embed) {
        if (ffm_w_embed(m, &m->tensors[m->t_embed], g->h_tok_tp ? g->h_tok_tp : g->h_tok, GW(g, i_tok), x, GW(g, xn), T)) return -1;
        if (m->tp > 1 && ffm_tp_sum(m, x, TH)) return -1; /* vocabulary-parallel embedding */
    } else if (g->pipe_dev) { /* the previous stage's output */
        if (pp->dev_recv(pp->ctx, st, pp->rank - 1, x, TH))
            return ff_error_wrap("pipeline: the hidden states of %d tokens from stage %d", T, pp->rank - 1);
    } else {
        if (pp->recv(pp->ctx, pp->rank - 1, g->h_px, TH)) return ff_error_wrap("pipeline: the hidden states of %d tokens from stage %d", T, pp->rank - 1);
        ff_memcpy_h2d(st, x, g->h_px, TH * 4);
    }
    for (int l = 0; l < m->L; l++) {
        tk.kv_k = kv_at(g, (size_t)l * g->kv_layer);
        tk.kv_v = kv_at(g, (size_t)l * g->kv_layer + rows * KD);
        tk.kv16 = g->kv_esz == 2;
        if (ffm_layer_forward(m, l, &tk, &a)) return -1;
    }
    if (m->has_final) {
        ff_gather_rows(st, x, GW(g, i_rows), GW(g, xr), R, H);
        ff_rmsnorm_fwd(st, GW(g, xr), ffm_w_vec(m, &m->tensors[m->t_norm]), GW(g, xrn), GW(g, rstdr), R, H, eps);
        ffm_w_out(m, &m->tensors[m->t_lm], R, GW(g, xrn), H, GW(g, logits_loc), m->V);
        if (m->tp > 1 && gather_logits(g, R)) return -1;
    } else if (g->pipe_dev) {
        if (pp->dev_send(pp->ctx, st, pp->rank + 1, x, TH))
            return ff_error_wrap("pipeline: the hidden states of %d tokens to stage %d", T, pp->rank + 1);
    } else {
        ff_memcpy_d2h(st, g->h_px, x, TH * 4);
        if (ff_stream_sync(st) || pp->send(pp->ctx, pp->rank + 1, g->h_px, TH))
            return ff_error_wrap("pipeline: the hidden states of %d tokens to stage %d", T, pp->rank + 1);
    }
    if (!pp) return 0;
    /* the last stage's logits to every stage: all sample the same tokens */
    const size_t RV = (size_t)R * (size_t)g->V;
    if (g->pipe_dev) {
        if (pp->dev_broadcast(pp->ctx, st, pp->size - 1, GW(g, logits), RV))
            return ff_error_wrap("pipeline: the logits of %d rows from the last stage", R);
        return 0;
    }
    if (m->has_final) ff_memcpy_d2h(st, g->h_plg, GW(g, logits), RV * 4);
    if (ff_stream_sync(st) || pp->broadcast(pp->ctx, pp->size - 1, g->h_plg, RV))
        return ff_error_wrap("pipeline: the logits of %d rows from the last stage", R);
    if (!m->has_final) ff_memcpy_h2d(st, GW(g, logits), g->h_plg, RV * 4);
    return 0;
}

/* A step's inputs, before its forward (and outside any graph capture): the tokens' positions,
 * rows and tables uploaded, and a view's weights as its products will read them (ffm_view_bf16:
 * the viewed model's bf16 copy made fresh where it is used). 0 or -1 + error. */
static int step_inputs(ff_generator *g, int32_t T, int32_t R, int32_t S) {
    if (ffm_view_bf16(g->m)) return -1;
    ff_stream *st = g->m->st;
    if (g->h_tok_tp) ffm_tp_local_ids(g->m, g->h_tok, g->h_tok_tp, T, false);
    ff_memcpy_h2d(st, GW(g, i_tok), g->h_tok_tp ? g->h_tok_tp : g->h_tok, (size_t)T * 4);
    ff_memcpy_h2d(st, GW(g, i_pos), g->h_pos, (size_t)T * 4);
    ff_memcpy_h2d(st, GW(g, i_wrow), g->h_wrow, (size_t)T * 4);
    ff_memcpy_h2d(st, GW(g, i_seq), g->h_seq, (size_t)T * 4);
    ff_memcpy_h2d(st, GW(g, i_table), g->h_table, (size_t)S * (size_t)g->table_ld * 4);
    ff_memcpy_h2d(st, GW(g, i_nkeys), g->h_nkeys, (size_t)T * 4);
    ff_memcpy_h2d(st, GW(g, i_rows), g->h_rows, (size_t)R * 4);
    if (g->m->tp > 1 && ff_model_comm_on_device(&g->m->comm)) { /* gather_logits' row order */
        const size_t tp = (size_t)g->m->tp;
        for (int32_t b = 0; b < R; b++)
            for (size_t r = 0; r < tp; r++) g->h_perm[(size_t)b * tp + r] = (int32_t)(r * (size_t)R + (size_t)b);
        ff_memcpy_h2d(st, GW(g, i_perm), g->h_perm, (size_t)R * tp * 4);
    }
    return 0;
}

static float draw(ff_rng *r) { return (float)(ff_rng_u64(r) >> 40) * 0x1p-24f; } /* [0, 1) in float */

static void fill_params(ff_generator *g, int32_t b, gen_seq *q) {
    ff_sample_params *p = &g->h_sp[b];
    p->temperature = q->req->sp.temperature;
    p->top_k = q->req->sp.top_k;
    p->top_p = q->req->sp.top_p;
    p->logprob_mode = (int32_t)q->req->sp.logprob_mode;
    p->uniform = draw(&q->rng);
}

static int push_done(ff_generator *g, ff_gen_output *o) {
    if (g->d_len == g->d_cap) {
        int32_t cap = g->d_cap ? g->d_cap * 2 : 16;
        ff_gen_output *d = ff_malloc((size_t)cap * sizeof *d);
        if (!d) return -1;
        for (int32_t i = 0; i < g->d_len; i++) d[i] = g->done[(g->d_head + i) % g->d_cap];
        free(g->done);
        g->done = d;
        g->d_head = 0;
        g->d_cap = cap;
    }
    g->done[(g->d_head + g->d_len) % g->d_cap] = *o;
    g->d_len++;
    return 0;
}

/* The slot is free again: its blocks back, its state gone (its table's memory stays). */
static void seq_clear(ff_generator *g, gen_seq *q) {
    seq_release(g, q);
    int32_t *table = q->table;
    memset(q, 0, sizeof *q);
    q->table = table;
}

/* The sequence in `slot` is done: its output (copied out of the slot) joins the finished
 * FIFO and the slot is free. Out of memory loses this output, with an error. */
static int finish(ff_generator *g, int32_t slot, ff_finish_reason why) {
    gen_seq *q = &g->seqs[slot];
    size_t n = (size_t)(q->n_gen > 0 ? q->n_gen : 1);
    ff_gen_output o = {.id = q->req->id, .sample = q->sample, .n_tokens = q->n_gen, .finish = why};
    o.tokens = ff_malloc(n * 4);
    o.logprobs = ff_malloc(n * 4);
    int rc = o.tokens && o.logprobs ? 0 : -1;
    if (!rc) {
        memcpy(o.tokens, q->tokens, (size_t)q->n_gen * 4);
        memcpy(o.logprobs, q->logprobs, (size_t)q->n_gen * 4);
        rc = push_done(g, &o);
    }
    if (rc) {
        ff_gen_output_free(&o);
        ff_error_wrap("generator: output of request %llu sample %d lost", (unsigned long long)q->req->id, q->sample);
    }
    req_release(q->req);
    seq_clear(g, q);
    g->n_running--;
    return rc;
}

/* Append the sampled token of batch row b to its sequence; finish it when it should stop. */
static int append(ff_generator *g, int32_t slot, int32_t tok, float lp) {
    gen_seq *q = &g->seqs[slot];
    const gen_req *r = q->req;
    q->tokens[q->n_gen] = tok;
    q->logprobs[q->n_gen] = lp;
    q->n_gen++;
    for (int32_t i = 0; i < r->n_stop; i++)
        if (r->stop[i] == tok) return finish(g, slot, FF_FINISH_STOP);
    if (q->n_gen >= q->max_new || r->prompt_len + q->n_gen >= g->c.max_seq_len)
        return finish(g, slot, FF_FINISH_LENGTH);
    return 0;
}

static bool banned(const gen_seq *q) { return q->n_gen + 1 < q->min_new && q->req->n_stop > 0; }

/* Rows [B, V] of logits for the sequences in g->batch: sample each, its stop tokens masked
 * (-inf) first when it is under its floor. The masked raw logits x_e are kept so that a
 * MODEL (TEMPERATURE: x / t) log-prob, which the kernel computes over the masked row, is
 * brought back to the whole row's softmax: with lse_m = x_tok - lp_m (the masked row's
 * log-sum-exp), lp = lp_m - log1p(sum_e exp(x_e - lse_m)). */
static int sample_rows(ff_generator *g, ff_dptr logits, int32_t B) {
    ff_stream *st = g->m->st;
    const size_t V = (size_t)g->V;
    int32_t nban = 0;
    for (int32_t b = 0; b < B; b++)
        if (banned(&g->seqs[g->batch[b]])) nban += g->seqs[g->batch[b]].req->n_stop;
    if (nban > g->ban_cap) { /* grows to the largest batch's need once, not per step */
        float *v = ff_realloc(g->h_ban, (size_t)nban * 2 * sizeof *v);
        if (!v) return ff_error_wrap("generator: masking %d stop-token logits", nban);
        g->h_ban = v;
        g->ban_cap = nban;
    }
    float *raw = g->h_ban, *tok_logit = g->h_ban + g->ban_cap; /* [nban], then [B <= nban] */
    if (nban > 0) {
        for (int32_t b = 0, k = 0; b < B; b++) {
            const gen_seq *q = &g->seqs[g->batch[b]];
            if (!banned(q)) continue;
            for (int32_t i = 0; i < q->req->n_stop; i++, k++)
                ff_memcpy_d2h(st, &raw[k], ff_dptr_add(logits, (size_t)b * V + (size_t)q->req->stop[i], 4), 4);
        }
        if (ff_stream_sync(st)) return -1;
        const float ninf = -INFINITY;
        for (int32_t b = 0; b < B; b++) {
            const gen_seq *q = &g->seqs[g->batch[b]];
            if (!banned(q)) continue;
            for (int32_t i = 0; i < q->req->n_stop; i++)
                ff_memcpy_h2d(st, ff_dptr_add(logits, (size_t)b * V + (size_t)q->req->stop[i], 4), &ninf, 4);
        }
    }
    ff_memcpy_h2d(st, GW(g, sparams), g->h_sp, (size_t)B * sizeof(ff_sample_params));
    ff_sample(st, logits, B, g->V, GW(g, sparams), GW(g, sws), GW(g, stok), GW(g, slp));
    ff_memcpy_d2h(st, g->h_stok, GW(g, stok), (size_t)B * 4);
    ff_memcpy_d2h(st, g->h_slp, GW(g, slp), (size_t)B * 4);
    if (ff_stream_sync(st)) return -1;
    if (nban == 0) return 0;
    for (int32_t b = 0, k = 0; b < B; b++) {
        const gen_seq *q = &g->seqs[g->batch[b]];
        if (!banned(q)) continue;
        ff_memcpy_d2h(st, &tok_logit[k++], ff_dptr_add(logits, (size_t)b * V + (size_t)g->h_stok[b], 4), 4);
    }
    if (ff_stream_sync(st)) return -1;
    for (int32_t b = 0, k = 0, e = 0; b < B; b++) {
        const gen_seq *q = &g->seqs[g->batch[b]];
        if (!banned(q)) continue;
        const ff_sample_params *p = &g->h_sp[b];
        const int32_t ns = q->req->n_stop;
        const double t = p->logprob_mode == FF_LOGPROB_TEMPERATURE && p->temperature > 0 ? p->temperature : 1.0;
        if (p->logprob_mode != FF_LOGPROB_SAMPLER) {
            const double lse_m = tok_logit[k] / t - g->h_slp[b];
            double mass = 0;
            for (int32_t i = 0; i < ns; i++) {
                bool dup = false; /* a stop id listed twice is one logit */
                for (int32_t j = 0; j < i; j++) dup |= q->req->stop[j] == q->req->stop[i];
                if (!dup) mass += exp(raw[e + i] / t - lse_m);
            }
            g->h_slp[b] = (float)(g->h_slp[b] - log1p(mass));
        }
        k++;
        e += ns;
    }
    return 0;
}

/* q's rows 0..n-1 (its blocks taken) from its tokens, by prefills of up to
 * max_prefill_tokens tokens each attending to the rows before it (the logits of one row are
 * computed and unused): a moved sequence's rows, or a long prompt's chunks before its last.
 * It fills the host mirrors' first rows and the first table row itself. */
static int prefill_rows(ff_generator *g, const gen_seq *q, const int32_t *tokens, int32_t n) {
    const int32_t chunk = g->c.max_prefill_tokens;
    put_table(g, 0, q);
    for (int32_t p0 = 0; p0 < n; p0 += chunk) {
        int32_t T = n - p0 < chunk ? n - p0 : chunk;
        for (int32_t i = 0; i < T; i++) {
            g->h_tok[i] = tokens[p0 + i];
            g->h_pos[i] = p0 + i;
            g->h_seq[i] = 0;
            g->h_wrow[i] = seq_row(g, q, p0 + i);
            g->h_nkeys[i] = p0 + i + 1;
        }
        g->h_rows[0] = T - 1;
        if (step_inputs(g, T, 1, 1) || infer(g, T, 1, 1)) return -1;
    }
    return 0;
}

/* Admit waiting requests into free slots and prefill them. */
static int admit(ff_generator *g) {
    ff_model *m = g->m;
    ff_stream *st = m->st;
    const size_t KD = (size_t)m->Hkv * m->D, rows = g->kv_rows;
    const int32_t bs = g->block_rows;
    const int32_t chunk = g->c.max_prefill_tokens;
    int32_t free_slots = g->c.max_slots - g->n_running, budget = chunk;
    int32_t T = 0, R = 0, B = 0;
    const int64_t t0 = ff_now_ns();
    while (g->q_head && g->q_head->n_samples <= free_slots && g->q_head->need <= g->n_free - g->promised) {
        /* the prompt's tokens in this step's packed forward: all of them, or for a prompt longer
         * than a forward holds, its last chunk, its others prefilled first on their own (so only
         * as the step's first request: those forwards use the host mirrors the batch fills) */
        const int32_t P = g->q_head->prompt_len, tail = P <= chunk ? P : (P - 1) % chunk + 1;
        if (tail > budget || (tail < P && T > 0)) break;
        gen_req *r = g->q_head;
        g->q_head = r->next;
        if (!g->q_head) g->q_tail = NULL;
        r->next = NULL;
        const int32_t shared = r->prompt_len / bs;
        gen_seq *first = NULL;
        for (int32_t j = 0, s = 0; j < r->n_samples; j++) {
            while (g->seqs[s].req) s++;
            gen_seq *q = &g->seqs[s];
            q->tokens = g->slot_tokens + (size_t)s * (size_t)g->c.max_seq_len;
            q->logprobs = g->slot_logprobs + (size_t)s * (size_t)g->c.max_seq_len;
            q->req = r;
            q->sample = j;
            q->n_gen = 0;
            ff_rng_seed(&q->rng, r->seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(j + 1)));
            q->min_new = r->sp.min_new_tokens;
            q->max_new = r->sp.max_new_tokens;
            if (r->sp.len_median > 0) q->min_new = q->max_new = draw_length(&r->sp, r->seed, j);
            /* what submit counted in r->need: sample 0 all its blocks, the others theirs beyond the shared ones */
            q->promise = seq_blocks(g, r->prompt_len, q->max_new) - (j ? shared : 0);
            g->promised += q->promise;
            g->n_running++;
            g->n_waiting--;
            free_slots--;
            if (j == 0) { /* the prompt's blocks, written by the prefill */
                first = q;
                for (int32_t k = blocks_of(g, r->prompt_len); k > 0; k--) blk_take(g, q);
                put_table(g, R, q);
            }
            g->batch[B] = s;
            g->h_rowmap[B] = R;
            B++;
        }
        if (tail < P && prefill_rows(g, first, r->prompt, P - tail)) return -1;
        for (int32_t i = P - tail; i < P; i++, T++) {
            g->h_tok[T] = r->prompt[i];
            g->h_pos[T] = i;
            g->h_seq[T] = R;
            g->h_wrow[T] = seq_row(g, first, i);
            g->h_nkeys[T] = i + 1;
        }
        put_table(g, R, first); /* prefill_rows used row 0 */
        g->h_rows[R++] = T - 1;
        budget -= tail;
    }
    if (B == 0) return 0;
    if (step_inputs(g, T, R, R) || infer(g, T, R, R)) return -1;
    /* the other samples share the prompt's full blocks and copy the rows of its partial one */
    for (int32_t b = 0; b < B; b++) {
        gen_seq *q = &g->seqs[g->batch[b]];
        if (q->sample == 0) continue;
        const gen_seq *src = &g->seqs[g->batch[b - q->sample]];
        const int32_t P = q->req->prompt_len, shared = P / bs, rest = P % bs;
        for (int32_t k = 0; k < shared; k++) blk_share(g, q, src->table[k]);
        if (rest == 0) continue;
        blk_take(g, q);
        const size_t from = (size_t)src->table[shared] * (size_t)bs * KD, to = (size_t)q->table[shared] * (size_t)bs * KD;
        for (int l = 0; l < m->L; l++)
            for (int kv = 0; kv < 2; kv++) {
                size_t base = (size_t)l * g->kv_layer + (size_t)kv * rows * KD;
                ff_memcpy_d2d(st, kv_at(g, base + to), kv_at(g, base + from), (size_t)rest * KD * g->kv_esz);
            }
    }
    ff_memcpy_h2d(st, GW(g, i_rowmap), g->h_rowmap, (size_t)B * 4);
    ff_gather_rows(st, GW(g, logits), GW(g, i_rowmap), GW(g, logits_rep), B, g->V);
    for (int32_t b = 0; b < B; b++) fill_params(g, b, &g->seqs[g->batch[b]]);
    if (sample_rows(g, GW(g, logits_rep), B)) return -1; /* the sampled tokens are on the host: the forward is done */
    for (int32_t b = 0; b < B; b++) /* the prompts' tokens, chunked ones whole */
        if (g->seqs[g->batch[b]].sample == 0) g->prefill_tokens += g->seqs[g->batch[b]].req->prompt_len;
    g->prefill_s += (double)(ff_now_ns() - t0) * 1e-9;
    for (int32_t b = 0; b < B; b++)
        if (append(g, g->batch[b], g->h_stok[b], g->h_slp[b])) return -1;
    return 0;
}

void ff_generator_prefill_stats(const ff_generator *g, int64_t *tokens, double *seconds) {
    *tokens = g->prefill_tokens;
    *seconds = g->prefill_s;
}

/* The rows a decode step of B sequences runs: B eagerly; with graphs, B padded to 1, 2, 4, 8 or
 * a multiple of 8 (at most graph_cap), so that a few graphs serve every batch size. */
static int32_t padded(const ff_generator *g, int32_t B) {
    if (!g->graphs_on || B > g->graph_cap) return B;
    int32_t p = B <= 8 ? 1 : (B + 7) / 8 * 8;
    while (p < B) p *= 2;
    return p < g->graph_cap ? p : g->graph_cap;
}

static void graphs_drop(ff_generator *g) {
    for (int32_t p = 0; p <= g->graph_cap; p++) {
        ff_stream_graph_destroy(&g->graph[p]);
        g->seen[p] = false;
    }
}

static void graphs_off(ff_generator *g, const char *why) {
    graphs_drop(g);
    g->graphs_on = false;
    snprintf(g->graph_off_why, sizeof g->graph_off_why, "%s", why);
}

/* Whether every rank of the model's tensor-parallel group and pipeline captured its step (ok,
 * this rank's answer in, the group's out). A rank whose capture failed goes on eagerly; were
 * the others to replay, its collectives would be launched directly against theirs from a
 * graph, which NCCL does not pair (a collective runs from a graph on every rank of it or on
 * none). So all go eagerly when one failed. Through the host calls (a float each), once per
 * capture, never per replay. 0 or -1 + error (the group is broken). */
static int captures_agree(ff_generator *g, bool *ok) {
    const ff_model *m = g->m;
    float failed = *ok ? 0.0f : 1.0f;
    if (m->tp > 1 && m->comm.all_reduce_max(m->comm.ctx, &failed, 1))
        return ff_error_wrap("tensor parallelism: whether every rank captured its decode graph");
    if (g->piped) {
        float any = failed;
        for (int r = 0; r < g->pipe.size; r++) {
            float theirs = failed;
            if (g->pipe.broadcast(g->pipe.ctx, r, &theirs, 1))
                return ff_error_wrap("pipeline: whether stage %d captured its decode graph", r);
            any = fmaxf(any, theirs);
        }
        failed = any;
    }
    *ok = failed == 0.0f;
    return 0;
}

/* The forward of a decode step of P rows (inputs uploaded): a graph's replay when there is one
 * for P, else kernel by kernel (the first step of a size; then its capture). The graphs hold
 * the addresses of the weights (a view's and the viewed model's, or its bf16 copy) and RoPE
 * tables: when the model's parameters were released and restored, or the copy made in a new
 * buffer or given back, they are captured again. */
static int decode_forward(ff_generator *g, int32_t P) {
    ff_model *m = g->m;
    if (!g->graphs_on || P > g->graph_cap) {
        g->eager_steps++;
        return infer(g, P, P, P);
    }
    void *key[5] = {ff_dptr_addr(ff_dptr_of(m->params, 0)), ff_dptr_addr(ff_dptr_of(m->rope_cos, 0)),
                    ff_dptr_addr(ff_dptr_of(m->rope_sin, 0)),
                    m->viewed ? ff_dptr_addr(ff_dptr_of(m->viewed->params, 0)) : NULL, /* a view reads the viewed weights */
                    m->v16 ? ff_dptr_addr(ff_dptr_of(m->viewed->w16c, 0)) : NULL};  /* or their bf16 copy */
    /* the count, not the addresses, decides: a buffer made anew may land at its old address on
     * one rank and not on another, and every rank must capture at the same steps (below) */
    const uint64_t made[2] = {m->buffers_moved, m->viewed ? m->viewed->buffers_moved : 0};
    if (memcmp(made, g->graph_made, sizeof made)) {
        graphs_drop(g);
        memcpy(g->graph_made, made, sizeof made);
        memcpy(g->graph_key, key, sizeof key);
    }
    assert(!memcmp(key, g->graph_key, sizeof key)); /* an address moved without a buffer made anew */
    ff_stream *st = m->st;
    if (!g->graph[P]) {
        if (!g->seen[P]) {
            g->seen[P] = true;
            g->eager_steps++;
            return infer(g, P, P, P);
        }
        ff_stream_graph *gr = NULL;
        bool ok = !ff_stream_capture_begin(st);
        if (ok) {
            const int rc = infer(g, P, P, P);
            ok = !ff_stream_capture_end(st, &gr) && !rc;
        }
        char why[sizeof g->graph_off_why] = "";
        if (!ok) snprintf(why, sizeof why, "%s", ff_error_message());
        if (captures_agree(g, &ok)) {
            ff_stream_graph_destroy(&gr);
            return -1;
        }
        if (!ok) { /* nothing ran: the step again, eagerly, on every rank */
            ff_stream_graph_destroy(&gr);
            graphs_off(g, *why ? why : "graph capture: it failed on another rank of the tensor-parallel group or pipeline");
            g->eager_steps++;
            return infer(g, P, P, P);
        }
        g->graph[P] = gr;
        g->graph_captures++;
    }
    g->graph_replays++;
    return ff_stream_graph_launch(g->graph[P], st) ? ff_error_wrap("generator: a decode step's graph (%d rows)", P) : 0;
}

void ff_generator_graph_stats_of(const ff_generator *g, ff_generator_graph_stats *out) {
    memset(out, 0, sizeof *out);
    out->on = g->graphs_on;
    out->captures = g->graph_captures;
    out->replays = g->graph_replays;
    out->eager_steps = g->eager_steps;
    snprintf(out->off_why, sizeof out->off_why, "%s", g->graph_off_why);
}

int ff_generator_step(ff_generator *g) {
    if (admit(g)) return -1;
    int32_t B = 0;
    for (int32_t s = 0; s < g->c.max_slots; s++) {
        gen_seq *q = &g->seqs[s];
        if (!q->req) continue;
        int32_t pos = q->req->prompt_len + q->n_gen - 1; /* where the last token goes */
        if (pos / g->block_rows == q->n_blocks) blk_take(g, q); /* promised at admission */
        g->batch[B] = s;
        g->h_tok[B] = q->tokens[q->n_gen - 1];
        g->h_pos[B] = pos;
        g->h_seq[B] = B;
        g->h_wrow[B] = seq_row(g, q, pos);
        g->h_nkeys[B] = pos + 1;
        g->h_rows[B] = B;
        put_table(g, B, q);
        fill_params(g, B, q);
        B++;
    }
    if (B == 0) return 0;
    const int32_t P = padded(g, B);
    for (int32_t b = B; b < P; b++) { /* padding: position 0 of a sequence that owns the sink block */
        g->h_tok[b] = 0;
        g->h_pos[b] = 0;
        g->h_seq[b] = b;
        g->h_wrow[b] = g->n_blocks * g->block_rows;
        g->h_nkeys[b] = 1;
        g->h_rows[b] = b;
        g->h_table[(size_t)b * (size_t)g->table_ld] = g->n_blocks;
    }
    if (step_inputs(g, P, P, P) || decode_forward(g, P)) return -1;
    if (sample_rows(g, GW(g, logits), B)) return -1;
    for (int32_t b = 0; b < B; b++)
        if (append(g, g->batch[b], g->h_stok[b], g->h_slp[b])) return -1;
    return 0;
}

int ff_generator_pop(ff_generator *g, ff_gen_output *out) {
    if (g->d_len == 0) return 0;
    *out = g->done[g->d_head];
    g->d_head = (g->d_head + 1) % g->d_cap;
    g->d_len--;
    return 1;
}

int32_t ff_generator_abort(ff_generator *g, uint64_t id) {
    int32_t ended = 0;
    for (gen_req **pp = &g->q_head; *pp;) {
        gen_req *r = *pp;
        if (r->id != id) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        g->n_waiting -= r->n_samples;
        ended += r->n_samples;
        free(r->prompt);
        free(r->stop);
        free(r);
    }
    g->q_tail = NULL;
    for (gen_req *r = g->q_head; r; r = r->next) g->q_tail = r;
    for (int32_t s = 0; s < g->c.max_slots; s++)
        if (g->seqs[s].req && g->seqs[s].req->id == id) {
            finish(g, s, FF_FINISH_ABORTED); /* on allocation failure the output is dropped */
            ended++;
        }
    return ended;
}

int ff_model_generate(ff_model *m, const ff_generator_config *cin, const ff_gen_request *reqs, int32_t n_reqs,
                      ff_gen_output **outs, int32_t *n_outs) {
    *outs = NULL;
    *n_outs = 0;
    if (n_reqs < 1) return ff_error_set("generate", NULL, "no requests");
    int32_t total = 0;
    ff_generator_config c = {0};
    if (cin) {
        c = *cin;
    } else {
        int32_t longest = 0, longest_prompt = 0;
        for (int32_t i = 0; i < n_reqs; i++) {
            int64_t len = (int64_t)reqs[i].prompt_len + (reqs[i].sampling.max_new_tokens > 0 ? reqs[i].sampling.max_new_tokens : 1);
            if (len > longest) longest = len > INT32_MAX ? INT32_MAX : (int32_t)len;
            if (reqs[i].prompt_len > longest_prompt) longest_prompt = reqs[i].prompt_len;
        }
        for (int32_t i = 0; i < n_reqs; i++) total += reqs[i].n_samples > 0 ? reqs[i].n_samples : 1;
        c.max_slots = total < 64 ? total : 64;
        c.max_seq_len = longest < m->max_pos ? longest : m->max_pos;
        if (c.max_seq_len < 2) c.max_seq_len = 2;
        c.max_prefill_tokens = longest_prompt > c.max_seq_len ? longest_prompt : c.max_seq_len;
    }
    ff_generator *g = ff_generator_new(m, &c);
    if (!g) return -1;
    /* ids are request indices inside; the caller's ids are restored below */
    int32_t *first = ff_malloc(((size_t)n_reqs + 1) * sizeof(int32_t));
    int rc = first ? 0 : -1;
    total = 0;
    for (int32_t i = 0; i < n_reqs && !rc; i++) {
        ff_gen_request r = reqs[i];
        r.id = (uint64_t)i;
        first[i] = total;
        rc = ff_generator_submit(g, &r);
        if (rc) ff_error_wrap("request %d", i);
        total += r.n_samples;
    }
    ff_gen_output *res = rc ? NULL : ff_calloc((size_t)total, sizeof *res);
    if (!res) rc = -1;
    while (!rc && ff_generator_pending(g) > 0) rc = ff_generator_step(g);
    ff_gen_output o;
    while (ff_generator_pop(g, &o)) {
        if (rc) {
            ff_gen_output_free(&o);
            continue;
        }
        size_t at = (size_t)first[o.id] + (size_t)o.sample;
        o.id = reqs[o.id].id;
        res[at] = o;
    }
    ff_generator_destroy(&g);
    free(first);
    if (rc) {
        if (res)
            for (int32_t i = 0; i < total; i++) ff_gen_output_free(&res[i]);
        free(res);
        return -1;
    }
    *outs = res;
    *n_outs = total;
    return 0;
}

/* ---- moving a running sequence ----------------------------------------------------------- */

static int32_t running_slot(const ff_generator *g, uint64_t id, int32_t sample) {
    for (int32_t s = 0; s < g->c.max_slots; s++)
        if (g->seqs[s].req && g->seqs[s].req->id == id && g->seqs[s].sample == sample) return s;
    return -1;
}

/* Between the host rows [positions, Hkv D] fp32 (one layer's K or V) and q's blocks, block by
 * block: to the cache (up) or from it. A bf16 cache converts through h16, a block's rows. */
static void copy_rows(ff_generator *g, const gen_seq *q, int l, int kv, float *host, int32_t positions, bool up, uint16_t *h16) {
    ff_model *m = g->m;
    const size_t KD = (size_t)m->Hkv * m->D, rows = g->kv_rows;
    const size_t base = (size_t)l * g->kv_layer + (size_t)kv * rows * KD;
    for (int32_t p0 = 0; p0 < positions; p0 += g->block_rows) {
        const int32_t n = positions - p0 < g->block_rows ? positions - p0 : g->block_rows;
        const size_t count = (size_t)n * KD;
        ff_dptr at = kv_at(g, base + (size_t)seq_row(g, q, p0) * KD);
        float *h = host + (size_t)p0 * KD;
        if (g->kv_esz == 4) {
            if (up) ff_memcpy_h2d(m->st, at, h, count * 4);
            else ff_memcpy_d2h(m->st, h, at, count * 4);
        } else if (up) {
            ff_dtype_from_f32(FF_DTYPE_BF16, h, h16, count);
            ff_memcpy_h2d(m->st, at, h16, count * 2); /* h2d keeps its own copy: h16 is reusable */
        } else {
            ff_memcpy_d2h(m->st, h16, at, count * 2);
            ff_dtype_to_f32(FF_DTYPE_BF16, h16, h, count);
        }
    }
}

int ff_generator_export(ff_generator *g, uint64_t id, int32_t sample, bool with_kv, ff_gen_seq_state *out) {
    memset(out, 0, sizeof *out);
    int32_t slot = running_slot(g, id, sample);
    if (slot < 0)
        return ff_error_set("generator export", "export a sequence while it decodes (not waiting, not finished)",
                            "request %llu sample %d is not running here", (unsigned long long)id, sample);
    const ff_model *m = g->m;
    gen_seq *q = &g->seqs[slot];
    gen_req *r = q->req;
    const int32_t positions = r->prompt_len + q->n_gen - 1; /* the last token is not in the cache yet */
    const size_t KD = (size_t)m->Hkv * m->D, per = (size_t)positions * KD; /* floats of one layer's K */
    out->tokens = ff_malloc(((size_t)r->prompt_len + (size_t)q->n_gen) * 4);
    out->logprobs = ff_malloc((size_t)q->n_gen * 4);
    out->stop = ff_malloc((size_t)(r->n_stop > 0 ? r->n_stop : 1) * 4);
    if (with_kv) out->kv.data = ff_malloc((size_t)m->L * 2 * per * 4);
    if (!out->tokens || !out->logprobs || !out->stop || (with_kv && !out->kv.data)) {
        ff_gen_seq_state_free(out);
        return ff_error_wrap("generator export of request %llu sample %d", (unsigned long long)id, sample);
    }
    out->id = id;
    out->sample = sample;
    out->seed = r->seed;
    out->prompt_len = r->prompt_len;
    out->n_gen = q->n_gen;
    memcpy(out->tokens, r->prompt, (size_t)r->prompt_len * 4);
    memcpy(out->tokens + r->prompt_len, q->tokens, (size_t)q->n_gen * 4);
    memcpy(out->logprobs, q->logprobs, (size_t)q->n_gen * 4);
    memcpy(out->stop, r->stop, (size_t)r->n_stop * 4);
    out->sampling = r->sp;
    out->sampling.max_new_tokens = q->max_new; /* a drawn length is the sequence's own */
    out->sampling.min_new_tokens = q->min_new;
    out->sampling.len_median = out->sampling.len_p99_ratio = 0;
    out->sampling.len_max = 0;
    /* here it would stop at its slot's end too: that limit travels inside the budget */
    int32_t room = g->c.max_seq_len - r->prompt_len;
    if (out->sampling.max_new_tokens > room) out->sampling.max_new_tokens = room;
    if (out->sampling.min_new_tokens > out->sampling.max_new_tokens) out->sampling.min_new_tokens = out->sampling.max_new_tokens;
    out->sampling.stop_tokens = out->stop;
    out->sampling.n_stop = r->n_stop;
    out->rng = q->rng;
    out->kv = (ff_gen_kv){.layers = m->L, .kv_heads = m->Hkv, .head_dim = m->D, .positions = positions,
                          .first_layer = m->layer_global[0], .tp_rank = m->tp_rank, .tp_size = m->tp,
                          .dtype = FF_DTYPE_F32, .data = out->kv.data};
    if (with_kv)
        for (int l = 0; l < m->L; l++)
            for (int kv = 0; kv < 2; kv++)
                copy_rows(g, q, l, kv, out->kv.data + ((size_t)l * 2 + (size_t)kv) * per, positions, false, g->h_kv16);
    req_release(r);
    seq_clear(g, q); /* ff_memcpy_d2h has waited: its blocks may be rewritten now */
    g->n_running--;
    return 0;
}

/* Everything about s this generator must agree with before it takes a slot. */
static int check_import(const ff_generator *g, const ff_gen_seq_state *s) {
    const char *w = "generator import";
    const ff_model *m = g->m;
    const ff_gen_kv *kv = &s->kv;
    if (s->prompt_len < 1 || s->n_gen < 1 || !s->tokens || !s->logprobs || (s->sampling.n_stop > 0 && !s->stop))
        return ff_error_set(w, "import a state that ff_generator_export or ff_gen_seq_state_read made",
                            "prompt of %d tokens, %d generated, or a missing array", s->prompt_len, s->n_gen);
    ff_sampling sp = s->sampling;
    sp.stop_tokens = s->stop;
    if (check_sampling(m, &sp)) return ff_error_wrap("%s", w);
    if (s->n_gen >= sp.max_new_tokens)
        return ff_error_set(w, "a finished sequence is an output, not a state to move",
                            "%d tokens generated of a budget of %d", s->n_gen, sp.max_new_tokens);
    if ((int64_t)s->prompt_len + sp.max_new_tokens > g->c.max_seq_len)
        return ff_error_set(w, "import into an engine whose slots hold the whole budget (raise max_seq_len)",
                            "the sequence may grow to %lld positions (prompt %d + budget %d); the slots hold %d",
                            (long long)s->prompt_len + sp.max_new_tokens, s->prompt_len, sp.max_new_tokens,
                            g->c.max_seq_len);
    if (ffm_check_tokens(m, s->tokens, (int64_t)s->prompt_len + s->n_gen, "a moved sequence's tokens", false))
        return ff_error_wrap("%s", w);
    if (kv->data) {
        if (kv->layers != m->L || kv->kv_heads != m->Hkv || kv->head_dim != m->D)
            return ff_error_set(w, "move sequences between engines of the same model (and the same pipeline stage)",
                                "KV rows of %d layers x %d kv heads x head dim %d; this model holds %d x %d x %d",
                                kv->layers, kv->kv_heads, kv->head_dim, m->L, m->Hkv, m->D);
        if (kv->first_layer != m->layer_global[0])
            return ff_error_set(w, "send each pipeline stage's rows to the same stage",
                                "KV rows of layers %d..%d; this stage holds layers %d..%d", kv->first_layer,
                                kv->first_layer + kv->layers - 1, m->layer_global[0], m->layer_global[0] + m->L - 1);
        if (kv->tp_rank != m->tp_rank || kv->tp_size != m->tp)
            return ff_error_set(w, "send each TP rank's rows to the same rank of a group of the same size",
                                "KV rows of TP rank %d of %d; this model is rank %d of %d", kv->tp_rank, kv->tp_size,
                                m->tp_rank, m->tp);
        if (kv->dtype != FF_DTYPE_F32)
            return ff_error_set(w, NULL, "KV rows of type %s; the cache holds F32", ff_dtype_name(kv->dtype));
        if (kv->positions != s->prompt_len + s->n_gen - 1)
            return ff_error_set(w, NULL, "%d KV positions for a sequence of %d tokens (expected %d)", kv->positions,
                                s->prompt_len + s->n_gen, s->prompt_len + s->n_gen - 1);
    }
    if (g->n_running >= g->c.max_slots)
        return ff_error_set(w, "import into an engine with a free slot, or wait for one to finish",
                            "no free slot: %d of %d slots are decoding", g->n_running, g->c.max_slots);
    const int32_t need = seq_blocks(g, s->prompt_len, sp.max_new_tokens);
    if (need > g->n_free - g->promised)
        return ff_error_set(w, "import into an engine with room in its KV cache (raise kv_blocks), or wait for sequences to finish",
                            "the sequence may fill %d KV blocks; %d are free and not promised to running sequences", need,
                            g->n_free - g->promised);
    return 0;
}

int ff_generator_import(ff_generator *g, const ff_gen_seq_state *s) {
    if (check_import(g, s)) return -1;
    ff_model *m = g->m;
    const int32_t n_stop = s->sampling.n_stop;
    gen_req *r = ff_calloc(1, sizeof *r);
    if (r) {
        r->prompt = ff_malloc((size_t)s->prompt_len * 4);
        r->stop = ff_malloc((size_t)(n_stop > 0 ? n_stop : 1) * 4);
    }
    if (!r || !r->prompt || !r->stop) {
        if (r) {
            free(r->prompt);
            free(r->stop);
        }
        free(r);
        return ff_error_wrap("generator import of request %llu sample %d", (unsigned long long)s->id, s->sample);
    }
    r->id = s->id;
    r->prompt_len = s->prompt_len;
    r->n_samples = 1;
    r->sp = s->sampling;
    r->sp.stop_tokens = NULL;
    r->seed = s->seed;
    r->refs = 1;
    r->n_stop = n_stop;
    memcpy(r->prompt, s->tokens, (size_t)s->prompt_len * 4);
    memcpy(r->stop, s->stop, (size_t)n_stop * 4);
    int32_t slot = 0;
    while (g->seqs[slot].req) slot++;
    const size_t maxlen = (size_t)g->c.max_seq_len;
    gen_seq *q = &g->seqs[slot];
    q->tokens = g->slot_tokens + (size_t)slot * maxlen;
    q->logprobs = g->slot_logprobs + (size_t)slot * maxlen;
    memcpy(q->tokens, s->tokens + s->prompt_len, (size_t)s->n_gen * 4);
    memcpy(q->logprobs, s->logprobs, (size_t)s->n_gen * 4);
    q->sample = s->sample;
    q->n_gen = s->n_gen;
    q->rng = s->rng;
    q->min_new = s->sampling.min_new_tokens;
    q->max_new = s->sampling.max_new_tokens;
    const int32_t positions = s->prompt_len + s->n_gen - 1;
    q->promise = seq_blocks(g, s->prompt_len, q->max_new); /* check_import saw room for it */
    g->promised += q->promise;
    for (int32_t k = blocks_of(g, positions); k > 0; k--) blk_take(g, q);
    int rc;
    if (s->kv.data) {
        const size_t per = (size_t)positions * m->Hkv * m->D;
        for (int l = 0; l < m->L; l++)
            for (int kv = 0; kv < 2; kv++)
                copy_rows(g, q, l, kv, s->kv.data + ((size_t)l * 2 + (size_t)kv) * per, positions, true, g->h_kv16);
        rc = ff_stream_sync(m->st); /* the caller may free s as soon as this returns */
    } else {
        rc = prefill_rows(g, q, s->tokens, positions);
    }
    if (rc) {
        free(r->prompt);
        free(r->stop);
        free(r);
        seq_clear(g, q);
        return ff_error_wrap("generator import of request %llu sample %d (%d positions %s)", (unsigned long long)s->id,
                             s->sample, positions, s->kv.data ? "written" : "recomputed");
    }
    q->req = r;
    g->n_running++;
    return 0;
}

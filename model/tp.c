/* Tensor parallelism inside one model (Megatron-style): which shard of each Hugging Face
 * tensor a rank holds, slicing whole tensors in and gathering them out, and the collectives
 * of the forward, backward and optimizer (through the host's ff_model_comm, staged through
 * host memory). The layer forward (layer.c), the model forward and backward (model.c) and
 * generation (generate.c) call these where Megatron puts its f and g operators; this file
 * knows no layer.
 *
 * Shards (docs/model.md, "Tensor parallelism"): rank r of t holds query heads
 * [r Hq/t, (r+1) Hq/t) and the key/value heads they read (Hkv/t of them, or, when t > Hkv,
 * the one head its query heads share with t/Hkv - 1 other ranks), rows [r I/t, (r+1) I/t)
 * of gate and up and those columns of down, the o_proj columns of its heads, and vocabulary
 * rows [r V/t, (r+1) V/t) of the embedding and LM head. Norms and the value head are whole
 * on every rank: their inputs and output gradients are the replicated residual stream, so
 * their gradients come out the same on every rank without a reduction (with sequence
 * parallelism they see a rank's rows, and their gradients are summed: ffm_sp_finish_grads).
 *
 * Weights come in as whole tensors (the rank copies its slices) or as the rank's shards,
 * which ff_model_tp_read_weights reads from a whole checkpoint's mapped files, touching only
 * the shard's bytes; they go out whole (gathered).
 *
 * Sequence parallelism (ff_model_opts.sequence_parallel, docs/model.md): a forward's T tokens
 * split into balanced row ranges (ffm_sp_rows), the all-gather and reduce-scatter over them,
 * and the sum of the partial gradients of the weights that then see only a rank's rows
 * (the norms, the value head).
 *
 * Not here: collectives on device memory (a device backend with NCCL would want them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/util.h"
#include "model/model_internal.h"

int ff_model_tp_check(const ff_model_config *c, int t, const char *where) {
    const char *w = where ? where : "tensor parallelism";
    if (t < 1) return ff_error_set(w, NULL, "tensor-parallel size %d must be >= 1", t);
    if (t == 1) return 0;
#define REQ(cond, field, value)                                                                     \
    if (!(cond))                                                                                    \
    return ff_error_set(w, "choose a tensor-parallel size that divides it",                        \
                        field " %d is not a multiple of the tensor-parallel size %d", value, t)
    REQ(c->num_attention_heads % t == 0, "num_attention_heads", c->num_attention_heads);
    REQ(c->intermediate_size % t == 0, "intermediate_size", c->intermediate_size);
    REQ(c->vocab_size % t == 0, "vocab_size", c->vocab_size);
#undef REQ
    int kv = c->num_key_value_heads;
    if (kv % t != 0 && (kv <= 0 || t % kv != 0))
        return ff_error_set(w, "use a tensor-parallel size that divides num_key_value_heads or is a multiple of it",
                            "num_key_value_heads %d and the tensor-parallel size %d: neither divides the other", kv, t);
    return 0;
}

int ffm_tp_dims(ff_model *m, int r, int t) {
    m->tp = 1;
    m->tp_rank = 0;
    m->kv_rep = 1;
    if (t < 1 || r < 0 || r >= t)
        return ff_error_set("tensor parallelism", "give 0 <= rank < size", "rank %d of a group of %d", r, t);
    if (t == 1) return 0;
    if (ff_model_tp_check(&m->cfg, t, NULL)) return -1;
    const int Hkv = m->Hkv;
    m->tp = t;
    m->tp_rank = r;
    m->Hq /= t;
    m->kv_rep = t > Hkv ? t / Hkv : 1;
    m->Hkv = t > Hkv ? 1 : Hkv / t;
    m->I /= t;
    m->V /= t;
    m->QKV = (m->Hq + 2 * m->Hkv) * m->D;
    m->q0 = r * m->Hq;
    /* the key/value head of this rank's first query head; its others read the same one
     * (t > Hkv) or the next ones in order (t <= Hkv) */
    m->kv0 = m->q0 / (m->cfg.num_attention_heads / Hkv);
    m->v0 = r * m->V;
    return 0;
}

int ffm_tp_setup(ff_model *m, const ff_model_comm *comm, bool sp) {
    if (!comm || comm->size == 1) return ffm_tp_dims(m, 0, 1);
    if (comm->size > 1 &&
        (!comm->all_reduce_sum || !comm->all_reduce_max || !comm->all_reduce_sum_f64 || !comm->all_gather))
        return ff_error_set("tensor parallelism", "the host must supply every collective of ff_model_comm",
                            "a communicator function is NULL");
    const int n_dev = !!comm->dev_all_reduce_sum + !!comm->dev_all_gather_v + !!comm->dev_reduce_scatter_sum_v;
    if (n_dev != 0 && n_dev != 3)
        return ff_error_set("tensor parallelism", "supply all three dev_ collectives of ff_model_comm, or none",
                            "%d of the three device-buffer collectives are set", n_dev);
    if (sp && (!comm->reduce_scatter_sum_v || !comm->all_gather_v))
        return ff_error_set("sequence parallelism", "supply reduce_scatter_sum_v and all_gather_v in ff_model_comm",
                            "a communicator function sequence parallelism needs is NULL");
    if (ffm_tp_dims(m, comm->rank, comm->size)) return -1;
    m->comm = *comm;
    if (sp) {
        m->sp_counts = ff_calloc((size_t)m->tp, sizeof *m->sp_counts);
        if (!m->sp_counts) return -1;
        m->sp = true;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

void ffm_tp_shards(ff_model *m) {
    const int64_t D = m->D;
    for (int i = 0; i < m->n_tensors; i++) {
        ff_param_tensor *p = &m->tensors[i];
        int split = -1, rep = 1;
        int64_t start = 0;
        const char *n = p->name;
        if (!strcmp(n, "model.embed_tokens.weight") || !strcmp(n, "lm_head.weight")) split = 0, start = m->v0;
        else if (ends_with(n, "q_proj.weight") || ends_with(n, "q_proj.bias")) split = 0, start = m->q0 * D;
        else if (ends_with(n, "k_proj.weight") || ends_with(n, "k_proj.bias") || ends_with(n, "v_proj.weight") ||
                 ends_with(n, "v_proj.bias"))
            split = 0, start = m->kv0 * D, rep = m->kv_rep;
        else if (ends_with(n, "o_proj.weight")) split = 1, start = m->q0 * D;
        else if (ends_with(n, "gate_proj.weight") || ends_with(n, "up_proj.weight")) split = 0, start = (int64_t)m->tp_rank * m->I;
        else if (ends_with(n, "down_proj.weight")) split = 1, start = (int64_t)m->tp_rank * m->I;
        else rep = m->tp; /* norms, score */
        p->axis = split;
        if (m->tp == 1) split = -1, start = 0, rep = 1;
        p->split = split;
        p->start = start;
        p->rep = rep;
        p->full[0] = p->shape[0];
        p->full[1] = p->shape[1];
        if (split >= 0) p->full[split] *= m->tp / rep;
    }
}

int ffm_tp_alloc(ff_model *m) {
    if (m->sp && !(m->sp_dw = ff_buffer_new(m->be, (2 * (size_t)m->L + 2) * (size_t)m->H * sizeof(float)))) return -1;
    if (m->kv_rep <= 1) return 0;
    /* a [Hkv, 2 D (H + 1)] slot per key/value head (ffm_tp_kv_grads) */
    m->tp_dkv = ff_buffer_new(m->be, (size_t)m->cfg.num_key_value_heads * (size_t)(2 * m->D) * ((size_t)m->H + 1) * sizeof(float));
    return m->tp_dkv ? 0 : -1;
}

void ffm_tp_free(ff_model *m) {
    ff_buffer_destroy(&m->tp_dkv);
    ff_buffer_destroy(&m->sp_dw);
    free(m->sp_counts);
    m->sp_counts = NULL;
    free(m->tp_host);
    free(m->tp_ids);
    m->tp_host = NULL;
    m->tp_ids = NULL;
    m->tp_host_cap = m->tp_ids_cap = 0;
}

float *ffm_tp_host(ff_model *m, size_t n) {
    if (n > m->tp_host_cap) {
        float *h = ff_realloc(m->tp_host, n * sizeof *h);
        if (!h) return NULL;
        m->tp_host = h;
        m->tp_host_cap = n;
    }
    return m->tp_host;
}

int32_t *ffm_tp_ids(ff_model *m, size_t n) {
    if (n > m->tp_ids_cap) {
        int32_t *h = ff_realloc(m->tp_ids, n * sizeof *h);
        if (!h) return NULL;
        m->tp_ids = h;
        m->tp_ids_cap = n;
    }
    return m->tp_ids;
}

int ffm_tp_reserve(ff_model *m, int32_t T) {
    if (m->tp == 1) return 0;
    const size_t t = (size_t)T, kv = m->kv_rep > 1 ? (size_t)m->cfg.num_key_value_heads * 2 * m->D * ((size_t)m->H + 1) : 0;
    size_t n = t * (size_t)m->H; /* a [T, H] all-reduce */
    if (m->sp) {                 /* a [T, H] gather or scatter with the rank's rows; the SP gradients */
        const size_t sp = (t + (size_t)ffm_sp_max_rows(m, T)) * (size_t)m->H, dw = (2 * (size_t)m->L + 2) * (size_t)m->H;
        n = sp > dw ? sp : dw;
    }
    if (7 * t > n) n = 7 * t;    /* ffm_tp_vocab_combine */
    if (kv > n) n = kv;          /* ffm_tp_kv_grads */
    return ffm_tp_host(m, n) && ffm_tp_ids(m, 2 * t) ? 0 : -1;
}

static int comm_failed(const char *what, size_t n) {
    return ff_error_wrap("tensor parallelism: %s of %zu elements", what, n);
}

int ffm_tp_sum(ff_model *m, ff_dptr x, size_t n) {
    if (ff_model_comm_on_device(&m->comm)) {
        if (m->comm.dev_all_reduce_sum(m->comm.ctx, m->st, x, n)) return comm_failed("all-reduce (sum)", n);
        return 0;
    }
    float *h = ffm_tp_host(m, n);
    if (!h) return -1;
    ff_memcpy_d2h(m->st, h, x, n * sizeof(float));
    if (m->comm.all_reduce_sum(m->comm.ctx, h, n)) return comm_failed("all-reduce (sum)", n);
    ff_memcpy_h2d(m->st, x, h, n * sizeof(float));
    return 0;
}

void ffm_sp_rows(const ff_model *m, int32_t T, int r, int32_t *r0, int32_t *nr) {
    const int32_t q = T / m->tp, extra = T % m->tp;
    *r0 = r * q + (r < extra ? r : extra);
    *nr = q + (r < extra ? 1 : 0);
}

const size_t *ffm_sp_counts(ff_model *m, int32_t T, size_t width) {
    for (int r = 0; r < m->tp; r++) {
        int32_t r0, nr;
        ffm_sp_rows(m, T, r, &r0, &nr);
        m->sp_counts[r] = (size_t)nr * width;
    }
    return m->sp_counts;
}

int ffm_sp_gather_host(ff_model *m, ff_dptr mine, float *full, int32_t T, int width) {
    const size_t *counts = ffm_sp_counts(m, T, (size_t)width), n = counts[m->tp_rank];
    float *h = ffm_tp_host(m, n ? n : 1);
    if (!h) return -1;
    ff_memcpy_d2h(m->st, h, mine, n * sizeof(float));
    if (m->comm.all_gather_v(m->comm.ctx, h, full, counts)) return comm_failed("all-gather (sequence-parallel)", (size_t)T * width);
    return 0;
}

int ffm_sp_gather(ff_model *m, ff_dptr mine, ff_dptr full, int32_t T, int width) {
    if (ff_model_comm_on_device(&m->comm)) { /* in place: mine moved to its rows of full first */
        const size_t *counts = ffm_sp_counts(m, T, (size_t)width);
        int32_t r0, nr;
        ffm_sp_rows(m, T, m->tp_rank, &r0, &nr);
        const ff_dptr at = ff_dptr_add(full, (size_t)r0 * (size_t)width, 4);
        if (mine.buf != at.buf || mine.off != at.off) ff_memcpy_d2d(m->st, at, mine, counts[m->tp_rank] * sizeof(float));
        if (m->comm.dev_all_gather_v(m->comm.ctx, m->st, at, full, counts))
            return comm_failed("all-gather (sequence-parallel)", (size_t)T * (size_t)width);
        return 0;
    }
    const size_t N = (size_t)T * (size_t)width, n = (size_t)ffm_sp_max_rows(m, T) * (size_t)width;
    float *h = ffm_tp_host(m, N + n), *in = h + N;
    if (!h) return -1;
    const size_t *counts = ffm_sp_counts(m, T, (size_t)width);
    ff_memcpy_d2h(m->st, in, mine, counts[m->tp_rank] * sizeof(float));
    if (m->comm.all_gather_v(m->comm.ctx, in, h, counts)) return comm_failed("all-gather (sequence-parallel)", N);
    ff_memcpy_h2d(m->st, full, h, N * sizeof(float));
    return 0;
}

int ffm_sp_scatter(ff_model *m, ff_dptr full, ff_dptr mine, int32_t T, int width) {
    if (ff_model_comm_on_device(&m->comm)) { /* in place at this rank's rows of full, then moved to mine */
        const size_t *counts = ffm_sp_counts(m, T, (size_t)width);
        int32_t r0, nr;
        ffm_sp_rows(m, T, m->tp_rank, &r0, &nr);
        const ff_dptr at = ff_dptr_add(full, (size_t)r0 * (size_t)width, 4);
        if (m->comm.dev_reduce_scatter_sum_v(m->comm.ctx, m->st, full, at, counts))
            return comm_failed("reduce-scatter (sequence-parallel)", (size_t)T * (size_t)width);
        if (mine.buf != at.buf || mine.off != at.off) ff_memcpy_d2d(m->st, mine, at, counts[m->tp_rank] * sizeof(float));
        return 0;
    }
    const size_t N = (size_t)T * (size_t)width, n = (size_t)ffm_sp_max_rows(m, T) * (size_t)width;
    float *h = ffm_tp_host(m, N + n), *out = h + N;
    if (!h) return -1;
    const size_t *counts = ffm_sp_counts(m, T, (size_t)width);
    ff_memcpy_d2h(m->st, h, full, N * sizeof(float));
    if (m->comm.reduce_scatter_sum_v(m->comm.ctx, h, out, counts)) return comm_failed("reduce-scatter (sequence-parallel)", N);
    ff_memcpy_h2d(m->st, mine, out, counts[m->tp_rank] * sizeof(float));
    return 0;
}

/* The layers' slots of sp_dw are in layer order and the head's follow the last layer's, so a
 * chunk's (the head chunk ends at the last layer) are one range [*lo, *hi) of it. */
static void dw_range(const ff_model *m, int l0, int nl, bool head, size_t *lo, size_t *hi) {
    const size_t H = (size_t)m->H;
    *lo = 2 * (size_t)l0 * H;
    *hi = head ? (2 * (size_t)m->L + (m->vhead ? 2 : 1)) * H : 2 * (size_t)(l0 + nl) * H;
}

void ffm_sp_zero_grads(ff_model *m, int l0, int nl, bool head) {
    size_t lo, hi;
    dw_range(m, l0, nl, head, &lo, &hi);
    ff_memset_zero(m->st, ff_dptr_f32(m->sp_dw, lo), (hi - lo) * sizeof(float));
}

int ffm_sp_finish_grads(ff_model *m, int l0, int nl, bool head) {
    const size_t H = (size_t)m->H;
    size_t lo, hi;
    dw_range(m, l0, nl, head, &lo, &hi);
    if (ffm_tp_sum(m, ff_dptr_f32(m->sp_dw, lo), hi - lo)) return -1;
    for (int l = l0; l < l0 + nl; l++) {
        ff_add(m->st, ffm_grad(m, m->layers[l].ln1), ffm_sp_dw(m, l, 0), (int64_t)H);
        ff_add(m->st, ffm_grad(m, m->layers[l].ln2), ffm_sp_dw(m, l, 1), (int64_t)H);
    }
    if (head) {
        ff_add(m->st, ffm_grad(m, m->off_norm), ffm_sp_dw(m, m->L, 0), (int64_t)H);
        if (m->vhead) ff_add(m->st, ffm_grad(m, m->off_score), ffm_sp_dw(m, m->L, 1), (int64_t)H);
    }
    return 0;
}

void ffm_tp_local_ids(const ff_model *m, const int32_t *ids, int32_t *out, int64_t n, bool targets) {
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i] - m->v0;
        out[i] = ids[i] < 0 ? -1 : id >= 0 && id < m->V ? id : targets ? -2 : -1;
    }
}

/* With lse_r, H_r the log-sum-exp and entropy over rank r's vocabulary rows and M the max of
 * the lse_r: Z = sum_r e_r, e_r = exp(lse_r - M); lse = M + log Z; and since rank r's share
 * of the probability is e_r / Z and its mean scaled logit lse_r - H_r,
 *   H = lse - sum_r (e_r / Z) (lse_r - H_r) = log Z - sum_r (e_r / Z) (lse_r - M - H_r)
 * (the second form keeps the terms small). The target's scaled logit comes from its owner
 * (logprob_r + lse_r), 0 from the others. */
int ffm_tp_vocab_combine(ff_model *m, ff_dptr lse, ff_dptr entropy, ff_dptr logprob, const int32_t *targets,
                         int32_t T) {
    const size_t n = (size_t)T, k = ff_dptr_null(logprob) ? 2 : 3;
    float *h = ffm_tp_host(m, (4 + k) * n);
    if (!h) return -1;
    float *lr = h, *hr = h + n, *pr = h + 2 * n, *mx = h + 3 * n, *s = h + 4 * n; /* s [k, T]: packed sums */
    ff_memcpy_d2h(m->st, lr, lse, n * 4);
    ff_memcpy_d2h(m->st, hr, entropy, n * 4);
    if (k == 3) ff_memcpy_d2h(m->st, pr, logprob, n * 4);
    memcpy(mx, lr, n * 4);
    if (m->comm.all_reduce_max(m->comm.ctx, mx, n)) return comm_failed("all-reduce (max) of log-sum-exp", n);
    for (size_t t = 0; t < n; t++) {
        float e = expf(lr[t] - mx[t]);
        s[t] = e;
        s[n + t] = e * (lr[t] - mx[t] - hr[t]);
        if (k == 3) s[2 * n + t] = targets[t] >= m->v0 && targets[t] < m->v0 + m->V ? pr[t] + lr[t] : 0.0f;
    }
    if (m->comm.all_reduce_sum(m->comm.ctx, s, k * n)) return comm_failed("all-reduce (sum) of softmax sums", k * n);
    for (size_t t = 0; t < n; t++) {
        float logz = logf(s[t]);
        lr[t] = mx[t] + logz;
        hr[t] = logz - s[n + t] / s[t];
        if (k == 3) pr[t] = targets[t] >= 0 ? s[2 * n + t] - lr[t] : 0.0f;
    }
    ff_memcpy_h2d(m->st, lse, lr, n * 4);
    ff_memcpy_h2d(m->st, entropy, hr, n * 4);
    if (k == 3) ff_memcpy_h2d(m->st, logprob, pr, n * 4);
    return 0;
}

int ffm_tp_kv_grads(ff_model *m, const ff_layer_params *p, ff_dptr dqkv, ff_dptr xn1, bool xn1_b16, int32_t T) {
    ff_stream *st = m->st;
    const int H = m->H, HD = m->Hq * m->D, KD2 = 2 * m->D; /* one k and one v head here */
    const size_t nw = (size_t)KD2 * H, n = nw + (m->bias ? (size_t)KD2 : 0);
    const size_t slots = (size_t)m->cfg.num_key_value_heads;
    /* the sharers of a head are a subgroup, and the communicator knows only the whole group:
     * each rank puts its part in its head's slot of a zeroed [Hkv, n] buffer and the sum over
     * the group fills every slot (Hkv / (t / Hkv) times the bytes a subgroup all-reduce of
     * the sharers would move) */
    const ff_dptr all = ff_dptr_f32(m->tp_dkv, 0), w = ff_dptr_f32(m->tp_dkv, (size_t)m->kv0 * n), b = ff_dptr_add(w, nw, 4);
    const ff_dptr dkv = ff_dptr_add(dqkv, (size_t)HD, 4);
    if (m->w16c_live) /* bf16 products: as the layer's other weight gradients */
        ff_gemm_bf16(st, FF_TRANS, FF_NO_TRANS, KD2, H, T, 1.0f, dkv, false, m->QKV, xn1, xn1_b16, H, 0.0f, w, H);
    else {
        assert(!xn1_b16);
        ff_gemm(st, FF_TRANS, FF_NO_TRANS, KD2, H, T, 1.0f, dkv, m->QKV, xn1, H, 0.0f, w, H);
    }
    if (m->bias) {
        ff_memset_zero(st, b, (size_t)KD2 * 4);
        ff_bias_bwd(st, ff_dptr_add(dqkv, (size_t)HD, 4), m->QKV, b, T, KD2);
    }
    if (ff_model_comm_on_device(&m->comm)) {
        const size_t before = (size_t)m->kv0 * n, after = (slots - (size_t)m->kv0 - 1) * n;
        ff_memset_zero(st, all, before * 4);
        ff_memset_zero(st, ff_dptr_add(w, n, 4), after * 4);
        if (m->comm.dev_all_reduce_sum(m->comm.ctx, st, all, slots * n))
            return comm_failed("all-reduce (sum) of k/v gradients", slots * n);
    } else {
        float *h = ffm_tp_host(m, slots * n);
        if (!h) return -1;
        memset(h, 0, slots * n * sizeof *h);
        float *mine = h + (size_t)m->kv0 * n;
        ff_memcpy_d2h(st, mine, w, n * 4);
        if (m->comm.all_reduce_sum(m->comm.ctx, h, slots * n)) return comm_failed("all-reduce (sum) of k/v gradients", slots * n);
        ff_memcpy_h2d(st, w, mine, n * 4);
    }
    ff_add(st, ffm_grad(m, p->wqkv + (size_t)HD * H), w, (int64_t)nw);
    if (m->bias) ff_add(st, ffm_grad(m, p->bqkv + (size_t)HD), b, KD2);
    return 0;
}

double ffm_grad_sumsq_range(ff_model *m, int64_t lo, int64_t hi) {
    if (m->tp == 1) { /* the tied copy of a last stage, when there is one, is the first region (off_embed 0) */
        if (m->embed_copy && lo < (int64_t)m->V * m->H) lo = (int64_t)m->V * m->H;
        return hi > lo ? ff_sumsq(m->st, ffm_grad(m, (size_t)lo), hi - lo) : 0.0;
    }
    double ss = 0.0;
    for (int i = 0; i < m->n_tensors; i++) {
        const ff_param_tensor *p = &m->tensors[i];
        int64_t a = (int64_t)p->off > lo ? (int64_t)p->off : lo, b = (int64_t)p->off + p->numel < hi ? (int64_t)p->off + p->numel : hi;
        if (b > a && m->tp_rank % p->rep == 0 && !p->copy) ss += ff_sumsq(m->st, ffm_grad(m, (size_t)a), b - a); /* one holder counts */
    }
    return ss;
}

int ffm_tp_sum_f64(ff_model *m, double *x) {
    if (m->tp == 1) return 0;
    if (m->comm.all_reduce_sum_f64(m->comm.ctx, x, 1)) return comm_failed("all-reduce (sum) of the gradient norm", 1);
    return 0;
}

/* rows and columns of a tensor seen as 2-D (a vector is one column) */
static int64_t cols_of(const ff_param_tensor *p, const int64_t *shape) { return p->ndim > 1 ? shape[1] : 1; }

bool ffm_tp_is_shard(const ff_param_tensor *p, const ff_host_tensor *t) {
    if (p->split < 0 || t->ndim != p->ndim) return false;
    for (int d = 0; d < p->ndim; d++)
        if (t->shape[d] != p->shape[d]) return false;
    return true;
}

const float *ffm_tp_local_view(ff_model *m, const ff_param_tensor *p, const ff_host_tensor *t) {
    const float *whole = t->data;
    if (p->split < 0 || ffm_tp_is_shard(p, t)) return whole;
    if (p->split == 0) return whole + (size_t)p->start * (size_t)cols_of(p, p->full); /* rows: one contiguous range */
    float *h = ffm_tp_host(m, (size_t)p->numel);
    if (!h) return NULL;
    const size_t c = (size_t)p->shape[1], fc = (size_t)p->full[1];
    for (int64_t i = 0; i < p->shape[0]; i++) memcpy(h + (size_t)i * c, whole + (size_t)i * fc + (size_t)p->start, c * 4);
    return h;
}

/* whole (p->full) from this rank's shard `mine` [numel], with `all` [tp, numel] as scratch */
static int gather_whole(ff_model *m, const ff_param_tensor *p, const float *mine, float *all, float *whole) {
    const size_t n = (size_t)p->numel;
    if (m->comm.all_gather(m->comm.ctx, mine, all, n)) return comm_failed("all-gather of a tensor", n);
    /* piece k (rank k rep, the first holder of each distinct shard) goes at k shape[split] */
    const int pieces = m->tp / p->rep;
    const size_t c = (size_t)cols_of(p, p->shape), fc = (size_t)cols_of(p, p->full);
    for (int k = 0; k < pieces; k++) {
        const float *s = all + (size_t)k * (size_t)p->rep * n;
        if (p->split == 0) {
            memcpy(whole + (size_t)k * n, s, n * sizeof(float));
        } else {
            for (int64_t i = 0; i < p->shape[0]; i++) memcpy(whole + (size_t)i * fc + (size_t)k * c, s + (size_t)i * c, c * 4);
        }
    }
    return 0;
}

int ffm_tp_store_whole(ff_model *m, const ff_param_tensor *p, ff_dptr src, float *whole) {
    const size_t n = (size_t)p->numel;
    if (p->split < 0) {
        ff_memcpy_d2h(m->st, whole, src, n * sizeof(float));
        return 0;
    }
    float *h = ffm_tp_host(m, n * ((size_t)m->tp + 1));
    if (!h) return -1;
    ff_memcpy_d2h(m->st, h, src, n * sizeof(float));
    return gather_whole(m, p, h, h + n, whole);
}

int ffm_tp_store_whole_host(ff_model *m, const ff_param_tensor *p, const float *mine, float *whole) {
    const size_t n = (size_t)p->numel;
    if (p->split < 0) {
        if (whole != mine) memcpy(whole, mine, n * sizeof(float));
        return 0;
    }
    float *all = ffm_tp_host(m, n * (size_t)m->tp);
    return all ? gather_whole(m, p, mine, all, whole) : -1;
}

int ffm_tp_export(ff_model *m, ff_buffer *b, const char *prefix, ff_tensor_set *out) {
    char name[160];
    for (int i = 0; i < m->n_tensors; i++) {
        const ff_param_tensor *p = &m->tensors[i];
        if (p->copy) continue; /* a pipeline stage's copy of a tensor another stage owns and exports */
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        ff_host_tensor *t = ff_tensor_set_add(out, name, p->ndim, p->full);
        if (!t || ffm_tp_store_whole(m, p, ff_dptr_f32(b, p->off), t->data)) return -1;
    }
    return 0;
}

/* the block of a checkpoint tensor that is this rank's shard (a tensor the model does not
 * know, or of another shape, stays whole: ff_model_new_tp then names the problem) */
/* What a rank reads: its TP shards (layout), of a stage's tensors only (stage NULL: all). */
typedef struct shard_reader {
    const ff_model *layout;
    const ff_model_stage *stage;
} shard_reader;

/* Does the stage hold tensor `name`? Its layers' tensors, the embedding on the chunk with
 * layer 0 (and, tied, on the one with the last layer: its LM head copy); the final norm and
 * heads are read everywhere (small beside the layers, and whether a model has an LM head is
 * told by its tensors). */
static bool stage_holds(const ff_model_stage *st, int32_t layers, bool tied, const char *name) {
    if (!st) return true;
    bool first = false, last = false;
    for (int c = 0; c < st->n_chunks; c++) {
        first = first || st->first_layer[c] == 0;
        last = last || st->first_layer[c] + st->n_layers[c] == layers;
    }
    if (!strcmp(name, "model.embed_tokens.weight")) return first || (tied && last);
    int layer;
    if (sscanf(name, "model.layers.%d.", &layer) != 1) return true;
    for (int c = 0; c < st->n_chunks; c++)
        if (layer >= st->first_layer[c] && layer < st->first_layer[c] + st->n_layers[c]) return true;
    return false;
}

static void shard_block(void *ctx, const ff_st_entry *e, int64_t *r0, int64_t *nr, int64_t *c0, int64_t *nc) {
    const shard_reader *rd = ctx;
    const ff_model *m = rd->layout;
    if (!stage_holds(rd->stage, m->cfg.num_hidden_layers, m->cfg.tie_word_embeddings, e->name) ||
        (m->cfg.tie_word_embeddings && !strcmp(e->name, "lm_head.weight"))) { /* a tied checkpoint's copy of the embedding */
        *nr = -1; /* not read */
        return;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const ff_param_tensor *p = &m->tensors[i];
        if (p->split < 0 || strcmp(p->name, e->name) || e->ndim != p->ndim || e->shape[0] != p->full[0] ||
            (p->ndim > 1 && e->shape[1] != p->full[1]))
            continue;
        if (p->split == 0) *r0 = p->start, *nr = p->shape[0];
        else *c0 = p->start, *nc = p->shape[1];
        return;
    }
}

int ff_model_read_shards(const char *dir, const ff_model_config *cfg, int tp_rank, int tp_size, const ff_model_stage *stage,
                         ff_tensor_set *out) {
    ff_model layout;
    if (ffm_layout(&layout, cfg, tp_rank, tp_size)) return -1;
    shard_reader rd = {&layout, stage};
    int rc = ff_safetensors_load_dir_blocks(dir, shard_block, &rd, out);
    ffm_layout_free(&layout);
    return rc;
}

int ff_model_tp_read_weights(const char *dir, const ff_model_config *cfg, int tp_rank, int tp_size, ff_tensor_set *out) {
    return ff_model_read_shards(dir, cfg, tp_rank, tp_size, NULL, out);
}

/* View models (ff_model_opts.view_of): an inference model whose tensors are made of pieces,
 * the part of each tensor that another model (the trained actor's shard on this rank) holds
 * read in place from that model's parameter buffer, the rest from a buffer of its own that
 * holds exactly the missing elements (the 3D-HybridEngine's generation shard over the
 * training shard, docs/run.md "Memory of the colocated copy"). The forward runs on the
 * pieces: a weight whose rows are the output features (q, k, v, gate, up, the LM head, split
 * by rows) is one product per piece into its output columns (ldc), a weight split by its
 * input columns (o_proj, down_proj) one product per piece over its columns of the input
 * (lda), accumulating with beta 1, the embedding one lookup per piece of vocabulary rows,
 * summed; norms are whole tensors, one piece each.
 *
 * Each output element of a row-split product is the same dot product as with one matrix;
 * a column-split product sums its input columns in pieces, so its rounding may differ from
 * one product's in the last bits (as tensor parallelism's all-reduce does).
 *
 * The same entry points serve a model with bf16 weights (ff_model_opts.bf16_weights, never a
 * view): its matrices go through ff_gemm_bf16w and ff_embedding_fwd_bf16.
 *
 * Not here: the backward (a view model only infers), the viewed model's memory (it must
 * outlive the view and keep its parameter buffer: a trainable model does). */
#include <string.h>

#include "fuseflow/error.h"
#include "model/model_internal.h"

/* elements per unit along the axis of a row-split (or whole) tensor */
static int64_t row_width(const ff_param_tensor *p) { return p->ndim > 1 ? p->shape[1] : 1; }
/* units along the axis: rows, columns, or the one whole tensor */
static int64_t units(const ff_param_tensor *p) { return p->axis == 1 ? p->shape[1] : p->axis == 0 ? p->shape[0] : 1; }
/* elements of units [lo, hi) */
static int64_t piece_numel(const ff_param_tensor *p, int64_t lo, int64_t hi) {
    if (p->axis == 1) return p->shape[0] * (hi - lo);
    return p->axis == 0 ? (hi - lo) * row_width(p) : p->numel;
}
/* the first unit along the axis in the whole tensor's coordinates */
static int64_t first_unit(const ff_param_tensor *p) { return p->axis >= 0 && p->split >= 0 ? p->start : 0; }

static const ff_param_tensor *find_gidx(const ff_model *m, int gidx) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].gidx == gidx) return &m->tensors[i];
    return NULL;
}

int ffm_view_setup(ff_model *m, const ff_model *src) {
    if (src->viewed) return ff_error_set("view model", "view the model that holds the weights", "the model to view is itself a view");
    if (src->be != m->be) return ff_error_set("view model", "create both on one backend", "the model to view is on another backend");
    const ff_model_config *a = &m->cfg, *b = &src->cfg;
    if (a->vocab_size != b->vocab_size || a->hidden_size != b->hidden_size || a->intermediate_size != b->intermediate_size ||
        a->num_hidden_layers != b->num_hidden_layers || a->num_attention_heads != b->num_attention_heads ||
        a->num_key_value_heads != b->num_key_value_heads || m->D != src->D || a->tie_word_embeddings != b->tie_word_embeddings ||
        a->attention_bias != b->attention_bias || a->value_head != b->value_head)
        return ff_error_set("view model", "view a model of the same config", "the model to view has another config");
    int64_t own = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        ff_param_tensor *p = &m->tensors[i];
        const ff_param_tensor *s = find_gidx(src, p->gidx);
        const int64_t n = units(p), g0 = first_unit(p);
        int64_t a0 = n, a1 = n; /* the viewed units, local */
        if (s && s->axis == p->axis) {
            const int64_t s0 = first_unit(s), s1 = s0 + units(s);
            const int64_t lo = g0 > s0 ? g0 : s0, hi = g0 + n < s1 ? g0 + n : s1;
            if (lo < hi) a0 = lo - g0, a1 = hi - g0;
        }
        p->view_lo = a0 < a1 ? a0 : 0, p->view_hi = a0 < a1 ? a1 : 0;
        const int64_t cut[4] = {0, a0 < a1 ? a0 : n, a0 < a1 ? a1 : n, n};
        p->npc = 0;
        for (int k = 0; k < 3; k++) {
            const int64_t lo = cut[k], hi = cut[k + 1];
            if (lo >= hi) continue;
            ffm_piece *q = &p->pc[p->npc++];
            q->lo = lo, q->hi = hi;
            if (k == 1) { /* in place: the same units of src's shard */
                const int64_t at = lo + g0 - first_unit(s);
                q->buf = src->params;
                if (p->axis == 1) q->off = s->off + (size_t)at, q->ld = s->shape[1];
                else q->off = s->off + (size_t)(at * row_width(s)), q->ld = row_width(s);
            } else { /* gathered: packed */
                q->buf = NULL;
                q->off = (size_t)own;
                q->ld = p->axis == 1 ? hi - lo : row_width(p);
                own += piece_numel(p, lo, hi);
            }
        }
    }
    m->viewed = src;
    m->n_own = own;
    return 0;
}

int ffm_view_bf16(ff_model *m) {
    m->v16 = false;
    /* the viewed model's bf16 copy is a cache of its weights: made here as its next forward
     * would make it, and that forward then finds it made */
    ff_model *src = (ff_model *)m->viewed;
    if (!src || !src->p16 || !ff_backend_bf16_products(m->be)) return 0;
    if (ffm_bf16_copy_fresh(src)) return ff_error_wrap("generation on the viewed model's bf16 weights");
    m->v16 = true;
    return 0;
}

/* A piece read in place from the viewed model's bf16 copy (v16), as an ff_gemm_bf16 operand;
 * {0}: the piece is the view's own (fp32, rounded by its product). */
static ff_dptr piece16(ff_model *m, const ffm_piece *q, int64_t numel) {
    if (!m->v16 || q->buf != m->viewed->params) return (ff_dptr){0};
    assert((int64_t)q->off + numel <= m->viewed->n_decay); /* a weight matrix: inside the copy */
    (void)numel;
    return ff_dptr_of(m->viewed->w16c, q->off * 2);
}

void ffm_w_out(ff_model *m, const ff_param_tensor *p, int M, ff_dptr A, int lda, ff_dptr C, int ldc) {
    const int K = (int)row_width(p);
    if (ffm_is16(m, p)) {
        ff_gemm_bf16w(m->st, M, (int)p->shape[0], K, A, lda, ffm_param16(m, p->off), K, 0.0f, C, ldc);
        return;
    }
    if (m->w16c_live) {
        ff_gemm_bf16(m->st, FF_NO_TRANS, FF_TRANS, M, (int)p->shape[0], K, 1.0f, A, false, lda, ffm_copy16(m, p->off), true,
                     K, 0.0f, C, ldc);
        return;
    }
    if (!p->npc) {
        ff_gemm(m->st, FF_NO_TRANS, FF_TRANS, M, (int)p->shape[0], K, 1.0f, A, lda, ffm_param(m, p->off), K, 0.0f, C, ldc);
        return;
    }
    assert(p->axis != 1);
    for (int k = 0; k < p->npc; k++) {
        const ffm_piece *q = &p->pc[k];
        const int64_t r0 = p->axis == 0 ? q->lo : 0, nr = p->axis == 0 ? q->hi - q->lo : p->shape[0];
        const ff_dptr w16 = piece16(m, q, nr * q->ld), out = ff_dptr_add(C, (size_t)r0, 4);
        if (w16.buf)
            ff_gemm_bf16(m->st, FF_NO_TRANS, FF_TRANS, M, (int)nr, K, 1.0f, A, false, lda, w16, true, (int)q->ld, 0.0f, out, ldc);
        else
            ff_gemm(m->st, FF_NO_TRANS, FF_TRANS, M, (int)nr, K, 1.0f, A, lda, ffm_piece_ptr(m, q), (int)q->ld, 0.0f, out, ldc);
    }
}

void ffm_w_in(ff_model *m, const ff_param_tensor *p, int M, ff_dptr A, bool a16, int lda, float beta, ff_dptr C, int ldc) {
    const int N = (int)p->shape[0], K = (int)p->shape[1];
    if (a16) { /* bf16 activations (ffm_act16): the weights as a bf16 operand */
        bool b16;
        const ff_dptr W = ffm_w16_operand(m, p->off, &b16);
        ff_gemm_bf16(m->st, FF_NO_TRANS, FF_TRANS, M, N, K, 1.0f, A, true, lda, W, b16, K, beta, C, ldc);
        return;
    }
    if (ffm_is16(m, p)) {
        ff_gemm_bf16w(m->st, M, N, K, A, lda, ffm_param16(m, p->off), K, beta, C, ldc);
        return;
    }
    if (m->w16c_live) {
        ff_gemm_bf16(m->st, FF_NO_TRANS, FF_TRANS, M, N, K, 1.0f, A, false, lda, ffm_copy16(m, p->off), true, K, beta, C, ldc);
        return;
    }
    if (!p->npc) {
        ff_gemm(m->st, FF_NO_TRANS, FF_TRANS, M, N, K, 1.0f, A, lda, ffm_param(m, p->off), K, beta, C, ldc);
        return;
    }
    assert(p->axis == 1);
    for (int k = 0; k < p->npc; k++) {
        const ffm_piece *q = &p->pc[k];
        const int kq = (int)(q->hi - q->lo);
        const ff_dptr Aq = ff_dptr_add(A, (size_t)q->lo, 4), w16 = piece16(m, q, (int64_t)(N - 1) * q->ld + kq);
        if (w16.buf)
            ff_gemm_bf16(m->st, FF_NO_TRANS, FF_TRANS, M, N, kq, 1.0f, Aq, false, lda, w16, true, (int)q->ld, k ? 1.0f : beta, C, ldc);
        else
            ff_gemm(m->st, FF_NO_TRANS, FF_TRANS, M, N, kq, 1.0f, Aq, lda, ffm_piece_ptr(m, q), (int)q->ld, k ? 1.0f : beta, C, ldc);
    }
}

void ffm_w_bias(ff_model *m, const ff_param_tensor *p, ff_dptr x, int ld, int T) {
    if (!p->npc) {
        ff_bias_add(m->st, x, ld, ffm_param(m, p->off), T, (int)p->numel);
        return;
    }
    for (int k = 0; k < p->npc; k++) {
        const ffm_piece *q = &p->pc[k];
        const int64_t c0 = p->axis == 0 ? q->lo : 0, n = p->axis == 0 ? q->hi - q->lo : p->numel;
        ff_bias_add(m->st, ff_dptr_add(x, (size_t)c0, 4), ld, ffm_piece_ptr(m, q), T, (int)n);
    }
}

ff_dptr ffm_w_vec(ff_model *m, const ff_param_tensor *p) {
    if (!p->npc) return ffm_param(m, p->off);
    assert(p->npc == 1);
    return ffm_piece_ptr(m, &p->pc[0]);
}

/* A view's embedding that is one piece of every row (the common case: a whole model viewed
 * whole): the token ids index it as they are. */
static bool embed_whole_piece(const ff_param_tensor *p) {
    return p->npc == 1 && p->axis == 0 && p->pc[0].lo == 0 && p->pc[0].hi == units(p);
}

bool ffm_embed_on_device(const ff_model *m) {
    if (!m->has_embed) return true;
    const ff_param_tensor *p = &m->tensors[m->t_embed];
    return !p->npc || embed_whole_piece(p);
}

int ffm_w_embed(ff_model *m, const ff_param_tensor *p, const int32_t *ids, ff_dptr dev_ids, ff_dptr out, ff_dptr scratch, int T) {
    const int H = (int)row_width(p);
    if (ffm_is16(m, p) || m->w16c_live) { /* bf16 weights, or bf16 products: the rows of the copy */
        ff_embedding_fwd_bf16(m->st, dev_ids, ffm_is16(m, p) ? ffm_param16(m, p->off) : ffm_copy16(m, p->off), out, T, H);
        return 0;
    }
    if (!p->npc || embed_whole_piece(p)) {
        ff_embedding_fwd(m->st, dev_ids, p->npc ? ffm_piece_ptr(m, &p->pc[0]) : ffm_param(m, p->off), out, T, H);
        return 0;
    }
    if ((size_t)T > m->view_ids_cap) {
        int32_t *v = ff_realloc(m->view_ids, (size_t)T * sizeof *v);
        if (!v) return -1;
        m->view_ids = v, m->view_ids_cap = (size_t)T;
    }
    for (int k = 0; k < p->npc; k++) {
        const ffm_piece *q = &p->pc[k];
        for (int t = 0; t < T; t++) m->view_ids[t] = ids[t] >= q->lo && ids[t] < q->hi ? ids[t] - (int32_t)q->lo : -1;
        ff_memcpy_h2d(m->st, dev_ids, m->view_ids, (size_t)T * 4); /* after the previous piece's lookup, in stream order */
        ff_embedding_fwd(m->st, dev_ids, ffm_piece_ptr(m, q), k ? scratch : out, T, H);
        if (k) ff_add(m->st, out, scratch, (int64_t)T * H); /* each row is one piece's, the others' zeros */
    }
    return 0;
}

/* piece q of tensor p from device into host [p->numel] (the shard's row-major layout), or
 * (from non-NULL) from host into device */
static void piece_copy(ff_model *m, const ff_param_tensor *p, const ffm_piece *q, float *to, const float *from) {
    const ff_dptr d = ffm_piece_ptr(m, q);
    if (p->axis != 1) {
        const int64_t e0 = p->axis == 0 ? q->lo * row_width(p) : 0, n = piece_numel(p, q->lo, q->hi);
        if (from) ff_memcpy_h2d(m->st, d, from + e0, (size_t)n * 4);
        else ff_memcpy_d2h(m->st, to + e0, d, (size_t)n * 4);
        return;
    }
    const int64_t w = q->hi - q->lo, ld = p->shape[1];
    for (int64_t r = 0; r < p->shape[0]; r++) { /* a column block: one row at a time */
        const ff_dptr dr = ff_dptr_add(d, (size_t)(r * q->ld), 4);
        if (from) ff_memcpy_h2d(m->st, dr, from + r * ld + q->lo, (size_t)w * 4);
        else ff_memcpy_d2h(m->st, to + r * ld + q->lo, dr, (size_t)w * 4);
    }
}

int ffm_view_read(ff_model *m, const ff_param_tensor *p, float *host) {
    assert(p->npc);
    for (int k = 0; k < p->npc; k++) piece_copy(m, p, &p->pc[k], host, NULL);
    return 0;
}

int ffm_view_write(ff_model *m, const ff_param_tensor *p, const float *host) {
    assert(p->npc);
    ffm_params_written(m); /* its own pieces alone: those it reads in place stay the viewed model's */
    for (int k = 0; k < p->npc; k++)
        if (!p->pc[k].buf) piece_copy(m, p, &p->pc[k], NULL, host);
    return ff_stream_sync(m->st);
}

/* One decoder layer's forward, the only copy: the training and scoring forward (model.c)
 * and generation's prefill and decode (generate.c) all run it. The caller says where the
 * activations go (ffm_layer_acts: kept per layer for a backward, or one reused set) and
 * where attention finds keys and values (ffm_layer_tokens: the packed batch, or a KV cache).
 *
 *   x ─ RMSNorm ─ q|k|v (+bias) ─ RoPE ─ attention ─ o_proj ─(+x)─ mid
 *   mid ─ RMSNorm ─ gate|up ─ SwiGLU ─ down_proj ─(+mid)─ y
 *
 * Tensor parallelism (Megatron-style, model/tp.c): q|k|v and gate|up are the
 * column-parallel products (a rank holds Hq/tp query heads, the key/value heads they read
 * and I/tp intermediate rows, and everything between them and the next product is local to
 * those heads or rows), o_proj and down_proj the row-parallel ones (each rank's product is a
 * partial sum over its heads or rows, all-reduced before the residual add: row_parallel
 * below). The norms and the residual stream stay whole on every rank.
 *
 * Sequence parallelism (tk->sp, Korthikanti et al. 2022): the residual stream and the norms
 * hold this rank's rows of the tokens only; each norm's output is all-gathered into [T, H]
 * before its column-parallel product, and each row-parallel product's partial sum is
 * reduce-scattered to the rank's rows instead of all-reduced (the same bytes in a ring).
 *
 * A view model (model/view.c) reads its weights in pieces: the same products, one per piece.
 * A model with bf16 weights multiplies by them with ff_gemm_bf16w (fp32 activations); one with
 * bf16 products, inside its training and scoring forwards, with ff_gemm_bf16 by the bf16 copy
 * of its weights (model_internal.h, w16c), and its forwards, training and scoring alike (in16;
 * a training forward keeps them for its backward), hold the products' inputs (xn1, xn2 rounded
 * once; att, hm), q|k|v (rounded once after its bias and rotation) and gate|up's output gu in
 * bf16 alone: attention reads q|k|v and writes att in bf16, gate|up writes gu in bf16, SwiGLU
 * reads and writes bf16. Generation (a forward against the KV cache) does not.
 *
 * Not here: the backward (model.c, which reads the activations this leaves), the
 * embedding, the final norm and the heads. */
#include "model/model_internal.h"

static bool same(ff_dptr a, ff_dptr b) { return a.buf == b.buf && a.off == b.off; }

/* out [T, H] = res + A [T, K] @ W^T (W [H, K]); out may be res; A fp32, or bf16 (a16). Under
 * TP (the g operator) the product is a partial sum: computed alone (into out, or into scratch
 * [T, H] when out is res), summed over the group, then added to res. Under SP out and res are the rank's rows
 * [nr, H]: the partial sum goes to part [T, H], and its reduce-scatter back into part's
 * first rows. */
static int row_parallel(ff_model *m, const ffm_layer_tokens *tk, int K, ff_dptr A, bool a16, const ff_param_tensor *W, ff_dptr res,
                        ff_dptr out, ff_dptr scratch, ff_dptr part) {
    ff_stream *st = m->st;
    const int H = m->H, T = tk->T;
    if (tk->sp) {
        ffm_w_in(m, W, T, A, a16, K, 0.0f, part, H);
        if (ffm_sp_scatter(m, part, part, T, H)) return -1;
        if (!same(out, res)) ff_memcpy_d2d(st, out, res, (size_t)tk->nr * H * 4);
        ff_add(st, out, part, (int64_t)tk->nr * H);
        return 0;
    }
    if (m->tp == 1) {
        if (!same(out, res)) ff_memcpy_d2d(st, out, res, (size_t)T * H * 4);
        ffm_w_in(m, W, T, A, a16, K, 1.0f, out, H);
        return 0;
    }
    ff_dptr p = same(out, res) ? scratch : out;
    ffm_w_in(m, W, T, A, a16, K, 0.0f, p, H);
    if (ffm_tp_sum(m, p, (size_t)T * H)) return -1;
    ff_add(st, out, same(p, out) ? res : p, (int64_t)T * H);
    return 0;
}

/* out [T, H] = RMSNorm(x) with rstd; under SP x is the rank's rows [nr, H], normed into its
 * rows of out (rstd [nr]) and gathered (the all-gather before a column-parallel product). */
static int norm_fwd(ff_model *m, const ffm_layer_tokens *tk, ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, float eps) {
    if (!tk->sp) {
        ff_rmsnorm_fwd(m->st, x, w, out, rstd, tk->T, m->H, eps);
        return 0;
    }
    ff_dptr mine = ff_dptr_add(out, (size_t)tk->r0 * (size_t)m->H, 4);
    ff_rmsnorm_fwd(m->st, x, w, mine, rstd, tk->nr, m->H, eps);
    return ffm_sp_gather(m, mine, out, tk->T, m->H);
}

/* C [T, N] = A [T, K] @ W^T over n consecutive tensors of the table from `first`, whose rows
 * side by side are W [N, K] (q|k|v, gate|up): one product on the fused rows at fused_off of an
 * ordinary model's buffer; a view model's (model/view.c), per tensor into its columns of C.
 * Where the forwards hold bf16 activations (ffm_act16) A may be bf16 (a16), and C (c16: C is
 * then bf16, rounded from the sums); the weights are then the bf16 operand of ffm_w16_operand. */
static void col_parallel(ff_model *m, int first, int n, int T, int K, ff_dptr A, bool a16, size_t fused_off, int N, ff_dptr C,
                         bool c16) {
    if (a16 || c16) {
        bool b16;
        const ff_dptr W = ffm_w16_operand(m, fused_off, &b16);
        if (c16) ff_gemm_bf16_out(m->st, FF_NO_TRANS, FF_TRANS, T, N, K, A, a16, K, W, b16, K, C, N);
        else ff_gemm_bf16(m->st, FF_NO_TRANS, FF_TRANS, T, N, K, 1.0f, A, a16, K, W, b16, K, 0.0f, C, N);
        return;
    }
    if (m->w16) {
        ff_gemm_bf16w(m->st, T, N, K, A, K, ffm_param16(m, fused_off), K, 0.0f, C, N);
        return;
    }
    if (m->w16c_live) {
        ff_gemm_bf16(m->st, FF_NO_TRANS, FF_TRANS, T, N, K, 1.0f, A, false, K, ffm_copy16(m, fused_off), true, K, 0.0f, C, N);
        return;
    }
    if (!m->viewed) {
        ff_gemm(m->st, FF_NO_TRANS, FF_TRANS, T, N, K, 1.0f, A, K, ffm_param(m, fused_off), K, 0.0f, C, N);
        return;
    }
    for (int i = 0, c0 = 0; i < n; c0 += (int)m->tensors[first + i].shape[0], i++)
        ffm_w_out(m, &m->tensors[first + i], T, A, K, ff_dptr_add(C, (size_t)c0, 4), N);
}

/* The input [T, K] of a product, as the product reads it: x, or (bf16 products and a kept
 * forward: x16 not null) x rounded once into x16, which the backward's weight gradient reads
 * too (the normed rows; SwiGLU writes its bf16 output itself). */
static ff_dptr product_input(ff_model *m, ff_dptr x, ff_dptr x16, int T, int K, bool *a16) {
    *a16 = !ff_dptr_null(x16);
    if (!*a16) return x;
    ff_cast_f32_bf16(m->st, x, x16, (int64_t)T * K);
    return x16;
}

int ffm_layer_forward(ff_model *m, int l, const ffm_layer_tokens *tk, const ffm_layer_acts *a) {
    ff_stream *st = m->st;
    const ff_layer_params *p = &m->layers[l];
    const int T = tk->T, H = m->H, D = m->D, QKV = m->QKV;
    const int Hq = m->Hq, Hkv = m->Hkv, I = m->I; /* under TP: this rank's share (/ tp) */
    const int HD = Hq * D, KD = Hkv * D;
    const float eps = (float)m->cfg.rms_norm_eps;

    /* attention block: xn1 = norm(x) [T, H] (replicated under TP; SP: the rank's rows, then
     * all-gathered) */
    const ff_param_tensor *tt = m->tensors;
    if (norm_fwd(m, tk, a->x, ffm_w_vec(m, &tt[p->t_ln1]), a->xn1, a->rstd1, eps)) return -1;

    /* column-parallel: qkv [T, QKV] = xn1 @ Wqkv^T (+ b), Wqkv [QKV, H] = q|k|v rows */
    bool a16;
    ff_dptr in = product_input(m, a->xn1, a->xn1_16, T, H, &a16);
    col_parallel(m, p->t_q, 3, T, H, in, a16, p->wqkv, QKV, a->qkv, false);
    if (m->bias && !m->viewed) ff_bias_add(st, a->qkv, QKV, ffm_param(m, p->bqkv), T, QKV);
    for (int i = 0, c0 = 0; m->bias && m->viewed && i < 3; c0 += (int)tt[p->t_bq + i].numel, i++)
        ffm_w_bias(m, &tt[p->t_bq + i], ff_dptr_add(a->qkv, (size_t)c0, 4), QKV, T);
    /* q and k heads are adjacent columns of qkv: one rotation over Hq + Hkv heads */
    ff_rope_fwd(st, a->qkv, QKV, tk->pos, ff_dptr_of(m->rope_cos, 0), ff_dptr_of(m->rope_sin, 0), T, Hq + Hkv, D);

    /* att [T, Hq D], per head: local to the rank's heads under TP */
    const bool att16 = !ff_dptr_null(a->qkv_16); /* q|k|v rounded once, here; att kept in bf16 alone */
    if (att16) {
        assert(ff_dptr_null(tk->kv_k)); /* a training or scoring forward: never against a cache */
        ff_cast_f32_bf16(st, a->qkv, a->qkv_16, (int64_t)T * QKV);
        ff_attention_fwd_bf16(st, a->qkv_16, QKV, tk->seq_start, tk->S, T, Hq, Hkv, D, a->att_16, a->lse);
    } else if (ff_dptr_null(tk->kv_k)) {
        ff_attention_fwd(st, a->qkv, QKV, tk->seq_start, tk->S, T, Hq, Hkv, D, a->att, a->lse);
    } else {
        /* the tokens' own k and v rows into the cache first (rounded there when it is bf16) */
        void (*scatter)(ff_stream *, ff_dptr, int, ff_dptr, ff_dptr, int, int) = tk->kv16 ? ff_scatter_rows_bf16 : ff_scatter_rows;
        scatter(st, ff_dptr_add(a->qkv, (size_t)HD, 4), QKV, tk->kv_k, tk->kv_wrow, T, KD);
        scatter(st, ff_dptr_add(a->qkv, (size_t)(HD + KD), 4), QKV, tk->kv_v, tk->kv_wrow, T, KD);
        (tk->kv16 ? ff_attention_cached_bf16 : ff_attention_cached)(st, a->qkv, QKV, tk->kv_k, tk->kv_v, tk->kv_table, tk->kv_S,
                                                                   tk->kv_table_ld, tk->kv_block_rows, tk->kv_seq,
                                                                   tk->kv_nkeys, T, Hq, Hkv, D, a->att);
    }

    /* row-parallel: mid [T, H] = x + att @ Wo^T, Wo [H, Hq D]. TP all-reduce #1, over the
     * rank's heads (scratch: xn1, which in place of x is no longer needed) */
    if (row_parallel(m, tk, HD, att16 ? a->att_16 : a->att, att16, &tt[p->t_o], a->x, a->mid, a->xn1, a->part)) return -1;

    /* MLP block: xn2 = norm(mid) [T, H] (replicated under TP; SP: gathered) */
    if (norm_fwd(m, tk, a->mid, ffm_w_vec(m, &tt[p->t_ln2]), a->xn2, a->rstd2, eps)) return -1;

    /* column-parallel: gu [T, 2I] = xn2 @ Wgu^T, Wgu [2I, H] = gate|up rows; hm [T, I] */
    in = product_input(m, a->xn2, a->xn2_16, T, H, &a16);
    const bool mlp16 = !ff_dptr_null(a->gu_16); /* gu and hm kept in bf16 alone */
    col_parallel(m, p->t_gate, 2, T, H, in, a16, p->wgu, 2 * I, mlp16 ? a->gu_16 : a->gu, mlp16);
    if (mlp16) ff_swiglu_fwd_bf16(st, a->gu_16, a->hm_16, T, I);
    else ff_swiglu_fwd(st, a->gu, a->hm, T, I);

    /* row-parallel: y [T, H] = mid + hm @ Wdown^T, Wdown [H, I]. TP all-reduce #2, over the
     * rank's intermediate rows (scratch: xn2, read by gate|up above) */
    return row_parallel(m, tk, I, mlp16 ? a->hm_16 : a->hm, mlp16, &tt[p->t_down], a->mid, a->y, a->xn2, a->part);
}

/* CPU kernels of the transformer's elementwise and row-wise layers: embedding, RMSNorm,
 * rotary embedding, bias, SwiGLU, row gather/scatter, and the optimizer's vector
 * operations (AdamW, scale, add, sum of squares). fp32, OpenMP. Contracts in
 * include/fuseflow/kernels.h. Reductions over rows (weight gradients) are split by column
 * blocks, so results do not depend on the thread count or on timing. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* Threads for `work` element-operations: one below FF_PAR_MIN. */
static int team(const ff_stream *s, double work) { return work < FF_PAR_MIN ? 1 : NT(s); }

/* [c0, c1) of n columns for thread id of nt, in blocks of 16. */
static void col_block(int n, int id, int nt, int *c0, int *c1) {
    int blocks = (n + 15) / 16;
    *c0 = (int)((int64_t)blocks * id / nt) * 16;
    *c1 = (int)((int64_t)blocks * (id + 1) / nt) * 16;
    if (*c1 > n) *c1 = n;
    if (*c0 > n) *c0 = n;
}

void ff_cpu_embedding_fwd(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H) {
    const int32_t *tok = I32(tokens); /* [T] */
    const float *tab = F(table);      /* [V, H] */
    float *o = F(out);                /* [T, H] */
#pragma omp parallel for num_threads(team(s, (double)T * H)) schedule(static)
    for (int t = 0; t < T; t++) memcpy(o + (size_t)t * H, tab + (size_t)tok[t] * H, (size_t)H * sizeof(float));
}

void ff_cpu_embedding_bwd(ff_stream *s, ff_dptr tokens, ff_dptr dout, ff_dptr dtable, int T, int H) {
    const int32_t *tok = I32(tokens); /* [T] */
    const float *g = F(dout);         /* [T, H] */
    float *dt = F(dtable);            /* [V, H] += */
#pragma omp parallel num_threads(team(s, (double)T * H))
    {
        int c0, c1;
        col_block(H, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int t = 0; t < T; t++) {
            float *row = dt + (size_t)tok[t] * H;
            const float *gr = g + (size_t)t * H;
#pragma omp simd
            for (int j = c0; j < c1; j++) row[j] += gr[j];
        }
    }
}

FF_VEC static float rms_row(const float *xr, const float *w, float *o, int H, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < H; j++) ss += xr[j] * xr[j];
    float r = 1.0f / sqrtf(ss / (float)H + eps);
#pragma omp simd
    for (int j = 0; j < H; j++) o[j] = xr[j] * r * w[j];
    return r;
}

void ff_cpu_rmsnorm_fwd(ff_stream *s, ff_dptr xp, ff_dptr wp, ff_dptr outp, ff_dptr rstdp, int T, int H, float eps) {
    const float *x = F(xp), *w = F(wp); /* [T, H], [H] */
    float *out = F(outp), *rstd = F(rstdp); /* [T, H], [T] */
#pragma omp parallel for num_threads(team(s, (double)T * H)) schedule(static)
    for (int t = 0; t < T; t++) rstd[t] = rms_row(x + (size_t)t * H, w, out + (size_t)t * H, H, eps);
}

FF_VEC static void rms_bwd_row(const float *xr, const float *w, const float *gr, float *d, float r, int H) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < H; j++) dot += w[j] * gr[j] * xr[j];
    float c = dot * r * r / (float)H;
#pragma omp simd
    for (int j = 0; j < H; j++) d[j] += r * (w[j] * gr[j] - xr[j] * c);
}

/* dw[c0:c1] += sum over rows of dout * x * rstd */
FF_VEC static void rms_dw_cols(const float *x, const float *dout, const float *rstd, float *dw, int T, int H, int c0,
                               int c1) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * H, *gr = dout + (size_t)t * H;
        float r = rstd[t];
#pragma omp simd
        for (int j = c0; j < c1; j++) dw[j] += gr[j] * xr[j] * r;
    }
}

void ff_cpu_rmsnorm_bwd(ff_stream *s, ff_dptr xp, ff_dptr wp, ff_dptr rstdp, ff_dptr doutp, ff_dptr dxp, ff_dptr dwp,
                        int T, int H) {
    const float *x = F(xp), *w = F(wp), *rstd = F(rstdp), *dout = F(doutp); /* [T,H], [H], [T], [T,H] */
    float *dx = F(dxp), *dw = F(dwp);                                       /* [T,H] +=, [H] += */
    /* dx = rstd * (w*dout - xhat * mean(w*dout*xhat)), xhat = x*rstd; dw = sum_t dout*xhat */
#pragma omp parallel num_threads(team(s, 2.0 * T * H))
    {
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++)
            rms_bwd_row(x + (size_t)t * H, w, dout + (size_t)t * H, dx + (size_t)t * H, rstd[t], H);
        int c0, c1;
        col_block(H, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        rms_dw_cols(x, dout, rstd, dw, T, H, c0, c1);
    }
}

FF_VEC static void rope_row(float *x, const float *c, const float *sr, int n_heads, int D, float sign) {
    int half = D / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * D;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half], si = sign * sr[i];
            v[i] = a * c[i] - b * si;
            v[i + half] = b * c[i] + a * si;
        }
    }
}

void ff_cpu_rope(ff_stream *s, ff_dptr xp, int ld, ff_dptr posp, ff_dptr cosp, ff_dptr sinp, int T, int n_heads, int D,
                 int inverse) {
    float *x = F(xp);                         /* [T, n_heads * D] ld */
    const int32_t *pos = I32(posp);           /* [T] */
    const float *cs = F(cosp), *sn = F(sinp); /* [max_pos, D/2] */
    int half = D / 2;
#pragma omp parallel for num_threads(team(s, (double)T * n_heads * D)) schedule(static)
    for (int t = 0; t < T; t++)
        rope_row(x + (size_t)t * ld, cs + (size_t)pos[t] * half, sn + (size_t)pos[t] * half, n_heads, D,
                 inverse ? -1.0f : 1.0f);
}

void ff_cpu_bias_add(ff_stream *s, ff_dptr xp, int ld, ff_dptr bp, int T, int N) {
    float *x = F(xp);       /* [T, N] ld */
    const float *b = F(bp); /* [N] */
#pragma omp parallel for num_threads(team(s, (double)T * N)) schedule(static)
    for (int t = 0; t < T; t++) {
        float *r = x + (size_t)t * ld;
#pragma omp simd
        for (int j = 0; j < N; j++) r[j] += b[j];
    }
}

void ff_cpu_bias_bwd(ff_stream *s, ff_dptr dyp, int ld, ff_dptr dbp, int T, int N) {
    const float *dy = F(dyp); /* [T, N] ld */
    float *db = F(dbp);       /* [N] += */
#pragma omp parallel num_threads(team(s, (double)T * N))
    {
        int c0, c1;
        col_block(N, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int t = 0; t < T; t++) {
            const float *r = dy + (size_t)t * ld;
#pragma omp simd
            for (int j = c0; j < c1; j++) db[j] += r[j];
        }
    }
}

FF_VEC static void swiglu_row(const float *g, const float *u, float *o, int n) {
#pragma omp simd
    for (int j = 0; j < n; j++) o[j] = g[j] / (1.0f + ff_fast_expf(-g[j])) * u[j];
}

FF_VEC static void swiglu_bwd_row(const float *g, const float *u, const float *d, float *dg, float *du, int n) {
#pragma omp simd
    for (int j = 0; j < n; j++) {
        float gj = g[j], uj = u[j];
        float sg = 1.0f / (1.0f + ff_fast_expf(-gj));
        float silu = gj * sg;
        dg[j] = d[j] * uj * sg * (1.0f + gj * (1.0f - sg));
        du[j] = d[j] * silu;
    }
}

void ff_cpu_swiglu_fwd(ff_stream *s, ff_dptr gup, ff_dptr hp, int T, int inter) {
    const float *gu = F(gup); /* [T, 2 inter] */
    float *h = F(hp);         /* [T, inter] */
#pragma omp parallel for num_threads(team(s, 8.0 * T * inter)) schedule(static)
    for (int t = 0; t < T; t++) {
        const float *g = gu + (size_t)t * 2 * inter;
        swiglu_row(g, g + inter, h + (size_t)t * inter, inter);
    }
}

void ff_cpu_swiglu_bwd(ff_stream *s, ff_dptr gup, ff_dptr dhp, ff_dptr dgup, int T, int inter) {
    const float *gu = F(gup), *dh = F(dhp); /* [T, 2 inter], [T, inter] */
    float *dgu = F(dgup);                   /* [T, 2 inter], may alias gu */
#pragma omp parallel for num_threads(team(s, 10.0 * T * inter)) schedule(static)
    for (int t = 0; t < T; t++) {
        const float *g = gu + (size_t)t * 2 * inter;
        float *dg = dgu + (size_t)t * 2 * inter;
        swiglu_bwd_row(g, g + inter, dh + (size_t)t * inter, dg, dg + inter, inter);
    }
}

void ff_cpu_scatter_rows(ff_stream *s, ff_dptr srcp, int lds, ff_dptr dstp, ff_dptr rowsp, int T, int N) {
    const float *src = F(srcp); /* [T, N] lds */
    float *dst = F(dstp);       /* [*, N] */
    const int32_t *rows = I32(rowsp);
#pragma omp parallel for num_threads(team(s, (double)T * N)) schedule(static)
    for (int t = 0; t < T; t++) memcpy(dst + (size_t)rows[t] * N, src + (size_t)t * lds, (size_t)N * sizeof(float));
}

void ff_cpu_gather_rows(ff_stream *s, ff_dptr srcp, ff_dptr rowsp, ff_dptr dstp, int R, int N) {
    const float *src = F(srcp); /* [*, N] */
    float *dst = F(dstp);       /* [R, N] */
    const int32_t *rows = I32(rowsp);
#pragma omp parallel for num_threads(team(s, (double)R * N)) schedule(static)
    for (int r = 0; r < R; r++) memcpy(dst + (size_t)r * N, src + (size_t)rows[r] * N, (size_t)N * sizeof(float));
}

void ff_cpu_add(ff_stream *s, ff_dptr yp, ff_dptr xp, int64_t n) {
    float *y = F(yp);
    const float *x = F(xp);
#pragma omp parallel for simd num_threads(team(s, (double)n)) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void ff_cpu_scale(ff_stream *s, ff_dptr xp, int64_t n, float alpha) {
    float *x = F(xp);
#pragma omp parallel for simd num_threads(team(s, (double)n)) schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] *= alpha;
}

double ff_cpu_sumsq(ff_stream *s, ff_dptr xp, int64_t n) {
    const float *x = F(xp);
    /* Fixed blocks summed in float, blocks summed in double in order: the result does not
     * depend on the thread count. */
    enum { BLK = 4096 };
    int64_t nb = (n + BLK - 1) / BLK;
    double total = 0.0;
#pragma omp parallel for num_threads(team(s, (double)n)) schedule(static) ordered
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * BLK, i1 = i0 + BLK < n ? i0 + BLK : n;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = i0; i < i1; i++) acc += x[i] * x[i];
#pragma omp ordered
        total += acc;
    }
    return total;
}

FF_VEC static void adamw_range(float *p, const float *g, float *m, float *v, int64_t i0, int64_t i1, float decay,
                               float b1, float b2, float step_size, float bc2_sqrt, float eps, float grad_scale) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float gi = g[i] * grad_scale;
        float pi = p[i] * decay;
        float mi = m[i] * b1 + (1.0f - b1) * gi;
        float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
}

void ff_cpu_adamw(ff_stream *s, ff_dptr pp, ff_dptr gp, ff_dptr mp, ff_dptr vp, int64_t n, float lr, float b1, float b2,
                  float eps, float weight_decay, float bc1, float bc2, float grad_scale) {
    float *p = F(pp), *m = F(mp), *v = F(vp); /* [n] each */
    const float *g = F(gp);                   /* [n] */
    /* The operation order of torch.optim.AdamW (single-tensor path, torch 1.13). */
    float decay = 1.0f - lr * weight_decay, step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
    enum { CHUNK = 16384 };
    int64_t nb = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(team(s, 8.0 * n)) schedule(static)
    for (int64_t b = 0; b < nb; b++)
        adamw_range(p, g, m, v, b * CHUNK, b * CHUNK + CHUNK < n ? b * CHUNK + CHUNK : n, decay, b1, b2, step_size,
                    bc2_sqrt, eps, grad_scale);
}

/* CPU kernels of the transformer's elementwise and row-wise layers: embedding, RMSNorm,
 * rotary embedding, bias, SwiGLU, row gather/scatter, and the optimizer's vector
 * operations (AdamW, scale, add, sum of squares), and the bf16 casts and embedding of bf16
 * weights. fp32, run on the backend's thread pool
 * (ff_cpu_for). Contracts in include/fuseflow/kernels.h. Reductions over rows (weight
 * gradients) are split by column blocks of COLS, each summed over rows in order by one
 * chunk, so results do not depend on the thread count, the chunking or timing. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

enum { COLS = 64 }; /* column block of the row reductions */

static int64_t col_blocks(int n) { return (n + COLS - 1) / COLS; }

/* ---- embedding ---------------------------------------------------------------------------- */

typedef struct emb_job {
    const int32_t *tok; /* [T] */
    const float *src;   /* fwd: table [V, H]; bwd: dout [T, H] */
    float *dst;         /* fwd: out [T, H]; bwd: dtable [V, H] += */
    int T, H;
} emb_job;

/* The forward is a row gather, out[t] = table[tokens[t]], with zeros for token -1 (a token
 * outside this rank's vocabulary rows under tensor parallelism). */
static void emb_fwd_part(void *arg, int64_t t0, int64_t t1) {
    const emb_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *o = j->dst + (size_t)t * j->H;
        if (j->tok[t] < 0) memset(o, 0, (size_t)j->H * sizeof(float));
        else memcpy(o, j->src + (size_t)j->tok[t] * j->H, (size_t)j->H * sizeof(float));
    }
}

void ff_cpu_embedding_fwd(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H) {
    emb_job j = {I32(tokens), F(table), F(out), T, H};
    ff_cpu_for(s, T, H, emb_fwd_part, &j);
}

/* The forward from a bf16 table: each row widened exactly. */
typedef struct emb16_job {
    const int32_t *tok;     /* [T] */
    const uint16_t *table;  /* bf16 [V, H] */
    float *out;             /* [T, H] */
    int H;
} emb16_job;

FF_VEC static void emb16_fwd_part(void *arg, int64_t t0, int64_t t1) {
    const emb16_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *o = j->out + (size_t)t * j->H;
        if (j->tok[t] < 0) {
            memset(o, 0, (size_t)j->H * sizeof(float));
            continue;
        }
        const uint16_t *r = j->table + (size_t)j->tok[t] * j->H;
#pragma omp simd
        for (int c = 0; c < j->H; c++) o[c] = bf16_widen(r[c]);
    }
}

void ff_cpu_embedding_fwd_bf16(ff_stream *s, ff_dptr tokens, ff_dptr table, ff_dptr out, int T, int H) {
    emb16_job j = {I32(tokens), (const uint16_t *)(const void *)F(table), F(out), H};
    ff_cpu_for(s, T, H, emb16_fwd_part, &j);
}

typedef struct cast_job {
    const void *src;
    void *dst;
} cast_job;

FF_VEC static void to_bf16_part(void *arg, int64_t i0, int64_t i1) {
    const cast_job *j = arg;
    const float *x = j->src;
    uint16_t *y = j->dst;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) y[i] = bf16_round(x[i]);
}
FF_VEC static void from_bf16_part(void *arg, int64_t i0, int64_t i1) {
    const cast_job *j = arg;
    const uint16_t *x = j->src;
    float *y = j->dst;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) y[i] = bf16_widen(x[i]);
}

void ff_cpu_cast_f32_bf16(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n) {
    cast_job j = {F(src), F(dst)};
    ff_cpu_for(s, n, 1.0, to_bf16_part, &j);
}
void ff_cpu_cast_bf16_f32(ff_stream *s, ff_dptr src, ff_dptr dst, int64_t n) {
    cast_job j = {F(src), F(dst)};
    ff_cpu_for(s, n, 1.0, from_bf16_part, &j);
}

FF_VEC static void emb_bwd_cols(void *arg, int64_t b0, int64_t b1) {
    const emb_job *j = arg;
    int c0 = (int)b0 * COLS, c1 = (int)b1 * COLS < j->H ? (int)b1 * COLS : j->H;
    for (int t = 0; t < j->T; t++) {
        if (j->tok[t] < 0) continue;
        float *row = j->dst + (size_t)j->tok[t] * j->H;
        const float *g = j->src + (size_t)t * j->H;
#pragma omp simd
        for (int c = c0; c < c1; c++) row[c] += g[c];
    }
}

void ff_cpu_embedding_bwd(ff_stream *s, ff_dptr tokens, ff_dptr dout, ff_dptr dtable, int T, int H) {
    emb_job j = {I32(tokens), F(dout), F(dtable), T, H};
    ff_cpu_for(s, col_blocks(H), (double)T * COLS, emb_bwd_cols, &j);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

typedef struct rms_job {
    const float *x, *w, *dout; /* [T, H], [H], [T, H] */
    float *out, *rstd, *dx, *dw; /* [T, H], [T], [T, H] +=, [H] += */
    int T, H;
    float eps;
} rms_job;

FF_VEC static void rms_fwd_rows(void *arg, int64_t t0, int64_t t1) {
    const rms_job *j = arg;
    const int H = j->H;
    for (int64_t t = t0; t < t1; t++) {
        const float *xr = j->x + (size_t)t * H;
        float *o = j->out + (size_t)t * H;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < H; c++) ss += xr[c] * xr[c];
        float r = 1.0f / sqrtf(ss / (float)H + j->eps);
        j->rstd[t] = r;
#pragma omp simd
        for (int c = 0; c < H; c++) o[c] = xr[c] * r * j->w[c];
    }
}

void ff_cpu_rmsnorm_fwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr out, ff_dptr rstd, int T, int H, float eps) {
    rms_job j = {.x = F(x), .w = F(w), .out = F(out), .rstd = F(rstd), .T = T, .H = H, .eps = eps};
    ff_cpu_for(s, T, 2.0 * H, rms_fwd_rows, &j);
}

/* dx = rstd * (w*dout - xhat * mean(w*dout*xhat)), xhat = x*rstd */
FF_VEC static void rms_bwd_rows(void *arg, int64_t t0, int64_t t1) {
    const rms_job *j = arg;
    const int H = j->H;
    const float *w = j->w;
    for (int64_t t = t0; t < t1; t++) {
        const float *xr = j->x + (size_t)t * H, *gr = j->dout + (size_t)t * H;
        float *d = j->dx + (size_t)t * H;
        float r = j->rstd[t], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < H; c++) dot += w[c] * gr[c] * xr[c];
        float k = dot * r * r / (float)H;
#pragma omp simd
        for (int c = 0; c < H; c++) d[c] += r * (w[c] * gr[c] - xr[c] * k);
    }
}

/* dw[c] += sum over rows of dout * x * rstd, for the column blocks [b0, b1) */
FF_VEC static void rms_dw_cols(void *arg, int64_t b0, int64_t b1) {
    const rms_job *j = arg;
    const int H = j->H;
    int c0 = (int)b0 * COLS, c1 = (int)b1 * COLS < H ? (int)b1 * COLS : H;
    for (int t = 0; t < j->T; t++) {
        const float *xr = j->x + (size_t)t * H, *gr = j->dout + (size_t)t * H;
        float r = j->rstd[t];
#pragma omp simd
        for (int c = c0; c < c1; c++) j->dw[c] += gr[c] * xr[c] * r;
    }
}

void ff_cpu_rmsnorm_bwd(ff_stream *s, ff_dptr x, ff_dptr w, ff_dptr rstd, ff_dptr dout, ff_dptr dx, ff_dptr dw, int T,
                        int H) {
    rms_job j = {.x = F(x), .w = F(w), .dout = F(dout), .rstd = F(rstd), .dx = F(dx), .dw = F(dw), .T = T, .H = H};
    ff_cpu_for(s, T, 3.0 * H, rms_bwd_rows, &j);
    ff_cpu_for(s, col_blocks(H), 2.0 * T * COLS, rms_dw_cols, &j);
}

/* ---- rotary embedding --------------------------------------------------------------------- */

typedef struct rope_job {
    float *x; /* [T, n_heads * D] ld */
    const int32_t *pos;
    const float *cs, *sn; /* [max_pos, D/2] */
    int ld, n_heads, D;
    float sign;
} rope_job;

FF_VEC static void rope_rows(void *arg, int64_t t0, int64_t t1) {
    const rope_job *j = arg;
    const int half = j->D / 2;
    for (int64_t t = t0; t < t1; t++) {
        const float *c = j->cs + (size_t)j->pos[t] * half, *sr = j->sn + (size_t)j->pos[t] * half;
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->x + (size_t)t * j->ld + (size_t)h * j->D;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half], si = j->sign * sr[i];
                v[i] = a * c[i] - b * si;
                v[i + half] = b * c[i] + a * si;
            }
        }
    }
}

void ff_cpu_rope(ff_stream *s, ff_dptr x, int ld, ff_dptr pos, ff_dptr cos_t, ff_dptr sin_t, int T, int n_heads, int D,
                 int inverse) {
    rope_job j = {F(x), I32(pos), F(cos_t), F(sin_t), ld, n_heads, D, inverse ? -1.0f : 1.0f};
    ff_cpu_for(s, T, 3.0 * n_heads * D, rope_rows, &j);
}

/* ---- bias ---------------------------------------------------------------------------------- */

typedef struct bias_job {
    float *x;       /* add: [T, N] ld; bwd: db [N] += */
    const float *y; /* add: b [N]; bwd: dy [T, N] ld */
    int ld, T, N;
} bias_job;

FF_VEC static void bias_add_rows(void *arg, int64_t t0, int64_t t1) {
    const bias_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *r = j->x + (size_t)t * j->ld;
#pragma omp simd
        for (int c = 0; c < j->N; c++) r[c] += j->y[c];
    }
}

void ff_cpu_bias_add(ff_stream *s, ff_dptr x, int ld, ff_dptr b, int T, int N) {
    bias_job j = {F(x), F(b), ld, T, N};
    ff_cpu_for(s, T, N, bias_add_rows, &j);
}

FF_VEC static void bias_bwd_cols(void *arg, int64_t b0, int64_t b1) {
    const bias_job *j = arg;
    int c0 = (int)b0 * COLS, c1 = (int)b1 * COLS < j->N ? (int)b1 * COLS : j->N;
    for (int t = 0; t < j->T; t++) {
        const float *r = j->y + (size_t)t * j->ld;
#pragma omp simd
        for (int c = c0; c < c1; c++) j->x[c] += r[c];
    }
}

void ff_cpu_bias_bwd(ff_stream *s, ff_dptr dy, int ld, ff_dptr db, int T, int N) {
    bias_job j = {F(db), F(dy), ld, T, N};
    ff_cpu_for(s, col_blocks(N), (double)T * COLS, bias_bwd_cols, &j);
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

typedef struct swiglu_job {
    const float *gu, *dh; /* [T, 2I] (g | u), [T, I] */
    float *h, *dgu;       /* [T, I], [T, 2I] (may alias gu) */
    const uint16_t *gu16, *dh16; /* bf16: gu [T, 2I], dh [T, I] */
    uint16_t *h16, *dgu16;       /* bf16: h [T, I], dgu [T, 2I] */
    int inter;
} swiglu_job;

/* one element: h = silu(g) u, and its gradients (dg, du) given dh; the fp32 and bf16 forms
 * below run these same formulas (bf16: on the widened values, the forward's output rounded) */
static inline float swiglu_h(float g, float u) { return g / (1.0f + ff_fast_expf(-g)) * u; }
static inline void swiglu_d(float g, float u, float d, float *dg, float *du) {
    const float sg = 1.0f / (1.0f + ff_fast_expf(-g));
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
    *du = d * (g * sg);
}

FF_VEC static void swiglu_fwd_rows(void *arg, int64_t t0, int64_t t1) {
    const swiglu_job *j = arg;
    const int n = j->inter;
    for (int64_t t = t0; t < t1; t++) {
        const size_t r = (size_t)t * 2 * n, o = (size_t)t * n;
        if (j->gu16) {
#pragma omp simd
            for (int c = 0; c < n; c++) j->h16[o + c] = bf16_round(swiglu_h(bf16_widen(j->gu16[r + c]), bf16_widen(j->gu16[r + n + c])));
        } else {
#pragma omp simd
            for (int c = 0; c < n; c++) j->h[o + c] = swiglu_h(j->gu[r + c], j->gu[r + n + c]);
        }
    }
}

/* dgu may alias gu (fp32): each element's g, u are read before its dg, du are written */
FF_VEC static void swiglu_bwd_rows(void *arg, int64_t t0, int64_t t1) {
    const swiglu_job *j = arg;
    const int n = j->inter;
    for (int64_t t = t0; t < t1; t++) {
        const size_t r = (size_t)t * 2 * n;
        if (j->gu16) {
            const uint16_t *d16 = j->dh16 + (size_t)t * n;
            uint16_t *dg16 = j->dgu16 + r, *du16 = dg16 + n;
#pragma omp simd
            for (int c = 0; c < n; c++) {
                float dg, du;
                swiglu_d(bf16_widen(j->gu16[r + c]), bf16_widen(j->gu16[r + n + c]), bf16_widen(d16[c]), &dg, &du);
                dg16[c] = bf16_round(dg), du16[c] = bf16_round(du);
            }
            continue;
        }
        const float *d = j->dh + (size_t)t * n;
        float *dg = j->dgu + r, *du = dg + n;
#pragma omp simd
        for (int c = 0; c < n; c++) swiglu_d(j->gu[r + c], j->gu[r + n + c], d[c], dg + c, du + c);
    }
}

void ff_cpu_swiglu_fwd(ff_stream *s, ff_dptr gu, ff_dptr h, int T, int inter, bool b16) {
    swiglu_job j = {.inter = inter};
    if (b16) j.gu16 = (const uint16_t *)(void *)F(gu), j.h16 = (uint16_t *)(void *)F(h);
    else j.gu = F(gu), j.h = F(h);
    ff_cpu_for(s, T, 12.0 * inter, swiglu_fwd_rows, &j);
}

void ff_cpu_swiglu_bwd(ff_stream *s, ff_dptr gu, ff_dptr dh, ff_dptr dgu, int T, int inter, bool b16) {
    swiglu_job j = {.inter = inter};
    if (b16) {
        j.gu16 = (const uint16_t *)(void *)F(gu), j.dh16 = (const uint16_t *)(void *)F(dh);
        j.dgu16 = (uint16_t *)(void *)F(dgu);
    } else {
        j.gu = F(gu), j.dh = F(dh), j.dgu = F(dgu);
    }
    ff_cpu_for(s, T, 16.0 * inter, swiglu_bwd_rows, &j);
}

/* ---- rows ------------------------------------------------------------------------------------ */

typedef struct rows_job {
    const float *src;
    float *dst;
    const int32_t *rows;
    int lds, N;
} rows_job;

static void scatter_part(void *arg, int64_t t0, int64_t t1) {
    const rows_job *j = arg;
    for (int64_t t = t0; t < t1; t++)
        memcpy(j->dst + (size_t)j->rows[t] * j->N, j->src + (size_t)t * j->lds, (size_t)j->N * sizeof(float));
}

void ff_cpu_scatter_rows(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N) {
    rows_job j = {F(src), F(dst), I32(rows), lds, N};
    ff_cpu_for(s, T, N, scatter_part, &j);
}

FF_VEC static void scatter16_part(void *arg, int64_t t0, int64_t t1) {
    const rows_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        uint16_t *d = (uint16_t *)(void *)j->dst + (size_t)j->rows[t] * j->N;
        const float *x = j->src + (size_t)t * j->lds;
#pragma omp simd
        for (int c = 0; c < j->N; c++) d[c] = bf16_round(x[c]);
    }
}

void ff_cpu_scatter_rows_bf16(ff_stream *s, ff_dptr src, int lds, ff_dptr dst, ff_dptr rows, int T, int N) {
    rows_job j = {F(src), F(dst), I32(rows), lds, N};
    ff_cpu_for(s, T, N, scatter16_part, &j);
}

static void gather_part(void *arg, int64_t r0, int64_t r1) {
    const rows_job *j = arg;
    for (int64_t r = r0; r < r1; r++)
        memcpy(j->dst + (size_t)r * j->N, j->src + (size_t)j->rows[r] * j->N, (size_t)j->N * sizeof(float));
}

void ff_cpu_gather_rows(ff_stream *s, ff_dptr src, ff_dptr rows, ff_dptr dst, int R, int N) {
    rows_job j = {F(src), F(dst), I32(rows), N, N};
    ff_cpu_for(s, R, N, gather_part, &j);
}

/* ---- vectors ------------------------------------------------------------------------------- */

typedef struct vec_job {
    float *y, *m, *v;
    const float *x;
    float alpha;
    /* adamw */
    float decay, b1, b2, step_size, bc2_sqrt, eps, grad_scale;
} vec_job;

FF_VEC static void add_part(void *arg, int64_t i0, int64_t i1) {
    const vec_job *j = arg;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) j->y[i] += j->x[i];
}

void ff_cpu_add(ff_stream *s, ff_dptr y, ff_dptr x, int64_t n) {
    vec_job j = {.y = F(y), .x = F(x)};
    ff_cpu_for(s, n, 1.0, add_part, &j);
}

FF_VEC static void scale_part(void *arg, int64_t i0, int64_t i1) {
    const vec_job *j = arg;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) j->y[i] *= j->alpha;
}

void ff_cpu_scale(ff_stream *s, ff_dptr x, int64_t n, float alpha) {
    vec_job j = {.y = F(x), .alpha = alpha};
    ff_cpu_for(s, n, 1.0, scale_part, &j);
}

enum { SUMSQ_BLK = 4096 };

typedef struct sumsq_job {
    const float *x;
    int64_t n;
    double *partial; /* [blocks] */
} sumsq_job;

FF_VEC static void sumsq_part(void *arg, int64_t b0, int64_t b1) {
    const sumsq_job *j = arg;
    for (int64_t b = b0; b < b1; b++) {
        int64_t i0 = b * SUMSQ_BLK, i1 = i0 + SUMSQ_BLK < j->n ? i0 + SUMSQ_BLK : j->n;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = i0; i < i1; i++) acc += j->x[i] * j->x[i];
        j->partial[b] = acc;
    }
}

/* Fixed blocks summed in float, then the blocks in order in double: the result does not
 * depend on the thread count. */
double ff_cpu_sumsq(ff_stream *s, ff_dptr x, int64_t n) {
    int64_t nb = (n + SUMSQ_BLK - 1) / SUMSQ_BLK;
    sumsq_job j = {F(x), n, ff_cpu_scratch(s, (size_t)(nb > 0 ? nb : 1) * sizeof(double))};
    if (!j.partial) return NAN; /* the stream has failed */
    ff_cpu_for(s, nb, 2.0 * SUMSQ_BLK, sumsq_part, &j);
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) total += j.partial[b];
    return total;
}

FF_VEC static void adamw_part(void *arg, int64_t i0, int64_t i1) {
    const vec_job *j = arg;
    float *p = j->y, *m = j->m, *v = j->v;
    const float *g = j->x;
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float gi = g[i] * j->grad_scale;
        float pi = p[i] * j->decay;
        float mi = m[i] * j->b1 + (1.0f - j->b1) * gi;
        float vi = v[i] * j->b2 + (1.0f - j->b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - j->step_size * (mi / (sqrtf(vi) / j->bc2_sqrt + j->eps));
    }
}

/* The operation order of torch.optim.AdamW (single-tensor path, torch 1.13). */
void ff_cpu_adamw(ff_stream *s, ff_dptr param, ff_dptr grad, ff_dptr m, ff_dptr v, int64_t n, float lr, float b1,
                  float b2, float eps, float weight_decay, float bc1, float bc2, float grad_scale) {
    vec_job j = {.y = F(param), .x = F(grad), .m = F(m), .v = F(v), .decay = 1.0f - lr * weight_decay, .b1 = b1,
                 .b2 = b2, .step_size = lr / bc1, .bc2_sqrt = sqrtf(bc2), .eps = eps, .grad_scale = grad_scale};
    ff_cpu_for(s, n, 12.0, adamw_part, &j);
}

/* CPU kernels on the logits: per-token log-probs and entropy (forward and backward into the
 * logits) and sampling (greedy, temperature, top-k, top-p). Rows are independent and split
 * across the OpenMP team. Contracts in include/fuseflow/kernels.h. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_internal.h"

static int team(const ff_stream *s, double work) { return work < FF_PAR_MIN ? 1 : NT(s); }

static float row_max(const float *z, int V) {
    float mx = -FLT_MAX;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    return mx;
}

void ff_cpu_logprob_fwd(ff_stream *s, ff_dptr logitsp, ff_dptr targetsp, float inv_temp, int T, int V, ff_dptr lpp,
                        ff_dptr entp, ff_dptr lsep) {
    const float *logits = F(logitsp);     /* [T, V] */
    const int32_t *targets = I32(targetsp); /* [T] or NULL */
    float *lp = F(lpp), *ent = F(entp), *lse = F(lsep); /* [T] each; lp, ent may be NULL */
#pragma omp parallel for num_threads(team(s, 4.0 * T * V)) schedule(static)
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * V;
        float mx = row_max(z, V) * inv_temp; /* inv_temp > 0 keeps the argmax */
        float sum = 0.0f, wsum = 0.0f;
#pragma omp simd reduction(+ : sum, wsum)
        for (int v = 0; v < V; v++) {
            float zs = z[v] * inv_temp - mx;
            float e = ff_fast_expf(zs);
            sum += e;
            wsum += e * zs;
        }
        float l = logf(sum);
        lse[t] = mx + l;
        /* H = -sum p (zs - l) = l - sum p zs, with zs the shifted scaled logits */
        if (ent) ent[t] = l - wsum / sum;
        if (lp) {
            int y = targets[t];
            lp[t] = y >= 0 ? z[y] * inv_temp - lse[t] : 0.0f;
        }
    }
}

void ff_cpu_logprob_bwd(ff_stream *s, ff_dptr logitsp, ff_dptr targetsp, float inv_temp, int T, int V, ff_dptr lsep,
                        ff_dptr dlpp, ff_dptr dentp, ff_dptr entp) {
    float *logits = F(logitsp);             /* [T, V] in: logits, out: dlogits */
    const int32_t *targets = I32(targetsp); /* [T] or NULL */
    const float *lse = F(lsep), *dlp = F(dlpp), *dent = F(dentp), *ent = F(entp); /* [T] */
    /* zs = z * it; p = exp(zs - lse);
     * d logp[y] / d zs_v = [v == y] - p_v;  d H / d zs_v = -p_v (log p_v + H) */
#pragma omp parallel for num_threads(team(s, 4.0 * T * V)) schedule(static)
    for (int t = 0; t < T; t++) {
        float *z = logits + (size_t)t * V;
        float a = 0.0f; /* dlogprob */
        int y = -1;
        if (dlp && targets && targets[t] >= 0) {
            a = dlp[t];
            y = targets[t];
        }
        float b = dent ? dent[t] : 0.0f, H = dent ? ent[t] : 0.0f, L = lse[t];
#pragma omp simd
        for (int v = 0; v < V; v++) {
            float logp = z[v] * inv_temp - L;
            float p = ff_fast_expf(logp);
            z[v] = (-a * p - b * p * (logp + H)) * inv_temp;
        }
        if (y >= 0) z[y] += a * inv_temp;
    }
}

/* ---- sampling ------------------------------------------------------------------------------ */

static int by_prob_desc(const void *a, const void *b, void *ctx) {
    const float *p = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (p[i] > p[j]) return -1;
    if (p[i] < p[j]) return 1;
    return i < j ? -1 : i > j;
}

static void sample_row(const float *z, int V, const ff_sample_params *sp, float *p, int32_t *idx, int32_t *tok_out,
                       float *lp_out) {
    int am = 0;
    for (int v = 1; v < V; v++)
        if (z[v] > z[am]) am = v;
    float mx = z[am];
    /* log-sum-exp at temperature 1 (for FF_LOGPROB_MODEL) */
    float s1 = 0.0f;
#pragma omp simd reduction(+ : s1)
    for (int v = 0; v < V; v++) s1 += ff_fast_expf(z[v] - mx);
    float lse1 = mx + logf(s1);
    if (sp->temperature <= 0.0f) {
        *tok_out = am;
        *lp_out = sp->logprob_mode == 2 ? 0.0f : z[am] - lse1;
        return;
    }
    float it = 1.0f / sp->temperature;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) {
        p[v] = ff_fast_expf((z[v] - mx) * it);
        sum += p[v];
    }
    float lseT = mx * it + logf(sum); /* log-sum-exp of z / temperature */
    float kept = sum;                 /* unnormalised mass of the kept tokens */
    int filter = (sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1.0f;
    if (filter) {
        for (int v = 0; v < V; v++) idx[v] = v;
        qsort_r(idx, (size_t)V, sizeof(int32_t), by_prob_desc, p);
        int k = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V;
        float mass = 0.0f;
        for (int r = 0; r < k; r++) mass += p[idx[r]];
        if (sp->top_p < 1.0f) {
            float target = sp->top_p * mass, acc = 0.0f;
            int r = 0;
            while (r < k) {
                acc += p[idx[r]];
                r++;
                if (acc >= target) break;
            }
            k = r;
        }
        kept = 0.0f;
        for (int r = 0; r < k; r++) kept += p[idx[r]];
        for (int r = k; r < V; r++) p[idx[r]] = 0.0f;
    }
    /* inverse CDF over the kept tokens in increasing id */
    float u = sp->uniform * kept, acc = 0.0f;
    int pick = -1, last = -1;
    for (int v = 0; v < V; v++) {
        if (p[v] <= 0.0f) continue;
        last = v;
        acc += p[v];
        if (acc > u) {
            pick = v;
            break;
        }
    }
    if (pick < 0) pick = last >= 0 ? last : am; /* rounding left u past the end */
    *tok_out = pick;
    switch (sp->logprob_mode) {
    case 1: *lp_out = z[pick] * it - lseT; break;
    case 2: *lp_out = logf(p[pick] / kept); break;
    default: *lp_out = z[pick] - lse1; break;
    }
}

void ff_cpu_sample(ff_stream *s, ff_dptr logitsp, int B, int V, ff_dptr paramsp, ff_dptr wsp, ff_dptr tokp,
                   ff_dptr lpp) {
    const float *logits = F(logitsp);                                            /* [B, V] */
    const ff_sample_params *params = (const ff_sample_params *)(void *)I32(paramsp); /* [B] */
    float *ws = F(wsp);                                                          /* [B, V] probs, then [B, V] ids */
    int32_t *idx = (int32_t *)(void *)(ws + (size_t)B * V);
    int32_t *tok = I32(tokp);
    float *lp = F(lpp);
#pragma omp parallel for num_threads(team(s, 8.0 * B * V)) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        sample_row(logits + (size_t)b * V, V, &params[b], ws + (size_t)b * V, idx + (size_t)b * V, &tok[b], &lp[b]);
}

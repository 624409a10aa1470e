/* CPU kernels on the logits: per-token log-probs and entropy (forward and backward into the
 * logits) and sampling (greedy, temperature, top-k, top-p). Rows are independent and split
 * across the OpenMP team. Contracts in include/fuseflow/kernels.h. */
#include <float.h>
#include <math.h>

#include "kernels/cpu/cpu_internal.h"

static int team(const ff_stream *s, double work) { return work < FF_PAR_MIN ? 1 : NT(s); }

FF_VEC static float row_max(const float *z, int V) {
    float mx = -FLT_MAX;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    return mx;
}

/* sum exp(z*it - mx) and sum exp(...)*(z*it - mx) */
FF_VEC static void row_sums(const float *z, int V, float it, float mx, float *sum_out, float *wsum_out) {
    float sum = 0.0f, wsum = 0.0f;
#pragma omp simd reduction(+ : sum, wsum)
    for (int v = 0; v < V; v++) {
        float zs = z[v] * it - mx;
        float e = ff_fast_expf(zs);
        sum += e;
        wsum += e * zs;
    }
    *sum_out = sum;
    *wsum_out = wsum;
}

void ff_cpu_logprob_fwd(ff_stream *s, ff_dptr logitsp, ff_dptr targetsp, float inv_temp, int T, int V, ff_dptr lpp,
                        ff_dptr entp, ff_dptr lsep) {
    const float *logits = F(logitsp);       /* [T, V] */
    const int32_t *targets = I32(targetsp); /* [T] or NULL */
    float *lp = F(lpp), *ent = F(entp), *lse = F(lsep); /* [T] each; lp, ent may be NULL */
#pragma omp parallel for num_threads(team(s, 4.0 * T * V)) schedule(static)
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * V;
        float mx = row_max(z, V) * inv_temp; /* inv_temp > 0 keeps the argmax */
        float sum, wsum;
        row_sums(z, V, inv_temp, mx, &sum, &wsum);
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

/* z <- (-a p - b p (log p + H)) * it, p = exp(z*it - L) */
FF_VEC static void logprob_bwd_row(float *z, int V, float it, float L, float a, float b, float H) {
#pragma omp simd
    for (int v = 0; v < V; v++) {
        float logp = z[v] * it - L;
        float p = ff_fast_expf(logp);
        z[v] = (-a * p - b * p * (logp + H)) * it;
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
        logprob_bwd_row(z, V, inv_temp, lse[t], a, dent ? dent[t] : 0.0f, dent ? ent[t] : 0.0f);
        if (y >= 0) z[y] += a * inv_temp;
    }
}

/* ---- sampling ------------------------------------------------------------------------------ */

/* Heap order: more probable first, lower id first on ties. */
static inline int ahead(const float *p, int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); }

static void sift_down(int32_t *h, int n, int i, const float *p) {
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && ahead(p, h[c + 1], h[c])) c++;
        if (!ahead(p, h[c], h[i])) return;
        int32_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

/* Keep the top_k most likely tokens, then the smallest prefix of them holding top_p of their
 * mass; zero every other p. A max-heap pops tokens in order, so only the kept prefix is ever
 * ordered: O(V + kept log V), no allocation (glibc's qsort would malloc). Returns the kept
 * mass. */
static float filter_top(float *p, int32_t *heap, int V, int top_k, float top_p, float total) {
    for (int v = 0; v < V; v++) heap[v] = v;
    for (int i = V / 2 - 1; i >= 0; i--) sift_down(heap, V, i, p);
    int k = top_k > 0 && top_k < V ? top_k : V, n = V, popped = 0;
    float mass = total;
    if (k < V) { /* the k most likely go to heap[V-1], heap[V-2], ... */
        mass = 0.0f;
        while (popped < k) {
            int32_t top = heap[0];
            heap[0] = heap[--n];
            heap[n] = top;
            sift_down(heap, n, 0, p);
            mass += p[top];
            popped++;
        }
    }
    int keep = k;
    if (top_p < 1.0f) {
        float target = top_p * mass, acc = 0.0f;
        keep = 0;
        while (keep < k) {
            if (keep == popped) { /* pop the next one */
                int32_t top = heap[0];
                heap[0] = heap[--n];
                heap[n] = top;
                sift_down(heap, n, 0, p);
                popped++;
            }
            acc += p[heap[V - 1 - keep]];
            keep++;
            if (acc >= target) break;
        }
    }
    if (keep == V) return total;
    /* mark the kept (negate), then zero the rest */
    float kept = 0.0f;
    for (int r = 0; r < keep; r++) {
        int32_t id = heap[V - 1 - r];
        kept += p[id];
        p[id] = -p[id];
    }
    for (int v = 0; v < V; v++) p[v] = p[v] < 0.0f ? -p[v] : 0.0f;
    return kept;
}

/* p[v] = exp((z[v] - mx) * it); returns the sum */
FF_VEC static float probs_row(const float *z, int V, float mx, float it, float *p) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) {
        p[v] = ff_fast_expf((z[v] - mx) * it);
        sum += p[v];
    }
    return sum;
}

static void sample_row(const float *z, int V, const ff_sample_params *sp, float *p, int32_t *idx, int32_t *tok_out,
                       float *lp_out) {
    int am = 0;
    for (int v = 1; v < V; v++)
        if (z[v] > z[am]) am = v;
    float mx = z[am];
    /* log-sum-exp at temperature 1 (for FF_LOGPROB_MODEL) */
    float s1, unused;
    row_sums(z, V, 1.0f, mx, &s1, &unused);
    float lse1 = mx + logf(s1);
    if (sp->temperature <= 0.0f) {
        *tok_out = am;
        *lp_out = sp->logprob_mode == 2 ? 0.0f : z[am] - lse1;
        return;
    }
    float it = 1.0f / sp->temperature;
    float sum = probs_row(z, V, mx, it, p);
    float lseT = mx * it + logf(sum); /* log-sum-exp of z / temperature */
    float kept = sum;                 /* unnormalised mass of the kept tokens */
    if ((sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1.0f) kept = filter_top(p, idx, V, sp->top_k, sp->top_p, sum);
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

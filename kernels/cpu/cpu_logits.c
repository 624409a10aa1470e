/* CPU kernels on the logits: per-token log-probs and entropy (forward and backward into the
 * logits) and sampling (greedy, temperature, top-k, top-p). Rows are independent and split
 * across the backend's thread pool. Contracts in include/fuseflow/kernels.h. */
#include <float.h>
#include <math.h>

#include "kernels/cpu/cpu_internal.h"

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

typedef struct lp_job {
    float *logits;          /* [T, V] (bwd: becomes dlogits) */
    const int32_t *targets; /* [T] or NULL */
    float it;               /* 1 / temperature */
    int V;
    float *lp, *ent, *lse;  /* [T] each; lp, ent may be NULL */
    const float *dlp, *dent; /* [T] or NULL */
    bool b16;                /* bwd: dlogits in bf16, each row's first half (ff_logprob_bwd_bf16) */
} lp_job;

static void lp_fwd_rows(void *arg, int64_t t0, int64_t t1) {
    const lp_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        const float *z = j->logits + (size_t)t * j->V;
        float mx = row_max(z, j->V) * j->it; /* it > 0 keeps the argmax */
        float sum, wsum;
        row_sums(z, j->V, j->it, mx, &sum, &wsum);
        float l = logf(sum);
        j->lse[t] = mx + l;
        /* H = -sum p (zs - l) = l - sum p zs, with zs the shifted scaled logits */
        if (j->ent) j->ent[t] = l - wsum / sum;
        if (j->lp) {
            int y = j->targets[t];
            j->lp[t] = y >= 0 ? z[y] * j->it - j->lse[t] : 0.0f;
        }
    }
}

void ff_cpu_logprob_fwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr logprob,
                        ff_dptr entropy, ff_dptr lse) {
    lp_job j = {.logits = F(logits), .targets = I32(targets), .it = inv_temp, .V = V, .lp = F(logprob),
                .ent = F(entropy), .lse = F(lse)};
    ff_cpu_for(s, T, 12.0 * V, lp_fwd_rows, &j);
}

/* out <- (-a p - b p (log p + H)) * it, p = exp(z*it - L); out may be z */
FF_VEC static void logprob_bwd_row(const float *z, float *out, int V, float it, float L, float a, float b, float H) {
#pragma omp simd
    for (int v = 0; v < V; v++) {
        float logp = z[v] * it - L;
        float p = ff_fast_expf(logp);
        out[v] = (-a * p - b * p * (logp + H)) * it;
    }
}

/* The bf16 form, in place: blocks of LP16 elements in order, each computed in fp32 (with the
 * target's term) before its bf16 values are stored over the row's first half; a block's stores
 * land on fp32 elements of itself or of earlier blocks, all read by then. */
enum { LP16 = 256 };
static void logprob_bwd_row16(float *z, int V, float it, float L, float a, int y, float b, float H) {
    uint16_t *o = (uint16_t *)(void *)z;
    float d[LP16];
    for (int v0 = 0; v0 < V; v0 += LP16) {
        const int n = V - v0 < LP16 ? V - v0 : LP16;
        logprob_bwd_row(z + v0, d, n, it, L, a, b, H);
        if (y >= v0 && y < v0 + n) d[y - v0] += a * it;
        for (int k = 0; k < n; k++) o[v0 + k] = bf16_round(d[k]);
    }
}

/* zs = z * it; p = exp(zs - lse);
 * d logp[y] / d zs_v = [v == y] - p_v;  d H / d zs_v = -p_v (log p_v + H) */
static void lp_bwd_rows(void *arg, int64_t t0, int64_t t1) {
    const lp_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *z = j->logits + (size_t)t * j->V;
        float a = 0.0f; /* dlogprob */
        int y = -1;
        if (j->dlp && j->targets && j->targets[t] != -1) { /* <= -2: the target is in another shard */
            a = j->dlp[t];
            y = j->targets[t];
        }
        const float b = j->dent ? j->dent[t] : 0.0f, H = j->dent ? j->ent[t] : 0.0f;
        if (j->b16) {
            logprob_bwd_row16(z, j->V, j->it, j->lse[t], a, y, b, H);
            continue;
        }
        logprob_bwd_row(z, z, j->V, j->it, j->lse[t], a, b, H);
        if (y >= 0) z[y] += a * j->it;
    }
}

void ff_cpu_logprob_bwd(ff_stream *s, ff_dptr logits, ff_dptr targets, float inv_temp, int T, int V, ff_dptr lse,
                        ff_dptr dlogprob, ff_dptr dentropy, ff_dptr entropy, bool b16) {
    lp_job j = {.logits = F(logits), .targets = I32(targets), .it = inv_temp, .V = V, .lse = F(lse),
                .dlp = F(dlogprob), .dent = F(dentropy), .ent = F(entropy), .b16 = b16};
    ff_cpu_for(s, T, 12.0 * V, lp_bwd_rows, &j);
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

typedef struct sample_job {
    const float *logits;            /* [B, V] */
    const ff_sample_params *params; /* [B] */
    float *probs;                   /* [B, V] workspace */
    int32_t *ids;                   /* [B, V] workspace */
    int32_t *tok;                   /* [B] */
    float *lp;                      /* [B] */
    int V;
} sample_job;

static void sample_part(void *arg, int64_t b0, int64_t b1) {
    const sample_job *j = arg;
    for (int64_t b = b0; b < b1; b++)
        sample_row(j->logits + (size_t)b * j->V, j->V, &j->params[b], j->probs + (size_t)b * j->V,
                   j->ids + (size_t)b * j->V, &j->tok[b], &j->lp[b]);
}

void ff_cpu_sample(ff_stream *s, ff_dptr logits, int B, int V, ff_dptr params, ff_dptr workspace, ff_dptr tokens,
                   ff_dptr logprob) {
    float *ws = F(workspace); /* [B, V] probs, then [B, V] ids */
    sample_job j = {F(logits), (const ff_sample_params *)(void *)I32(params), ws, (int32_t *)(void *)(ws + (size_t)B * V),
                    I32(tokens), F(logprob), V};
    ff_cpu_for(s, B, 16.0 * V, sample_part, &j);
}

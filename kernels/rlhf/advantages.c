/* Advantage estimators and returns: GAE (backward recursion and the RLHFuse matrix form),
 * masked whitening, and the outcome estimators GRPO, RLOO, REINFORCE++ and ReMax. See
 * include/fuseflow/rlhf.h for the formulas and docs/rlhf-math.md for the derivations.
 *
 * Masks inside a sequence are "transparent" in the recursions (GAE, returns): a token with
 * m = 0 adds nothing and carries the advantage and value of the next counted token, as verl
 * does for observation tokens; with no holes this is the usual recursion.
 *
 * Not here: losses (losses.c). */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/rlhf.h"
#include "fuseflow/util.h"

static inline bool counted(const ff_rlhf_seqs *s, int64_t t) { return !s->mask || s->mask[t] != 0; }

void ff_rlhf_seq_scores(const ff_rlhf_seqs *s, const float *token_rewards, float *scores) {
    for (int32_t q = 0; q < s->n_seq; q++) {
        double sum = 0;
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) sum += token_rewards[t];
        scores[q] = (float)sum;
    }
}

void ff_rlhf_scores_to_tokens(const ff_rlhf_seqs *s, const float *scores, float *out) {
    for (int32_t q = 0; q < s->n_seq; q++) {
        int64_t last = -1;
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) {
            out[t] = 0;
            if (counted(s, t)) last = t;
        }
        if (last >= 0) out[last] = scores[q];
    }
}

/* ---- GAE --------------------------------------------------------------------------------- */

void ff_rlhf_gae(const ff_rlhf_seqs *s, const float *rewards, const float *values, double gamma, double lam, float *adv,
                 float *ret) {
    assert(s && rewards && values && adv && ret);
    for (int32_t q = 0; q < s->n_seq; q++) {
        double next_v = 0, last_a = 0;
        for (int64_t t = s->offsets[q + 1] - 1; t >= s->offsets[q]; t--) {
            if (counted(s, t)) {
                double delta = (double)rewards[t] + gamma * next_v - values[t];
                last_a = delta + gamma * lam * last_a;
                next_v = values[t];
            }
            adv[t] = (float)last_a;
            ret[t] = (float)(last_a + values[t]);
        }
    }
}

int ff_rlhf_gae_matrix(const ff_rlhf_seqs *s, const float *rewards, const float *values, double gamma, double lam,
                       float *adv, float *ret) {
    assert(s && rewards && values && adv && ret);
    int32_t B = s->n_seq;
    int64_t L = 0; /* longest sequence, in counted tokens */
    for (int32_t q = 0; q < B; q++) {
        int64_t n = 0;
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) n += counted(s, t);
        if (n > L) L = n;
    }
    if (B == 0 || L == 0) {
        ff_rlhf_gae(s, rewards, values, gamma, lam, adv, ret); /* nothing counted: A = 0 */
        return 0;
    }
    if ((uint64_t)L > (1u << 15))
        return ff_error_set("gae_matrix", "use ff_rlhf_gae (the recursion) for sequences this long",
                            "a sequence of %lld counted tokens needs a %lld x %lld matrix", (long long)L, (long long)L,
                            (long long)L);
    double *C = ff_malloc((size_t)L * (size_t)L * sizeof *C); /* [L, L] lower triangular */
    double *D = ff_calloc((size_t)B * (size_t)L, sizeof *D);  /* [B, L] deltas, zero padded */
    double *A = ff_calloc((size_t)B * (size_t)L, sizeof *A);  /* [B, L] advantages */
    if (!C || !D || !A) {
        free(C), free(D), free(A);
        return ff_error_wrap("gae_matrix");
    }
    /* C[l][t] = (gamma lam)^(l - t) for l >= t */
    double gl = gamma * lam;
    for (int64_t l = 0; l < L; l++) {
        double p = 1;
        for (int64_t t = l; t >= 0; t--) {
            C[l * L + t] = p;
            p *= gl;
        }
        for (int64_t t = l + 1; t < L; t++) C[l * L + t] = 0;
    }
    /* D[b][k] = r_k + gamma V_{k+1} - V_k over the counted tokens of sequence b */
    for (int32_t b = 0; b < B; b++) {
        int64_t k = 0, prev = -1;
        for (int64_t t = s->offsets[b]; t < s->offsets[b + 1]; t++) {
            if (!counted(s, t)) continue;
            if (prev >= 0) D[b * L + k - 1] += gamma * values[t];
            D[b * L + k] = (double)rewards[t] - values[t];
            prev = t;
            k++;
        }
    }
    /* A = D C: the whole recursion in one product */
    for (int32_t b = 0; b < B; b++) {
        double *a = A + (size_t)b * L;
        const double *d = D + (size_t)b * L;
        for (int64_t l = 0; l < L; l++) {
            double dl = d[l];
            if (dl == 0) continue;
            const double *c = C + (size_t)l * L;
            for (int64_t t = 0; t <= l; t++) a[t] += dl * c[t];
        }
    }
    /* scatter back; uncounted tokens carry the advantage of the next counted one */
    for (int32_t b = 0; b < B; b++) {
        int64_t k = 0;
        for (int64_t t = s->offsets[b]; t < s->offsets[b + 1]; t++) k += counted(s, t);
        double carry = 0;
        for (int64_t t = s->offsets[b + 1] - 1; t >= s->offsets[b]; t--) {
            if (counted(s, t)) carry = A[(size_t)b * L + --k];
            adv[t] = (float)carry;
            ret[t] = (float)(carry + values[t]);
        }
    }
    free(C), free(D), free(A);
    return 0;
}

/* ---- whitening --------------------------------------------------------------------------- */

void ff_rlhf_whiten(const ff_rlhf_seqs *s, const float *x, bool shift_mean, float *out) {
    int64_t T = ff_rlhf_seqs_tokens(s);
    double n = 0, sum = 0;
    for (int64_t t = 0; t < T; t++) {
        double m = s->mask ? s->mask[t] : 1.0;
        if (m != 0) n += m, sum += m * x[t];
    }
    double mean = n > 0 ? sum / n : 0, var = 0;
    for (int64_t t = 0; t < T; t++) {
        double m = s->mask ? s->mask[t] : 1.0;
        if (m != 0) var += m * (x[t] - mean) * (x[t] - mean);
    }
    double scale = 1;
    if (n > 1) {
        var = var / n * (n / (n - 1)); /* unbiased, as verl's masked_var */
        scale = 1.0 / sqrt(var + 1e-8);
    }
    for (int64_t t = 0; t < T; t++) {
        double w = ((double)x[t] - mean) * scale;
        out[t] = (float)(shift_mean ? w : w + mean);
    }
}

/* ---- outcome advantages ------------------------------------------------------------------ */

/* Per-group count, mean and unbiased std of the sequence scores. The arrays are [n_seq]. */
static int group_stats(const ff_rlhf_seqs *s, const float *scores, const int32_t *group, double **out_n,
                       double **out_mean, double **out_std) {
    int32_t B = s->n_seq;
    for (int32_t q = 0; q < B; q++)
        if (group[q] < 0 || group[q] >= B)
            return ff_error_set("advantage", "group ids are prompt indices in [0, number of sequences)",
                                "sequence %d has group id %d, outside [0, %d)", q, group[q], B);
    size_t k = B > 0 ? (size_t)B : 1;
    double *n = ff_calloc(k, sizeof *n), *mean = ff_calloc(k, sizeof *mean), *sd = ff_calloc(k, sizeof *sd);
    if (!n || !mean || !sd) {
        free(n), free(mean), free(sd);
        return ff_error_wrap("advantage");
    }
    for (int32_t q = 0; q < B; q++) n[group[q]] += 1, mean[group[q]] += scores[q];
    for (int32_t g = 0; g < B; g++)
        if (n[g] > 0) mean[g] /= n[g];
    for (int32_t q = 0; q < B; q++) {
        double d = scores[q] - mean[group[q]];
        sd[group[q]] += d * d;
    }
    for (int32_t g = 0; g < B; g++) sd[g] = n[g] > 1 ? sqrt(sd[g] / (n[g] - 1)) : 1.0;
    *out_n = n, *out_mean = mean, *out_std = sd;
    return 0;
}

static void broadcast(const ff_rlhf_seqs *s, int32_t q, double a, float *adv) {
    for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) adv[t] = (float)(a * (s->mask ? s->mask[t] : 1.0));
}

int ff_rlhf_grpo(const ff_rlhf_seqs *s, const float *scores, const int32_t *group, bool norm_by_std, double eps,
                 float *adv) {
    double *n, *mean, *sd;
    if (group_stats(s, scores, group, &n, &mean, &sd) != 0) return -1;
    for (int32_t q = 0; q < s->n_seq; q++) {
        int32_t g = group[q];
        double m = n[g] > 1 ? mean[g] : 0.0, d = n[g] > 1 ? sd[g] : 1.0;
        double a = scores[q] - m;
        if (norm_by_std) a /= d + eps;
        broadcast(s, q, a, adv);
    }
    free(n), free(mean), free(sd);
    return 0;
}

int ff_rlhf_rloo(const ff_rlhf_seqs *s, const float *scores, const int32_t *group, float *adv) {
    double *n, *mean, *sd;
    if (group_stats(s, scores, group, &n, &mean, &sd) != 0) return -1;
    for (int32_t q = 0; q < s->n_seq; q++) {
        double k = n[group[q]];
        double a = k > 1 ? k / (k - 1) * (scores[q] - mean[group[q]]) : scores[q];
        broadcast(s, q, a, adv);
    }
    free(n), free(mean), free(sd);
    return 0;
}

/* Discounted returns with transparent holes: G_t = r_t + gamma G_{t'} on counted tokens. */
static void discounted_returns(const ff_rlhf_seqs *s, const float *r, double gamma, float *ret) {
    for (int32_t q = 0; q < s->n_seq; q++) {
        double g = 0;
        for (int64_t t = s->offsets[q + 1] - 1; t >= s->offsets[q]; t--) {
            if (counted(s, t)) g = (double)r[t] + gamma * g;
            ret[t] = (float)g;
        }
    }
}

void ff_rlhf_reinforce_pp(const ff_rlhf_seqs *s, const float *token_rewards, double gamma, float *adv, float *ret) {
    discounted_returns(s, token_rewards, gamma, ret);
    ff_rlhf_whiten(s, ret, true, adv);
    int64_t T = ff_rlhf_seqs_tokens(s);
    if (s->mask)
        for (int64_t t = 0; t < T; t++) adv[t] *= s->mask[t];
}

void ff_rlhf_remax(const ff_rlhf_seqs *s, const float *token_rewards, const float *baseline, float *adv, float *ret) {
    discounted_returns(s, token_rewards, 1.0, ret);
    for (int32_t q = 0; q < s->n_seq; q++)
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++)
            adv[t] = (float)(((double)ret[t] - baseline[q]) * (s->mask ? s->mask[t] : 1.0));
}

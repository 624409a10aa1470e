/* Masked aggregations, the PPO clipped surrogate, the clipped value loss and the KL
 * estimators, each with its derivative (see include/fuseflow/rlhf.h for the formulas).
 *
 * Every aggregation mode is linear in the per-token values, L = sum_t w_t x_t, with
 * w_t = m_t c_s for a per-sequence scale c_s; so each loss computes its per-token value l_t
 * and derivative g_t once, and dL/dlogp_t = w_t g_t. Ties of max/min split the gradient in
 * half, as PyTorch's maximum/minimum do, so the reference fixtures match exactly.
 *
 * Not here: advantages (advantages.c), anything that allocates. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/rlhf.h"

static inline double mask_at(const ff_rlhf_seqs *s, int64_t t) { return s->mask ? (double)s->mask[t] : 1.0; }

static double seq_mask_sum(const ff_rlhf_seqs *s, int32_t q) {
    double n = 0;
    for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) n += mask_at(s, t);
    return n;
}

static void check_seqs(const ff_rlhf_seqs *s) {
    (void)s;
    assert(s && s->offsets && s->n_seq >= 0 && s->offsets[0] == 0);
#ifndef NDEBUG
    for (int32_t q = 0; q < s->n_seq; q++) assert(s->offsets[q + 1] >= s->offsets[q]);
#endif
}

/* ---- aggregation ------------------------------------------------------------------------- */

static const char *const agg_names[FF_RLHF_AGG_COUNT] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"};

const char *ff_rlhf_agg_name(ff_rlhf_agg_mode m) { return (unsigned)m < FF_RLHF_AGG_COUNT ? agg_names[m] : "?"; }

int ff_rlhf_agg_parse(const char *name, ff_rlhf_agg_mode *out) {
    for (int i = 0; i < FF_RLHF_AGG_COUNT; i++)
        if (name && !strcmp(name, agg_names[i])) {
            *out = (ff_rlhf_agg_mode)i;
            return 0;
        }
    return ff_error_set(NULL, "use token-mean, seq-mean-token-sum or seq-mean-token-mean", "unknown loss aggregation '%s'",
                        name ? name : "(null)");
}

double ff_rlhf_agg_denom(ff_rlhf_agg_mode mode, const ff_rlhf_seqs *s) {
    check_seqs(s);
    double d = 0;
    for (int32_t q = 0; q < s->n_seq; q++) {
        double n = seq_mask_sum(s, q);
        if (mode == FF_RLHF_AGG_TOKEN_MEAN)
            d += n;
        else if (n > 0)
            d += 1;
    }
    return d;
}

/* The per-sequence scale c_s of w_t = m_t c_s for an aggregation normalised by denom. */
static inline double seq_scale(ff_rlhf_agg_mode mode, const ff_rlhf_seqs *s, int32_t q, double denom) {
    if (denom <= 0) return 0;
    switch (mode) {
    case FF_RLHF_AGG_TOKEN_MEAN:
    case FF_RLHF_AGG_SEQ_MEAN_TOKEN_SUM:
        return 1.0 / denom;
    case FF_RLHF_AGG_SEQ_MEAN_TOKEN_MEAN: {
        double n = seq_mask_sum(s, q);
        return n > 0 ? 1.0 / (denom * n) : 0.0;
    }
    default:
        assert(!"bad aggregation mode");
        return 0;
    }
}

static inline double resolve_denom(ff_rlhf_agg_mode mode, const ff_rlhf_seqs *s, double denom) {
    return denom > 0 ? denom : ff_rlhf_agg_denom(mode, s);
}

double ff_rlhf_agg(ff_rlhf_agg_mode mode, const ff_rlhf_seqs *s, const float *x, double denom, float *w) {
    check_seqs(s);
    assert(x);
    double D = resolve_denom(mode, s, denom), L = 0;
    for (int32_t q = 0; q < s->n_seq; q++) {
        double c = seq_scale(mode, s, q, D);
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) {
            double m = mask_at(s, t), wt = m * c;
            if (m != 0) L += wt * x[t]; /* a masked token's value may be garbage: never read it */
            if (w) w[t] = (float)wt;
        }
    }
    return L;
}

double ff_rlhf_masked_mean(const ff_rlhf_seqs *s, const float *x) {
    return ff_rlhf_agg(FF_RLHF_AGG_TOKEN_MEAN, s, x, 0, NULL);
}

/* ---- policy losses ----------------------------------------------------------------------- */

/* d/dx of max(a, b) given da, db; ties split as torch.maximum does. */
static inline double max_grad(double a, double b, double da, double db) {
    return a > b ? da : (b > a ? db : 0.5 * (da + db));
}

double ff_rlhf_ppo_loss(const ff_rlhf_ppo_cfg *cfg, const ff_rlhf_seqs *s, const float *logp, const float *old_logp,
                        const float *adv, float *dlogp, ff_rlhf_pg_stats *stats) {
    check_seqs(s);
    assert(cfg && logp && old_logp && adv);
    double D = resolve_denom(cfg->agg, s, cfg->denom);
    double lo = 1.0 - cfg->clip_low, hi = 1.0 + cfg->clip_high;
    bool dual = cfg->clip_c > 1.0;
    double L = 0, n = 0, n_clip = 0, n_lower = 0, kl = 0, rsum = 0, rmin = INFINITY, rmax = -INFINITY;
    for (int32_t q = 0; q < s->n_seq; q++) {
        double c = seq_scale(cfg->agg, s, q, D);
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) {
            double m = mask_at(s, t);
            if (m == 0) {
                if (dlogp) dlogp[t] = 0;
                continue;
            }
            double A = adv[t], d = (double)logp[t] - (double)old_logp[t];
            double dc = d < -20 ? -20 : (d > 20 ? 20 : d);
            double in_d = (d >= -20 && d <= 20) ? 1.0 : 0.0; /* d(dc)/d(logp) */
            double r = exp(dc);
            double l1 = -A * r, g1 = -A * r * in_d;
            double rc = r < lo ? lo : (r > hi ? hi : r);
            double l2 = -A * rc, g2 = (r >= lo && r <= hi) ? g1 : 0.0;
            double l = l1 > l2 ? l1 : l2, g = max_grad(l1, l2, g1, g2);
            if (l2 > l1) n_clip += m;
            if (dual && A < 0) {
                double l3 = -A * cfg->clip_c; /* constant in logp */
                if (l > l3) n_lower += m;
                g = l3 < l ? 0.0 : (l < l3 ? g : 0.5 * g);
                l = l3 < l ? l3 : l;
            }
            L += m * c * l;
            if (dlogp) dlogp[t] = (float)(m * c * g);
            n += m;
            kl += m * -dc;
            rsum += m * r;
            if (r < rmin) rmin = r;
            if (r > rmax) rmax = r;
        }
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        if (n > 0) {
            stats->clipfrac = n_clip / n;
            stats->clipfrac_lower = n_lower / n;
            stats->approx_kl = kl / n;
            stats->ratio_mean = rsum / n;
            stats->ratio_min = rmin;
            stats->ratio_max = rmax;
        }
    }
    return L;
}

double ff_rlhf_pg_loss(ff_rlhf_agg_mode agg, double denom, const ff_rlhf_seqs *s, const float *logp, const float *adv,
                       float *dlogp) {
    check_seqs(s);
    double D = resolve_denom(agg, s, denom), L = 0;
    for (int32_t q = 0; q < s->n_seq; q++) {
        double c = seq_scale(agg, s, q, D);
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) {
            double w = mask_at(s, t) * c;
            if (w != 0) L += w * -(double)adv[t] * logp[t];
            if (dlogp) dlogp[t] = w != 0 ? (float)(w * -(double)adv[t]) : 0.0f;
        }
    }
    return L;
}

/* ---- value loss -------------------------------------------------------------------------- */

double ff_rlhf_value_loss(const ff_rlhf_value_cfg *cfg, const ff_rlhf_seqs *s, const float *v, const float *old_v,
                          const float *ret, float *dv, double *clipfrac) {
    check_seqs(s);
    assert(cfg && v && ret && (cfg->clip <= 0 || old_v));
    double D = resolve_denom(cfg->agg, s, cfg->denom), L = 0, n = 0, n_clip = 0;
    for (int32_t q = 0; q < s->n_seq; q++) {
        double c = seq_scale(cfg->agg, s, q, D);
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) {
            double m = mask_at(s, t);
            if (m == 0) {
                if (dv) dv[t] = 0;
                continue;
            }
            double x = v[t], R = ret[t];
            double l = (x - R) * (x - R), g = 2 * (x - R);
            if (cfg->clip > 0) {
                double lo = (double)old_v[t] - cfg->clip, hi = (double)old_v[t] + cfg->clip;
                double xc = x < lo ? lo : (x > hi ? hi : x);
                double l2 = (xc - R) * (xc - R), g2 = (x >= lo && x <= hi) ? 2 * (xc - R) : 0.0;
                if (l2 > l) n_clip += m;
                g = max_grad(l, l2, g, g2);
                l = l > l2 ? l : l2;
            }
            L += 0.5 * m * c * l;
            if (dv) dv[t] = (float)(0.5 * m * c * g);
            n += m;
        }
    }
    if (clipfrac) *clipfrac = n > 0 ? n_clip / n : 0;
    return L;
}

/* ---- KL ---------------------------------------------------------------------------------- */

static const char *const kl_names[FF_RLHF_KL_COUNT] = {"kl", "abs", "mse", "low_var_kl"};

const char *ff_rlhf_kl_name(ff_rlhf_kl_kind k) { return (unsigned)k < FF_RLHF_KL_COUNT ? kl_names[k] : "?"; }

int ff_rlhf_kl_parse(const char *name, ff_rlhf_kl_kind *out) {
    static const struct {
        const char *name;
        ff_rlhf_kl_kind kind;
    } table[] = {{"kl", FF_RLHF_KL_K1},  {"k1", FF_RLHF_KL_K1},         {"abs", FF_RLHF_KL_ABS},
                 {"mse", FF_RLHF_KL_K2}, {"k2", FF_RLHF_KL_K2},         {"low_var_kl", FF_RLHF_KL_K3},
                 {"k3", FF_RLHF_KL_K3}};
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (name && !strcmp(name, table[i].name)) {
            *out = table[i].kind;
            return 0;
        }
    return ff_error_set(NULL, "use kl (k1), abs, mse (k2) or low_var_kl (k3)", "unknown KL estimator '%s'",
                        name ? name : "(null)");
}

static inline void kl_one(ff_rlhf_kl_kind kind, double logp, double ref, double *val, double *der) {
    double d = logp - ref;
    switch (kind) {
    case FF_RLHF_KL_K1:
        *val = d, *der = 1;
        break;
    case FF_RLHF_KL_ABS:
        *val = fabs(d), *der = d > 0 ? 1 : (d < 0 ? -1 : 0);
        break;
    case FF_RLHF_KL_K2:
        *val = 0.5 * d * d, *der = d;
        break;
    case FF_RLHF_KL_K3: {
        double q = -d, in_q = (q >= -20 && q <= 20) ? 1.0 : 0.0;
        q = q < -20 ? -20 : (q > 20 ? 20 : q);
        double e = exp(q), k = e - q - 1;
        double in_k = (k >= -10 && k <= 10) ? 1.0 : 0.0;
        *val = k < -10 ? -10 : (k > 10 ? 10 : k);
        *der = (1.0 - e) * in_q * in_k; /* dk/dq = e - 1, dq/dlogp = -1 */
        break;
    }
    default:
        assert(!"bad KL kind");
        *val = *der = 0;
    }
}

void ff_rlhf_kl(ff_rlhf_kl_kind kind, int64_t T, const float *logp, const float *ref, float *kl, float *dkl) {
    assert(logp && ref);
    for (int64_t t = 0; t < T; t++) {
        double v, g;
        kl_one(kind, logp[t], ref[t], &v, &g);
        if (kl) kl[t] = (float)v;
        if (dkl) dkl[t] = (float)g;
    }
}

double ff_rlhf_kl_loss(ff_rlhf_kl_kind kind, ff_rlhf_agg_mode agg, double denom, const ff_rlhf_seqs *s, const float *logp,
                       const float *ref, float *dlogp) {
    check_seqs(s);
    double D = resolve_denom(agg, s, denom), L = 0;
    for (int32_t q = 0; q < s->n_seq; q++) {
        double c = seq_scale(agg, s, q, D);
        for (int64_t t = s->offsets[q]; t < s->offsets[q + 1]; t++) {
            double w = mask_at(s, t) * c, v = 0, g = 0;
            if (w != 0) kl_one(kind, logp[t], ref[t], &v, &g);
            L += w * v;
            if (dlogp) dlogp[t] = (float)(w * g);
        }
    }
    return L;
}

void ff_rlhf_kl_penalty(const ff_rlhf_seqs *s, const float *token_scores, const float *kl, double coef, float *out) {
    int64_t T = ff_rlhf_seqs_tokens(s);
    for (int64_t t = 0; t < T; t++) {
        double m = mask_at(s, t);
        out[t] = (float)((double)token_scores[t] - (m != 0 ? coef * kl[t] * m : 0.0));
    }
}

void ff_rlhf_kl_ctl_update(ff_rlhf_kl_ctl *c, double current_kl, int64_t n_steps) {
    if (!c->adaptive) return;
    assert(c->target > 0 && c->horizon > 0);
    double e = current_kl / c->target - 1;
    e = e < -0.2 ? -0.2 : (e > 0.2 ? 0.2 : e);
    c->coef *= 1 + e * (double)n_steps / c->horizon;
}

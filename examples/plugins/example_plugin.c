/* An example fuseflow plugin: one advantage estimator, one policy loss, one KL estimator and
 * one reward function, registered by name from ff_plugin_init (include/fuseflow/plugin.h).
 *
 * Build (CMake builds it as build/example_plugin.so):
 *     cc -shared -fPIC -O2 -I include -o example_plugin.so examples/plugins/example_plugin.c
 * Use: name it in a run config and refer to what it registers:
 *     trainer:
 *       plugins: [build/example_plugin.so]
 *     graph:
 *       advantage: {op: advantage, in: [score], out: [advantages], estimator: group_median, scale: 1.0}
 *
 * Everything fuseflow provides comes through the api table, so this file links against
 * nothing of fuseflow. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/plugin.h"

static const ff_plugin_api *api; /* valid until the registry is destroyed */

/* ---- estimator "group_median": a_i = scale * (r_i - median of its group) ---------------- */

typedef struct median_state {
    double scale;
} median_state;

static int median_create(ff_cnode *params, void **state) {
    median_state *s = calloc(1, sizeof *s);
    if (!s) return api->error_set("group_median", NULL, "out of memory");
    s->scale = 1.0;
    if (params && api->get_double(params, "scale", 1.0, &s->scale) < 0) {
        free(s);
        return -1;
    }
    if (!(s->scale > 0)) {
        free(s);
        return api->error_set("group_median", "use a positive scale", "scale must be > 0");
    }
    *state = s;
    return 0;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int median_compute(void *state, const ff_adv_batch *in, float *adv, float *ret) {
    const median_state *st = state;
    int32_t B = in->seqs.n_seq;
    float *score = calloc((size_t)(B ? B : 1), sizeof *score), *tmp = calloc((size_t)(B ? B : 1), sizeof *tmp);
    if (!score || !tmp) {
        free(score), free(tmp);
        return api->error_set("group_median", NULL, "out of memory");
    }
    for (int32_t q = 0; q < B; q++)
        for (int32_t t = in->seqs.offsets[q]; t < in->seqs.offsets[q + 1]; t++) score[q] += in->token_rewards[t];
    for (int32_t q = 0; q < B; q++) {
        size_t k = 0;
        for (int32_t j = 0; j < B; j++)
            if (in->group[j] == in->group[q]) tmp[k++] = score[j];
        qsort(tmp, k, sizeof *tmp, cmp_float);
        double med = k % 2 ? tmp[k / 2] : 0.5 * ((double)tmp[k / 2 - 1] + tmp[k / 2]);
        double a = st->scale * (score[q] - med);
        for (int32_t t = in->seqs.offsets[q]; t < in->seqs.offsets[q + 1]; t++) {
            float m = in->seqs.mask ? in->seqs.mask[t] : 1.0f;
            adv[t] = ret[t] = (float)(a * m);
        }
    }
    free(score), free(tmp);
    return 0;
}

/* ---- policy loss "clipped_adv_pg": l = -clip(A, -c, c) logp ----------------------------- */

typedef struct cpg_state {
    double c;
    ff_rlhf_agg_mode agg;
} cpg_state;

static int cpg_create(ff_cnode *params, void **state) {
    cpg_state *s = calloc(1, sizeof *s);
    if (!s) return api->error_set("clipped_adv_pg", NULL, "out of memory");
    s->c = 2.0;
    const char *agg = "token-mean";
    if (params && (api->get_double(params, "adv_clip", 2.0, &s->c) < 0 || api->get_str(params, "loss_agg_mode", "token-mean", &agg) < 0)) {
        free(s);
        return -1;
    }
    if (api->agg_parse(agg, &s->agg) != 0) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int cpg_compute(void *state, const ff_pg_batch *in, double *loss, float *dlogp, ff_rlhf_pg_stats *stats) {
    const cpg_state *s = state;
    int64_t T = in->seqs.offsets[in->seqs.n_seq];
    float *l = calloc((size_t)(T ? T : 1), sizeof(float));
    if (!l) return api->error_set("clipped_adv_pg", NULL, "out of memory");
    int64_t clipped = 0, n = 0;
    for (int64_t t = 0; t < T; t++) {
        double a = in->adv[t];
        double ac = a < -s->c ? -s->c : (a > s->c ? s->c : a);
        l[t] = (float)(-ac * in->logp[t]);
        bool counted = !in->seqs.mask || in->seqs.mask[t] != 0;
        clipped += counted && ac != a;
        n += counted;
    }
    /* the loss is linear in logp: dL/dlogp_t = w_t * -clip(A_t), with w the aggregation weights */
    *loss = api->agg(s->agg, &in->seqs, l, in->denom, dlogp);
    if (dlogp)
        for (int64_t t = 0; t < T; t++) {
            double a = in->adv[t];
            dlogp[t] *= (float)-(a < -s->c ? -s->c : (a > s->c ? s->c : a));
        }
    stats->clipfrac = n ? (double)clipped / (double)n : 0;
    free(l);
    return 0;
}

static ff_rlhf_agg_mode cpg_agg(const void *state) { return ((const cpg_state *)state)->agg; }

/* ---- KL "sq": (logp - ref)^2, without k2's one half ---------------------------------------- */

static void sq_kl(int64_t T, const float *logp, const float *ref, float *kl, float *dkl) {
    for (int64_t t = 0; t < T; t++) {
        double d = (double)logp[t] - ref[t];
        if (kl) kl[t] = (float)(d * d);
        if (dkl) dkl[t] = (float)(2 * d);
    }
}

/* ---- reward "short_answer": 1 when the response has at most max_chars characters ---------- */

typedef struct short_state {
    int64_t max_chars;
} short_state;

static int short_create(ff_cnode *params, void **state) {
    short_state *s = calloc(1, sizeof *s);
    if (!s) return api->error_set("short_answer", NULL, "out of memory");
    s->max_chars = 8;
    if (params && api->get_int(params, "max_chars", 8, &s->max_chars) < 0) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int short_score(void *state, const ff_reward_item *items, size_t n, float *scores) {
    const short_state *s = state;
    for (size_t i = 0; i < n; i++) scores[i] = items[i].response && (int64_t)strlen(items[i].response) <= s->max_chars ? 1.0f : 0.0f;
    return 0;
}

/* ---- registration ---------------------------------------------------------------------------- */

__attribute__((visibility("default"))) int ff_plugin_init(const ff_plugin_api *a) {
    if (a->abi_version != FF_PLUGIN_ABI_VERSION)
        return a->error_set(a->path, "rebuild the plugin against this fuseflow's headers", "built for plugin ABI %d, host has %d",
                            FF_PLUGIN_ABI_VERSION, a->abi_version);
    api = a;
    const ff_advantage_def adv = {"group_median", "score minus the median score of its group (scale)", 0, FF_GRAN_GROUP,
                                  median_create, NULL, median_compute, free};
    const ff_policy_loss_def loss = {"clipped_adv_pg", "-clip(A, -adv_clip, adv_clip) logp (adv_clip, loss_agg_mode)", cpg_create,
                                     cpg_compute, free, cpg_agg};
    const ff_kl_def kl = {"sq", "(logp - ref)^2", sq_kl};
    const ff_reward_def rw = {"short_answer", "1 when the response has at most max_chars characters", short_create, short_score, free};
    if (a->add_advantage(a->registry, &adv) || a->add_policy_loss(a->registry, &loss) || a->add_kl(a->registry, &kl) ||
        a->add_reward(a->registry, &rw))
        return -1;
    return 0;
}

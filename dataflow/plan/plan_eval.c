/* The planner's cost model: constraints, layer placement, memory per stage, traffic per dimension
 * and link, bubbles and the iteration time of one layout. Formulas: docs/planner.md, which cites
 * the chapter (seeds/001) and the rail-only paper (seeds/004) for each. Not here: ranks and flows
 * (plan_rank.c), reports (plan_report.c), search (plan_search.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/plan/plan_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

#define WEIGHT_BYTES 2.0 /* BF16 weights (compute copy), gathered in BF16 */
#define OPT_BYTES 12.0   /* FP32 master weight + Adam m + v */

/* ---- names -------------------------------------------------------------------------------- */

static const char *const schedule_names[] = {"1f1b", "gpipe", "interleaved", "afab"};
static const char *const zs_names[] = {"default",   "allreduce-once", "rs-once",      "rs-each",  "afab-once",
                                       "local-once", "gather-each",   "keep-fwd-bwd", "keep-step"};
static const char *const dim_names[] = {"tp", "cp", "pp", "dp", "ep"};
static const char *const link_names[] = {"none", "nvlink", "nic", "nvlink+nic"};

const char *ff_plan_schedule_name(ff_plan_schedule s) { return (unsigned)s < FF_PLAN_NSCHEDULES ? schedule_names[s] : "?"; }
const char *ff_plan_zero_schedule_name(ff_plan_zero_schedule z) { return (unsigned)z < FF_PLAN_NZS ? zs_names[z] : "?"; }
const char *ff_plan_dim_name(ff_plan_dim d) { return (unsigned)d < FF_PLAN_NDIMS ? dim_names[d] : "?"; }
const char *ff_plan_link_name(ff_plan_link l) { return (unsigned)l <= FF_PLAN_LINK_BOTH ? link_names[l] : "?"; }

void ff_plan_input_defaults(ff_plan_input *in) {
    memset(in, 0, sizeof *in);
    in->workload.seq = 4096;
    in->workload.micro_batch = 1;
    in->workload.grad_reduce_bytes = 4;
    in->workload.grad_bytes = 2;
    in->workload.act_coeff = 34.0;
    ff_plan_layout *l = &in->layout;
    l->tp = l->cp = l->pp = l->ep = l->vpp = 1;
    l->dp = 0; /* from the GPU count */
    l->sequence_parallel = true;
    l->zero = 1;
    l->zero_schedule = FF_PLAN_ZS_DEFAULT;
    l->schedule = FF_PLAN_1F1B;
    l->order[0] = FF_PLAN_TP, l->order[1] = FF_PLAN_CP, l->order[2] = FF_PLAN_PP, l->order[3] = FF_PLAN_DP;
    l->n_order = 4;
    ff_plan_cluster_preset("dgx-h100", &in->cluster);
}

ff_plan_zero_schedule ff_plan_zero_schedule_resolve(int zero, ff_plan_zero_schedule z, ff_plan_schedule s) {
    if (z != FF_PLAN_ZS_DEFAULT) return z;
    switch (zero) {
    case 0: return FF_PLAN_ZS_ALLREDUCE;
    case 1: return FF_PLAN_ZS_RS_ONCE;
    case 2: return (s == FF_PLAN_AFAB || s == FF_PLAN_GPIPE) ? FF_PLAN_ZS_AFAB_ONCE : FF_PLAN_ZS_RS_EACH;
    default: return FF_PLAN_ZS_GATHER_EACH;
    }
}

static int zero_of(ff_plan_zero_schedule z) {
    switch (z) {
    case FF_PLAN_ZS_ALLREDUCE: return 0;
    case FF_PLAN_ZS_RS_ONCE: return 1;
    case FF_PLAN_ZS_RS_EACH:
    case FF_PLAN_ZS_AFAB_ONCE:
    case FF_PLAN_ZS_LOCAL_ONCE: return 2;
    default: return 3;
    }
}

/* ---- the chapter's formulas ------------------------------------------------------------------ */

double ff_plan_ring_allreduce_bytes(int64_t n, double s) { return n <= 1 ? 0.0 : 2.0 * (double)(n - 1) / (double)n * s; }
double ff_plan_ring_allgather_bytes(int64_t n, double s) { return n <= 1 ? 0.0 : (double)(n - 1) / (double)n * s; }

double ff_plan_hier_allgather_s(int64_t x, int64_t y, double shard, double b_hb, double b_nic) {
    return (double)(y - 1) * shard / b_nic + (double)(x - 1) * ((double)y * shard) / b_hb;
}

static int64_t vchunks(ff_plan_schedule s, int64_t v) { return s == FF_PLAN_INTERLEAVED && v > 1 ? v : 1; }

double ff_plan_bubble_fraction(ff_plan_schedule s, int64_t p, int64_t g, int64_t v) {
    if (p <= 1) return 0.0;
    v = vchunks(s, v);
    return (double)(p - 1) / ((double)(v * g) + (double)(p - 1));
}

double ff_plan_bubble_of_compute(ff_plan_schedule s, int64_t p, int64_t g, int64_t v) {
    if (p <= 1) return 0.0;
    v = vchunks(s, v);
    return (double)(p - 1) / (double)(v * g);
}

double ff_plan_in_flight(ff_plan_schedule s, int64_t p, int64_t g, int64_t v, int64_t stage) {
    switch (s) {
    case FF_PLAN_GPIPE:
    case FF_PLAN_AFAB: return (double)g; /* every forward before any backward */
    case FF_PLAN_INTERLEAVED: {
        v = v > 1 ? v : 1;
        /* Megatron's warm-up: 2 (p - i - 1) + (v - 1) p chunk forwards, plus the one running */
        int64_t units = 2 * (p - stage - 1) + (v - 1) * p + 1;
        if (units > v * g) units = v * g;
        return (double)units / (double)v;
    }
    default: {
        int64_t n = p - stage;
        return (double)(n < g ? n : g);
    }
    }
}

double ff_plan_state_bytes_per_param(int zero, ff_plan_zero_schedule z, int64_t d, int grad_bytes, bool peak) {
    z = ff_plan_zero_schedule_resolve(zero, z, FF_PLAN_1F1B);
    double D = (double)(d > 0 ? d : 1), w = WEIGHT_BYTES, g = (double)grad_bytes, o = OPT_BYTES;
    switch (z) {
    case FF_PLAN_ZS_ALLREDUCE: return w + g + o;
    case FF_PLAN_ZS_RS_ONCE:
    case FF_PLAN_ZS_LOCAL_ONCE: return w + g + o / D;
    case FF_PLAN_ZS_RS_EACH:
    case FF_PLAN_ZS_KEEP_STEP: return w + (g + o) / D;
    case FF_PLAN_ZS_AFAB_ONCE: return w + (g + o) / D + (peak ? g : 0.0); /* full gradients during the backwards */
    case FF_PLAN_ZS_GATHER_EACH: return (w + g + o) / D;
    case FF_PLAN_ZS_KEEP_FWD_BWD: return (w + g + o) / D + (peak ? w : 0.0); /* weights kept forward to backward */
    default: return w + g + o;
    }
}

/* Collectives of one step over psi parameters: phases that run once and phases per micro-batch,
 * as (gradient phases, weight phases). An all-reduce is two phases. */
typedef struct dp_ops {
    int once_grad, once_weight; /* reduce-scatter / all-reduce halves of gradients, all-gathers of weights */
    int each_grad, each_weight; /* per micro-batch */
} dp_ops;

static dp_ops dp_ops_of(ff_plan_zero_schedule z) {
    dp_ops o = {0, 0, 0, 0};
    switch (z) {
    case FF_PLAN_ZS_ALLREDUCE: o.once_grad = 2; break;
    case FF_PLAN_ZS_RS_ONCE:
    case FF_PLAN_ZS_AFAB_ONCE:
    case FF_PLAN_ZS_LOCAL_ONCE: o.once_grad = 1, o.once_weight = 1; break;
    case FF_PLAN_ZS_RS_EACH: o.each_grad = 1, o.once_weight = 1; break;
    case FF_PLAN_ZS_GATHER_EACH: o.each_grad = 1, o.each_weight = 2; break;
    case FF_PLAN_ZS_KEEP_FWD_BWD: o.each_grad = 1, o.each_weight = 1; break;
    case FF_PLAN_ZS_KEEP_STEP: o.each_grad = 1, o.once_weight = 1; break;
    default: break;
    }
    return o;
}

double ff_plan_dp_bytes(int zero, ff_plan_zero_schedule z, int64_t d, double psi, int64_t g, int grad_reduce_bytes) {
    if (d <= 1) return 0.0;
    dp_ops o = dp_ops_of(ff_plan_zero_schedule_resolve(zero, z, FF_PLAN_1F1B));
    double f = (double)(d - 1) / (double)d, r = (double)grad_reduce_bytes;
    double per_param = (double)o.once_grad * r + (double)o.once_weight * WEIGHT_BYTES +
                       (double)g * ((double)o.each_grad * r + (double)o.each_weight * WEIGHT_BYTES);
    return f * psi * per_param;
}

double ff_plan_tp_bytes(double layers, int64_t g, int64_t t, double tokens, int64_t h) {
    return 4.0 * layers * (double)g * ff_plan_ring_allreduce_bytes(t, tokens * (double)h * 2.0);
}

double ff_plan_kv_heads_per_rank(int64_t kv_heads, int64_t t) {
    return t > kv_heads ? 1.0 : (double)kv_heads / (double)t; /* replicated above the heads */
}

double ff_plan_cp_bytes(double layers, int64_t g, int64_t c, int64_t seq, int64_t kv_heads, int64_t t, int64_t head_dim) {
    double kv = (double)seq * 2.0 * ff_plan_kv_heads_per_rank(kv_heads, t) * (double)head_dim * 2.0;
    return 3.0 * layers * (double)g * ff_plan_ring_allgather_bytes(c, kv);
}

double ff_plan_pp_bytes(int64_t v, int64_t g, double tokens, int64_t h, int64_t t) {
    return 2.0 * (double)v * (double)g * tokens * (double)h * 2.0 / (double)t;
}

double ff_plan_ep_bytes(double moe_layers, int64_t g, int64_t e, double tokens, int64_t k, int64_t h) {
    if (e <= 1) return 0.0;
    return 4.0 * moe_layers * (double)g * (double)(e - 1) / (double)e * tokens * (double)k * (double)h * 2.0;
}

double ff_plan_layer_activation_bytes(double coeff, double tokens, int64_t h, int64_t t, bool sp) {
    double sbh = tokens * (double)h;
    if (t <= 1 || sp) return coeff * sbh / (double)(t > 0 ? t : 1);
    /* Korthikanti et al.: without SP the 10 sbh of LayerNorm, dropout and residual inputs stay
     * replicated and only the 24 sbh inside attention and the MLP split over t. */
    return sbh * (10.0 + (coeff - 10.0) / (double)t);
}

/* ---- resolving and checking an input ----------------------------------------------------- */

/* An impossible layout: the message names the constraint. */
#define bad(hint, ...) ff_error_set("layout", hint, __VA_ARGS__)

int ff_plan_layout_fit(ff_plan_layout *l, int64_t gpus) {
    if (l->tp < 1 || l->cp < 1 || l->pp < 1 || l->ep < 1 || l->dp < 0 || l->vpp < 1)
        return ff_error_set("layout", NULL, "degrees must be positive (TP %lld, CP %lld, PP %lld, DP %lld, EP %lld, VPP %lld)",
                            (long long)l->tp, (long long)l->cp, (long long)l->pp, (long long)l->dp, (long long)l->ep,
                            (long long)l->vpp);
    int64_t tcp, all;
    /* products of large degrees would wrap */
    bool wraps = __builtin_mul_overflow(l->tp, l->cp, &tcp) || __builtin_mul_overflow(tcp, l->pp, &tcp) ||
                 __builtin_mul_overflow(tcp, l->dp, &all);
    if (wraps)
        return ff_error_set("layout", "choose degrees whose product is the GPU count",
                            "TP x CP x PP x DP = %lld x %lld x %lld x %lld is far more than the %lld GPUs of the cluster",
                            (long long)l->tp, (long long)l->cp, (long long)l->pp, (long long)l->dp, (long long)gpus);
    if (l->dp == 0) {
        if (gpus % tcp)
            return bad("choose degrees whose product divides the GPU count",
                       "TP x CP x PP = %lld does not divide the %lld GPUs of the cluster", (long long)tcp, (long long)gpus);
        l->dp = gpus / tcp;
    }
    if (tcp * l->dp != gpus)
        return ff_error_set("layout", "set --dp to GPUs / (TP x CP x PP), or leave it out to infer it",
                            "TP x CP x PP x DP = %lld x %lld x %lld x %lld = %lld, but the cluster has %lld GPUs", (long long)l->tp,
                            (long long)l->cp, (long long)l->pp, (long long)l->dp, (long long)(tcp * l->dp), (long long)gpus);
    return 0;
}

int ff_plan_resolve(ff_plan_input *in) {
    ff_plan_model *m = &in->model;
    ff_plan_workload *w = &in->workload;
    ff_plan_layout *l = &in->layout;
    ff_plan_cluster *c = &in->cluster;

    if (m->layers < 1 || m->hidden < 1 || m->heads < 1 || m->head_dim < 1 || m->ffn < 1 || m->vocab < 1)
        return ff_error_set("model", "choose a preset (--model) or read a config.json (--config)",
                            "layers, hidden, heads, head_dim, ffn and vocab must all be positive (got %lld, %lld, %lld, %lld, %lld, %lld)",
                            (long long)m->layers, (long long)m->hidden, (long long)m->heads, (long long)m->head_dim,
                            (long long)m->ffn, (long long)m->vocab);
    if (m->kv_heads < 1) m->kv_heads = m->heads;
    if (m->heads % m->kv_heads)
        return ff_error_set("model", NULL, "%lld query heads are not a multiple of %lld key-value heads", (long long)m->heads,
                            (long long)m->kv_heads);
    if (m->experts > 0) {
        if (m->experts_per_token < 1 || m->experts_per_token > m->experts)
            return ff_error_set("model", NULL, "experts per token must be 1..%lld, got %lld", (long long)m->experts,
                                (long long)m->experts_per_token);
        if (m->moe_layers <= 0) m->moe_layers = m->layers;
        if (m->moe_layers > m->layers)
            return ff_error_set("model", NULL, "%lld MoE layers but only %lld layers", (long long)m->moe_layers, (long long)m->layers);
        if (m->expert_ffn <= 0) m->expert_ffn = m->ffn;
    } else {
        m->experts = m->experts_per_token = m->moe_layers = 0;
    }

    if (w->seq < 1 || w->micro_batch < 1)
        return ff_error_set("workload", NULL, "sequence length and micro-batch size must be positive (got %lld, %lld)",
                            (long long)w->seq, (long long)w->micro_batch);
    if ((w->grad_reduce_bytes != 2 && w->grad_reduce_bytes != 4) || (w->grad_bytes != 2 && w->grad_bytes != 4))
        return ff_error_set("workload", "use fp32 or bf16", "gradients are 2 (BF16) or 4 (FP32) bytes");
    if (!(w->act_coeff > 0)) return ff_error_set("workload", NULL, "the activation coefficient must be positive");

    if (c->gpus < 1 || c->domain < 1)
        return ff_error_set("cluster", NULL, "GPUs (%lld) and GPUs per HB domain (%lld) must be positive", (long long)c->gpus,
                            (long long)c->domain);
    if (c->gpus > c->domain && c->gpus % c->domain)
        return ff_error_set("cluster", "use whole servers", "%lld GPUs do not fill HB domains of %lld GPUs", (long long)c->gpus,
                            (long long)c->domain);
    if (!(c->hbm_bytes > 0) || !(c->nvlink_bps > 0) || !(c->nic_bps > 0) || !(c->flops > 0))
        return ff_error_set("cluster", NULL, "HBM, NVLink and NIC bandwidths and FLOP/s must be positive");
    if (!(c->oversubscription >= 1.0)) return ff_error_set("cluster", NULL, "the oversubscription ratio must be at least 1");
    if (!(c->nvlink_latency_s >= 0) || !(c->nic_latency_s >= 0) || c->nvlink_latency_s > 1.0 || c->nic_latency_s > 1.0)
        return ff_error_set("cluster", "latencies are per collective step, microseconds", "latency out of range");
    if (c->radix < 4 || c->radix % 2) return ff_error_set("cluster", NULL, "switch radix must be even and at least 4");

    if (ff_plan_layout_fit(l, c->gpus) != 0) return -1;
    /* TP above the KV heads replicates each head on TP / n_kv ranks (the model engine's way,
     * model/tp.c; Megatron-core refuses it): it must then be a multiple of them */
    if (m->kv_heads % l->tp && l->tp % m->kv_heads)
        return ff_error_set("layout", "choose TP dividing the key-value heads, or a multiple of them (each head then replicated)",
                            "TP %lld and the %lld key-value heads: neither divides the other", (long long)l->tp,
                            (long long)m->kv_heads);
    if (m->heads % l->tp)
        return bad("choose TP dividing the query heads", "TP %lld does not divide the %lld query heads", (long long)l->tp,
                   (long long)m->heads);
    if (m->vocab_unpadded && m->vocab % l->tp)
        return bad("the vocabulary is split over TP as it is (not padded as Megatron pads it): choose TP dividing it, or pad "
                   "vocab_size in config.json (and the embedding rows)",
                   "TP %lld does not divide the vocabulary of %lld tokens", (long long)l->tp, (long long)m->vocab);
    if (m->ffn % l->tp || (m->experts > 0 && m->expert_ffn % l->tp))
        return bad(NULL, "TP %lld does not divide the FFN size %lld", (long long)l->tp, (long long)m->ffn);
    if (l->pp > m->layers)
        return bad("use fewer stages", "PP %lld has more stages than the %lld layers", (long long)l->pp, (long long)m->layers);
    if (l->cp > 1 && w->seq % (2 * l->cp))
        return bad("Llama 3 splits a sequence into 2 x CP chunks to balance the causal mask",
                   "CP %lld needs the sequence length (%lld) to be a multiple of 2 x CP = %lld", (long long)l->cp, (long long)w->seq,
                   (long long)(2 * l->cp));
    if (l->sequence_parallel && l->tp > 1 && (w->seq / l->cp) % l->tp)
        return bad("turn sequence parallelism off or change the sequence length",
                   "sequence parallelism splits the %lld tokens per GPU over TP %lld: they must divide",
                   (long long)(w->seq / l->cp), (long long)l->tp);
    if (l->ep > 1) {
        if (m->experts == 0)
            return bad("EP needs a mixture-of-experts model", "EP %lld without experts: this model has none", (long long)l->ep);
        if (m->experts % l->ep)
            return bad(NULL, "EP %lld does not divide the %lld experts", (long long)l->ep, (long long)m->experts);
        if (l->dp % l->ep)
            return bad("expert parallelism splits the data-parallel ranks", "EP %lld must divide DP %lld", (long long)l->ep,
                       (long long)l->dp);
    }
    /* rank order: TP, CP, PP, DP once each, EP at most once */
    int seen[FF_PLAN_NDIMS] = {0};
    for (int i = 0; i < l->n_order; i++) {
        if ((unsigned)l->order[i] >= FF_PLAN_NDIMS)
            return ff_error_set("layout", NULL, "bad dimension in the rank order");
        seen[l->order[i]]++;
    }
    for (int d = 0; d < FF_PLAN_NDIMS; d++)
        if (seen[d] > 1 || (d != FF_PLAN_EP && seen[d] != 1))
            return ff_error_set("layout", "list tp, cp, pp and dp once each (ep optional), innermost first",
                                "the rank order %s '%s'", seen[d] ? "repeats" : "lacks", dim_names[d]);

    /* schedule and chunks */
    if (l->vpp > 1 && l->schedule == FF_PLAN_1F1B) l->schedule = FF_PLAN_INTERLEAVED;
    if (l->vpp > 1 && l->schedule != FF_PLAN_INTERLEAVED)
        return ff_error_set("layout", "use the interleaved schedule", "%s has no interleaved chunks (VPP %lld)",
                            schedule_names[l->schedule], (long long)l->vpp);
    if (l->schedule == FF_PLAN_INTERLEAVED && (l->vpp < 2 || l->pp < 2))
        return ff_error_set("layout", "set --vpp 2 or more with PP 2 or more", "the interleaved schedule needs chunks (VPP %lld) on stages (PP %lld)",
                            (long long)l->vpp, (long long)l->pp);
    if (l->vpp * l->pp > m->layers)
        return bad("use fewer chunks or stages", "PP %lld x VPP %lld virtual stages are more than the %lld layers", (long long)l->pp,
                   (long long)l->vpp, (long long)m->layers);

    /* micro-batches */
    int64_t bd = w->micro_batch * l->dp;
    if (w->micro_batches <= 0 && w->global_batch <= 0) w->micro_batches = 1;
    if (w->micro_batches <= 0) {
        if (w->global_batch % bd)
            return bad("choose a global batch that DP x micro-batch divides",
                       "the global batch of %lld sequences is not a multiple of micro-batch %lld x DP %lld", (long long)w->global_batch,
                       (long long)w->micro_batch, (long long)l->dp);
        w->micro_batches = w->global_batch / bd;
    }
    if (w->global_batch <= 0) w->global_batch = w->micro_batches * bd;
    if (w->micro_batches * bd != w->global_batch)
        return bad("give either --micro-batches or --global-batch",
                   "%lld micro-batches x %lld sequences x DP %lld is not the global batch", (long long)w->micro_batches,
                   (long long)w->micro_batch, (long long)l->dp);
    if (l->schedule == FF_PLAN_INTERLEAVED && w->micro_batches % l->pp)
        return bad("Megatron's interleaved order runs micro-batches in groups of PP",
                   "the interleaved schedule needs the micro-batches (%lld) to be a multiple of PP (%lld)",
                   (long long)w->micro_batches, (long long)l->pp);

    /* ZeRO */
    if (l->zero < 0 || l->zero > 3) return ff_error_set("layout", NULL, "ZeRO stage %d: use 0, 1, 2 or 3", l->zero);
    if (l->zero_schedule != FF_PLAN_ZS_DEFAULT) {
        if ((unsigned)l->zero_schedule >= FF_PLAN_NZS) return ff_error_set("layout", NULL, "bad ZeRO schedule");
        if (zero_of(l->zero_schedule) != l->zero)
            return ff_error_set("layout", "pick a schedule of that stage (docs/planner.md)", "ZeRO schedule %s belongs to ZeRO-%d, not ZeRO-%d",
                                zs_names[l->zero_schedule], zero_of(l->zero_schedule), l->zero);
        if (l->zero_schedule == FF_PLAN_ZS_AFAB_ONCE && l->pp > 1 && l->schedule != FF_PLAN_AFAB && l->schedule != FF_PLAN_GPIPE)
            return ff_error_set("layout", "use --schedule afab", "ZeRO-2 with one reduce-scatter per step needs all forwards before the backwards, not %s",
                                schedule_names[l->schedule]);
    }
    /* placement (checks uneven first/last stages) */
    int64_t *tmp = ff_malloc(sizeof(int64_t) * (size_t)(l->vpp * l->pp));
    if (!tmp) return -1;
    int rc = ff_plan_place_layers(m, l, tmp);
    free(tmp);
    return rc;
}

/* ---- placement ---------------------------------------------------------------------------- */

int ff_plan_place_layers(const ff_plan_model *m, const ff_plan_layout *l, int64_t *out) {
    int64_t v = l->vpp > 0 ? l->vpp : 1, V = v * l->pp, L = m->layers;
    if (V > L) return bad(NULL, "%lld virtual stages but %lld layers", (long long)V, (long long)L);
    if (l->layers_first <= 0 && l->layers_last <= 0) {
        /* Balanced: the stages that get one layer fewer sit at both ends, first and last
         * alternately (the first stage holds the embedding and the most activations, the last
         * the LM head and the loss): Llama 3 405B's 126 layers on 16 stages become 7, 8 x 14, 7. */
        int64_t base = L / V, rem = L % V, shorter = rem ? V - rem : 0;
        for (int64_t k = 0; k < V; k++) out[k] = base + (rem ? 1 : 0);
        for (int64_t i = 0; i < shorter; i++) {
            int64_t k = (i % 2 == 0) ? i / 2 : V - 1 - i / 2;
            out[k] = base;
        }
        return 0;
    }
    if (V < 2) return bad("uneven first and last stages need at least two stages", "PP %lld x VPP %lld", (long long)l->pp, (long long)v);
    int64_t lf = l->layers_first, ll = l->layers_last, n_rest = V - (lf > 0) - (ll > 0), rest = L - (lf > 0 ? lf : 0) - (ll > 0 ? ll : 0);
    if (rest < n_rest || (n_rest > 0 && rest % n_rest) || (n_rest == 0 && rest != 0))
        return ff_error_set("layout", "Megatron's uneven option needs the remaining layers to divide evenly",
                            "first stage %lld and last stage %lld layers leave %lld layers for %lld stages", (long long)lf, (long long)ll,
                            (long long)rest, (long long)n_rest);
    for (int64_t k = 0; k < V; k++) out[k] = n_rest ? rest / n_rest : 0;
    if (lf > 0) out[0] = lf;
    if (ll > 0) out[V - 1] = ll;
    return 0;
}

/* A layer is an MoE layer when the running count floor((i+1) L_e / L) steps: L_e of L layers
 * spread evenly (all of them when L_e = L). */
static bool is_moe_layer(const ff_plan_model *m, int64_t i) {
    if (m->experts <= 0) return false;
    return ((i + 1) * m->moe_layers) / m->layers > (i * m->moe_layers) / m->layers;
}

int prep_place(const ff_plan_input *in, int64_t *layers, int64_t *moe_layers, int64_t *scratch) {
    const ff_plan_layout *l = &in->layout;
    int64_t v = l->vpp > 0 ? l->vpp : 1, p = l->pp;
    if (ff_plan_place_layers(&in->model, l, scratch)) return -1;
    for (int64_t s = 0; s < p; s++) layers[s] = moe_layers[s] = 0;
    int64_t first = 0;
    for (int64_t k = 0; k < v * p; k++) {
        int64_t s = k % p;
        layers[s] += scratch[k];
        if (in->model.experts > 0) {
            if (in->model.moe_layers == in->model.layers) moe_layers[s] += scratch[k];
            else
                for (int64_t i = first; i < first + scratch[k]; i++) moe_layers[s] += is_moe_layer(&in->model, i);
        }
        first += scratch[k];
    }
    return 0;
}

void prep_links(const ff_plan_input *in, const rankmap *m, bool exact, prep *p) {
    bool regular = rankmap_regular(m);
    for (int i = 0; i < G_N; i++) {
        if (exact || !regular) group_stat_exact(m, group_kinds(i), &p->g[i]);
        else group_stat_fast(m, group_kinds(i), &p->g[i]);
    }
    pp_links(m, exact || !regular, p->pp);
    const ff_plan_cluster *c = &in->cluster;
    double rail = c->nic_bps;
    if (c->topology == FF_PLAN_CLOS && c->oversubscription > 1.0) {
        /* A rail-optimized leaf gives k r / (r + 1) ports to GPUs; a job on more servers than
         * one leaf reaches crosses the oversubscribed uplinks. */
        int64_t down = (int64_t)floor((double)c->radix * c->oversubscription / (c->oversubscription + 1.0));
        int64_t servers = (c->gpus + c->domain - 1) / c->domain;
        if (servers > down) rail = c->nic_bps / c->oversubscription;
    }
    p->cross_bw_rail = rail;
    p->lat_hb = c->nvlink_latency_s > 0 ? c->nvlink_latency_s : 0.0;
    p->lat_nic = c->nic_latency_s > 0 ? c->nic_latency_s : 0.0;
    if (c->topology == FF_PLAN_RAIL_ONLY) /* forwarded: an NVLink hop to the right rail, then the rail */
        p->cross_bw_other = 1.0 / (1.0 / c->nic_bps + 1.0 / c->nvlink_bps);
    else
        p->cross_bw_other = c->topology == FF_PLAN_CLOS && c->oversubscription > 1.0 && rail < c->nic_bps ? rail : c->nic_bps;
}

/* ---- the core ----------------------------------------------------------------------------- */

double phase_time(const prep *p, const gstat *g, double shard, double b_hb, double *nv, double *nic) {
    *nv = *nic = 0;
    if (g->n <= 1 || shard <= 0) return 0.0;
    if (g->grid) {
        /* rail-only's hierarchical all-gather (and its mirror, the reduce-scatter): along the
         * rail first, then inside the domain */
        *nic = (double)(g->y - 1) * shard;
        *nv = (double)(g->a - 1) * (double)g->y * shard;
        return *nic / p->cross_bw_rail + *nv / b_hb + (double)(g->y - 1) * p->lat_nic + (double)(g->a - 1) * p->lat_hb;
    }
    /* irregular groups: the member with the most partners outside its domain, even spread */
    *nic = (double)(g->n - g->min_count) * shard;
    *nv = (double)(g->min_count - 1) * shard;
    return *nic / (g->rail ? p->cross_bw_rail : p->cross_bw_other) + *nv / b_hb + (double)(g->n - g->min_count) * p->lat_nic +
           (double)(g->min_count - 1) * p->lat_hb;
}

/* All-to-all: payload P per GPU, P / n to each member. */
static double a2a_time(const prep *p, const gstat *g, double payload, double b_hb, bool rail_only, double *nv, double *nic) {
    *nv = *nic = 0;
    if (g->n <= 1 || payload <= 0) return 0.0;
    double unit = payload / (double)g->n;
    int64_t same = g->grid ? g->a - 1 : g->min_count - 1, cross = g->n - 1 - same;
    int64_t cross_rail = g->grid ? g->y - 1 : (g->rail ? cross : 0);
    int64_t cross_other = cross - cross_rail;
    *nv = (double)same * unit;
    *nic = (double)cross * unit;
    /* the sends to all members go out together: one step of latency per kind of link */
    double t = *nv / b_hb + (double)cross_rail * unit / p->cross_bw_rail + (same > 0 ? p->lat_hb : 0.0) + (cross > 0 ? p->lat_nic : 0.0);
    if (rail_only) *nv += (double)cross_other * unit; /* forwarded to the GPU on the destination's rail */
    return t + (double)cross_other * unit / p->cross_bw_other;
}

static ff_plan_link link_of(double nv, double nic) {
    if (nv > 0 && nic > 0) return FF_PLAN_LINK_BOTH;
    if (nic > 0) return FF_PLAN_LINK_NIC;
    if (nv > 0) return FF_PLAN_LINK_NVLINK;
    return FF_PLAN_LINK_NONE;
}

void stage_dp_bytes(const ff_plan_input *in, const ff_plan_stage *st, double *dense, double *expert) {
    const ff_plan_layout *l = &in->layout;
    int64_t D = l->cp * l->dp, De = l->cp * l->dp / l->ep;
    ff_plan_zero_schedule zs = ff_plan_zero_schedule_resolve(l->zero, l->zero_schedule, l->schedule);
    *dense = ff_plan_dp_bytes(l->zero, zs, D, st->params - st->expert_params, in->workload.micro_batches, in->workload.grad_reduce_bytes);
    *expert = ff_plan_dp_bytes(l->zero, zs, De, st->expert_params, in->workload.micro_batches, in->workload.grad_reduce_bytes);
}

void plan_core(const ff_plan_input *in, const prep *pr, ff_plan_result *out, ff_plan_stage *stages) {
    const ff_plan_model *m = &in->model;
    const ff_plan_workload *w = &in->workload;
    const ff_plan_layout *l = &in->layout;
    const ff_plan_cluster *c = &in->cluster;
    int64_t t = l->tp, cp = l->cp, p = l->pp, e = l->ep, G = w->micro_batches;
    int64_t v = l->schedule == FF_PLAN_INTERLEAVED ? l->vpp : 1;
    int64_t D = cp * l->dp, De = D / e;
    double T = (double)t, B_hb = c->nvlink_bps, F = c->flops;
    bool rail_only = c->topology == FF_PLAN_RAIL_ONLY;
    ff_plan_zero_schedule zs = ff_plan_zero_schedule_resolve(l->zero, l->zero_schedule, l->schedule);
    dp_ops ops = dp_ops_of(zs);

    /* per layer, per GPU */
    double tokens = (double)w->micro_batch * (double)w->seq / (double)cp; /* held by one GPU per micro-batch */
    double h = (double)m->hidden;
    /* replicated key/value heads: each rank holds max(n_kv / t, 1) heads of W_K, W_V (and
     * biases), the excess over its n_kv / t share counted t times so that the "/ T" below
     * leaves it whole on every rank */
    double kv_excess = ff_plan_kv_heads_per_rank(m->kv_heads, t) - (double)m->kv_heads / T; /* heads, 0 unless t > n_kv */
    double attn = ff_plan_params_attention(m) + T * kv_excess * 2.0 * (h + (m->linear_bias ? 1.0 : 0.0)) * (double)m->head_dim;
    double norms = 2.0 * h * (m->layernorm ? 2.0 : 1.0);
    double mlp = ff_plan_params_mlp(m), expert = m->experts > 0 ? ff_plan_params_expert(m) : 0.0;
    double router = h * (double)m->experts, emb = ff_plan_params_embedding(m);
    /* plus the K and V (BF16, [tokens, d] per head) of the replicated heads' excess */
    double act_layer = ff_plan_layer_activation_bytes(w->act_coeff, tokens, m->hidden, t, l->sequence_parallel) +
                       kv_excess * 2.0 * tokens * (double)m->head_dim * 2.0;
    double ckpt_layer = 2.0 * tokens * h / (l->sequence_parallel ? T : 1.0); /* each layer's input */
    double recompute = l->checkpoint ? 4.0 / 3.0 : 1.0;                     /* one more forward */
    double attn_flops_layer = 6.0 * tokens * (double)w->seq * (double)m->head_dim * ((double)m->heads / T); /* causal */

    /* messages and phases per micro-batch per layer */
    double tp_msg = tokens * h * 2.0;                   /* the activation an all-reduce combines */
    double tp_ar_layer = l->checkpoint ? 6.0 : 4.0;     /* all-reduces (or AG + RS pairs) per layer */
    double kv_shard = tokens * 2.0 * ff_plan_kv_heads_per_rank(m->kv_heads, t) * (double)m->head_dim * 2.0; /* K and V of my tokens */
    /* Replicated key/value heads: each backward of a layer all-reduces their weight gradients
     * over the TP group (model/tp.c ffm_tp_kv_grads: every rank's head in its slot of an
     * [n_kv, 2 d (h + bias)] buffer, so the whole K/V projection, not a subgroup's share) */
    double kv_grad_msg = t > m->kv_heads ? (double)m->kv_heads * 2.0 * (double)m->head_dim * (h + (m->linear_bias ? 1.0 : 0.0)) *
                                               (double)w->grad_reduce_bytes
                                         : 0.0;
    double cp_ph_layer = l->checkpoint ? 4.0 : 3.0;     /* AG forward, AG backward, RS of gradients */
    double ep_tokens = l->sequence_parallel ? tokens / T : tokens;
    double ep_payload = ep_tokens * (double)m->experts_per_token * h * 2.0;
    double ep_a2a_layer = l->checkpoint ? 6.0 : 4.0;
    double pp_msg = tokens * h * 2.0 / T;

    double nv, nic;
    double tp_ph_t = phase_time(pr, &pr->g[G_TP], tp_msg / T, B_hb, &nv, &nic);
    double tp_ph_nv = nv, tp_ph_nic = nic;
    double kv_ph_t = phase_time(pr, &pr->g[G_TP], kv_grad_msg / T, B_hb, &nv, &nic);
    double kv_ph_nv = nv, kv_ph_nic = nic;
    double cp_ph_t = phase_time(pr, &pr->g[G_CP], kv_shard, B_hb, &nv, &nic);
    double cp_ph_nv = nv, cp_ph_nic = nic;
    double ep_t = a2a_time(pr, &pr->g[G_EP], ep_payload, B_hb, rail_only, &nv, &nic);
    double ep_nv = nv, ep_nic = nic;
    double ep_sent = pr->g[G_EP].n > 1 ? ep_payload * (double)(pr->g[G_EP].n - 1) / (double)pr->g[G_EP].n : 0.0;

    memset(out, 0, sizeof *out);
    out->gpus = c->gpus;
    out->micro_batches = G;
    out->global_batch = w->global_batch;
    out->tokens_per_step = (double)w->global_batch * (double)w->seq;
    out->params_total = ff_plan_params_total(m);
    out->params_active = ff_plan_params_active(m);
    out->n_stages = p;
    out->memory.hbm_bytes = c->hbm_bytes;

    double sum_tmb = 0, max_tmb = 0, max_sync = 0, max_compute = 0;
    double sum_traffic[FF_PLAN_NDIMS] = {0}, sum_nv = 0, sum_nic = 0;
    double best[FF_PLAN_NDIMS], best_nv[FF_PLAN_NDIMS] = {0}, best_nic[FF_PLAN_NDIMS] = {0};
    int64_t busiest[FF_PLAN_NDIMS] = {0};
    for (int d = 0; d < FF_PLAN_NDIMS; d++) best[d] = -1.0;
    double pp_fwd_t = 0, pp_bwd_t = 0;
    ff_plan_stage stbuf;
    for (int64_t s = 0; s < p; s++) {
        ff_plan_stage *st = stages ? &stages[s] : &stbuf;
        memset(st, 0, sizeof *st);
        int64_t Ls = pr->layers[s], Le = pr->moe_layers[s];
        bool first = s == 0, last = s == p - 1;
        double dense = ((double)Ls * (attn + norms) + (double)(Ls - Le) * mlp + (double)Le * router) / T;
        if (first) dense += emb / T + (double)m->pos_embeddings * h;
        /* final norm and LM head; a tied head is a second copy of the embedding on the last
         * stage when it is not also the first (Megatron) */
        if (last) dense += h * (m->layernorm ? 2.0 : 1.0) / T + ((!m->tied_embeddings || p > 1) ? emb / T : 0.0);
        double experts = (double)Le * (double)(m->experts / e) * expert / T;
        st->layers = Ls;
        st->moe_layers = Le;
        st->params = dense + experts;
        st->expert_params = experts;

        /* memory */
        st->state_bytes = dense * ff_plan_state_bytes_per_param(l->zero, zs, D, w->grad_bytes, false) +
                          experts * ff_plan_state_bytes_per_param(l->zero, zs, De, w->grad_bytes, false);
        st->state_peak_bytes = dense * ff_plan_state_bytes_per_param(l->zero, zs, D, w->grad_bytes, true) +
                               experts * ff_plan_state_bytes_per_param(l->zero, zs, De, w->grad_bytes, true);
        st->in_flight = ff_plan_in_flight(l->schedule, p, G, v, s);
        if (l->checkpoint) st->activation_bytes = st->in_flight * (double)Ls * ckpt_layer + act_layer;
        else st->activation_bytes = st->in_flight * (double)Ls * act_layer;
        if (l->zero == 3) { /* the gathered BF16 weights of the running layer and the prefetched one */
            double layer = (attn + norms + (Le > 0 ? router + (double)(m->experts / e) * expert : mlp)) / T;
            st->buffer_bytes += 2.0 * WEIGHT_BYTES * layer;
        }
        if (last) st->buffer_bytes += tokens * ((double)m->vocab / T) * 4.0; /* FP32 logits for the loss */
        st->total_bytes = st->state_peak_bytes + st->activation_bytes + st->buffer_bytes;

        /* compute per micro-batch: 6 FLOPs per matmul parameter per token, plus attention */
        double matmul = ((double)Ls * attn + (double)(Ls - Le) * mlp + (double)Le * ((double)m->experts_per_token * expert + router)) / T;
        if (last) matmul += emb / T; /* the LM head */
        st->flops_mb = recompute * (6.0 * tokens * matmul + attn_flops_layer * (double)Ls);
        double compute_mb = st->flops_mb / F;

        /* bytes per step on each link, per dimension */
        double dnv[FF_PLAN_NDIMS] = {0}, dnic[FF_PLAN_NDIMS] = {0};
        double tp_n = tp_ar_layer * (double)Ls, cp_n = cp_ph_layer * (double)Ls, ep_n = ep_a2a_layer * (double)Le;
        double kv_n = kv_grad_msg > 0 ? (double)Ls : 0.0; /* one all-reduce per layer backward */
        double t_tp = tp_n * 2.0 * tp_ph_t + kv_n * 2.0 * kv_ph_t, t_cp = cp_n * cp_ph_t, t_ep = ep_n * ep_t;
        dnv[FF_PLAN_TP] = (double)G * 2.0 * (tp_n * tp_ph_nv + kv_n * kv_ph_nv);
        dnic[FF_PLAN_TP] = (double)G * 2.0 * (tp_n * tp_ph_nic + kv_n * kv_ph_nic);
        dnv[FF_PLAN_CP] = (double)G * cp_n * cp_ph_nv, dnic[FF_PLAN_CP] = (double)G * cp_n * cp_ph_nic;
        dnv[FF_PLAN_EP] = (double)G * ep_n * ep_nv, dnic[FF_PLAN_EP] = (double)G * ep_n * ep_nic;
        st->traffic[FF_PLAN_TP] = dnv[FF_PLAN_TP] + dnic[FF_PLAN_TP];
        st->traffic[FF_PLAN_CP] = dnv[FF_PLAN_CP] + dnic[FF_PLAN_CP];
        st->traffic[FF_PLAN_EP] = (double)G * ep_n * ep_sent; /* forwarding hops are not sent twice */

        int64_t nfwd = p > 1 ? (last ? v - 1 : v) : 0, nbwd = p > 1 ? (first ? v - 1 : v) : 0;
        st->traffic[FF_PLAN_PP] = (double)G * (double)(nfwd + nbwd) * pp_msg;
        const pplink *pl = &pr->pp[s];
        if (nfwd) {
            double b = (double)(G * nfwd) * pp_msg, bw = B_hb;
            if (pl->next_cross) dnic[FF_PLAN_PP] += b, bw = pl->next_rail ? pr->cross_bw_rail : pr->cross_bw_other;
            else dnv[FF_PLAN_PP] += b;
            double tm = pp_msg / bw + (pl->next_cross ? pr->lat_nic : pr->lat_hb);
            if (tm > pp_fwd_t) pp_fwd_t = tm;
        }
        if (nbwd) {
            double b = (double)(G * nbwd) * pp_msg, bw = B_hb;
            if (pl->prev_cross) dnic[FF_PLAN_PP] += b, bw = pl->prev_rail ? pr->cross_bw_rail : pr->cross_bw_other;
            else dnv[FF_PLAN_PP] += b;
            double tm = pp_msg / bw + (pl->prev_cross ? pr->lat_nic : pr->lat_hb);
            if (tm > pp_bwd_t) pp_bwd_t = tm;
        }

        /* data parallel: dense weights over CP x DP, experts over CP x DP / EP */
        double dp_once_t = 0, dp_each_t = 0, nv, nic;
        const double psi[2] = {dense, experts};
        const int grp[2] = {G_DPD, G_DPE};
        for (int k = 0; k < 2; k++) {
            if (psi[k] <= 0) continue;
            const gstat *g = &pr->g[grp[k]];
            double sd = (double)(k ? De : D);
            double tg = phase_time(pr, g, psi[k] * (double)w->grad_reduce_bytes / sd, B_hb, &nv, &nic);
            double gnv = nv, gnic = nic;
            double tw = phase_time(pr, g, psi[k] * WEIGHT_BYTES / sd, B_hb, &nv, &nic);
            dp_once_t += ops.once_grad * tg + ops.once_weight * tw;
            dp_each_t += ops.each_grad * tg + ops.each_weight * tw;
            double n_g = ops.once_grad + (double)G * ops.each_grad, n_w = ops.once_weight + (double)G * ops.each_weight;
            dnv[FF_PLAN_DP] += n_g * gnv + n_w * nv;
            dnic[FF_PLAN_DP] += n_g * gnic + n_w * nic;
        }
        st->traffic[FF_PLAN_DP] = dnv[FF_PLAN_DP] + dnic[FF_PLAN_DP];
        for (int d = 0; d < FF_PLAN_NDIMS; d++) st->nvlink_bytes += dnv[d], st->nic_bytes += dnic[d];

        double dp_exposed = dp_each_t > compute_mb ? dp_each_t - compute_mb : 0.0; /* overlaps its micro-batch */
        st->time_mb = compute_mb + t_tp + t_cp + t_ep + dp_exposed;
        sum_tmb += st->time_mb;
        if (st->time_mb > max_tmb) max_tmb = st->time_mb;
        if (dp_once_t > max_sync) max_sync = dp_once_t;
        if (compute_mb * (double)G > max_compute) max_compute = compute_mb * (double)G;

        for (int d = 0; d < FF_PLAN_NDIMS; d++) {
            sum_traffic[d] += st->traffic[d];
            if (st->traffic[d] > best[d]) best[d] = st->traffic[d], best_nv[d] = dnv[d], best_nic[d] = dnic[d], busiest[d] = s;
        }
        sum_nv += st->nvlink_bytes, sum_nic += st->nic_bytes;
        if (st->nvlink_bytes > out->time.nvlink_bytes) out->time.nvlink_bytes = st->nvlink_bytes;
        if (st->nic_bytes > out->time.nic_bytes) out->time.nic_bytes = st->nic_bytes;

        if (st->state_bytes > out->memory.state_bytes) out->memory.state_bytes = st->state_bytes;
        if (st->state_peak_bytes > out->memory.state_peak_bytes) out->memory.state_peak_bytes = st->state_peak_bytes;
        if (first) out->memory.activation_bytes = st->activation_bytes;
        if (st->total_bytes > out->memory.total_bytes) out->memory.total_bytes = st->total_bytes, out->memory.worst_stage = s;
    }
    out->memory.fits = out->memory.total_bytes <= c->hbm_bytes;

    /* traffic per dimension: one GPU of the busiest stage, and the mean over GPUs */
    bool cross_on_rails = true;
    const gstat *gd[FF_PLAN_NDIMS] = {&pr->g[G_TP], &pr->g[G_CP], NULL, &pr->g[G_DPD], &pr->g[G_EP]};
    for (int d = 0; d < FF_PLAN_NDIMS; d++) {
        ff_plan_traffic *tr = &out->traffic[d];
        int64_t s = busiest[d], Ls = pr->layers[s], Le = pr->moe_layers[s];
        tr->bytes = best[d] > 0 ? best[d] : 0.0;
        tr->bytes_mean = sum_traffic[d] / (double)p;
        tr->nvlink_bytes = best_nv[d];
        tr->nic_bytes = best_nic[d];
        switch (d) {
        case FF_PLAN_TP:
            tr->collective = l->sequence_parallel && t > 1 ? "all-gather + reduce-scatter" : "all-reduce";
            tr->messages = (double)G * (tp_ar_layer + (kv_grad_msg > 0 ? 1.0 : 0.0)) * (double)Ls;
            tr->message_bytes = tp_msg;
            tr->compute_waits = true;
            break;
        case FF_PLAN_CP:
            tr->collective = "all-gather of K,V + reduce-scatter of their gradients";
            tr->messages = (double)G * cp_ph_layer * (double)Ls;
            tr->message_bytes = kv_shard * (double)cp; /* K and V of the whole sequence */
            tr->compute_waits = true;
            break;
        case FF_PLAN_EP:
            tr->collective = "all-to-all (dispatch + combine)";
            tr->messages = (double)G * ep_a2a_layer * (double)Le;
            tr->message_bytes = ep_payload;
            tr->compute_waits = true;
            break;
        case FF_PLAN_PP: {
            int64_t nf = p > 1 ? (s == p - 1 ? v - 1 : v) : 0, nb = p > 1 ? (s == 0 ? v - 1 : v) : 0;
            tr->collective = "send/recv";
            tr->messages = (double)G * (double)(nf + nb);
            tr->message_bytes = p > 1 ? pp_msg : 0.0;
            tr->compute_waits = false;
            break;
        }
        case FF_PLAN_DP: {
            tr->collective = zs == FF_PLAN_ZS_ALLREDUCE ? "all-reduce" : "reduce-scatter + all-gather";
            tr->messages = D > 1 ? (double)(ops.once_grad + ops.once_weight) + (double)G * (ops.each_grad + ops.each_weight) : 0.0;
            double psi = stages ? stages[s].params : 0.0;
            if (!stages)
                psi = ((double)Ls * (attn + norms) + (double)(Ls - Le) * mlp + (double)Le * router) / T +
                      (double)Le * (double)(m->experts / e) * expert / T;
            tr->message_bytes = D > 1 ? psi * (double)w->grad_reduce_bytes : 0.0; /* the gradients reduced */
            tr->compute_waits = false;
            break;
        }
        }
        if (d != FF_PLAN_PP) {
            const gstat *g = gd[d];
            tr->group.size = g->n;
            tr->group.per_domain = g->a;
            tr->group.domains = g->y;
            tr->group.regular = g->grid;
            if (d == FF_PLAN_EP) /* an all-to-all has cross pairs between rails unless a = 1 */
                tr->group.rail_aligned = g->y <= 1 || (g->grid ? g->a == 1 : g->rail);
            else
                tr->group.rail_aligned = g->y <= 1 || g->grid || g->rail;
            if (d == FF_PLAN_DP && m->experts > 0 && e > 1) {
                const gstat *ge = &pr->g[G_DPE];
                if (ge->y > 1 && !(ge->grid || ge->rail)) tr->group.rail_aligned = false;
            }
        } else {
            tr->group.size = p;
            bool cross = false, rail = true;
            for (int64_t k = 0; k < p && p > 1; k++) {
                if (pr->pp[k].next_cross && (k < p - 1 || v > 1)) cross = true, rail = rail && pr->pp[k].next_rail;
                if (pr->pp[k].prev_cross && (k > 0 || v > 1)) cross = true, rail = rail && pr->pp[k].prev_rail;
            }
            tr->group.per_domain = cross ? 1 : p;
            tr->group.domains = cross ? p : 1;
            tr->group.regular = true;
            tr->group.rail_aligned = rail;
        }
        if (tr->nic_bytes > 0 && !tr->group.rail_aligned) cross_on_rails = false;
        tr->link = link_of(tr->nvlink_bytes, tr->nic_bytes);
        double cross_bw = tr->group.rail_aligned ? pr->cross_bw_rail : pr->cross_bw_other;
        tr->wire_s = tr->nvlink_bytes / B_hb + tr->nic_bytes / cross_bw;
    }
    out->cross_domain_on_rails = cross_on_rails;

    /* time: the rail-only decomposition T = T_bubble + T_last + T_sync */
    out->time.compute_s = max_compute;
    out->time.nvlink_bytes_mean = sum_nv / (double)p;
    out->time.nic_bytes_mean = sum_nic / (double)p;
    out->time.nvlink_s = out->time.nvlink_bytes / B_hb;
    out->time.nic_s = out->time.nic_bytes / c->nic_bps;
    out->time.bubble_fraction = ff_plan_bubble_fraction(l->schedule, p, G, v);
    out->time.bubble_of_compute = ff_plan_bubble_of_compute(l->schedule, p, G, v);
    double mean_tmb = sum_tmb / (double)p;
    out->time.bubble_s = p > 1 ? (double)(p - 1) * (mean_tmb / (double)v + pp_fwd_t + pp_bwd_t) : 0.0;
    out->time.last_s = (double)G * max_tmb;
    out->time.sync_s = max_sync;
    out->time.iteration_s = out->time.bubble_s + out->time.last_s + out->time.sync_s;
    out->time.tokens_per_s = out->time.iteration_s > 0 ? out->tokens_per_step / out->time.iteration_s : 0.0;
    out->time.compute_fraction = out->time.iteration_s > 0 ? max_compute / out->time.iteration_s : 0.0;
    /* the model's attention, not a rank's replicated key/value heads */
    double matmul_active = (double)m->layers * ff_plan_params_attention(m) + (double)(m->layers - m->moe_layers) * mlp +
                           (double)m->moe_layers * ((double)m->experts_per_token * expert + router) + emb;
    out->time.flops_dense_mean = 6.0 * matmul_active * out->tokens_per_step / (double)c->gpus;
}

int ff_plan_evaluate(const ff_plan_input *in_const, ff_plan_result *out) {
    memset(out, 0, sizeof *out);
    ff_plan_input in = *in_const;
    if (ff_plan_resolve(&in)) return -1;
    int64_t p = in.layout.pp, V = in.layout.vpp * p;
    ff_plan_stage *stages = ff_calloc((size_t)p, sizeof *stages);
    int64_t *buf = ff_calloc((size_t)(2 * p + V), sizeof(int64_t));
    pplink *pl = ff_calloc((size_t)p, sizeof *pl);
    if (!stages || !buf || !pl) {
        free(stages), free(buf), free(pl);
        return -1;
    }
    prep pr;
    memset(&pr, 0, sizeof pr);
    pr.n_stages = p;
    pr.layers = buf;
    pr.moe_layers = buf + p;
    pr.pp = pl;
    int rc = prep_place(&in, pr.layers, pr.moe_layers, buf + 2 * p);
    if (!rc) {
        rankmap rm;
        rankmap_build(&in, &rm);
        prep_links(&in, &rm, true, &pr);
        plan_core(&in, &pr, out, stages);
        out->stages = stages;
        stages = NULL;
    }
    free(stages), free(buf), free(pl);
    return rc;
}

void ff_plan_result_clear(ff_plan_result *r) {
    if (!r) return;
    free(r->stages);
    memset(r, 0, sizeof *r);
}

/* Planner reports: the readable text of `fuseflow plan` (and of its search), and the same as one
 * JSON object (jansson). Not here: any number that the report shows but does not compute
 * elsewhere; every figure comes from ff_plan_result. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/plan/plan_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

static const char *bytes_str(double v, char *buf, size_t cap) {
    static const char *const u[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
    int i = 0;
    while (v >= 1000.0 && i < 6) v /= 1000.0, i++;
    snprintf(buf, cap, v >= 100 || i == 0 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, u[i]);
    return buf;
}

static const char *count_str(double v, char *buf, size_t cap) {
    if (v >= 1e18) snprintf(buf, cap, "%.3g", v);
    else if (v >= 1e15) snprintf(buf, cap, "%.2f P", v / 1e15);
    else if (v >= 1e12) snprintf(buf, cap, "%.2f T", v / 1e12);
    else if (v >= 1e9) snprintf(buf, cap, "%.2f B", v / 1e9);
    else if (v >= 1e6) snprintf(buf, cap, "%.2f M", v / 1e6);
    else if (v >= 1e4) snprintf(buf, cap, "%.1f k", v / 1e3);
    else snprintf(buf, cap, "%.0f", v);
    return buf;
}

static const char *secs_str(double s, char *buf, size_t cap) {
    if (s >= 100) snprintf(buf, cap, "%.0f s", s);
    else if (s >= 1) snprintf(buf, cap, "%.2f s", s);
    else if (s >= 1e-3) snprintf(buf, cap, "%.1f ms", s * 1e3);
    else if (s > 0) snprintf(buf, cap, "%.1f us", s * 1e6);
    else snprintf(buf, cap, "0");
    return buf;
}

static void order_str(const ff_plan_layout *l, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int i = 0; i < l->n_order; i++) {
        strncat(buf, i ? "," : "", cap - strlen(buf) - 1);
        strncat(buf, ff_plan_dim_name((ff_plan_dim)l->order[i]), cap - strlen(buf) - 1);
    }
}

static const char *topo_str(const ff_plan_cluster *c, char *buf, size_t cap) {
    if (c->topology == FF_PLAN_RAIL_ONLY) snprintf(buf, cap, "rail-only");
    else if (c->oversubscription > 1.0) snprintf(buf, cap, "Clos oversubscribed %.3g:1", c->oversubscription);
    else snprintf(buf, cap, "non-blocking Clos");
    return buf;
}

static void stage_line(FILE *out, const ff_plan_stage *st, int64_t s, double hbm) {
    char a[32], b[32], c[32], d[32], e[32], f[32];
    fprintf(out, "  %5lld %6lld %9s %9s %10s %9.2f %11s %9s %9s  %s\n", (long long)(s + 1), (long long)st->layers,
            count_str(st->params, a, sizeof a), bytes_str(st->state_bytes, b, sizeof b), bytes_str(st->state_peak_bytes, c, sizeof c),
            st->in_flight, bytes_str(st->activation_bytes, d, sizeof d), bytes_str(st->buffer_bytes, e, sizeof e),
            bytes_str(st->total_bytes, f, sizeof f), st->total_bytes <= hbm ? "yes" : "NO");
}

void ff_plan_report_write(const ff_plan_input *in_const, const ff_plan_result *r, FILE *out) {
    ff_plan_input in = *in_const;
    if (ff_plan_resolve(&in)) {
        fprintf(out, "fuseflow plan: %s\n", ff_error_message());
        return;
    }
    const ff_plan_model *m = &in.model;
    const ff_plan_workload *w = &in.workload;
    const ff_plan_layout *l = &in.layout;
    const ff_plan_cluster *c = &in.cluster;
    char s1[64], s2[64], s3[64], s4[64], s5[64], ord[64];

    fprintf(out, "fuseflow plan: %s on %lld GPUs\n\n", m->name, (long long)c->gpus);
    fprintf(out, "cluster    %s: %lld GPUs per HB domain, %s HBM, NVLink %s/s per direction, NIC %s/s, %sFLOP/s achieved, "
            "latency %.3g us (NVLink) / %.3g us (NIC) per step, %s\n",
            c->name[0] ? c->name : "custom", (long long)c->domain, bytes_str(c->hbm_bytes, s1, sizeof s1), bytes_str(c->nvlink_bps, s2, sizeof s2),
            bytes_str(c->nic_bps, s3, sizeof s3), count_str(c->flops, s4, sizeof s4), c->nvlink_latency_s * 1e6, c->nic_latency_s * 1e6,
            topo_str(c, s5, sizeof s5));
    fprintf(out, "model      %s parameters (%s active): %lld layers, hidden %lld, %lld heads / %lld KV heads x %lld, FFN %lld, vocab %lld%s",
            count_str(r->params_total, s1, sizeof s1), count_str(r->params_active, s2, sizeof s2), (long long)m->layers,
            (long long)m->hidden, (long long)m->heads, (long long)m->kv_heads, (long long)m->head_dim, (long long)m->ffn,
            (long long)m->vocab, m->tied_embeddings ? ", tied embeddings" : "");
    if (m->experts) fprintf(out, ", %lld experts (top-%lld) in %lld MoE layers", (long long)m->experts, (long long)m->experts_per_token, (long long)m->moe_layers);
    fprintf(out, "\n");
    fprintf(out, "workload   seq %lld, %lld sequence(s) per micro-batch, %lld micro-batches per replica: %lld sequences = %s tokens per step; "
            "gradients %s in memory, %s on the wire\n",
            (long long)w->seq, (long long)w->micro_batch, (long long)w->micro_batches, (long long)w->global_batch,
            count_str(r->tokens_per_step, s1, sizeof s1), w->grad_bytes == 4 ? "FP32" : "BF16", w->grad_reduce_bytes == 4 ? "FP32" : "BF16");
    order_str(l, ord, sizeof ord);
    fprintf(out, "layout     TP%lld CP%lld PP%lld DP%lld EP%lld, %s", (long long)l->tp, (long long)l->cp, (long long)l->pp, (long long)l->dp,
            (long long)l->ep, ff_plan_schedule_name(l->schedule));
    if (l->schedule == FF_PLAN_INTERLEAVED) fprintf(out, " (%lld chunks)", (long long)l->vpp);
    fprintf(out, ", SP %s, ZeRO-%d (%s), %s, rank order %s\n", l->sequence_parallel ? "on" : "off", l->zero,
            ff_plan_zero_schedule_name(ff_plan_zero_schedule_resolve(l->zero, l->zero_schedule, l->schedule)),
            l->checkpoint ? "full recomputation" : "no checkpointing", ord);
    /* the rank formula of the chapter's figure 3.13, e.g. rank = tp + 8 pp + 128 dp */
    rankmap rm;
    rankmap_build(&in, &rm);
    static const char *const fname[F_N] = {"tp", "cp", "pp", "ep", "dp"};
    fprintf(out, "ranks      rank =");
    int terms = 0;
    for (int i = 0; i < rm.n; i++) {
        if (rm.deg[i] == 1) continue;
        const char *nm = rm.kind[i] == F_EDP && l->ep > 1 ? "dp/ep" : fname[rm.kind[i]];
        if (rm.stride[i] == 1) fprintf(out, "%s %s", terms ? " +" : "", nm);
        else fprintf(out, "%s %lld %s", terms ? " +" : "", (long long)rm.stride[i], nm);
        terms++;
    }
    if (!terms) fprintf(out, " 0");
    fprintf(out, "; server = rank / %lld, local rank = rail = rank mod %lld (each GPU: --matrix PREFIX, PREFIX.ranks.csv)\n",
            (long long)c->domain, (long long)c->domain);
    fprintf(out, "placement  %lld layers on %lld stages:", (long long)m->layers, (long long)l->pp);
    for (int64_t s = 0; s < r->n_stages && s < 64; s++) fprintf(out, " %lld", (long long)r->stages[s].layers);
    if (r->n_stages > 64) fprintf(out, " ...");
    if (l->layers_first > 0 || l->layers_last > 0) fprintf(out, " (uneven first/last stage as asked, the rest even)\n");
    else if (m->layers % (l->pp * l->vpp)) fprintf(out, " (balanced; the stages with one layer fewer sit first and last)\n");
    else fprintf(out, " (even)\n");
    if (l->tp > m->kv_heads)
        fprintf(out, "kv heads   TP %lld > %lld KV heads: each replicated on %lld GPUs (its K/V weights and activations on each), "
                     "their weight gradients all-reduced over TP in every layer's backward\n",
                (long long)l->tp, (long long)m->kv_heads, (long long)(l->tp / m->kv_heads));

    fprintf(out, "\nmemory per GPU\n  stage layers    params     state peak state in flight activations   buffers     total  fits %s\n",
            bytes_str(c->hbm_bytes, s1, sizeof s1));
    int64_t p = r->n_stages;
    for (int64_t s = 0; s < p; s++) {
        bool show = p <= 24 || s < 8 || s >= p - 4 || s == r->memory.worst_stage;
        if (show) stage_line(out, &r->stages[s], s, c->hbm_bytes);
        else if (s == 8) fprintf(out, "    ...\n");
    }
    fprintf(out, "  %s: the largest is stage %lld with %s of %s\n", r->memory.fits ? "fits" : "DOES NOT FIT",
            (long long)r->memory.worst_stage + 1, bytes_str(r->memory.total_bytes, s1, sizeof s1), bytes_str(c->hbm_bytes, s2, sizeof s2));

    fprintf(out, "\ntraffic per GPU per step (one GPU of the busiest stage; mean over all GPUs)\n");
    fprintf(out, "  dim %10s %10s %9s %10s  %-11s %-5s %-5s %9s  %s\n", "bytes", "mean", "messages", "message", "link", "rails", "waits",
            "wire", "collective");
    for (int d = 0; d < FF_PLAN_NDIMS; d++) {
        const ff_plan_traffic *t = &r->traffic[d];
        char a[32], b[32], cc[32], dd[32], ee[32];
        if (t->bytes <= 0) {
            fprintf(out, "  %-3s %10s\n", ff_plan_dim_name((ff_plan_dim)d), "-");
            continue;
        }
        fprintf(out, "  %-3s %10s %10s %9s %10s  %-11s %-5s %-5s %9s  %s\n", ff_plan_dim_name((ff_plan_dim)d), bytes_str(t->bytes, a, sizeof a),
                bytes_str(t->bytes_mean, b, sizeof b), count_str(t->messages, cc, sizeof cc), bytes_str(t->message_bytes, dd, sizeof dd),
                ff_plan_link_name(t->link), t->nic_bytes > 0 ? (t->group.rail_aligned ? "yes" : "NO") : "-", t->compute_waits ? "yes" : "no",
                secs_str(t->wire_s, ee, sizeof ee), t->collective);
    }

    const ff_plan_time *tm = &r->time;
    fprintf(out, "\ntime per step\n");
    fprintf(out, "  compute    %s on the busiest stage at %sFLOP/s; 6 x parameters x tokens per GPU = %sFLOP (%s)\n",
            secs_str(tm->compute_s, s1, sizeof s1), count_str(c->flops, s2, sizeof s2), count_str(tm->flops_dense_mean, s3, sizeof s3),
            secs_str(tm->flops_dense_mean / c->flops, s4, sizeof s4));
    fprintf(out, "  wire       NVLink %s = %s, NIC %s = %s at full rate (busiest GPU)\n", bytes_str(tm->nvlink_bytes, s1, sizeof s1),
            secs_str(tm->nvlink_s, s2, sizeof s2), bytes_str(tm->nic_bytes, s3, sizeof s3), secs_str(tm->nic_s, s4, sizeof s4));
    fprintf(out, "  bubble     %.1f%% of the step, %.1f%% of compute (%s, p=%lld, G=%lld", 100 * tm->bubble_fraction, 100 * tm->bubble_of_compute,
            ff_plan_schedule_name(l->schedule), (long long)l->pp, (long long)w->micro_batches);
    if (l->schedule == FF_PLAN_INTERLEAVED) fprintf(out, ", v=%lld", (long long)l->vpp);
    fprintf(out, ")\n");
    fprintf(out, "  iteration  %s = bubble %s + last stage %s + gradient sync %s (rail-only decomposition)\n",
            secs_str(tm->iteration_s, s1, sizeof s1), secs_str(tm->bubble_s, s2, sizeof s2), secs_str(tm->last_s, s3, sizeof s3),
            secs_str(tm->sync_s, s4, sizeof s4));
    fprintf(out, "  throughput %s tokens/s, %.0f%% of the step computing\n", count_str(tm->tokens_per_s, s1, sizeof s1), 100 * tm->compute_fraction);

    fprintf(out, "\n");
    ff_plan_network_write(c, out);
    fprintf(out, "  this layout's cross-domain traffic %s\n",
            r->cross_domain_on_rails ? "stays on rails (it runs on a rail-only network)" : "crosses rails (rail-only must forward it over NVLink)");
}

int ff_plan_network_write(const ff_plan_cluster *c, FILE *out) {
    ff_plan_network net;
    if (ff_plan_network_cost(c->gpus, c->domain, c->radix, &net)) return -1;
    fprintf(out, "network for %lld GPUs in HB domains of %lld, radix-%lld switches\n", (long long)c->gpus, (long long)c->domain,
            (long long)c->radix);
    fprintf(out, "  non-blocking Clos  %d tier(s), %lld switches, %lld transceivers\n", net.clos.tiers, (long long)net.clos.switches,
            (long long)net.clos.transceivers);
    fprintf(out, "  rail-only          %lld rails, %d tier(s), %lld switches, %lld transceivers\n",
            (long long)(c->gpus < c->domain ? c->gpus : c->domain), net.rail_only.tiers, (long long)net.rail_only.switches,
            (long long)net.rail_only.transceivers);
    long long ds = (long long)(net.clos.switches - net.rail_only.switches), dt = (long long)(net.clos.transceivers - net.rail_only.transceivers);
    fprintf(out, "  difference         %lld switches (%.0f%%), %lld transceivers (%.0f%%) fewer with rail-only\n", ds,
            net.clos.switches ? 100.0 * (double)ds / (double)net.clos.switches : 0.0, dt,
            net.clos.transceivers ? 100.0 * (double)dt / (double)net.clos.transceivers : 0.0);
    return 0;
}

/* ---- JSON --------------------------------------------------------------------------------- */

static json_t *traffic_json(const ff_plan_traffic *t) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:s, s:s, s:b, s:{s:I, s:I, s:I, s:b}}", "bytes", t->bytes, "bytes_mean",
                     t->bytes_mean, "nvlink_bytes", t->nvlink_bytes, "nic_bytes", t->nic_bytes, "messages", t->messages, "message_bytes",
                     t->message_bytes, "wire_s", t->wire_s, "compute_waits", t->compute_waits, "collective", t->collective ? t->collective : "",
                     "link", ff_plan_link_name(t->link), "rail_aligned", t->group.rail_aligned, "group", "size", (json_int_t)t->group.size,
                     "per_domain", (json_int_t)t->group.per_domain, "domains", (json_int_t)t->group.domains, "regular", t->group.regular);
}

static json_t *fabric_json(const ff_plan_fabric *f) {
    return json_pack("{s:i, s:I, s:I, s:I}", "tiers", f->tiers, "switches", (json_int_t)f->switches, "links", (json_int_t)f->links,
                     "transceivers", (json_int_t)f->transceivers);
}

static json_t *layout_json(const ff_plan_layout *l) {
    json_t *order = json_array();
    for (int i = 0; i < l->n_order; i++) json_array_append_new(order, json_string(ff_plan_dim_name((ff_plan_dim)l->order[i])));
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:i, s:s, s:s, s:b, s:o}", "tp", (json_int_t)l->tp, "cp", (json_int_t)l->cp, "pp",
                     (json_int_t)l->pp, "dp", (json_int_t)l->dp, "ep", (json_int_t)l->ep, "vpp", (json_int_t)l->vpp, "sp",
                     l->sequence_parallel, "zero", l->zero, "zero_schedule",
                     ff_plan_zero_schedule_name(ff_plan_zero_schedule_resolve(l->zero, l->zero_schedule, l->schedule)), "schedule",
                     ff_plan_schedule_name(l->schedule), "checkpoint", l->checkpoint, "order", order);
}

static char *dump(json_t *root) {
    if (!root) {
        ff_error_set("plan", NULL, "could not build the JSON report");
        return NULL;
    }
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (!s) ff_error_set("plan", NULL, "could not print the JSON report");
    return s;
}

char *ff_plan_report_json(const ff_plan_input *in_const, const ff_plan_result *r) {
    ff_plan_input in = *in_const;
    if (ff_plan_resolve(&in)) return NULL;
    const ff_plan_model *m = &in.model;
    const ff_plan_workload *w = &in.workload;
    const ff_plan_cluster *c = &in.cluster;
    json_t *root = json_object();
    json_object_set_new(root, "model",
                        json_pack("{s:s, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:I}", "name", m->name, "params",
                                  r->params_total, "params_active", r->params_active, "layers", (json_int_t)m->layers, "hidden",
                                  (json_int_t)m->hidden, "heads", (json_int_t)m->heads, "kv_heads", (json_int_t)m->kv_heads, "head_dim",
                                  (json_int_t)m->head_dim, "ffn", (json_int_t)m->ffn, "vocab", (json_int_t)m->vocab, "tied_embeddings",
                                  m->tied_embeddings, "experts", (json_int_t)m->experts, "experts_per_token", (json_int_t)m->experts_per_token,
                                  "moe_layers", (json_int_t)m->moe_layers));
    json_object_set_new(root, "workload",
                        json_pack("{s:I, s:I, s:I, s:I, s:f, s:s, s:s}", "seq", (json_int_t)w->seq, "micro_batch", (json_int_t)w->micro_batch,
                                  "micro_batches", (json_int_t)w->micro_batches, "global_batch", (json_int_t)w->global_batch,
                                  "tokens_per_step", r->tokens_per_step, "grad_reduce", w->grad_reduce_bytes == 4 ? "fp32" : "bf16",
                                  "grad_accum", w->grad_bytes == 4 ? "fp32" : "bf16"));
    json_t *layout = layout_json(&in.layout);
    json_t *sl = json_array();
    for (int64_t s = 0; s < r->n_stages; s++) json_array_append_new(sl, json_integer((json_int_t)r->stages[s].layers));
    json_object_set_new(layout, "stage_layers", sl);
    json_object_set_new(root, "layout", layout);
    json_object_set_new(root, "cluster",
                        json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:s, s:f, s:I}", "name", c->name, "gpus", (json_int_t)c->gpus,
                                  "gpus_per_domain", (json_int_t)c->domain, "hbm_bytes", c->hbm_bytes, "nvlink_bps", c->nvlink_bps, "nic_bps",
                                  c->nic_bps, "flops", c->flops, "nvlink_latency_s", c->nvlink_latency_s, "nic_latency_s", c->nic_latency_s,
                                  "topology", c->topology == FF_PLAN_RAIL_ONLY ? "rail-only" : "clos", "oversubscription", c->oversubscription,
                                  "radix", (json_int_t)c->radix));
    json_t *stages = json_array();
    for (int64_t s = 0; s < r->n_stages; s++) {
        const ff_plan_stage *st = &r->stages[s];
        json_array_append_new(stages, json_pack("{s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b, s:f, s:f, s:f}", "layers",
                                                (json_int_t)st->layers, "moe_layers", (json_int_t)st->moe_layers, "params", st->params,
                                                "state_bytes", st->state_bytes, "state_peak_bytes", st->state_peak_bytes, "in_flight",
                                                st->in_flight, "activation_bytes", st->activation_bytes, "buffer_bytes", st->buffer_bytes,
                                                "total_bytes", st->total_bytes, "fits", st->total_bytes <= c->hbm_bytes, "time_mb_s",
                                                st->time_mb, "nvlink_bytes", st->nvlink_bytes, "nic_bytes", st->nic_bytes));
    }
    json_object_set_new(root, "memory",
                        json_pack("{s:f, s:f, s:f, s:f, s:I, s:f, s:b, s:o}", "state_bytes", r->memory.state_bytes, "state_peak_bytes",
                                  r->memory.state_peak_bytes, "activation_bytes", r->memory.activation_bytes, "total_bytes",
                                  r->memory.total_bytes, "worst_stage", (json_int_t)r->memory.worst_stage, "hbm_bytes", r->memory.hbm_bytes,
                                  "fits", r->memory.fits, "stages", stages));
    json_t *traffic = json_object();
    for (int d = 0; d < FF_PLAN_NDIMS; d++) json_object_set_new(traffic, ff_plan_dim_name((ff_plan_dim)d), traffic_json(&r->traffic[d]));
    json_object_set_new(root, "traffic", traffic);
    const ff_plan_time *t = &r->time;
    json_object_set_new(root, "time",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "compute_s", t->compute_s,
                                  "flops_dense_mean", t->flops_dense_mean, "nvlink_bytes", t->nvlink_bytes, "nic_bytes", t->nic_bytes,
                                  "nvlink_bytes_mean", t->nvlink_bytes_mean, "nic_bytes_mean", t->nic_bytes_mean, "nvlink_s", t->nvlink_s,
                                  "nic_s", t->nic_s, "bubble_fraction", t->bubble_fraction, "bubble_of_compute", t->bubble_of_compute,
                                  "bubble_s", t->bubble_s, "last_s", t->last_s, "sync_s", t->sync_s, "iteration_s", t->iteration_s,
                                  "tokens_per_s", t->tokens_per_s, "compute_fraction", t->compute_fraction));
    ff_plan_network net;
    if (!ff_plan_network_cost(c->gpus, c->domain, c->radix, &net))
        json_object_set_new(root, "network",
                            json_pack("{s:o, s:o, s:b}", "clos", fabric_json(&net.clos), "rail_only", fabric_json(&net.rail_only),
                                      "cross_domain_on_rails", r->cross_domain_on_rails));
    return dump(root);
}

/* ---- search ------------------------------------------------------------------------------- */

void ff_plan_search_write(const ff_plan_input *base, const ff_plan_search_result *r, FILE *out) {
    char s1[32], s2[32], s3[32];
    fprintf(out, "fuseflow plan search: %s on %lld GPUs (%s HBM each), seq %lld\n", base->model.name, (long long)base->cluster.gpus,
            bytes_str(base->cluster.hbm_bytes, s1, sizeof s1), (long long)base->workload.seq);
    fprintf(out, "%zu layouts evaluated in %s (%s per second), %zu fit in memory; ranked by the estimated step time\n\n", r->evaluated,
            secs_str(r->elapsed_s, s1, sizeof s1), count_str(r->elapsed_s > 0 ? (double)r->evaluated / r->elapsed_s : 0.0, s2, sizeof s2),
            r->fitting);
    if (!r->n_best) {
        fprintf(out, "no layout fits: use more GPUs, a shorter sequence, or also try recomputation (--try-checkpoint)\n");
        return;
    }
    fprintf(out, "  #  %-26s %-16s %3s %5s %7s %-5s %-5s %9s %9s %7s %10s\n", "layout", "schedule", "b", "G", "tok/GPU", "ZeRO", "ckpt", "memory",
            "step", "bubble", "tokens/s");
    for (size_t i = 0; i < r->n_best; i++) {
        const ff_plan_candidate *c = &r->best[i];
        char lay[64], sch[32];
        snprintf(lay, sizeof lay, "TP%lld CP%lld PP%lld DP%lld EP%lld", (long long)c->layout.tp, (long long)c->layout.cp, (long long)c->layout.pp,
                 (long long)c->layout.dp, (long long)c->layout.ep);
        if (c->layout.schedule == FF_PLAN_INTERLEAVED) snprintf(sch, sizeof sch, "interleaved v=%lld", (long long)c->layout.vpp);
        else snprintf(sch, sizeof sch, "%s", ff_plan_schedule_name(c->layout.schedule));
        fprintf(out, "%3zu  %-26s %-16s %3lld %5lld %7lld %-5d %-5s %9s %9s %6.1f%% %10s\n", i + 1, lay, sch, (long long)c->micro_batch,
                (long long)c->micro_batches, (long long)(c->micro_batch * base->workload.seq / c->layout.cp), c->layout.zero,
                c->layout.checkpoint ? "full" : "no", bytes_str(c->total_bytes, s1, sizeof s1), secs_str(c->iteration_s, s2, sizeof s2),
                100 * c->bubble_fraction, count_str(c->tokens_per_s, s3, sizeof s3));
    }
}

char *ff_plan_network_json(const ff_plan_cluster *c) {
    ff_plan_network net;
    if (ff_plan_network_cost(c->gpus, c->domain, c->radix, &net)) return NULL;
    return dump(json_pack("{s:I, s:I, s:I, s:o, s:o}", "gpus", (json_int_t)c->gpus, "gpus_per_domain", (json_int_t)c->domain, "radix",
                          (json_int_t)c->radix, "clos", fabric_json(&net.clos), "rail_only", fabric_json(&net.rail_only)));
}

char *ff_plan_search_json(const ff_plan_input *base, const ff_plan_search_result *r) {
    json_t *root = json_object();
    json_object_set_new(root, "model", json_string(base->model.name));
    json_object_set_new(root, "gpus", json_integer((json_int_t)base->cluster.gpus));
    json_object_set_new(root, "evaluated", json_integer((json_int_t)r->evaluated));
    json_object_set_new(root, "fitting", json_integer((json_int_t)r->fitting));
    json_object_set_new(root, "elapsed_s", json_real(r->elapsed_s));
    json_t *arr = json_array();
    for (size_t i = 0; i < r->n_best; i++) {
        const ff_plan_candidate *c = &r->best[i];
        json_t *o = layout_json(&c->layout);
        json_object_set_new(o, "micro_batch", json_integer((json_int_t)c->micro_batch));
        json_object_set_new(o, "micro_batches", json_integer((json_int_t)c->micro_batches));
        json_object_set_new(o, "iteration_s", json_real(c->iteration_s));
        json_object_set_new(o, "total_bytes", json_real(c->total_bytes));
        json_object_set_new(o, "bubble_fraction", json_real(c->bubble_fraction));
        json_object_set_new(o, "tokens_per_s", json_real(c->tokens_per_s));
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "candidates", arr);
    return dump(root);
}

/* Planner resharding: the bytes each rank receives, its peak weight memory and the time of the
 * transition of an actor that trains in layout (p, t, d) and generates in (pg, tg) - the
 * 3D-HybridEngine of HybridFlow (seeds/003) beside the naive full gather and the "gather to rank 0,
 * broadcast" sync - and the transfer plan to a separate generation pool. docs/planner.md,
 * "Resharding (3D-HybridEngine)", gives the rank mapping and the byte counts.
 * Not here: moving any weight (the planner never runs anything), latency per message, overlap
 * with compute, or the uneven share of the embedding and LM head (weights are spread evenly over
 * layers and columns). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/plan/plan_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

void ff_plan_reshard_input_defaults(ff_plan_reshard_input *in) {
    memset(in, 0, sizeof *in);
    ff_plan_input d;
    ff_plan_input_defaults(&d);
    in->train = d.layout;
    in->train.dp = 0; /* from the GPU count */
    in->cluster = d.cluster;
    in->cluster.gpus = 0; /* from the training degrees */
    in->gen_tp = 1, in->gen_pp = 1;
    in->dtype_bytes = 2;
}

/* The model's constraints on one layout of (tp, pp), as ff_plan_resolve states them. */
static int check_layout(const ff_plan_model *m, int64_t tp, int64_t pp, const char *what) {
    if (tp < 1 || pp < 1)
        return ff_error_set(what, "degrees are positive", "TP %lld, PP %lld", (long long)tp, (long long)pp);
    if (m->heads % tp)
        return ff_error_set(what, "choose TP dividing the query heads", "TP %lld does not divide the %lld query heads of %s",
                            (long long)tp, (long long)m->heads, m->name);
    if (m->kv_heads % tp && tp % m->kv_heads)
        return ff_error_set(what, "choose TP dividing the key-value heads, or a multiple of them",
                            "TP %lld and the %lld key-value heads of %s: neither divides the other", (long long)tp,
                            (long long)m->kv_heads, m->name);
    if (m->ffn % tp)
        return ff_error_set(what, NULL, "TP %lld does not divide the FFN size %lld of %s", (long long)tp, (long long)m->ffn,
                            m->name);
    if (m->vocab_unpadded && m->vocab % tp)
        return ff_error_set(what, "choose TP dividing the vocabulary", "TP %lld does not divide the vocabulary of %lld tokens",
                            (long long)tp, (long long)m->vocab);
    if (pp > m->layers)
        return ff_error_set(what, "use fewer stages", "PP %lld has more stages than the %lld layers of %s", (long long)pp,
                            (long long)m->layers, m->name);
    return 0;
}

/* One gather over groups of ranks: every rank of a group holds `shard` bytes and (root < 0)
 * receives every other member's shard, or (root >= 0) only the member with group index `root`
 * does. A group is the ranks whose TP coordinate lies in [tp0, tp0 + nt) and PP coordinate in
 * [pp0, pp0 + np) for every (tp0, pp0) on the grid of steps nt, np, at each outer coordinate.
 * The time of the slowest group: the hierarchical all-gather (rail-only paper) when every domain
 * of the group holds the same number of members, else each member's receive from its own domain
 * over NVLink and from the others over its NIC. */
typedef struct gather {
    double bytes, nvlink, nic, time;
    int64_t per_domain, domains;
} gather;

static int gather_groups(const rankmap *rm, const ff_plan_cluster *c, int64_t nt, int64_t np, double shard, bool to_root,
                         gather *out) {
    int64_t n = nt * np;
    int64_t *srv = ff_malloc((size_t)n * sizeof *srv);
    int64_t *cnt = ff_malloc((size_t)n * sizeof *cnt);
    if (!srv || !cnt) {
        free(srv), free(cnt);
        return -1;
    }
    memset(out, 0, sizeof *out);
    for (int64_t r = 0; r < rm->gpus; r++) {
        int64_t idx[F_N];
        rankmap_coords(rm, r, idx);
        if (idx[F_TP] % nt || idx[F_PP] % np) continue; /* not a group's first member */
        for (int64_t b = 0; b < np; b++)
            for (int64_t a = 0; a < nt; a++) {
                int64_t j[F_N];
                memcpy(j, idx, sizeof j);
                j[F_TP] += a, j[F_PP] += b;
                srv[b * nt + a] = rankmap_rank(rm, j) / c->domain;
            }
        /* members in each member's domain, and the domains */
        int64_t domains = 0, amin = n, amax = 0;
        for (int64_t i = 0; i < n; i++) {
            cnt[i] = 0;
            bool first = true;
            for (int64_t k = 0; k < n; k++) {
                if (srv[k] == srv[i]) cnt[i]++;
                if (k < i && srv[k] == srv[i]) first = false;
            }
            if (first) domains++;
            if (cnt[i] < amin) amin = cnt[i];
            if (cnt[i] > amax) amax = cnt[i];
        }
        gather g = {0};
        g.domains = domains, g.per_domain = amax;
        for (int64_t i = 0; i < n; i++) {
            if (to_root && i != 0) continue;
            double nv, nic, t;
            if (!to_root && amin == amax) { /* a grid: rails first, then inside the domain */
                nic = (double)(domains - 1) * shard;
                nv = (double)(amax - 1) * (double)domains * shard;
                t = ff_plan_hier_allgather_s(amax, domains, shard, c->nvlink_bps, c->nic_bps);
            } else {
                nv = (double)(cnt[i] - 1) * shard;
                nic = (double)(n - cnt[i]) * shard;
                t = nv / c->nvlink_bps + nic / c->nic_bps;
            }
            if (t > g.time) g.time = t;
            if (nv + nic > g.bytes) g.bytes = nv + nic, g.nvlink = nv, g.nic = nic;
        }
        if (g.time > out->time || (g.time == out->time && g.bytes > out->bytes)) *out = g;
    }
    free(srv);
    free(cnt);
    return 0;
}

static ff_plan_reshard_path path(double recv, double nvlink, double nic, double peak, double time_s) {
    return (ff_plan_reshard_path){.recv_bytes = recv, .nvlink_bytes = nvlink, .nic_bytes = nic, .peak_bytes = peak, .time_s = time_s};
}

/* Training TP/PP ranks whose shard overlaps the generation shard j of ng, for t training shards
 * of the same axis (columns or layers, spread evenly). */
static int64_t overlaps(int64_t t, int64_t ng, int64_t j) {
    int64_t n = 0;
    for (int64_t i = 0; i < t; i++)
        if (i * ng < (j + 1) * t && j * t < (i + 1) * ng) n++;
    return n;
}

int ff_plan_reshard_evaluate(const ff_plan_reshard_input *in, ff_plan_reshard *out) {
    memset(out, 0, sizeof *out);
    const ff_plan_model *m = &in->model;
    if (m->layers <= 0 || m->hidden <= 0)
        return ff_error_set("model", "choose a preset (--model) or read a config.json (--config)", "no model");
    if (in->dtype_bytes != 2 && in->dtype_bytes != 4)
        return ff_error_set("dtype", "use bf16 or fp32", "weights of %d bytes", in->dtype_bytes);
    ff_plan_input pi;
    ff_plan_input_defaults(&pi);
    pi.model = *m;
    pi.cluster = in->cluster;
    pi.layout = in->train;
    ff_plan_layout *l = &pi.layout;
    if (l->cp != 1 || l->ep != 1 || l->vpp != 1)
        return ff_error_set("train", "give TP, PP and DP only", "resharding models TP, PP and DP (got CP %lld, EP %lld, VPP %lld)",
                            (long long)l->cp, (long long)l->ep, (long long)l->vpp);
    if (pi.cluster.gpus <= 0) pi.cluster.gpus = l->tp * l->pp * (l->dp > 0 ? l->dp : 1);
    if (ff_plan_layout_fit(l, pi.cluster.gpus)) return -1;
    if (pi.cluster.domain < 1) return ff_error_set("cluster", NULL, "GPUs per HB domain must be positive");
    if (!(pi.cluster.nvlink_bps > 0) || !(pi.cluster.nic_bps > 0))
        return ff_error_set("cluster", NULL, "NVLink and NIC bandwidths must be positive");
    if (check_layout(m, l->tp, l->pp, "train")) return -1;
    int64_t t = l->tp, p = l->pp, tg = in->gen_tp, pg = in->gen_pp;
    if (check_layout(m, tg, pg, "gen")) return -1;
    bool pool = in->gen_workers > 0;
    if (!pool) {
        if ((t * p) % (tg * pg))
            return ff_error_set("gen", "on the training GPUs, generation's TP x PP divides training's (or use --gen-workers)",
                                "generation TP %lld x PP %lld = %lld does not divide training TP %lld x PP %lld = %lld",
                                (long long)tg, (long long)pg, (long long)(tg * pg), (long long)t, (long long)p,
                                (long long)(t * p));
        if (t % tg || p % pg)
            return ff_error_set("gen", "the training shard is reused in place only when generation's TP divides training's "
                                       "and its PP divides training's (or use --gen-workers)",
                                "generation TP %lld / PP %lld against training TP %lld / PP %lld", (long long)tg,
                                (long long)pg, (long long)t, (long long)p);
    } else if (in->gen_workers % (tg * pg)) {
        return ff_error_set("gen-workers", "give a multiple of generation's TP x PP",
                            "%lld generation GPUs are not whole replicas of TP %lld x PP %lld", (long long)in->gen_workers,
                            (long long)tg, (long long)pg);
    }

    const ff_plan_cluster *c = &pi.cluster;
    double M = ff_plan_params_total(m) * in->dtype_bytes;
    double train_shard = M / (double)(t * p), gen_shard = M / (double)(tg * pg);
    out->model_bytes = M;
    out->train_shard_bytes = train_shard;
    out->gen_shard_bytes = gen_shard;
    out->train_dp = l->dp;
    out->gpus = c->gpus;
    rankmap rm;
    rankmap_build(&pi, &rm);
    gather g;

    /* the naive full gather: every rank of a replica gathers the whole model, then slices */
    if (gather_groups(&rm, c, t, p, train_shard, false, &g)) return -1;
    out->naive = path(g.bytes, g.nvlink, g.nic, M, g.time);
    /* rank 0 gathers the whole model, then broadcasts it (a pipelined chain: M over the slowest
     * link it crosses) to the other t p - 1 ranks, each then slicing its generation shard */
    if (gather_groups(&rm, c, t, p, train_shard, true, &g)) return -1;
    bool crosses = g.domains > 1;
    double bcast = t * p > 1 ? M : 0;
    out->rank0 = path(g.bytes > bcast ? g.bytes : bcast, crosses ? 0 : bcast, crosses ? bcast : 0, M,
                      g.time + bcast / (crosses ? c->nic_bps : c->nvlink_bps));

    if (!pool) {
        /* 3D-HybridEngine: micro-DP groups of dg = (t/tg)(p/pg) neighbouring ranks */
        int64_t nt = t / tg, np = p / pg;
        out->micro_dp = nt * np;
        if (gather_groups(&rm, c, nt, np, train_shard, false, &g)) return -1;
        out->hybrid = path(g.bytes, g.nvlink, g.nic, gen_shard, g.time);
        out->group_per_domain = g.per_domain;
        out->group_domains = g.domains;
    } else {
        /* a separate pool: each generation rank receives its shard, over its NIC, from the
         * training ranks holding it; the replicas' demand is spread over the d training replicas */
        int64_t replicas = in->gen_workers / (tg * pg);
        out->pool_senders = overlaps(t, tg, 0) * overlaps(p, pg, 0);
        for (int64_t j = 0; j < tg; j++)
            for (int64_t q = 0; q < pg; q++) {
                int64_t s = overlaps(t, tg, j) * overlaps(p, pg, q);
                if (s > out->pool_senders) out->pool_senders = s;
            }
        double send = (double)replicas * train_shard / (double)l->dp;
        double wire = gen_shard > send ? gen_shard : send;
        out->pool = path(gen_shard, 0, gen_shard, gen_shard, wire / c->nic_bps);
        out->pool_send_bytes = send;
        out->pool_replicas = replicas;
    }
    return 0;
}

static double gb(double b) { return b / 1e9; }

static void path_line(FILE *f, const char *name, const ff_plan_reshard_path *p) {
    fprintf(f, "  %-28s %10.3f GB  (%8.3f NVLink, %8.3f NIC)  peak %9.3f GB  %9.3f s\n", name, gb(p->recv_bytes),
            gb(p->nvlink_bytes), gb(p->nic_bytes), gb(p->peak_bytes), p->time_s);
}

void ff_plan_reshard_write(const ff_plan_reshard_input *in, const ff_plan_reshard *r, FILE *f) {
    const ff_plan_layout *l = &in->train;
    fprintf(f, "resharding %s (%.3f GB of %s weights) on %lld GPUs of %s (%lld per domain, NVLink %.0f GB/s, NIC %.0f GB/s)\n",
            in->model.name, gb(r->model_bytes), in->dtype_bytes == 2 ? "bf16" : "fp32", (long long)r->gpus,
            in->cluster.name, (long long)in->cluster.domain, in->cluster.nvlink_bps / 1e9, in->cluster.nic_bps / 1e9);
    fprintf(f, "  train TP%lld-PP%lld-DP%lld: %.3f GB per rank; generate TP%lld-PP%lld: %.3f GB per rank\n", (long long)l->tp,
            (long long)l->pp, (long long)r->train_dp, gb(r->train_shard_bytes), (long long)in->gen_tp, (long long)in->gen_pp,
            gb(r->gen_shard_bytes));
    if (in->gen_workers > 0) {
        fprintf(f, "  separate pool of %lld GPUs (%lld replicas): each generation rank receives its %.3f GB from %lld "
                   "training ranks; each training rank sends %.3f GB\n",
                (long long)in->gen_workers, (long long)r->pool_replicas, gb(r->gen_shard_bytes), (long long)r->pool_senders,
                gb(r->pool_send_bytes));
    } else {
        fprintf(f, "  micro-DP %lld: groups of %lld neighbouring ranks, %lld per domain over %lld domain%s\n",
                (long long)r->micro_dp, (long long)r->micro_dp, (long long)r->group_per_domain, (long long)r->group_domains,
                r->group_domains == 1 ? "" : "s");
    }
    fprintf(f, "  %-28s %13s  %30s  %14s  %11s\n", "per rank", "received", "", "weights", "time");
    if (in->gen_workers > 0) path_line(f, "pool transfer", &r->pool);
    else path_line(f, "3D-HybridEngine", &r->hybrid);
    path_line(f, "naive full gather", &r->naive);
    path_line(f, "gather to rank 0, broadcast", &r->rank0);
    const ff_plan_reshard_path *best = in->gen_workers > 0 ? &r->pool : &r->hybrid;
    if (best->time_s > 0)
        fprintf(f, "  naive / %s: %.2fx the time, %.2fx the bytes\n", in->gen_workers > 0 ? "pool" : "3D-HybridEngine",
                r->naive.time_s / best->time_s, r->naive.recv_bytes / best->recv_bytes);
    fprintf(f, "  (bandwidth only: no per-message latency, no per-tensor launch cost, no overlap)\n");
}

static json_t *path_json(const ff_plan_reshard_path *p) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f}", "recv_bytes", p->recv_bytes, "nvlink_bytes", p->nvlink_bytes, "nic_bytes",
                     p->nic_bytes, "peak_bytes", p->peak_bytes, "time_s", p->time_s);
}

char *ff_plan_reshard_json(const ff_plan_reshard_input *in, const ff_plan_reshard *r) {
    json_t *root = json_pack("{s:s, s:s, s:I, s:i, s:f, s:{s:I, s:I, s:I, s:f}, s:{s:I, s:I, s:f, s:I}, s:o, s:o}", "model",
                             in->model.name, "cluster", in->cluster.name, "gpus", (json_int_t)r->gpus, "dtype_bytes",
                             in->dtype_bytes, "model_bytes", r->model_bytes, "train", "tp", (json_int_t)in->train.tp, "pp",
                             (json_int_t)in->train.pp, "dp", (json_int_t)r->train_dp, "shard_bytes", r->train_shard_bytes, "gen",
                             "tp", (json_int_t)in->gen_tp, "pp", (json_int_t)in->gen_pp, "shard_bytes", r->gen_shard_bytes,
                             "workers", (json_int_t)in->gen_workers, "naive", path_json(&r->naive), "rank0",
                             path_json(&r->rank0));
    if (root && in->gen_workers > 0) {
        json_object_set_new(root, "pool", path_json(&r->pool));
        json_object_set_new(root, "pool_senders", json_integer((json_int_t)r->pool_senders));
        json_object_set_new(root, "pool_send_bytes", json_real(r->pool_send_bytes));
    } else if (root) {
        json_object_set_new(root, "hybrid", path_json(&r->hybrid));
        json_object_set_new(root, "micro_dp", json_integer((json_int_t)r->micro_dp));
        json_object_set_new(root, "group_per_domain", json_integer((json_int_t)r->group_per_domain));
        json_object_set_new(root, "group_domains", json_integer((json_int_t)r->group_domains));
    }
    if (!root) {
        ff_error_set("plan reshard", NULL, "could not build the JSON report");
        return NULL;
    }
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (!s) ff_error_set("plan reshard", NULL, "could not print the JSON report");
    return s;
}

/* Ranks on the cluster: how a rank number splits into parallel coordinates for a rank order,
 * which HB domain (server), local rank and rail each GPU has, where the groups of each dimension
 * sit, and every GPU-to-GPU flow of one step (the traffic matrix). Not here: the byte counts per
 * dimension (plan_eval.c), the files (plan_matrix.c). */
#include <stdlib.h>
#include <string.h>

#include "dataflow/plan/plan_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

void rankmap_build(const ff_plan_input *in, rankmap *m) {
    const ff_plan_layout *l = &in->layout;
    memset(m, 0, sizeof *m);
    bool ep_listed = false;
    for (int i = 0; i < l->n_order; i++)
        if (l->order[i] == FF_PLAN_EP) ep_listed = true;
    int n = 0;
    int64_t ep = l->ep > 0 ? l->ep : 1, dp = l->dp > 0 ? l->dp : 1;
    for (int i = 0; i < l->n_order && n < F_N; i++) {
        switch (l->order[i]) {
        case FF_PLAN_TP: m->kind[n] = F_TP, m->deg[n++] = l->tp; break;
        case FF_PLAN_CP: m->kind[n] = F_CP, m->deg[n++] = l->cp; break;
        case FF_PLAN_PP: m->kind[n] = F_PP, m->deg[n++] = l->pp; break;
        case FF_PLAN_EP: m->kind[n] = F_EP, m->deg[n++] = ep; break;
        case FF_PLAN_DP:
            if (!ep_listed && n < F_N) m->kind[n] = F_EP, m->deg[n++] = ep;
            if (n < F_N) m->kind[n] = F_EDP, m->deg[n++] = dp / ep;
            break;
        default: break;
        }
    }
    m->n = n;
    int64_t s = 1;
    for (int k = 0; k < F_N; k++) m->at[k] = -1;
    for (int i = 0; i < n; i++) {
        m->stride[i] = s;
        s *= m->deg[i];
        m->at[m->kind[i]] = i;
    }
    m->gpus = s;
    m->domain = in->cluster.domain;
}

void rankmap_coords(const rankmap *m, int64_t rank, int64_t idx[F_N]) {
    for (int k = 0; k < F_N; k++) idx[k] = 0;
    for (int i = 0; i < m->n; i++) idx[m->kind[i]] = (rank / m->stride[i]) % m->deg[i];
}

int64_t rankmap_rank(const rankmap *m, const int64_t idx[F_N]) {
    int64_t r = 0;
    for (int i = 0; i < m->n; i++) r += idx[m->kind[i]] * m->stride[i];
    return r;
}

bool rankmap_regular(const rankmap *m) {
    int64_t x = m->domain;
    if (m->gpus <= x) return true;
    if (m->gpus % x) return false;
    for (int i = 0; i < m->n; i++) {
        int64_t s = m->stride[i], n = m->deg[i];
        if (n == 1) continue;
        if (x % (s * n) == 0 || s % x == 0) continue;
        if (x % s == 0 && (s * n) % x == 0) continue;
        return false;
    }
    return true;
}

unsigned group_kinds(int g) {
    switch (g) {
    case G_TP: return 1u << F_TP;
    case G_CP: return 1u << F_CP;
    case G_EP: return 1u << F_EP;
    case G_DPD: return (1u << F_CP) | (1u << F_EP) | (1u << F_EDP);
    case G_DPE: return (1u << F_CP) | (1u << F_EDP);
    default: return 0;
    }
}

void group_stat_fast(const rankmap *m, unsigned kinds, gstat *out) {
    int64_t local = 1, remote = 1, x = m->domain;
    bool one_domain = m->gpus <= x;
    for (int i = 0; i < m->n; i++) {
        if (!(kinds & (1u << m->kind[i])) || m->deg[i] == 1) continue;
        int64_t s = m->stride[i], n = m->deg[i];
        if (one_domain || x % (s * n) == 0) local *= n;
        else if (s % x == 0) remote *= n;
        else local *= x / s, remote *= s * n / x;
    }
    memset(out, 0, sizeof *out);
    out->n = local * remote;
    out->a = out->min_count = out->max_count = local;
    out->y = remote;
    out->grid = true;
    out->rail = true;
}

/* Visit every group: members in increasing rank order, so each domain's members come as one run. */
void group_stat_exact(const rankmap *m, unsigned kinds, gstat *out) {
    int gf[F_N], ng = 0;
    int64_t n = 1;
    for (int i = 0; i < m->n; i++)
        if ((kinds & (1u << m->kind[i])) && m->deg[i] > 1) gf[ng++] = i, n *= m->deg[i];
    memset(out, 0, sizeof *out);
    out->n = n;
    out->grid = true;
    out->rail = true;
    out->min_count = n;
    out->max_count = 0;
    out->a = n;
    out->y = 1;
    if (n == 1) {
        out->min_count = out->max_count = 1;
        return;
    }
    int64_t x = m->domain;
    int64_t *first_run = malloc(sizeof(int64_t) * (size_t)(n < x ? n : x) + sizeof(int64_t));
    if (!first_run) return; /* stays the conservative all-in-one answer only on OOM */
    int64_t worst_y = 0;
    bool worst_set = false;
    for (int64_t base = 0; base < m->gpus; base++) {
        bool is_base = true;
        for (int j = 0; j < ng && is_base; j++)
            if ((base / m->stride[gf[j]]) % m->deg[gf[j]]) is_base = false;
        if (!is_base) continue;
        int64_t k[F_N] = {0};
        int64_t dom = -1, count = 0, domains = 0, first_len = 0, run_pos = 0;
        bool same_pattern = true, uniform = true, one_local = true;
        int64_t first_local = base % x, gmin = n, gmax = 0, first_count = -1;
        for (int64_t it = 0; it < n; it++) {
            int64_t r = base;
            for (int j = 0; j < ng; j++) r += k[j] * m->stride[gf[j]];
            int64_t d = r / x, loc = r % x;
            if (loc != first_local) one_local = false;
            if (d != dom) {
                if (count) {
                    if (first_count < 0) first_count = count, first_len = count;
                    else if (count != first_count) uniform = false;
                    if (count < gmin) gmin = count;
                    if (count > gmax) gmax = count;
                }
                dom = d, count = 0, domains++, run_pos = 0;
            }
            if (domains == 1) first_run[count] = loc;
            else if (run_pos >= first_len || first_run[run_pos] != loc) same_pattern = false;
            count++, run_pos++;
            for (int j = 0; j < ng; j++) { /* innermost factor fastest: ranks increase */
                if (++k[j] < m->deg[gf[j]]) break;
                k[j] = 0;
            }
        }
        if (first_count < 0) first_count = count, first_len = count;
        else if (count != first_count) uniform = false;
        if (count < gmin) gmin = count;
        if (count > gmax) gmax = count;
        if (gmin < out->min_count) out->min_count = gmin;
        if (gmax > out->max_count) out->max_count = gmax;
        bool grid = uniform && same_pattern;
        if (!grid) out->grid = false;
        bool rail = domains == 1 || grid || (gmax == 1 && one_local);
        if (!rail) out->rail = false;
        if (!worst_set || domains > worst_y) {
            worst_set = true;
            worst_y = domains;
            out->y = domains;
            out->a = grid ? n / domains : gmax;
        }
    }
    free(first_run);
    if (!out->grid) {
        /* even spread: the rail flag says whether every cross pair shares a local rank */
        out->a = out->max_count;
    }
}

static bool pair_flags(const rankmap *m, int64_t r1, int64_t r2, bool *rail) {
    int64_t x = m->domain;
    bool cross = r1 / x != r2 / x;
    *rail = !cross || r1 % x == r2 % x;
    return cross;
}

void pp_links(const rankmap *m, bool exact, pplink *out) {
    int f = m->at[F_PP];
    int64_t p = f >= 0 ? m->deg[f] : 1;
    for (int64_t s = 0; s < p; s++) {
        pplink *o = &out[s];
        o->next_cross = o->prev_cross = false;
        o->next_rail = o->prev_rail = true;
        if (p == 1 || m->gpus <= m->domain) continue;
        int64_t nxt = (s + 1) % p, prv = (s + p - 1) % p;
        if (!exact) {
            int64_t r = s * m->stride[f];
            o->next_cross = pair_flags(m, r, nxt * m->stride[f], &o->next_rail);
            o->prev_cross = pair_flags(m, r, prv * m->stride[f], &o->prev_rail);
            continue;
        }
        for (int64_t r = 0; r < m->gpus; r++) {
            if ((r / m->stride[f]) % p != s) continue;
            int64_t rn = r + (nxt - s) * m->stride[f], rp = r + (prv - s) * m->stride[f];
            bool rail;
            if (pair_flags(m, r, rn, &rail)) {
                o->next_cross = true;
                if (!rail) o->next_rail = false;
            }
            if (pair_flags(m, r, rp, &rail)) {
                o->prev_cross = true;
                if (!rail) o->prev_rail = false;
            }
        }
    }
}

/* ---- public: coordinates and flows ------------------------------------------------------ */

void ff_plan_rank_coords(const ff_plan_input *in_const, int64_t rank, ff_plan_rank *out) {
    ff_plan_input in_copy = *in_const;
    ff_plan_input *in = &in_copy;
    ff_plan_layout *l = &in->layout;
    if (l->dp <= 0 && l->tp > 0 && l->cp > 0 && l->pp > 0) l->dp = in->cluster.gpus / (l->tp * l->cp * l->pp); /* as resolving does */
    if (l->ep < 1) l->ep = 1;
    if (l->dp < 1) l->dp = 1;
    rankmap m;
    rankmap_build(in, &m);
    int64_t idx[F_N];
    rankmap_coords(&m, rank, idx);
    memset(out, 0, sizeof *out);
    out->rank = rank;
    out->server = rank / in->cluster.domain;
    out->local_rank = rank % in->cluster.domain;
    out->rail = out->local_rank; /* rail r joins local rank r of every domain */
    out->stage = idx[F_PP];
    out->idx[FF_PLAN_TP] = idx[F_TP];
    out->idx[FF_PLAN_CP] = idx[F_CP];
    out->idx[FF_PLAN_PP] = idx[F_PP];
    out->idx[FF_PLAN_EP] = idx[F_EP];
    out->idx[FF_PLAN_DP] = idx[F_EP] + (in->layout.ep > 0 ? in->layout.ep : 1) * idx[F_EDP];
}

/* Spread `bytes` of one GPU over its group: the hierarchical pattern (y D to each member of its
 * domain, D to each same-rail member elsewhere) on a grid, else evenly. */
static void spread(const rankmap *m, int64_t src, unsigned kinds, const gstat *g, bool hier, ff_plan_dim dim, double bytes,
                   ff_plan_edge_fn fn, void *ctx) {
    if (g->n <= 1 || bytes <= 0) return;
    int gf[F_N], ng = 0;
    for (int i = 0; i < m->n; i++)
        if ((kinds & (1u << m->kind[i])) && m->deg[i] > 1) gf[ng++] = i;
    int64_t base = src;
    for (int j = 0; j < ng; j++) base -= ((src / m->stride[gf[j]]) % m->deg[gf[j]]) * m->stride[gf[j]];
    int64_t x = m->domain, k[F_N] = {0};
    double unit = bytes / (double)(g->n - 1);
    for (int64_t it = 0; it < g->n; it++) {
        int64_t r = base;
        for (int j = 0; j < ng; j++) r += k[j] * m->stride[gf[j]];
        for (int j = 0; j < ng; j++) {
            if (++k[j] < m->deg[gf[j]]) break;
            k[j] = 0;
        }
        if (r == src) continue;
        double b = unit;
        if (hier && g->grid && g->y > 1) {
            if (r / x == src / x) b = unit * (double)g->y;
            else if (r % x == src % x) b = unit;
            else b = 0;
        }
        if (b > 0) fn(src, r, dim, b, ctx);
    }
}

int ff_plan_traffic_edges(const ff_plan_input *in_const, const ff_plan_result *r, ff_plan_edge_fn fn, void *ctx) {
    ff_plan_input in_copy = *in_const;
    ff_plan_input *in = &in_copy;
    if (ff_plan_resolve(in)) return -1;
    if (!r->stages || r->n_stages != in->layout.pp || r->gpus != in->cluster.gpus)
        return ff_error_set("plan", "evaluate the plan first", "no per-stage results of this layout to draw flows from");
    rankmap m;
    rankmap_build(in, &m);
    gstat g[G_N];
    bool regular = rankmap_regular(&m);
    for (int i = 0; i < G_N; i++) {
        if (regular) group_stat_fast(&m, group_kinds(i), &g[i]);
        else group_stat_exact(&m, group_kinds(i), &g[i]);
    }
    const ff_plan_layout *l = &in->layout;
    int64_t p = l->pp, v = l->vpp > 0 ? l->vpp : 1, G = r->micro_batches;
    int fpp = m.at[F_PP];
    double msg = in->workload.micro_batch * ((double)in->workload.seq / (double)l->cp) * (double)in->model.hidden * 2.0 / (double)l->tp;
    for (int64_t src = 0; src < m.gpus; src++) {
        int64_t idx[F_N];
        rankmap_coords(&m, src, idx);
        const ff_plan_stage *st = &r->stages[idx[F_PP]];
        spread(&m, src, group_kinds(G_TP), &g[G_TP], true, FF_PLAN_TP, st->traffic[FF_PLAN_TP], fn, ctx);
        spread(&m, src, group_kinds(G_CP), &g[G_CP], true, FF_PLAN_CP, st->traffic[FF_PLAN_CP], fn, ctx);
        spread(&m, src, group_kinds(G_EP), &g[G_EP], false, FF_PLAN_EP, st->traffic[FF_PLAN_EP], fn, ctx);
        double dense, expert;
        stage_dp_bytes(in, st, &dense, &expert);
        spread(&m, src, group_kinds(G_DPD), &g[G_DPD], true, FF_PLAN_DP, dense, fn, ctx);
        spread(&m, src, group_kinds(G_DPE), &g[G_DPE], true, FF_PLAN_DP, expert, fn, ctx);
        if (p > 1) {
            int64_t s = idx[F_PP];
            int64_t nfwd = s < p - 1 ? v : v - 1, nbwd = s > 0 ? v : v - 1;
            int64_t nxt = (s + 1) % p, prv = (s + p - 1) % p;
            if (nfwd > 0) fn(src, src + (nxt - s) * m.stride[fpp], FF_PLAN_PP, (double)(G * nfwd) * msg, ctx);
            if (nbwd > 0) fn(src, src + (prv - s) * m.stride[fpp], FF_PLAN_PP, (double)(G * nbwd) * msg, ctx);
        }
    }
    return 0;
}

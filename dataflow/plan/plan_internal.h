/* Planner internals shared by plan_eval.c, plan_rank.c and plan_search.c: the rank map (how a
 * rank number splits into TP, CP, PP, EP and outer-DP coordinates), where a group of ranks sits
 * on the HB domains, and the per-layout values that a search can compute once and reuse.
 * Not a public API. */
#ifndef FF_PLAN_INTERNAL_H
#define FF_PLAN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/plan.h"

/* Factors of the rank number, innermost first. DP is split into EP (inner) and EDP = DP/EP. */
enum { F_TP = 0, F_CP, F_PP, F_EP, F_EDP, F_N };

typedef struct rankmap {
    int n;                  /* factors in use (always F_N; degree-1 factors are harmless) */
    int kind[F_N];          /* factor i is of kind kind[i] (F_TP, ...) */
    int64_t deg[F_N];       /* degree of factor i */
    int64_t stride[F_N];    /* rank stride of factor i */
    int at[F_N];            /* index of the factor of each kind */
    int64_t gpus, domain;
} rankmap;

void rankmap_build(const ff_plan_input *in, rankmap *m);
/* Coordinate of each kind (F_TP..F_EDP) of a rank. */
void rankmap_coords(const rankmap *m, int64_t rank, int64_t idx[F_N]);
int64_t rankmap_rank(const rankmap *m, const int64_t idx[F_N]);
/* Every factor tiles the HB domain exactly (inside it, a multiple of it, or splitting it),
 * so rank = local rank + domain x domain size is a product and every group of a dimension has
 * the same shape. */
bool rankmap_regular(const rankmap *m);

/* Groups: the kinds a group varies over. */
enum { G_TP = 0, G_CP, G_EP, G_DPD, G_DPE, G_N }; /* DPD: dense weights (CP x DP), DPE: experts (CP x DP/EP) */
unsigned group_kinds(int g);

typedef struct gstat {
    int64_t n;              /* members */
    int64_t a, y;           /* grid: members per domain and domains; else the worst member's */
    int64_t min_count;      /* fewest members of one group in one domain */
    int64_t max_count;
    bool grid;              /* the hierarchical (domain + rail) algorithm applies */
    bool rail;              /* cross-domain pairs of the pattern share a local rank */
} gstat;

/* Shape of the groups that vary over `kinds`: from the factors when the map is regular (fast),
 * or by visiting every group (exact, any layout). */
void group_stat_fast(const rankmap *m, unsigned kinds, gstat *out);
void group_stat_exact(const rankmap *m, unsigned kinds, gstat *out);

/* Pipeline neighbours: does the pair (stage s, stage s') cross a domain, and if it does, do
 * all its rank pairs share a local rank. */
typedef struct pplink {
    bool next_cross, next_rail; /* s -> s+1 (or p-1 -> 0 for interleaved chunks) */
    bool prev_cross, prev_rail; /* s -> s-1 (or 0 -> p-1) */
} pplink;
void pp_links(const rankmap *m, bool exact, pplink *out /* pp entries */);

/* What the core evaluation needs beyond the input. */
typedef struct prep {
    int64_t n_stages;
    int64_t *layers;        /* per stage (sum over its chunks) */
    int64_t *moe_layers;
    gstat g[G_N];
    pplink *pp;
    double cross_bw_rail;   /* bytes/s of cross-domain traffic between GPUs of one rail */
    double cross_bw_other;  /* bytes/s per byte of cross-domain traffic between rails (harmonic) */
    double lat_hb, lat_nic; /* seconds per collective step inside the domain / over the network */
} prep;

/* Stage layer counts from the placement (layers, moe_layers must hold pp entries; scratch holds
 * vpp*pp). */
int prep_place(const ff_plan_input *in, int64_t *layers, int64_t *moe_layers, int64_t *scratch);
void prep_links(const ff_plan_input *in, const rankmap *m, bool exact, prep *p);

/* The evaluation proper; stages may be NULL (search). Fills every scalar of out. */
void plan_core(const ff_plan_input *in, const prep *p, ff_plan_result *out, ff_plan_stage *stages);

/* Time and bytes of one phase (all-gather or reduce-scatter) over a group; shard = bytes each
 * member contributes. */
double phase_time(const prep *p, const gstat *g, double shard, double b_hb, double *nv_bytes, double *nic_bytes);

/* DP bytes per step of each kind of parameter on one stage. */
void stage_dp_bytes(const ff_plan_input *in, const ff_plan_stage *st, double *dense, double *expert);

#endif

/* Planner clusters: named presets (DGX H100 and H200 servers on a rail-optimized Clos or on a
 * rail-only network) and the switch and transceiver count of a non-blocking Clos against
 * rail-only (rail-only paper, cost analysis). Not here: how traffic uses the links (plan_eval.c). */
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"

typedef struct preset {
    const char *name;
    ff_plan_cluster c;
} preset;

/* DGX H100 and H200: 8 SXM GPUs per server on NVLink 4 (900 GB/s both directions, 450 GB/s each
 * way), one 400 Gb/s ConnectX-7 NIC per GPU (50 GB/s), 80 GB or 141 GB of HBM (decimal GB, as
 * the chapter counts). 400 TFLOP/s achieved per GPU is Llama 3's measured BF16 rate (Table 4);
 * the H200 has the same compute die, so the same rate is assumed. HBM: 3.35 TB/s (H100 SXM) and
 * 4.8 TB/s (H200), the data sheets' peaks. Switches: 64-port 400G.
 * Latency per collective step (not from the seeds, which count bandwidth only): about 1 us across
 * NVSwitch and 5 us across an RDMA NIC and a switch, the order of NCCL's own per-step estimates;
 * set them to 0 for the rail-only paper's pure bandwidth model. */
#define LAT_HB 1e-6
#define LAT_NIC 5e-6
static const preset presets[] = {
    {"dgx-h100", {"dgx-h100", 8, 8, 80e9, 450e9, 50e9, 400e12, LAT_HB, LAT_NIC, FF_PLAN_CLOS, 1.0, 64, 3.35e12}},
    {"dgx-h200", {"dgx-h200", 8, 8, 141e9, 450e9, 50e9, 400e12, LAT_HB, LAT_NIC, FF_PLAN_CLOS, 1.0, 64, 4.8e12}},
    {"dgx-h100-rail", {"dgx-h100-rail", 8, 8, 80e9, 450e9, 50e9, 400e12, LAT_HB, LAT_NIC, FF_PLAN_RAIL_ONLY, 1.0, 64, 3.35e12}},
    {"dgx-h200-rail", {"dgx-h200-rail", 8, 8, 141e9, 450e9, 50e9, 400e12, LAT_HB, LAT_NIC, FF_PLAN_RAIL_ONLY, 1.0, 64, 4.8e12}},
};
#define NPRESETS (sizeof presets / sizeof presets[0])

static const char *const preset_names[] = {"dgx-h100", "dgx-h200", "dgx-h100-rail", "dgx-h200-rail", NULL};

const char *const *ff_plan_cluster_preset_names(void) { return preset_names; }

int ff_plan_cluster_preset(const char *name, ff_plan_cluster *out) {
    for (size_t i = 0; i < NPRESETS; i++)
        if (!strcmp(presets[i].name, name)) {
            *out = presets[i].c;
            return 0;
        }
    return ff_error_set(name, "or describe the cluster with --gpus-per-domain, --hbm, --nvlink, --nic, --flops",
                        "unknown cluster preset (known: dgx-h100, dgx-h200, dgx-h100-rail, dgx-h200-rail)");
}

/* A non-blocking folded Clos (fat tree) of radix-k switches: t tiers serve up to 2 (k/2)^t
 * endpoints. Every tier below the top has ceil(n / (k/2)) switches (half the ports down, half
 * up); the top tier has ceil(n / k) (all ports down). Each tier boundary carries n links, so
 * there are t n links in all, the endpoint links included, and two transceivers per link. */
int ff_plan_fabric_clos(int64_t endpoints, int64_t radix, ff_plan_fabric *out) {
    if (radix < 4 || radix % 2)
        return ff_error_set("network", "switches have an even number of ports, at least 4", "radix %lld", (long long)radix);
    if (endpoints < 1) return ff_error_set("network", NULL, "no endpoints");
    memset(out, 0, sizeof *out);
    if (endpoints == 1) { /* a lone endpoint needs no network */
        return 0;
    }
    int t = 1;
    double cap = (double)radix;
    while (cap < (double)endpoints) {
        t++;
        cap *= (double)radix / 2.0;
        if (t > 16) return ff_error_set("network", NULL, "%lld endpoints need more than 16 tiers", (long long)endpoints);
    }
    int64_t half = radix / 2;
    out->tiers = t;
    out->switches = (int64_t)(t - 1) * ((endpoints + half - 1) / half) + (endpoints + radix - 1) / radix;
    out->links = (int64_t)t * endpoints;
    out->transceivers = 2 * out->links;
    return 0;
}

/* Rail-only: the GPUs of local rank r in every HB domain form rail r, a network of its own; nothing
 * joins the rails. A rail that fits one switch shares it with other rails (disjoint port groups,
 * no path between them), so small clusters do not pay a switch per rail; a larger rail is a
 * non-blocking Clos of its own. */
int ff_plan_network_cost(int64_t gpus, int64_t domain, int64_t radix, ff_plan_network *out) {
    if (domain < 1 || gpus < 1) return ff_error_set("network", NULL, "%lld GPUs in domains of %lld", (long long)gpus, (long long)domain);
    memset(out, 0, sizeof *out);
    if (ff_plan_fabric_clos(gpus, radix, &out->clos)) return -1;
    if (gpus <= domain) { /* one HB domain: no scale-out network at all */
        memset(&out->clos, 0, sizeof out->clos);
        return 0;
    }
    int64_t rails = gpus < domain ? gpus : domain;
    int64_t per_rail = (gpus + domain - 1) / domain;
    if (per_rail <= radix) {
        int64_t rails_per_switch = radix / per_rail;
        out->rail_only.tiers = 1;
        out->rail_only.switches = (rails + rails_per_switch - 1) / rails_per_switch;
        out->rail_only.links = rails * per_rail;
        out->rail_only.transceivers = 2 * out->rail_only.links;
        return 0;
    }
    ff_plan_fabric r;
    if (ff_plan_fabric_clos(per_rail, radix, &r)) return -1;
    out->rail_only.tiers = r.tiers;
    out->rail_only.switches = rails * r.switches;
    out->rail_only.links = rails * r.links;
    out->rail_only.transceivers = rails * r.transceivers;
    return 0;
}

/* Placement across hosts, as pure functions of the workers' hosts and local indices (their
 * hellos'), so that the run's log and tests/exec/test_placement.c read the same: the order in
 * which the planner's ranks go to the workers, and whether a layout's DP groups keep to rails.
 * exec_run.c (place_by_host) applies them; nothing here talks to a worker. */
#include <stdio.h>
#include <string.h>

#include "controller/rl/exec_internal.h"

/* hosts in the order of their lowest worker rank (host_of numbers them so); inside a host by
 * local index, the workers without one after, by rank */
void ex_place_order(int n, const int *host_of, const int *local_index, int *order) {
    int k = 0, nhosts = 0;
    for (int r = 0; r < n; r++) nhosts = host_of[r] + 1 > nhosts ? host_of[r] + 1 : nhosts;
    for (int h = 0; h < nhosts; h++) {
        int first = k;
        for (int r = 0; r < n; r++)
            if (host_of[r] == h) order[k++] = r;
        for (int i = first + 1; i < k; i++) { /* insertion sort: stable, n is small */
            int w = order[i], j = i;
            int key = local_index[w] < 0 ? -1 : local_index[w];
            while (j > first) {
                int prev = local_index[order[j - 1]];
                bool after = key >= 0 && (prev < 0 || prev > key);
                if (!after) break;
                order[j] = order[j - 1];
                j--;
            }
            order[j] = w;
        }
    }
}

/* the sorted local indices of group g's members on host h, into out; their count */
static int indices_on(int dp, int mp, int g, const int *rep_ranks, const int *host_of, const int *local_index, int h, int *out) {
    int m = 0;
    for (int d = 0; d < dp; d++) {
        int w = rep_ranks[d * mp + g];
        if (host_of[w] != h) continue;
        int j = m++;
        while (j > 0 && out[j - 1] > local_index[w]) out[j] = out[j - 1], j--;
        out[j] = local_index[w];
    }
    return m;
}

static void list(char *buf, size_t cap, const int *v, int n) {
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < n && off < cap; i++) off += (size_t)snprintf(buf + off, cap - off, "%s%d", i ? " " : "", v[i]);
}

int ex_rail_aligned(int dp, int mp, const int *rep_ranks, const int *host_of, const int *local_index, ex_rail_gap *gap) {
    int a[EX_MAX_RANKS], b[EX_MAX_RANKS];
    for (int g = 0; g < mp; g++) {
        int h0 = host_of[rep_ranks[g]];
        int na = indices_on(dp, mp, g, rep_ranks, host_of, local_index, h0, a);
        for (int d = 1; d < dp; d++) {
            int h = host_of[rep_ranks[d * mp + g]];
            if (h == h0) continue;
            int nb = indices_on(dp, mp, g, rep_ranks, host_of, local_index, h, b);
            if (na == nb && !memcmp(a, b, sizeof a[0] * (size_t)na) && a[0] >= 0) continue;
            gap->group = g, gap->host_a = h0, gap->host_b = h;
            list(gap->on_a, sizeof gap->on_a, a, na);
            list(gap->on_b, sizeof gap->on_b, b, nb);
            return 0;
        }
    }
    return 1;
}

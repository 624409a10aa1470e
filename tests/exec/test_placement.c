/* Placement across hosts (controller/rl/exec_place.c), the functions the run's log is made of:
 *   - the planner's ranks go host by host, inside a host by the workers' local indices (their
 *     rails) whatever order they joined in, workers without one after by rank;
 *   - on two hosts of four workers at TP 2 x DP 4 that makes every DP group rail-aligned (the
 *     same local indices on both hosts), and ex_rail_aligned says so;
 *   - hosts of unequal shares (3 and 5), or indices that differ between hosts, are not, and
 *     the gap names the group and each host's indices. */
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "tests/test_util.h"

/* the workers of the layout's replicas (tp x pp = mp, dp of them), the planner's ranks
 * 0..mp*dp-1 mapped through order */
static void replicas(int dp, int mp, const int *order, int *rep) {
    for (int i = 0; i < dp * mp; i++) rep[i] = order[i];
}

int main(void) {
    /* 8 workers joined in a scrambled order: hosts A (0) and B (1), local indices 0..3 each */
    int host[8] = {0, 1, 0, 1, 1, 0, 0, 1}, idx[8] = {2, 0, 0, 3, 1, 3, 1, 2}, order[8];
    ex_place_order(8, host, idx, order);
    int want[8] = {2, 6, 0, 5, 1, 4, 7, 3}; /* A by index: 2 6 0 5; then B: 1 4 7 3 */
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(order[i], want[i]);
    int rep[8];
    ex_rail_gap gap;
    replicas(4, 2, order, rep); /* TP 2 x DP 4: replicas 0 and 1 on A, 2 and 3 on B */
    CHECK_EQ_INT(ex_rail_aligned(4, 2, rep, host, idx, &gap), 1);
    replicas(2, 4, order, rep); /* TP 4 x DP 2: one replica per host */
    CHECK_EQ_INT(ex_rail_aligned(2, 4, rep, host, idx, &gap), 1);
    replicas(8, 1, order, rep); /* DP 8: each host's four at indices 0..3 */
    CHECK_EQ_INT(ex_rail_aligned(8, 1, rep, host, idx, &gap), 1);

    /* the join order instead (no local indices): by rank inside each host */
    int none[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
    ex_place_order(8, host, none, order);
    int by_rank[8] = {0, 2, 5, 6, 1, 3, 4, 7};
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(order[i], by_rank[i]);
    replicas(4, 2, order, rep);
    CHECK_EQ_INT(ex_rail_aligned(4, 2, rep, host, none, &gap), 0); /* nothing known: not claimed */

    /* some with an index, some without: those first by index, the rest by rank */
    int h1[4] = {0, 0, 0, 0}, i1[4] = {-1, 1, -1, 0}, o1[4];
    ex_place_order(4, h1, i1, o1);
    CHECK(o1[0] == 3 && o1[1] == 1 && o1[2] == 0 && o1[3] == 2);

    /* hosts of 3 and 5 workers: replica 1 spans them, the DP groups change rails */
    int h2[8] = {0, 0, 0, 1, 1, 1, 1, 1}, i2[8] = {0, 1, 2, 0, 1, 2, 3, 4}, o2[8];
    ex_place_order(8, h2, i2, o2);
    replicas(4, 2, o2, rep);
    CHECK_EQ_INT(ex_rail_aligned(4, 2, rep, h2, i2, &gap), 0);
    CHECK_EQ_INT(gap.group, 0);
    CHECK(gap.host_a == 0 && gap.host_b == 1);
    CHECK(!strcmp(gap.on_a, "0 2") && !strcmp(gap.on_b, "1 3"));

    /* equal shares but host B's indices are 4..7: aligned by position, not by rail */
    int i3[8] = {2, 4, 0, 7, 5, 3, 1, 6};
    ex_place_order(8, host, i3, order);
    replicas(4, 2, order, rep);
    CHECK_EQ_INT(ex_rail_aligned(4, 2, rep, host, i3, &gap), 0);
    CHECK(!strcmp(gap.on_a, "0 2") && !strcmp(gap.on_b, "4 6"));
    TEST_MAIN_END();
}

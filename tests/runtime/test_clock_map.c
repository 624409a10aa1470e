/* A worker's subtask span onto the controller's clock (ctl_map_span): the offset estimate can
 * be off by more than a short subtask lasts, so the span is moved whole into the window
 * between dispatch and result, keeping the duration the worker measured on one clock; it is
 * cut only where the window is shorter. And one worker's spans kept in the order it ran them
 * (ctl_keep_worker_order), which that window alone can break. Times in ns. */
#include "controller/ctl_internal.h"
#include "tests/test_util.h"

static void span(int64_t offset, int64_t ws, int64_t we, int64_t dispatch, int64_t done, int64_t want_st, int64_t want_en) {
    ctl_worker w = {0};
    w.offset_ns = offset;
    int64_t st = -1, en = -1;
    ctl_map_span(&w, ws, we, dispatch, done, &st, &en);
    CHECK_EQ_INT(st, want_st);
    CHECK_EQ_INT(en, want_en);
}

/* One worker's spans put back in its order (ctl_keep_worker_order). Times in ns. */
static void test_worker_order(void) {
    /* The estimate 300 ns too large: A ran [1200, 1300] on the worker, dispatched at 1000, its
     * result at 1500: mapped to [900, 1000], moved to its dispatch, [1000, 1100]. B ran [1350,
     * 1400] after it, dispatched at 900 while A ran: mapped to [1050, 1100], inside its window,
     * so not moved: it started before A's end. Put back after it: [1100, 1150]. */
    ctl_span s[3] = {{1350, 1400, 1600, 1050, 1100, 1}, {1200, 1300, 1500, 1000, 1100, 0},
                     /* C overlapped B on the worker (an inline handler): left where it is */
                     {1360, 1370, 1410, 1060, 1070, 2}};
    ctl_keep_worker_order(s, 3);
    CHECK(s[0].id == 0 && s[1].id == 1 && s[2].id == 2); /* sorted by the worker's start */
    CHECK_EQ_INT(s[0].st, 1000);
    CHECK_EQ_INT(s[0].en, 1100);
    CHECK_EQ_INT(s[1].st, 1100);
    CHECK_EQ_INT(s[1].en, 1150);
    CHECK_EQ_INT(s[2].st, 1060);
    CHECK_EQ_INT(s[2].en, 1070);
    /* moved past its result: cut there */
    ctl_span t[2] = {{100, 200, 300, 50, 290, 0}, {250, 300, 310, 200, 250, 1}};
    ctl_keep_worker_order(t, 2);
    CHECK_EQ_INT(t[1].st, 290);
    CHECK_EQ_INT(t[1].en, 310);
    /* in order already: nothing moves */
    ctl_span u[2] = {{100, 200, 300, 100, 200, 0}, {250, 300, 400, 260, 310, 1}};
    ctl_keep_worker_order(u, 2);
    CHECK_EQ_INT(u[1].st, 260);
    CHECK_EQ_INT(u[1].en, 310);
}

int main(void) {
    test_worker_order();
    /* a right estimate: the mapped span as it is */
    span(100, 1200, 1300, 1000, 1500, 1100, 1200);
    /* the estimate 400 ns too small: mapped to [1500, 1600], past the result; moved back whole
     * to end at it (clamping each end had given [1500, 1500], no time at all) */
    span(-300, 1200, 1300, 1000, 1500, 1400, 1500);
    /* too large: mapped before the dispatch, moved forward to start there */
    span(900, 1200, 1300, 1000, 1500, 1000, 1100);
    /* longer than the window (a clock that drifted): the window, no more */
    span(0, 0, 5000, 1000, 1500, 1000, 1500);
    /* a worker end before its start: no duration, at the mapped start */
    span(0, 1200, 1100, 1000, 1500, 1200, 1200);
    TEST_MAIN_END();
}

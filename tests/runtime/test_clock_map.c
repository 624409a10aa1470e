/* A worker's subtask span onto the controller's clock (ctl_map_span): the offset estimate can
 * be off by more than a short subtask lasts, so the span is moved whole into the window
 * between dispatch and result, keeping the duration the worker measured on one clock; it is
 * cut only where the window is shorter. Times in ns. */
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

int main(void) {
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

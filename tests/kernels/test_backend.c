/* The backend handles: selection by name (and clear errors for unknown or unbuilt ones),
 * thread counts from FF_NUM_THREADS, zeroed buffers, the explicit copies, events, and the
 * addresses handed to a collectives library. */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/error.h"
#include "tests/test_util.h"

int main(void) {
    ff_backend *be = ff_backend_new("cpu:3");
    REQUIRE(be);
    CHECK(!strcmp(ff_backend_name(be), "cpu"));
    CHECK_EQ_INT(ff_backend_threads(be), 3);
    ff_stream *st = ff_backend_stream(be);
    REQUIRE(st && ff_stream_backend(st) == be);

    ff_buffer *a = ff_buffer_new(be, 1000), *b = ff_buffer_new(be, 1000);
    REQUIRE(a && b);
    CHECK_EQ_INT(ff_buffer_size(a), 1000);
    CHECK(ff_buffer_backend(a) == be);
    unsigned char host[1000], back[1000];
    ff_memcpy_d2h(st, back, ff_dptr_of(a, 0), sizeof back);
    int zero = 1;
    for (int i = 0; i < 1000; i++) zero &= back[i] == 0;
    CHECK(zero); /* new buffers are zero-filled */
    for (int i = 0; i < 1000; i++) host[i] = (unsigned char)(i * 7);
    ff_memcpy_h2d(st, ff_dptr_of(a, 0), host, sizeof host);
    ff_memcpy_d2d(st, ff_dptr_of(b, 100), ff_dptr_of(a, 0), 900);
    ff_memset_zero(st, ff_dptr_of(b, 0), 50);
    CHECK(ff_stream_sync(st) == 0);
    ff_memcpy_d2h(st, back, ff_dptr_of(b, 0), sizeof back);
    CHECK(back[0] == 0 && back[49] == 0);
    CHECK(memcmp(back + 100, host, 900) == 0);
    /* a 2-D block: 3 rows of 5 bytes from a pitch of 40 into a pitch of 8, the rest left alone */
    ff_memset_zero(st, ff_dptr_of(b, 0), 1000);
    ff_memcpy_2d(st, ff_dptr_of(b, 2), 8, ff_dptr_of(a, 7), 40, 5, 3);
    ff_memcpy_d2h(st, back, ff_dptr_of(b, 0), 32);
    int ok2d = back[0] == 0 && back[1] == 0;
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 8; c++) ok2d &= back[2 + r * 8 + c] == (c < 5 ? host[7 + r * 40 + c] : 0);
    CHECK(ok2d);
    ff_memcpy_2d(st, ff_dptr_of(b, 0), 5, ff_dptr_of(a, 0), 5, 5, 0); /* no rows: nothing */
    ff_dptr p = ff_dptr_add(ff_dptr_f32(a, 2), 3, 4);
    CHECK(p.buf == a && p.off == 20);
    CHECK(!ff_dptr_null(p) && ff_dptr_null((ff_dptr){0}));
    ff_stream *s2 = ff_stream_new(be);
    REQUIRE(s2);
    CHECK(ff_stream_sync(s2) == 0);
    /* events: work is done when queued here, so they order nothing and cost nothing; the
     * address of a dptr is host memory, the native stream none; the cpu ff_coll reads it */
    ff_event *ev = ff_event_new(be);
    REQUIRE(ev);
    ff_event_record(ev, st);
    ff_stream_wait(s2, ev);
    ff_event_record(ev, s2); /* re-recorded */
    ff_event_destroy(&ev);
    CHECK(ev == NULL);
    ff_event_destroy(&ev); /* NULL: nothing */
    CHECK((unsigned char *)ff_dptr_addr(ff_dptr_of(a, 7)) == (unsigned char *)ff_dptr_addr(ff_dptr_of(a, 0)) + 7);
    CHECK(*(unsigned char *)ff_dptr_addr(ff_dptr_of(a, 7)) == host[7]);
    CHECK(ff_stream_native(st) == NULL && ff_stream_native(s2) == NULL);
    CHECK(ff_backend_shares_memory_with(be, "cpu") && !ff_backend_shares_memory_with(be, "nccl") &&
          !ff_backend_shares_memory_with(be, NULL));
    ff_stream_destroy(&s2);
    CHECK(s2 == NULL);
    ff_buffer_destroy(&a);
    ff_buffer_destroy(&b);
    CHECK(a == NULL);
    ff_buffer *empty = ff_buffer_new(be, 0);
    CHECK(empty != NULL);
    ff_buffer_destroy(&empty);
    ff_backend_destroy(&be);
    CHECK(be == NULL);

    /* unknown names and unbuilt backends fail with a message that says what to do */
    CHECK(ff_backend_new("tpu") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown backend 'tpu'");
    CHECK(ff_backend_new("cpu:x") == NULL);
    CHECK(ff_backend_new(NULL) == NULL);
    CHECK(ff_backend_cpu_new(-1) == NULL);
#ifndef FF_HAVE_CUDA
    CHECK(ff_backend_new("cuda") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "without the CUDA backend");
#else
    /* built with CUDA: either a device answers, or the error says there is none and what to use */
    ff_backend *g = ff_backend_new("cuda");
    if (!g) {
        CHECK_STR_CONTAINS(ff_error_message(), "no CUDA device: cudaGetDeviceCount says");
        CHECK_STR_CONTAINS(ff_error_message(), "use the cpu backend");
    } else {
        CHECK(!strncmp(ff_backend_name(g), "cuda:", 5));
        ff_backend_destroy(&g);
    }
#endif

    /* FF_NUM_THREADS sets the default; a bad value is an error */
    setenv("FF_NUM_THREADS", "1", 1);
    be = ff_backend_new("cpu");
    REQUIRE(be);
    CHECK_EQ_INT(ff_backend_threads(be), 1);
    ff_backend_destroy(&be);
    setenv("FF_NUM_THREADS", "many", 1);
    CHECK(ff_backend_new("cpu") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "FF_NUM_THREADS");
    unsetenv("FF_NUM_THREADS");
    TEST_MAIN_END();
}

/* The generic subtask kinds every worker offers, so the runtime can be measured and tested
 * without a model: echo, sleep, axpy, sum, fail. ("collective" and the unique-id helper live
 * in group.c, next to the communicators.) Each checks its inputs and says what is wrong. */
#include <string.h>
#include <time.h>

#include "msgs/transport.h"
#include "workers/worker_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"

/* echo: every input tensor comes back as an output, shared rather than copied. Inline: it
 * takes a microsecond, less than the hop to the compute thread would. */
static int kind_echo(ff_task *t, void *ud) {
    (void)ud;
    for (int i = 0; i < ff_task_ninputs(t); i++)
        if (ff_task_output_input(t, i, NULL) != 0) return -1;
    return 0;
}

/* sleep: args ms (number). Sleeps in short slices so a cancel takes effect within ~2 ms. */
static int kind_sleep(ff_task *t, void *ud) {
    (void)ud;
    double ms;
    if (ff_msg_arg_float(ff_task_subtask(t), "ms", &ms) != 0) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s", ff_error_message());
    if (ms < 0 || ms > 3.6e6) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "sleep: ms = %g outside [0, 3600000]", ms);
    int64_t end = ff_now_ns() + (int64_t)(ms * 1e6);
    for (;;) {
        if (ff_task_cancelled(t)) return ff_error_set("sleep", NULL, "cancelled");
        int64_t left = end - ff_now_ns();
        if (left <= 0) break;
        int64_t slice = left < 2000000 ? left : 2000000;
        struct timespec ts = {0, (long)slice};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static const ff_tensor *f32_input(ff_task *t, const char *name) {
    const ff_tensor *x = ff_task_input_named(t, name);
    if (!x) return NULL;
    if (x->dtype != FF_DTYPE_F32) {
        ff_error_set(ff_task_kind(t), "send F32", "input '%s' is %s", name, ff_dtype_name(x->dtype));
        return NULL;
    }
    return x;
}

/* axpy: out = alpha * x + y; inputs x, y (F32, same shape), args alpha. */
static int kind_axpy(ff_task *t, void *ud) {
    (void)ud;
    double alpha;
    const ff_tensor *x = f32_input(t, "x"), *y = x ? f32_input(t, "y") : NULL;
    if (!x || !y || ff_msg_arg_float(ff_task_subtask(t), "alpha", &alpha) != 0)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "%s", ff_error_message());
    if (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim) != 0)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "axpy: x and y have different shapes");
    int64_t n = ff_tensor_numel(x);
    float *out = ff_task_output(t, "out", FF_DTYPE_F32, x->ndim, x->shape);
    if (!out) return -1;
    const float *xs = x->data, *ys = y->data;
    float a = (float)alpha;
    for (int64_t i = 0; i < n; i++) out[i] = a * xs[i] + ys[i];
    return 0;
}

/* sum: out "sum" [1] (F32) = sum of all elements of input 0 (F32), accumulated in double. */
static int kind_sum(ff_task *t, void *ud) {
    (void)ud;
    if (ff_task_ninputs(t) < 1) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "sum: needs one F32 input tensor");
    const ff_tensor *x = ff_task_input(t, 0);
    if (x->dtype != FF_DTYPE_F32)
        return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "sum: input is %s, expected F32", ff_dtype_name(x->dtype));
    const float *xs = x->data;
    double s = 0;
    for (int64_t i = 0, n = ff_tensor_numel(x); i < n; i++) s += xs[i];
    int64_t one = 1;
    float *out = ff_task_output(t, "sum", FF_DTYPE_F32, 1, &one);
    if (!out) return -1;
    out[0] = (float)s;
    return 0;
}

/* fail: always fails, with args message (string) when given: for testing error paths. */
static int kind_fail(ff_task *t, void *ud) {
    (void)ud;
    const char *p;
    size_t n;
    if (ff_msg_arg_str(ff_task_subtask(t), "message", &p, &n) == 0)
        return ff_error_set("fail", NULL, "%.*s", (int)(n > 200 ? 200 : n), p);
    return ff_error_set("fail", NULL, "failed on purpose");
}

int rt_register_builtin_kinds(ff_worker *w) {
    if (ff_worker_register(w, "echo", kind_echo, NULL, FF_TASK_INLINE) || ff_worker_register(w, "sleep", kind_sleep, NULL, 0) ||
        ff_worker_register(w, "axpy", kind_axpy, NULL, 0) || ff_worker_register(w, "sum", kind_sum, NULL, 0) ||
        ff_worker_register(w, "fail", kind_fail, NULL, 0))
        return -1;
    return rt_register_group_kinds(w);
}

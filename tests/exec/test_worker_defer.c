/* Deferred tasks and the worker's step hook (worker.h): the mechanism continuous batching
 * across subtasks rests on. This program is also the worker (argv[1] == "worker"), with a
 * kind "count" that defers its task and a step hook that advances every deferred task by
 * one per step, like a decoding step over a batch of sequences:
 *   - many subtasks in flight are advanced together (one step serves several subtasks) and
 *     each completes once with the right output: the hook holds its steps until every task
 *     sent to its worker is open ("gather"), so that this checks that the runtime hands new
 *     tasks to a worker whose tasks are deferred, whatever the timing (a fast compute thread
 *     finished each task alone before the next message came, on a CI machine);
 *   - ordinary subtasks run between steps while deferred ones wait;
 *   - a cancelled deferred task comes back CANCELLED, the others still finish;
 *   - a failing hook fails every deferred task with its message;
 *   - shutting down with deferred work: the hook completes the cancelled tasks, workers exit 0.
 */
#include <time.h>

#include "tests/runtime/rt_test.h"

/* ---- worker side ---------------------------------------------------------------------- */
enum { MAX_OPEN = 256 };
typedef struct open_task {
    ff_task *t;
    int64_t goal, done;
    float x;
} open_task;

static open_task open_tasks[MAX_OPEN];
static int n_open, max_together;
static int64_t gather;        /* steps wait until this many tasks are open (or GATHER_LIMIT_NS) */
static int64_t gather_since;  /* when the first of them opened, ns */
static const int64_t GATHER_LIMIT_NS = 20LL * 1000 * 1000 * 1000;

static int count_kind(ff_task *t, void *ud) {
    (void)ud;
    int64_t goal;
    if (ff_msg_arg_int(ff_task_subtask(t), "steps", &goal) != 0) return ff_task_fail(t, FF_STATUS_BAD_REQUEST, "steps?");
    const ff_tensor *x = ff_task_input_named(t, "x");
    if (!x || n_open == MAX_OPEN) return -1;
    int64_t g = 0;
    (void)ff_msg_arg_int(ff_task_subtask(t), "gather", &g); /* optional */
    if (g > 0 && n_open == 0) gather = g, gather_since = ff_now_ns();
    if (ff_task_defer(t) != 0) return -1;
    open_tasks[n_open++] = (open_task){t, goal, 0, ((const float *)x->data)[0]};
    return 0;
}

static int step_hook(ff_worker *w, void *ud) {
    (void)w;
    (void)ud;
    if (gather > 0) {
        if (n_open < gather && ff_now_ns() - gather_since < GATHER_LIMIT_NS) {
            nanosleep(&(struct timespec){0, 200000}, NULL); /* the hook runs again at once */
            return 0;
        }
        gather = 0;
    }
    if (n_open > max_together) max_together = n_open;
    for (int i = 0; i < n_open;) {
        open_task *o = &open_tasks[i];
        if (o->goal < 0 && ++o->done > 3) {
            n_open = 0; /* the runtime fails every deferred task: forget them */
            return ff_error_set("count", NULL, "the engine broke at step %lld", (long long)o->done);
        }
        bool finished = false;
        int rc = 0;
        if (ff_task_cancelled(o->t)) {
            finished = true, rc = -1;
        } else if (o->goal >= 0 && ++o->done >= o->goal) {
            float *y = ff_task_output(o->t, "y", FF_DTYPE_F32, 1, (int64_t[]){1});
            int32_t *m = ff_task_output(o->t, "together", FF_DTYPE_I32, 1, (int64_t[]){1});
            if (!y || !m) return -1;
            y[0] = o->x + (float)o->goal;
            m[0] = max_together;
            finished = true;
        }
        if (finished) {
            ff_task_complete(o->t, rc);
            open_tasks[i] = open_tasks[--n_open];
        } else {
            i++;
        }
    }
    return 0;
}

static int setup(ff_worker *w, void *ud) {
    (void)ud;
    ff_worker_set_step(w, step_hook, NULL);
    return ff_worker_register(w, "count", count_kind, NULL, 0);
}

/* ---- controller side ------------------------------------------------------------------ */
typedef struct rec {
    int calls, status;
    float y;
    int together;
} rec;

static void on_done(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c, (void)job, (void)n;
    rec *x = ud;
    x->calls++;
    x->status = r[0].status;
    for (int i = 0; i < r[0].noutputs; i++) {
        if (!strcmp(r[0].outputs[i].name, "y")) x->y = *(const float *)r[0].outputs[i].data;
        if (!strcmp(r[0].outputs[i].name, "together")) x->together = *(const int32_t *)r[0].outputs[i].data;
    }
    if (r[0].status != FF_STATUS_OK && r[0].status != FF_STATUS_CANCELLED && r[0].status != FF_STATUS_FAILED)
        fprintf(stderr, "unexpected status %s: %s\n", ff_status_name(r[0].status), r[0].error);
}

static uint64_t submit_gathered(ff_controller *c, int rank, float x, int64_t steps, int64_t gather_n, rec *out) {
    int64_t one = 1;
    ff_input in = rt_f32("x", &one, x);
    ff_arg a[2] = {ff_arg_int("steps", steps), ff_arg_int("gather", gather_n)};
    ff_subtask_spec s = {.kind = "count", .target = FF_TARGET_RANK, .rank = rank, .args = a, .nargs = 2, .inputs = &in,
                         .ninputs = 1};
    uint64_t id = ff_controller_submit(c, &s, on_done, out);
    REQUIRE(id > 0);
    return id;
}

static uint64_t submit_count(ff_controller *c, int rank, float x, int64_t steps, rec *out) {
    return submit_gathered(c, rank, x, steps, 0, out);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "worker")) return rt_worker_main(argc - 1, argv + 1, setup, NULL);
    ff_controller_opts o = rt_opts();
    ff_controller *c = rt_start(&o, 2);

    /* 1. many deferred subtasks advance together; an ordinary one runs meanwhile */
    enum { N = 40 };
    static rec r[N];
    for (int i = 0; i < N; i++) submit_gathered(c, i % 2, (float)i, 20 + i % 7, N / 2, &r[i]);
    rt_counter sum = {0};
    int64_t four = 4;
    ff_input xin = rt_f32("x", &four, 2.0f);
    ff_subtask_spec ss = {.kind = "sum", .target = FF_TARGET_RANK, .rank = 0, .inputs = &xin, .ninputs = 1};
    REQUIRE(ff_controller_submit(c, &ss, rt_count, &sum) > 0);
    REQUIRE(ff_controller_run(c, 60) == 0);
    int together = 0;
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(r[i].calls, 1);
        CHECK_EQ_INT(r[i].status, FF_STATUS_OK);
        CHECK_CLOSE(r[i].y, (float)i + (float)(20 + i % 7), 0, 0);
        if (r[i].together > together) together = r[i].together;
    }
    CHECK_EQ_INT(together, N / 2); /* one step served every subtask of its worker */
    CHECK_EQ_INT(sum.ok, 1);

    /* 2. cancel one deferred task among others */
    rec a = {0}, b = {0};
    uint64_t ja = submit_count(c, 0, 1.0f, 1000000000, &a);
    submit_count(c, 0, 1.0f, 50, &b);
    for (int64_t t0 = ff_now_ns(); ff_now_ns() - t0 < 200000000LL;) ff_controller_poll(c, false); /* let it start */
    REQUIRE(ff_controller_cancel(c, ja) == 0);
    REQUIRE(ff_controller_run(c, 60) == 0);
    CHECK_EQ_INT(a.calls, 1);
    CHECK_EQ_INT(a.status, FF_STATUS_CANCELLED);
    CHECK_EQ_INT(b.status, FF_STATUS_OK);

    /* 3. a failing step hook fails every deferred task of that worker, with its message */
    rec f1 = {0}, f2 = {0};
    submit_count(c, 1, 0.0f, 1000000000, &f1);
    submit_count(c, 1, 0.0f, -1, &f2); /* breaks the engine after three steps */
    REQUIRE(ff_controller_run(c, 60) == 0);
    CHECK_EQ_INT(f1.status, FF_STATUS_FAILED);
    CHECK_EQ_INT(f2.status, FF_STATUS_FAILED);

    /* the worker still serves after that */
    rec after = {0};
    submit_count(c, 1, 3.0f, 5, &after);
    REQUIRE(ff_controller_run(c, 60) == 0);
    CHECK_EQ_INT(after.status, FF_STATUS_OK);
    CHECK_CLOSE(after.y, 8.0f, 0, 0);

    /* 4. shut down with deferred work in flight: answered, workers exit cleanly */
    rec s1 = {0}, s2 = {0};
    submit_count(c, 0, 0.0f, 1000000000, &s1);
    submit_count(c, 1, 0.0f, 1000000000, &s2);
    int64_t t0 = ff_now_ns();
    while (ff_now_ns() - t0 < 300000000LL) ff_controller_poll(c, false);
    rt_shutdown_clean(c);
    CHECK_EQ_INT(s1.calls, 1);
    CHECK_EQ_INT(s2.calls, 1);
    CHECK(s1.status != FF_STATUS_OK);
    ff_controller_destroy(&c);
    TEST_MAIN_END();
}

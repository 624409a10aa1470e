/* Timelines: a live run writes valid Chrome Trace Event JSON with the expected events (named
 * processes and threads, one slice per subtask, a dispatch->execution flow per slice, tracks
 * that nest, an arrow per dependency); events a client adds through the recorder API
 * (tracks, slices that are jobs and depend on jobs, instants, arrows) appear in the same
 * file with their tracks, times, args and arrows, and chain with the subtasks; and
 * `trace summary` gives the right numbers on a known trace and finds the chains of
 * dependent jobs in the live ones. */
#include <jansson.h>
#include <math.h>

#include "fuseflow/trace_summary.h"
#include "tests/runtime/rt_test.h"

static json_t *summary_json(const char *path) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    int rc = ff_trace_summary(path, f, true);
    fclose(f);
    if (rc != 0) {
        fprintf(stderr, "summary of %s: %s\n", path, ff_error_message());
        free(buf);
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loads(buf, 0, &e);
    if (!j) fprintf(stderr, "summary is not JSON: %s\n%s\n", e.text, buf);
    free(buf);
    return j;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static json_t *find_named(json_t *arr, const char *prefix) {
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *n = json_string_value(json_object_get(json_array_get(arr, i), "name"));
        if (n && !strncmp(n, prefix, strlen(prefix))) return json_array_get(arr, i);
    }
    return NULL;
}

static void test_known_trace(void) {
    const char *src = getenv("FF_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/runtime/data/trace_known.json", src ? src : ".");
    json_t *s = summary_json(path);
    REQUIRE(s);
    CHECK_CLOSE(num(s, "span_us"), 52, 1e-9, 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "subtasks")), 5);
    json_t *w = json_object_get(s, "workers");
    CHECK_EQ_INT(json_array_size(w), 2);
    json_t *w0 = find_named(w, "worker 0"), *w1 = find_named(w, "worker 1");
    REQUIRE(w0 && w1);
    CHECK_CLOSE(num(w0, "busy_us"), 25, 1e-9, 0); /* [0,10] u [5,15] u [20,30] */
    CHECK_CLOSE(num(w0, "idle_us"), 27, 1e-9, 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(w0, "subtasks")), 3);
    CHECK_CLOSE(num(w1, "busy_us"), 52, 1e-9, 0);
    CHECK_CLOSE(num(w1, "idle_us"), 0, 1e-9, 0);
    json_t *g = find_named(json_object_get(s, "groups"), "g");
    REQUIRE(g);
    CHECK_EQ_INT(json_integer_value(json_object_get(g, "members")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(g, "subtasks")), 3);
    CHECK_CLOSE(num(g, "busy_us"), 55, 1e-9, 0);  /* 15 on worker 0 + 40 on worker 1 */
    CHECK_CLOSE(num(g, "idle_us"), 49, 1e-9, 0);  /* 2 members x 52 - 55 */
    json_t *ch = json_object_get(s, "longest_chain");
    CHECK_EQ_INT(json_integer_value(json_object_get(ch, "length")), 4);
    CHECK_CLOSE(num(ch, "busy_us"), 42, 1e-9, 0); /* a 10 + b 10 + d 10 + e 12 beats c 40 */
    CHECK_CLOSE(num(ch, "elapsed_us"), 52, 1e-9, 0);
    json_t *ids = json_object_get(ch, "jobs");
    REQUIRE(json_array_size(ids) == 4);
    int64_t want[4] = {1, 2, 4, 5};
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(json_integer_value(json_array_get(ids, (size_t)i)), want[i]);
    json_decref(s);

    /* the text form says the same */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(ff_trace_summary(path, f, false) == 0);
    fclose(f);
    CHECK_STR_CONTAINS(buf, "longest chain of dependent jobs: 4 jobs, 0.042 ms of work");
    CHECK_STR_CONTAINS(buf, "worker 1 (hostB, pid 22, cpu)");
    free(buf);

    /* files that are not traces */
    CHECK(ff_trace_summary("/nonexistent/t.json", stdout, false) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/t.json");
    char tmp[128];
    snprintf(tmp, sizeof tmp, "/tmp/ff-test-trace-bad-%d.json", (int)getpid());
    ff_write_file_atomic(tmp, "{\"a\": 1}", 8);
    CHECK(ff_trace_summary(tmp, stdout, false) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no traceEvents");
    ff_write_file_atomic(tmp, "{\"traceEvents\": []}", 19);
    CHECK(ff_trace_summary(tmp, stdout, false) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no subtask events");
    ff_write_file_atomic(tmp, "{\"traceEvents\": [", 17);
    CHECK(ff_trace_summary(tmp, stdout, false) == -1);
    unlink(tmp);
}

typedef struct chain {
    ff_controller *c;
    int left;
    uint64_t ids[8];
    int n;
} chain;

static void next_link(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud);

static void submit_link(chain *ch, uint64_t after) {
    ff_arg a = ff_arg_float("ms", 50); /* far longer than any other job here, even on a loaded machine */
    ff_subtask_spec s = {.kind = "sleep", .target = FF_TARGET_ANY, .group = "all", .args = &a, .nargs = 1,
                         .after = after ? &after : NULL, .nafter = after ? 1 : 0, .label = "step"};
    uint64_t id = ff_controller_submit(ch->c, &s, next_link, ch);
    REQUIRE(id > 0);
    ch->ids[ch->n++] = id;
}

static void next_link(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c;
    (void)n;
    chain *ch = ud;
    CHECK(r[0].status == FF_STATUS_OK);
    if (--ch->left > 0) submit_link(ch, job);
}

static void test_live_trace(void) {
    ff_controller_opts o = rt_opts();
    o.trace = true;
    ff_controller *c = rt_start(&o, 3);
    chain ch = {c, 4, {0}, 0};
    submit_link(&ch, 0);
    rt_counter k = {0};
    for (int i = 0; i < 30; i++) {
        ff_subtask_spec s = {.kind = "echo", .target = FF_TARGET_ANY, .group = "all"};
        REQUIRE(ff_controller_submit(c, &s, rt_count, &k) > 0);
    }
    int64_t n4 = 4;
    ff_input in = rt_f32("x", &n4, 1);
    ff_subtask_spec g = {.kind = "sum", .target = FF_TARGET_GROUP, .group = "all", .inputs = &in, .ninputs = 1};
    REQUIRE(ff_controller_submit(c, &g, rt_count, &k) > 0);
    REQUIRE(ff_controller_run(c, 30) == 0);
    CHECK_EQ_INT(ch.n, 4);
    char path[128];
    snprintf(path, sizeof path, "/tmp/ff-test-trace-%d.json", (int)getpid());
    REQUIRE(ff_controller_trace_write(c, path) == 0);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);

    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) fprintf(stderr, "%s: %s (line %d)\n", path, e.text, e.line);
    REQUIRE(root);
    json_t *ev = json_object_get(root, "traceEvents");
    REQUIRE(json_is_array(ev));
    int nsub = 0, nproc = 0, nthread = 0, nafter_arrows = 0;
    json_t *flows_s = json_object(), *flows_f = json_object();
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(x, "ph"));
        const char *name = json_string_value(json_object_get(x, "name"));
        int pid = (int)json_integer_value(json_object_get(x, "pid"));
        REQUIRE(ph && name);
        if (!strcmp(ph, "M") && !strcmp(name, "process_name")) {
            const char *pn = json_string_value(json_object_get(json_object_get(x, "args"), "name"));
            if (pid == 0) CHECK(!strcmp(pn, "controller"));
            else CHECK(!strncmp(pn, "worker ", 7) && strstr(pn, "pid "));
            nproc++;
        } else if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            nthread++;
        } else if (!strcmp(ph, "X") && !strcmp(json_string_value(json_object_get(x, "cat")), "subtask")) {
            nsub++;
            json_t *args = json_object_get(x, "args");
            CHECK(!strcmp(json_string_value(json_object_get(args, "status")), "ok"));
            CHECK(json_number_value(json_object_get(x, "dur")) >= 0);
            CHECK(json_number_value(json_object_get(x, "ts")) >= json_number_value(json_object_get(args, "dispatch_us")));
            CHECK(pid >= 1 && pid <= 3);
        } else if ((!strcmp(ph, "s") || !strcmp(ph, "f")) && !strcmp(json_string_value(json_object_get(x, "cat")), "after")) {
            nafter_arrows += !strcmp(ph, "s");
        } else if (!strcmp(ph, "s") || !strcmp(ph, "f")) {
            char key[32];
            snprintf(key, sizeof key, "%lld", (long long)json_integer_value(json_object_get(x, "id")));
            json_object_set(!strcmp(ph, "s") ? flows_s : flows_f, key, x);
        }
    }
    CHECK_EQ_INT(nproc, 4);
    CHECK(nthread >= 4);
    CHECK_EQ_INT(nsub, 3 + 4 + 30 + 3); /* group setup, chain, echoes, group sum */
    CHECK_EQ_INT(nafter_arrows, 3);     /* one per link of the chain of sleeps */
    /* every subtask slice has its arrow: s on the controller, f where the slice starts */
    CHECK_EQ_INT(json_object_size(flows_s), nsub);
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(x, "ph"));
        if (strcmp(ph, "X") || strcmp(json_string_value(json_object_get(x, "cat")), "subtask")) continue;
        char key[32];
        snprintf(key, sizeof key, "%lld",
                 (long long)json_integer_value(json_object_get(json_object_get(x, "args"), "id")));
        json_t *f = json_object_get(flows_f, key), *s = json_object_get(flows_s, key);
        REQUIRE(f && s && json_is_object(f));
        CHECK(json_integer_value(json_object_get(s, "pid")) == 0);
        CHECK(json_integer_value(json_object_get(f, "pid")) == json_integer_value(json_object_get(x, "pid")));
        CHECK(json_integer_value(json_object_get(f, "tid")) == json_integer_value(json_object_get(x, "tid")));
        CHECK(json_number_value(json_object_get(f, "ts")) == json_number_value(json_object_get(x, "ts")));
        /* slices on one track never overlap */
        for (size_t j = 0; j < json_array_size(ev); j++) {
            json_t *y = json_array_get(ev, j);
            if (j == i || strcmp(json_string_value(json_object_get(y, "ph")), "X") ||
                json_integer_value(json_object_get(y, "pid")) != json_integer_value(json_object_get(x, "pid")) ||
                json_integer_value(json_object_get(y, "tid")) != json_integer_value(json_object_get(x, "tid")))
                continue;
            double a0 = json_number_value(json_object_get(x, "ts")), a1 = a0 + json_number_value(json_object_get(x, "dur"));
            double b0 = json_number_value(json_object_get(y, "ts")), b1 = b0 + json_number_value(json_object_get(y, "dur"));
            CHECK(a1 <= b0 + 0.002 || b1 <= a0 + 0.002);
        }
    }
    json_decref(flows_s);
    json_decref(flows_f);
    json_decref(root);

    /* the summary finds the chain of four dependent sleeps */
    json_t *s = summary_json(path);
    REQUIRE(s);
    json_t *ids = json_object_get(json_object_get(s, "longest_chain"), "jobs");
    CHECK_EQ_INT(json_array_size(ids), 4);
    for (int i = 0; i < 4 && i < (int)json_array_size(ids); i++)
        CHECK_EQ_INT(json_integer_value(json_array_get(ids, (size_t)i)), ch.ids[i]);
    CHECK_EQ_INT(json_array_size(json_object_get(s, "workers")), 3);
    json_decref(s);
    unlink(path);
}

static json_t *find_event(json_t *ev, const char *ph, const char *cat, const char *name) {
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        const char *p = json_string_value(json_object_get(x, "ph")), *c = json_string_value(json_object_get(x, "cat"));
        const char *n = json_string_value(json_object_get(x, "name"));
        if (p && !strcmp(p, ph) && (!cat || (c && !strcmp(c, cat))) && n && !strcmp(n, name)) return x;
    }
    return NULL;
}

static const char *thread_name(json_t *ev, int pid, int tid) {
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        if (!strcmp(json_string_value(json_object_get(x, "ph")), "M") &&
            !strcmp(json_string_value(json_object_get(x, "name")), "thread_name") &&
            json_integer_value(json_object_get(x, "pid")) == pid && json_integer_value(json_object_get(x, "tid")) == tid)
            return json_string_value(json_object_get(json_object_get(x, "args"), "name"));
    }
    return NULL;
}

static int64_t arg_int(json_t *x, const char *k) { return json_integer_value(json_object_get(json_object_get(x, "args"), k)); }
static double ts_of(json_t *x) { return num(x, "ts"); }
static double end_of(json_t *x) { return num(x, "ts") + num(x, "dur"); }

/* The s and f ends of the arrow (cat, name) whose s lies on (pid, tid), or NULLs. */
static void find_arrow(json_t *ev, const char *cat, const char *name, int pid, int tid, json_t **s, json_t **f) {
    *s = *f = NULL;
    for (size_t i = 0; i < json_array_size(ev) && !*f; i++) {
        json_t *x = json_array_get(ev, i);
        if (strcmp(json_string_value(json_object_get(x, "ph")), "s") || strcmp(json_string_value(json_object_get(x, "cat")), cat) ||
            strcmp(json_string_value(json_object_get(x, "name")), name) || json_integer_value(json_object_get(x, "pid")) != pid ||
            json_integer_value(json_object_get(x, "tid")) != tid)
            continue;
        for (size_t j = 0; j < json_array_size(ev); j++) {
            json_t *y = json_array_get(ev, j);
            if (!strcmp(json_string_value(json_object_get(y, "ph")), "f") && !strcmp(json_string_value(json_object_get(y, "cat")), cat) &&
                json_integer_value(json_object_get(y, "id")) == json_integer_value(json_object_get(x, "id"))) {
                *s = x;
                *f = y;
                break;
            }
        }
    }
}

typedef struct one_result {
    bool done;
    ff_result r;
} one_result;

static void keep_result(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c, (void)job, (void)n;
    one_result *o = ud;
    o->done = true;
    o->r = r[0];
    o->r.outputs = NULL;
    o->r.msg = NULL;
    o->r.error = "";
}

static bool one_done(void *ud) { return ((one_result *)ud)->done; }

static void sleep_ms(double ms) {
    int64_t until = ff_now_ns() + (int64_t)(ms * 1e6);
    while (ff_now_ns() < until) usleep(200);
}

static void test_client_events(void) {
    /* with tracing off the API says so */
    ff_controller_opts o = rt_opts();
    ff_controller *c = rt_start(&o, 0);
    CHECK(ff_controller_trace_track(c, "executor") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "tracing is off");
    ff_trace_slice none = {.track = 1, .name = "x"};
    CHECK(ff_controller_trace_slice(c, &none) == 0);
    ff_controller_destroy(&c);

    o = rt_opts();
    o.trace = true;
    c = rt_start(&o, 2);
    /* job A on worker 0, then controller-side work B that used its result, then job C on
     * worker 1 that used B's */
    ff_arg a20 = ff_arg_float("ms", 20), a10 = ff_arg_float("ms", 10);
    one_result ra = {0}, rc = {0};
    ff_subtask_spec sa = {.kind = "sleep", .target = FF_TARGET_RANK, .rank = 0, .args = &a20, .nargs = 1, .label = "gen A"};
    uint64_t A = ff_controller_submit(c, &sa, keep_result, &ra);
    REQUIRE(A > 0);
    REQUIRE(ff_controller_run_until(c, one_done, &ra, 30) == 0);
    int exec = ff_controller_trace_track(c, "executor"), stages = ff_controller_trace_track(c, "stages");
    CHECK(exec >= 1 && stages >= 1 && exec != stages);
    CHECK_EQ_INT(ff_controller_trace_track(c, "executor"), exec);
    int64_t t0 = ff_now_ns();
    sleep_ms(3);
    int64_t t1 = ff_now_ns();
    ff_arg args[4] = {ff_arg_int("samples", 4), ff_arg_str("node", "adv \"x\""), ff_arg_float("x", 0.5), ff_arg_bool("b", true)};
    ff_trace_slice sb = {.track = exec, .name = "advantage s0-3", .cat = "local", .kind = "advantage", .start_ns = t0, .end_ns = t1,
                         .job = true, .after = &A, .nafter = 1, .args = args, .nargs = 4};
    uint64_t B = ff_controller_trace_slice(c, &sb);
    REQUIRE(B > 0);
    CHECK(B != A);
    uint64_t I = ff_controller_trace_instant(c, stages, "checkpoint", t1);
    CHECK(I > 0 && I != B);
    /* two overlapping slices on one track: the second goes to a lane of its own */
    ff_trace_slice s1 = {.track = stages, .name = "stage 1", .cat = "stage", .start_ns = t0, .end_ns = t1};
    ff_trace_slice s2 = {.track = stages, .name = "stage 2", .cat = "stage", .start_ns = (t0 + t1) / 2, .end_ns = t1 + 1000000};
    CHECK(ff_controller_trace_slice(c, &s1) > 0);
    CHECK(ff_controller_trace_slice(c, &s2) > 0);
    /* misuse: an unknown track, an end before the start, an arrow to an id never given out */
    ff_trace_slice bad = {.track = 99, .name = "bad", .start_ns = t0, .end_ns = t1};
    CHECK(ff_controller_trace_slice(c, &bad) == 0);
    CHECK_STR_CONTAINS(ff_error_message(), "no track 99");
    bad.track = exec, bad.end_ns = t0 - 5;
    CHECK(ff_controller_trace_slice(c, &bad) == 0);
    CHECK_STR_CONTAINS(ff_error_message(), "ends 5 ns before it starts");
    CHECK(ff_controller_trace_flow(c, A, 1u << 30, "x") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no job or slice");
    /* counters on worker 1's process; misuse: no such worker, a value that is not a number */
    const ff_arg mem[2] = {ff_arg_float("peak", 12.5), ff_arg_int("held", 7)};
    CHECK(ff_controller_trace_counter(c, 1, "device memory (MiB)", t1, mem, 2) == 0);
    CHECK(ff_controller_trace_counter(c, 2, "device memory (MiB)", t1, mem, 2) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no worker 2 (of 2)");
    const ff_arg word = ff_arg_str("peak", "high");
    CHECK(ff_controller_trace_counter(c, 0, "device memory (MiB)", t1, &word, 1) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "series 'peak' is not a number");
    /* what worker 1 computes on, as the client placed it: its process name says it */
    CHECK(ff_controller_set_worker_device(c, 1, "cuda:1") == 0);
    CHECK(ff_controller_set_worker_device(c, 7, "cuda:7") == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no worker with rank 7");
    ff_worker_info wi;
    CHECK(ff_controller_worker_info(c, 1, &wi) == 0 && !strcmp(wi.device, "cuda:1"));
    uint64_t after_c[2] = {B, A}; /* A -> C is implied by A -> B -> C: no arrow of its own */
    ff_subtask_spec sc = {.kind = "sleep", .target = FF_TARGET_RANK, .rank = 1, .args = &a10, .nargs = 1, .label = "train C",
                          .after = after_c, .nafter = 2};
    uint64_t C = ff_controller_submit(c, &sc, keep_result, &rc);
    REQUIRE(C > 0);
    CHECK(ff_controller_trace_flow(c, A, C, "handoff") == 0);
    REQUIRE(ff_controller_run_until(c, one_done, &rc, 30) == 0);
    char path[128];
    snprintf(path, sizeof path, "/tmp/ff-test-trace-client-%d.json", (int)getpid());
    REQUIRE(ff_controller_trace_write(c, path) == 0);
    rt_shutdown_clean(c);
    ff_controller_destroy(&c);

    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) fprintf(stderr, "%s: %s (line %d)\n", path, e.text, e.line);
    REQUIRE(root);
    json_t *ev = json_object_get(root, "traceEvents");
    json_t *xa = find_event(ev, "X", "subtask", "gen A"), *xc = find_event(ev, "X", "subtask", "train C");
    json_t *xb = find_event(ev, "X", "local", "advantage s0-3"), *xi = find_event(ev, "i", NULL, "checkpoint");
    json_t *x1 = find_event(ev, "X", "stage", "stage 1"), *x2 = find_event(ev, "X", "stage", "stage 2");
    REQUIRE(xa && xb && xc && xi && x1 && x2);
    /* tracks: threads of the controller, named; the overlapping slice on a lane of its own */
    int tb = (int)json_integer_value(json_object_get(xb, "tid")), t1d = (int)json_integer_value(json_object_get(x1, "tid"));
    int t2d = (int)json_integer_value(json_object_get(x2, "tid"));
    CHECK_EQ_INT(json_integer_value(json_object_get(xb, "pid")), 0);
    CHECK(tb >= 1);
    CHECK(thread_name(ev, 0, tb) && !strcmp(thread_name(ev, 0, tb), "executor"));
    CHECK(thread_name(ev, 0, t1d) && !strcmp(thread_name(ev, 0, t1d), "stages"));
    CHECK(t2d != t1d && t2d != tb && thread_name(ev, 0, t2d) && !strcmp(thread_name(ev, 0, t2d), "stages (lane 2)"));
    CHECK_EQ_INT(json_integer_value(json_object_get(xi, "tid")), t1d);
    CHECK(!strcmp(json_string_value(json_object_get(xi, "s")), "t"));
    /* the counter: ph C in worker 1's process (pid 2), at its time, one series per value; the
     * refused ones absent */
    json_t *xm = find_event(ev, "C", NULL, "device memory (MiB)");
    REQUIRE(xm);
    CHECK_EQ_INT(json_integer_value(json_object_get(xm, "pid")), 2);
    CHECK_CLOSE(ts_of(xm), ts_of(xi), 0.002, 0);
    CHECK_CLOSE(num(json_object_get(xm, "args"), "peak"), 12.5, 0, 0);
    CHECK_EQ_INT(arg_int(xm, "held"), 7);
    int n_counters = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) n_counters += !strcmp(json_string_value(json_object_get(json_array_get(ev, i), "ph")), "C");
    CHECK_EQ_INT(n_counters, 1);
    bool named = false;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        const char *n = json_string_value(json_object_get(json_object_get(x, "args"), "name"));
        named |= !strcmp(json_string_value(json_object_get(x, "ph")), "M") && json_integer_value(json_object_get(x, "pid")) == 2 &&
                 n && strstr(n, "worker 1 (") && strstr(n, ", cuda:1)");
    }
    CHECK(named);
    /* times on the controller's clock, in the same frame as the subtasks */
    double disp_a = num(json_object_get(xa, "args"), "dispatch_us");
    CHECK_CLOSE(ts_of(xb) - disp_a, (double)(t0 - ra.r.dispatch_ns) / 1e3, 0.002, 0);
    CHECK_CLOSE(num(xb, "dur"), (double)(t1 - t0) / 1e3, 0.002, 0);
    CHECK_CLOSE(ts_of(xi), end_of(xb), 0.002, 0);
    CHECK(ts_of(xb) >= end_of(xa) && ts_of(xc) >= end_of(xb));
    /* args: the job, its kind and dependencies, the client's own */
    json_t *ab = json_object_get(xb, "args");
    CHECK_EQ_INT(arg_int(xb, "id"), (int64_t)B);
    CHECK_EQ_INT(arg_int(xb, "job"), (int64_t)B);
    CHECK(!strcmp(json_string_value(json_object_get(ab, "kind")), "advantage"));
    CHECK(json_array_size(json_object_get(ab, "after")) == 1 &&
          json_integer_value(json_array_get(json_object_get(ab, "after"), 0)) == (json_int_t)A);
    CHECK_EQ_INT(arg_int(xb, "samples"), 4);
    CHECK(!strcmp(json_string_value(json_object_get(ab, "node")), "adv \"x\""));
    CHECK_CLOSE(num(ab, "x"), 0.5, 0, 0);
    CHECK(json_is_true(json_object_get(ab, "b")));
    CHECK(!json_object_get(json_object_get(x1, "args"), "job")); /* not a job */
    json_t *ac = json_object_get(json_object_get(xc, "args"), "after");
    CHECK(json_array_size(ac) == 2 && json_integer_value(json_array_get(ac, 0)) == (json_int_t)B);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(xc, "args"), "kind")), "sleep"));
    /* arrows: A -> B and B -> C for the dependencies (none for the implied A -> C), and the
     * client's own from A to C */
    int pa = (int)json_integer_value(json_object_get(xa, "pid")), ta = (int)json_integer_value(json_object_get(xa, "tid"));
    int pc = (int)json_integer_value(json_object_get(xc, "pid")), tc = (int)json_integer_value(json_object_get(xc, "tid"));
    int n_after = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *x = json_array_get(ev, i);
        n_after += !strcmp(json_string_value(json_object_get(x, "ph")), "s") && !strcmp(json_string_value(json_object_get(x, "cat")), "after");
    }
    CHECK_EQ_INT(n_after, 2);
    json_t *s, *f;
    find_arrow(ev, "after", "after", pa, ta, &s, &f);
    REQUIRE(s && f);
    CHECK(ts_of(s) > ts_of(xa) && ts_of(s) <= end_of(xa));
    CHECK(json_integer_value(json_object_get(f, "pid")) == 0 && json_integer_value(json_object_get(f, "tid")) == tb);
    CHECK_CLOSE(ts_of(f), ts_of(xb), 0, 0);
    CHECK(!strcmp(json_string_value(json_object_get(f, "bp")), "e"));
    find_arrow(ev, "after", "after", 0, tb, &s, &f);
    REQUIRE(s && f);
    CHECK(ts_of(s) > ts_of(xb) && ts_of(s) <= end_of(xb));
    CHECK(json_integer_value(json_object_get(f, "pid")) == pc && json_integer_value(json_object_get(f, "tid")) == tc);
    CHECK_CLOSE(ts_of(f), ts_of(xc), 0, 0);
    find_arrow(ev, "flow", "handoff", pa, ta, &s, &f);
    REQUIRE(s && f);
    CHECK(json_integer_value(json_object_get(f, "pid")) == pc && json_integer_value(json_object_get(f, "tid")) == tc);
    CHECK_CLOSE(ts_of(f), ts_of(xc), 0, 0);
    json_decref(root);

    /* the summary chains the subtasks through the controller-side job */
    json_t *sm = summary_json(path);
    REQUIRE(sm);
    json_t *ch = json_object_get(sm, "longest_chain"), *links = json_object_get(ch, "links");
    CHECK_EQ_INT(json_integer_value(json_object_get(ch, "length")), 3);
    REQUIRE(json_array_size(links) == 3);
    const char *kinds[3] = {"sleep", "advantage", "sleep"};
    uint64_t ids[3] = {A, B, C};
    for (size_t i = 0; i < 3; i++) {
        json_t *l = json_array_get(links, i);
        CHECK_EQ_INT(json_integer_value(json_object_get(l, "job")), (int64_t)ids[i]);
        CHECK(!strcmp(json_string_value(json_object_get(l, "kind")), kinds[i]));
        if (i) CHECK(num(l, "start_us") >= num(json_array_get(links, i - 1), "end_us"));
    }
    json_t *kk = json_object_get(ch, "kinds");
    CHECK(json_array_size(kk) == 2 && json_integer_value(json_object_get(json_array_get(kk, 0), "jobs")) == 2);
    json_t *ctl = find_named(json_object_get(sm, "controller"), "executor");
    CHECK(ctl && json_integer_value(json_object_get(ctl, "jobs")) == 1);
    CHECK_CLOSE(num(ctl, "busy_us"), (double)(t1 - t0) / 1e3, 0.002, 0);
    json_decref(sm);
    char *buf = NULL;
    size_t len = 0;
    FILE *tf = open_memstream(&buf, &len);
    REQUIRE(ff_trace_summary(path, tf, false) == 0);
    fclose(tf);
    CHECK_STR_CONTAINS(buf, "longest chain of dependent jobs: 3 jobs");
    CHECK_STR_CONTAINS(buf, "by kind: sleep 2 x");
    CHECK_STR_CONTAINS(buf, "advantage s0-3 (advantage)");
    free(buf);
    unlink(path);
}

int main(int argc, char **argv) {
    RT_WORKER_MAIN(argc, argv);
    test_known_trace();
    test_live_trace();
    test_client_events();
    TEST_MAIN_END();
}

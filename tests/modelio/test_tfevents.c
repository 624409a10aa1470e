/* TensorBoard event files: what ff_tfevents writes is read back by a decoder of this file's
 * own (a bitwise CRC32C checked against its published test vector, a generic protobuf field
 * walker), record by record: the framing and both checksums, file_version first, then each
 * event's wall_time, step and (tag, simple_value) pairs, a metrics line flattened, the
 * restart's session_log. Then the run folder's loggers (train_dir.h): which files
 * ff_train_dir_metrics writes for each setting, and that a fresh start removes an earlier
 * run's event files. TensorBoard's own reader: tests/cli/test_tensorboard.sh. */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fuseflow/config.h"
#include "fuseflow/modelio.h"
#include "fuseflow/tfevents.h"
#include "fuseflow/train_dir.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

/* ---- an independent reader -------------------------------------------------------------- */

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    return ~c;
}

static uint32_t unmask(uint32_t m) {
    uint32_t r = m - 0xa282ead8u;
    return (r >> 17) | (r << 15);
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

typedef struct value {
    char tag[256];
    float v;
} value;

typedef struct event {
    double wall_time;
    bool has_step, has_summary, has_session_log;
    int64_t step;
    char file_version[32];
    value values[16];
    int n_values;
    int64_t session_status;
} event;

static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int s = 0; s < 64 && *p < end; s += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* One field: its number, wire type, and the varint / fixed bits / the bytes of a
 * length-delimited field. */
typedef struct field {
    int num, wire;
    uint64_t u;
    const uint8_t *data;
    size_t len;
} field;

static bool next_field(const uint8_t **p, const uint8_t *end, field *f) {
    uint64_t key;
    memset(f, 0, sizeof *f);
    if (*p >= end || !varint(p, end, &key)) return false;
    f->num = (int)(key >> 3), f->wire = (int)(key & 7);
    switch (f->wire) {
    case 0: return varint(p, end, &f->u);
    case 1:
        if (end - *p < 8) return false;
        f->u = le(*p, 8), *p += 8;
        return true;
    case 5:
        if (end - *p < 4) return false;
        f->u = le(*p, 4), *p += 4;
        return true;
    case 2:
        if (!varint(p, end, &f->u) || (uint64_t)(end - *p) < f->u) return false;
        f->data = *p, f->len = (size_t)f->u, *p += f->u;
        return true;
    }
    return false;
}

static void decode_value(const uint8_t *p, const uint8_t *end, value *v) {
    field f;
    memset(v, 0, sizeof *v);
    while (next_field(&p, end, &f)) {
        if (f.num == 1 && f.wire == 2) snprintf(v->tag, sizeof v->tag, "%.*s", (int)f.len, (const char *)f.data);
        if (f.num == 2 && f.wire == 5) {
            uint32_t u = (uint32_t)f.u;
            memcpy(&v->v, &u, 4);
        }
    }
    REQUIRE(p == end);
}

static void decode_event(const uint8_t *p, size_t n, event *e) {
    const uint8_t *end = p + n;
    memset(e, 0, sizeof *e);
    field f;
    while (next_field(&p, end, &f)) {
        if (f.num == 1 && f.wire == 1) memcpy(&e->wall_time, &f.u, 8);
        else if (f.num == 2 && f.wire == 0) e->has_step = true, e->step = (int64_t)f.u;
        else if (f.num == 3 && f.wire == 2) snprintf(e->file_version, sizeof e->file_version, "%.*s", (int)f.len, (const char *)f.data);
        else if (f.num == 5 && f.wire == 2) {
            e->has_summary = true;
            const uint8_t *q = f.data, *qe = f.data + f.len;
            field g;
            while (next_field(&q, qe, &g)) {
                REQUIRE(g.num == 1 && g.wire == 2 && e->n_values < 16);
                decode_value(g.data, g.data + g.len, &e->values[e->n_values++]);
            }
            REQUIRE(q == qe);
        } else if (f.num == 7 && f.wire == 2) { /* session_log (6 is log_message) */
            e->has_session_log = true;
            const uint8_t *q = f.data, *qe = f.data + f.len;
            field g;
            while (next_field(&q, qe, &g))
                if (g.num == 1 && g.wire == 0) e->session_status = (int64_t)g.u;
        } else REQUIRE(!"an unexpected Event field");
    }
    REQUIRE(p == end); /* every byte is a whole field */
}

/* Every record of the file, checksums verified. Returns the count. */
static int read_events(const char *path, event *ev, int cap) {
    size_t len;
    uint8_t *b = (uint8_t *)ff_read_file(path, &len);
    DIE_IF(!b);
    size_t off = 0;
    int n = 0;
    while (off < len) {
        REQUIRE(len - off >= 12 && n < cap);
        uint64_t dl = le(b + off, 8);
        CHECK_EQ_INT(unmask((uint32_t)le(b + off + 8, 4)), crc32c_bitwise(b + off, 8));
        REQUIRE(len - off - 12 >= dl + 4);
        CHECK_EQ_INT(unmask((uint32_t)le(b + off + 12 + dl, 4)), crc32c_bitwise(b + off + 12, (size_t)dl));
        decode_event(b + off + 12, (size_t)dl, &ev[n++]);
        off += 12 + dl + 4;
    }
    free(b);
    return n;
}

static float value_of(const event *e, const char *tag) {
    for (int i = 0; i < e->n_values; i++)
        if (!strcmp(e->values[i].tag, tag)) return e->values[i].v;
    fprintf(stderr, "no tag '%s' in the event at step %lld\n", tag, (long long)e->step);
    ff_test_failures++;
    return NAN;
}

/* The event files in dir: their count, the last name in path. */
static int event_files(const char *dir, char *path, size_t cap) {
    DIR *d = opendir(dir);
    REQUIRE(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            snprintf(path, cap, "%s/%s", dir, e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

/* ---- the tests ---------------------------------------------------------------------------- */

static void test_checker(void) { /* the reader's CRC is CRC32C: its check value */
    CHECK_EQ_INT(crc32c_bitwise((const uint8_t *)"123456789", 9), 0xe3069283u);
}

static void test_writer(const char *dir) {
    ff_tfevents *w = ff_tfevents_open(dir);
    DIE_IF(!w);
    char host[256] = "", want[512];
    gethostname(host, sizeof host);
    snprintf(want, sizeof want, "%s/events.out.tfevents.", dir);
    CHECK(!strncmp(ff_tfevents_path(w), want, strlen(want)));
    CHECK_STR_CONTAINS(ff_tfevents_path(w), host);
    const char *tags[] = {"loss", "a/long/tag/with/a/path/that/is/over/one/hundred/and/twenty/eight/bytes/long/so/its/length/needs/two/varint/bytes/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"};
    float vals[] = {0.25f, -3.5e7f};
    DIE_IF(ff_tfevents_scalars(w, 1, 1700000000.5, 2, tags, vals) != 0);
    DIE_IF(ff_tfevents_scalars(w, 300, -1, 0, NULL, NULL) != 0); /* a step > 127: a two-byte varint */
    json_t *line = json_pack("{s:I, s:f, s:i, s:s, s:b, s:[i], s:{s:f, s:{s:f}}}", "iteration", (json_int_t)7, "reward_mean", 0.75, "samples", 64,
                             "note", "text", "flag", 1, "memory", 5, "time", "iteration", 1.5, "deep", "x", 2.0);
    DIE_IF(ff_tfevents_json(w, line, "iteration") != 0);
    json_t *bad = json_pack("{s:f}", "loss", 1.0);
    CHECK_EQ_INT(ff_tfevents_json(w, bad, "iteration"), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "without an integer 'iteration'");
    json_decref(line);
    json_decref(bad);
    DIE_IF(ff_tfevents_restart(w, 5) != 0);
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s", ff_tfevents_path(w));
    DIE_IF(ff_tfevents_close(&w) != 0);
    CHECK(w == NULL);

    event ev[8];
    int n = read_events(path, ev, 8);
    REQUIRE(n == 5);
    double now = (double)time(NULL);
    CHECK(!strcmp(ev[0].file_version, "brain.Event:2"));
    CHECK(!ev[0].has_step && !ev[0].has_summary);
    CHECK(fabs(ev[0].wall_time - now) < 120);
    CHECK(ev[1].has_step && ev[1].step == 1 && ev[1].wall_time == 1700000000.5);
    REQUIRE(ev[1].n_values == 2);
    CHECK(!strcmp(ev[1].values[0].tag, "loss") && ev[1].values[0].v == 0.25f);
    CHECK(!strcmp(ev[1].values[1].tag, tags[1]) && ev[1].values[1].v == -3.5e7f);
    CHECK(ev[2].step == 300 && ev[2].has_summary && ev[2].n_values == 0);
    CHECK(ev[3].step == 7);
    CHECK_EQ_INT(ev[3].n_values, 4); /* reward_mean, samples, time/iteration, time/deep/x */
    CHECK(value_of(&ev[3], "reward_mean") == 0.75f);
    CHECK(value_of(&ev[3], "samples") == 64.0f);
    CHECK(value_of(&ev[3], "time/iteration") == 1.5f);
    CHECK(value_of(&ev[3], "time/deep/x") == 2.0f);
    CHECK(ev[4].has_session_log && ev[4].session_status == 1 && ev[4].step == 5 && !ev[4].has_summary);

    /* a name already taken: another file beside it, not an overwrite */
    ff_tfevents *a = ff_tfevents_open(dir), *b = ff_tfevents_open(dir);
    DIE_IF(!a || !b);
    CHECK(strcmp(ff_tfevents_path(a), ff_tfevents_path(b)) != 0);
    ff_tfevents_close(&a);
    ff_tfevents_close(&b);
    CHECK(ff_tfevents_open("/nonexistent/folder") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot create the event file");
}

static bool file_size(const char *dir, const char *name, off_t *size) {
    char p[FF_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    if (stat(p, &st) != 0) return false;
    *size = st.st_size;
    return true;
}

/* One fresh run folder with these loggers, two metrics lines. */
static void run_folder(const char *out, unsigned loggers) {
    ff_config *cfg = ff_config_parse("steps: 2\n", 9, "c.yaml");
    REQUIRE(cfg);
    ff_train_dir_spec spec = {.cmd = "test", .out = out, .out_key = "out", .step_key = "step", .loggers = loggers};
    ff_train_dir d;
    DIE_IF(ff_train_dir_open(&d, &spec) != 0);
    DIE_IF(ff_train_dir_start(&d, cfg) != 0);
    for (int s = 1; s <= 2; s++) {
        json_t *m = json_pack("{s:i, s:f}", "step", s, "loss", 1.0 / s);
        DIE_IF(ff_train_dir_metrics(&d, m) != 0);
        json_decref(m);
    }
    ff_train_dir_close(&d);
    ff_config_destroy(&cfg);
}

static void test_loggers(const char *root) {
    char out[FF_PATH_MAX], path[FF_PATH_MAX];
    off_t size;
    snprintf(out, sizeof out, "%s/run", root);
    run_folder(out, 0); /* the default: metrics.jsonl only */
    CHECK(file_size(out, "metrics.jsonl", &size) && size > 0);
    CHECK_EQ_INT(event_files(out, path, sizeof path), 0);

    run_folder(out, FF_LOGGER_JSONL | FF_LOGGER_TENSORBOARD);
    CHECK(file_size(out, "metrics.jsonl", &size) && size > 0);
    REQUIRE(event_files(out, path, sizeof path) == 1);
    event ev[8];
    int n = read_events(path, ev, 8);
    REQUIRE(n == 3);
    CHECK(ev[1].step == 1 && ev[2].step == 2);
    CHECK(value_of(&ev[2], "loss") == 0.5f);
    CHECK_EQ_INT(ev[2].n_values, 1); /* the step is the event's, not a scalar */

    sleep(1); /* a later second: another name, so the removal below is what leaves one file */
    run_folder(out, FF_LOGGER_TENSORBOARD); /* fresh: the earlier file goes, metrics.jsonl stays empty */
    CHECK(file_size(out, "metrics.jsonl", &size) && size == 0);
    char again[FF_PATH_MAX];
    CHECK_EQ_INT(event_files(out, again, sizeof again), 1);
    CHECK(strcmp(again, path) != 0);
    CHECK_EQ_INT(read_events(again, ev, 8), 3);
}

int main(void) {
    char root[] = "/tmp/ff_tfevents_XXXXXX";
    REQUIRE(mkdtemp(root));
    test_checker();
    test_writer(root);
    test_loggers(root);
    ff_remove_tree(root);
    TEST_MAIN_END();
}

/* TensorBoard event files (include/fuseflow/tfevents.h): TFRecord framing with CRC32C and the
 * few tensorflow.Event protobuf fields the scalars need, encoded by hand.
 *
 * Not here: reading event files; anything but scalars. */
#include "fuseflow/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"

struct ff_tfevents {
    FILE *f;
    char path[FF_PATH_MAX];
    uint8_t *buf; /* the event being encoded */
    size_t len, cap;
    bool failed;  /* out of memory while encoding */
};

/* ---- CRC32C (Castagnoli, reflected polynomial 0x82f63b78) as TFRecord masks it ----------- */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t masked_crc(const uint8_t *p, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    c ^= 0xffffffffu;
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protobuf encoding into w->buf -------------------------------------------------------- */

static void put(ff_tfevents *w, const void *p, size_t n) {
    if (w->failed) return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n) cap *= 2;
        uint8_t *b = ff_realloc(w->buf, cap);
        if (!b) {
            w->failed = true;
            return;
        }
        w->buf = b, w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void put_varint(ff_tfevents *w, uint64_t v) {
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) b[n] |= 0x80;
        n++;
    } while (v);
    put(w, b, n);
}

static void put_le(ff_tfevents *w, uint64_t v, size_t bytes) {
    uint8_t b[8];
    for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, bytes);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static void put_key(ff_tfevents *w, int field, int wire) { put_varint(w, (uint64_t)field << 3 | (uint64_t)wire); }

static void put_double(ff_tfevents *w, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    put_key(w, field, WIRE_FIXED64);
    put_le(w, u, 8);
}

static void put_float(ff_tfevents *w, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_key(w, field, WIRE_FIXED32);
    put_le(w, u, 4);
}

static void put_bytes(ff_tfevents *w, int field, const void *p, size_t n) {
    put_key(w, field, WIRE_LEN);
    put_varint(w, n);
    put(w, p, n);
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >>= 7) n++;
    return n;
}

/* tensorflow.Event's fields. */
enum { EV_WALL_TIME = 1, EV_STEP = 2, EV_FILE_VERSION = 3, EV_SUMMARY = 5, EV_SESSION_LOG = 7 }; /* 6 is the deprecated log_message */
/* Summary { repeated Value value = 1; } Value { string tag = 1; float simple_value = 2; } */
enum { SUM_VALUE = 1, VAL_TAG = 1, VAL_SIMPLE_VALUE = 2 };
/* SessionLog { SessionStatus status = 1; } with START = 1 */
enum { SL_STATUS = 1, SL_START = 1 };

static double now_s(void) { return (double)ff_wall_ns() * 1e-9; }

static void begin_event(ff_tfevents *w, double wall_time, int64_t step, bool with_step) {
    w->len = 0;
    w->failed = false;
    put_double(w, EV_WALL_TIME, wall_time < 0 ? now_s() : wall_time);
    if (with_step) {
        put_key(w, EV_STEP, WIRE_VARINT);
        put_varint(w, (uint64_t)step); /* int64 varints are two's complement */
    }
}

/* The encoded event as one record, flushed. */
static int write_record(ff_tfevents *w) {
    if (w->failed) return ff_error_set(w->path, NULL, "out of memory encoding an event");
    uint8_t head[12];
    uint64_t n = w->len;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(n >> (8 * i));
    uint32_t hc = masked_crc(head, 8), dc = masked_crc(w->buf, w->len);
    uint8_t tail[4];
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(hc >> (8 * i)), tail[i] = (uint8_t)(dc >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(w->buf, 1, w->len, w->f) != w->len || fwrite(tail, 1, 4, w->f) != 4 ||
        fflush(w->f) != 0)
        return ff_error_set(w->path, "check the disk (space, permissions)", "cannot write an event: %s", strerror(errno));
    return 0;
}

/* ---- the file ------------------------------------------------------------------------------ */

ff_tfevents *ff_tfevents_open(const char *dir) {
    ff_tfevents *w = ff_calloc(1, sizeof *w);
    if (!w) return NULL;
    char host[256];
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    long long t = (long long)time(NULL);
    int fd = -1;
    for (int k = 0; k < 1000 && fd < 0; k++) {
        if (k == 0) snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s", dir, t, host);
        else snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d", dir, t, host, k);
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        ff_error_set(w->path, "check that the folder exists and can be written", "cannot create the event file: %s", strerror(errno));
        if (fd >= 0) close(fd);
        free(w);
        return NULL;
    }
    begin_event(w, -1, 0, false);
    put_bytes(w, EV_FILE_VERSION, "brain.Event:2", 13);
    if (write_record(w) != 0) {
        ff_tfevents_close(&w);
        return NULL;
    }
    return w;
}

const char *ff_tfevents_path(const ff_tfevents *w) { return w->path; }

int ff_tfevents_scalars(ff_tfevents *w, int64_t step, double wall_time, size_t n, const char *const *tags, const float *values) {
    begin_event(w, wall_time, step, true);
    size_t sum = 0; /* the Summary's length: each Value is key + length + tag field + 5 */
    for (size_t i = 0; i < n; i++) {
        size_t tl = strlen(tags[i]), vl = 1 + varint_len(tl) + tl + 5;
        sum += 1 + varint_len(vl) + vl;
    }
    put_key(w, EV_SUMMARY, WIRE_LEN);
    put_varint(w, sum);
    for (size_t i = 0; i < n; i++) {
        size_t tl = strlen(tags[i]);
        put_key(w, SUM_VALUE, WIRE_LEN);
        put_varint(w, 1 + varint_len(tl) + tl + 5);
        put_bytes(w, VAL_TAG, tags[i], tl);
        put_float(w, VAL_SIMPLE_VALUE, values[i]);
    }
    return write_record(w);
}

int ff_tfevents_restart(ff_tfevents *w, int64_t step) {
    begin_event(w, -1, step, true);
    put_key(w, EV_SESSION_LOG, WIRE_LEN);
    put_varint(w, 2);
    put_key(w, SL_STATUS, WIRE_VARINT);
    put_varint(w, SL_START);
    return write_record(w);
}

/* ---- metrics lines ---------------------------------------------------------------------------- */

typedef struct scalars {
    char **tags;
    float *values;
    size_t n, cap;
    bool failed;
} scalars;

static void add_scalar(scalars *s, const char *tag, double v) {
    if (s->failed) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 32;
        char **t = ff_realloc(s->tags, cap * sizeof *t);
        if (t) s->tags = t;
        float *v2 = t ? ff_realloc(s->values, cap * sizeof *v2) : NULL;
        if (!v2) {
            s->failed = true;
            return;
        }
        s->values = v2, s->cap = cap;
    }
    if (!(s->tags[s->n] = ff_strdup(tag))) {
        s->failed = true;
        return;
    }
    s->values[s->n++] = (float)v;
}

static void flatten(scalars *s, const json_t *o, const char *prefix, const char *skip) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (skip && !strcmp(key, skip)) continue;
        char tag[512];
        snprintf(tag, sizeof tag, "%s%s", prefix, key);
        if (json_is_number(v)) add_scalar(s, tag, json_number_value(v));
        else if (json_is_object(v)) {
            char sub[520];
            snprintf(sub, sizeof sub, "%s/", tag);
            flatten(s, v, sub, NULL);
        }
    }
}

int ff_tfevents_json(ff_tfevents *w, const json_t *line, const char *step_key) {
    const json_t *st = json_object_get(line, step_key);
    if (!json_is_integer(st)) return ff_error_set(w->path, NULL, "a metrics line without an integer '%s'", step_key);
    scalars s = {0};
    flatten(&s, line, "", step_key);
    int rc = s.failed ? ff_error_set(w->path, NULL, "out of memory flattening a metrics line")
                      : ff_tfevents_scalars(w, (int64_t)json_integer_value(st), -1, s.n, (const char *const *)s.tags, s.values);
    for (size_t i = 0; i < s.n; i++) free(s.tags[i]);
    free(s.tags);
    free(s.values);
    return rc;
}

int ff_tfevents_close(ff_tfevents **wp) {
    ff_tfevents *w = *wp;
    if (!w) return 0;
    *wp = NULL;
    int rc = 0;
    if (w->f && fclose(w->f) != 0) rc = ff_error_set(w->path, NULL, "cannot close the event file: %s", strerror(errno));
    free(w->buf);
    free(w);
    return rc;
}

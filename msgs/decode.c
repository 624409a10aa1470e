/* The wire, incoming half: receiving multiparts and validating them into ff_msg.
 *
 * Order of checks: frame sizes and counts (cheap, before any parsing), then a structural
 * pre-scan of the msgpack header that refuses container counts larger than the bytes left
 * (msgpack-c allocates count * sizeof(msgpack_object) before reading the elements, so an
 * array header claiming 2^32 items would otherwise ask for 100 GB), then the parse into a
 * reused zone, then every field by type and range, then tensor frames against their
 * descriptions. The first failure wins, is counted by reason, and leaves an error message. */
#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/msgs.h"
#include "fuseflow/util.h"
#include "msgs/internal.h"

#define PRESCAN_MAX_DEPTH 16

struct ff_msg_decoder {
    msgpack_zone zone;
    size_t max_frame_bytes;
    ff_msg_stats stats;
};

ff_msg_decoder *ff_msg_decoder_new(size_t max_frame_bytes) {
    ff_msg_decoder *d = ff_calloc(1, sizeof *d);
    if (!d) return NULL;
    if (!msgpack_zone_init(&d->zone, 16 * 1024)) {
        free(d);
        ff_error_set("msgs", NULL, "out of memory");
        return NULL;
    }
    d->max_frame_bytes = max_frame_bytes ? max_frame_bytes : (size_t)1 << 30;
    return d;
}

void ff_msg_decoder_destroy(ff_msg_decoder **pd) {
    if (!*pd) return;
    msgpack_zone_destroy(&(*pd)->zone);
    free(*pd);
    *pd = NULL;
}

const ff_msg_stats *ff_msg_decoder_stats(const ff_msg_decoder *d) { return &d->stats; }

/* ---- pre-scan ------------------------------------------------------------------------ */
static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* Walks one msgpack object in buf[0, len). Returns 0 when it ends exactly at len, else -1
 * with *reason and an error. Rejects extension types (never sent) and the unused 0xc1. */
static int prescan(const uint8_t *buf, size_t len, ff_reject *reason) {
    uint64_t remain[PRESCAN_MAX_DEPTH];
    int depth = 0;
    remain[0] = 1;
    size_t pos = 0;
    while (depth >= 0) {
        if (remain[depth] == 0) {
            depth--;
            continue;
        }
        remain[depth]--;
        if (pos >= len) goto truncated;
        uint8_t b = buf[pos++];
        uint64_t skip = 0, children = 0;
        int lenbytes = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool */
        } else if (b >= 0x80 && b <= 0x8f) {
            children = 2ULL * (b & 0x0f);
        } else if (b >= 0x90 && b <= 0x9f) {
            children = b & 0x0f;
        } else if (b >= 0xa0 && b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4: case 0xd9: lenbytes = 1; break; /* bin8, str8 */
            case 0xc5: case 0xda: lenbytes = 2; break;
            case 0xc6: case 0xdb: lenbytes = 4; break;
            case 0xca: skip = 4; break;
            case 0xcb: skip = 8; break;
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xce: case 0xd2: skip = 4; break;
            case 0xcf: case 0xd3: skip = 8; break;
            case 0xdc: case 0xde:
                if (len - pos < 2) goto truncated;
                children = be(buf + pos, 2) * (b == 0xde ? 2 : 1);
                pos += 2;
                break;
            case 0xdd: case 0xdf:
                if (len - pos < 4) goto truncated;
                children = be(buf + pos, 4) * (b == 0xdf ? 2 : 1);
                pos += 4;
                break;
            default:
                *reason = FF_REJECT_MALFORMED;
                return ff_error_set("message header", NULL, "byte 0x%02x at offset %zu is not a msgpack type we accept",
                                    b, pos - 1);
            }
        }
        if (lenbytes) {
            if (len - pos < (size_t)lenbytes) goto truncated;
            skip = be(buf + pos, lenbytes);
            pos += (size_t)lenbytes;
        }
        if (skip > len - pos) goto truncated;
        pos += skip;
        if (children) {
            /* every element takes at least one byte */
            if (children > len - pos) goto truncated;
            if (depth + 1 >= PRESCAN_MAX_DEPTH) {
                *reason = FF_REJECT_MALFORMED;
                return ff_error_set("message header", NULL, "nested deeper than %d levels", PRESCAN_MAX_DEPTH);
            }
            remain[++depth] = children;
        }
    }
    if (pos != len) {
        *reason = FF_REJECT_MALFORMED;
        return ff_error_set("message header", NULL, "%zu trailing bytes after the header object", len - pos);
    }
    return 0;
truncated:
    *reason = FF_REJECT_TRUNCATED;
    return ff_error_set("message header", "the sender may have cut the message", "ends early (%zu bytes)", len);
}

/* ---- field readers ----------------------------------------------------------------------- */
typedef struct ctx {
    ff_reject *reason;
    const char *type;
} ctx;

#define REJECT(c, r, ...)                                 \
    do {                                                  \
        *(c)->reason = (r);                               \
        ff_error_set((c)->type, NULL, __VA_ARGS__);       \
        return -1;                                        \
    } while (0)

static int get_i64(ctx *c, const msgpack_object *o, const char *field, int64_t lo, int64_t hi, int64_t *out) {
    int64_t v;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) REJECT(c, FF_REJECT_MALFORMED, "field '%s' out of range", field);
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        REJECT(c, FF_REJECT_MALFORMED, "field '%s' is not an integer", field);
    }
    if (v < lo || v > hi) REJECT(c, FF_REJECT_MALFORMED, "field '%s' = %lld out of range [%lld, %lld]", field,
                                 (long long)v, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int get_u64(ctx *c, const msgpack_object *o, const char *field, uint64_t *out) {
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        REJECT(c, FF_REJECT_MALFORMED, "field '%s' is not a non-negative integer", field);
    *out = o->via.u64;
    return 0;
}

static int get_u32(ctx *c, const msgpack_object *o, const char *field, uint32_t *out) {
    int64_t v;
    if (get_i64(c, o, field, 0, UINT32_MAX, &v)) return -1;
    *out = (uint32_t)v;
    return 0;
}

static int get_i32(ctx *c, const msgpack_object *o, const char *field, int32_t lo, int32_t hi, int32_t *out) {
    int64_t v;
    if (get_i64(c, o, field, lo, hi, &v)) return -1;
    *out = (int32_t)v;
    return 0;
}

static int get_bool(ctx *c, const msgpack_object *o, const char *field, bool *out) {
    if (o->type != MSGPACK_OBJECT_BOOLEAN) REJECT(c, FF_REJECT_MALFORMED, "field '%s' is not a boolean", field);
    *out = o->via.boolean;
    return 0;
}

/* A string into a NUL-terminated buffer of cap bytes; refuses NULs inside and overlong ones. */
static int get_str(ctx *c, const msgpack_object *o, const char *field, char *dst, size_t cap) {
    if (o->type != MSGPACK_OBJECT_STR) REJECT(c, FF_REJECT_MALFORMED, "field '%s' is not a string", field);
    uint32_t n = o->via.str.size;
    if (n >= cap) REJECT(c, FF_REJECT_OVERSIZED, "field '%s' has %u bytes (at most %zu)", field, n, cap - 1);
    if (n && memchr(o->via.str.ptr, 0, n)) REJECT(c, FF_REJECT_MALFORMED, "field '%s' contains a NUL byte", field);
    if (n) memcpy(dst, o->via.str.ptr, n);
    dst[n] = 0;
    return 0;
}

static const msgpack_object *expect_array(ctx *c, const msgpack_object *o, const char *field, uint32_t max,
                                          uint32_t *n) {
    if (o->type != MSGPACK_OBJECT_ARRAY) {
        *c->reason = FF_REJECT_MALFORMED;
        ff_error_set(c->type, NULL, "field '%s' is not an array", field);
        return NULL;
    }
    if (o->via.array.size > max) {
        *c->reason = FF_REJECT_OVERSIZED;
        ff_error_set(c->type, NULL, "field '%s' has %u items (at most %u)", field, o->via.array.size, max);
        return NULL;
    }
    *n = o->via.array.size;
    return o->via.array.ptr ? o->via.array.ptr : o; /* an empty array may have ptr NULL */
}

static int get_tensors(ctx *c, const msgpack_object *o, ff_msg *m, int nframes) {
    uint32_t n;
    const msgpack_object *items = expect_array(c, o, "tensors", FF_MSG_MAX_TENSORS, &n);
    if (!items) return -1;
    if ((int)n != nframes)
        REJECT(c, FF_REJECT_FRAMES, "header describes %u tensors but %d tensor frames followed", n, nframes);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *d = &items[i];
        if (d->type != MSGPACK_OBJECT_ARRAY || d->via.array.size != 3)
            REJECT(c, FF_REJECT_MALFORMED, "tensor %u: description is not [name, dtype, shape]", i);
        ff_tensor *t = &m->tensors[i];
        memset(t, 0, sizeof *t);
        if (get_str(c, &d->via.array.ptr[0], "tensor name", t->name, sizeof t->name)) return -1;
        char dt[16];
        if (get_str(c, &d->via.array.ptr[1], "tensor dtype", dt, sizeof dt)) return -1;
        if (ff_dtype_parse(dt, &t->dtype) != 0) REJECT(c, FF_REJECT_MALFORMED, "tensor %u: unknown dtype '%s'", i, dt);
        uint32_t nd;
        const msgpack_object *dims = expect_array(c, &d->via.array.ptr[2], "tensor shape", FF_MSG_MAX_DIMS, &nd);
        if (!dims) return -1;
        t->ndim = (int)nd;
        unsigned long long numel = 1;
        for (uint32_t k = 0; k < nd; k++) {
            int64_t v;
            if (get_i64(c, &dims[k], "tensor dimension", 0, INT64_MAX, &v)) return -1;
            if (v && numel > (1ULL << 62) / (unsigned long long)v)
                REJECT(c, FF_REJECT_OVERSIZED, "tensor %u ('%s'): shape overflows", i, t->name);
            numel *= (unsigned long long)v;
            t->shape[k] = v;
        }
        unsigned long long bytes = numel * ff_dtype_size(t->dtype);
        size_t have = zmq_msg_size(&m->frames[i]);
        if (bytes != have)
            REJECT(c, FF_REJECT_FRAMES, "tensor %u ('%s', %s [%u dims]) needs %llu bytes but its frame has %zu", i,
                   t->name, dt, nd, bytes, have);
        t->nbytes = (size_t)bytes;
    }
    return 0;
}

static int get_args(ctx *c, const msgpack_object *o, ff_msg_subtask *s) {
    if (o->type != MSGPACK_OBJECT_MAP) REJECT(c, FF_REJECT_MALFORMED, "field 'args' is not a map");
    if (o->via.map.size > FF_MSG_MAX_ARGS)
        REJECT(c, FF_REJECT_OVERSIZED, "%u arguments (at most %d)", o->via.map.size, FF_MSG_MAX_ARGS);
    s->nargs = 0;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        ff_arg *a = &s->args[i];
        if (get_str(c, &kv->key, "argument key", a->key, sizeof a->key)) return -1;
        if (!a->key[0]) REJECT(c, FF_REJECT_MALFORMED, "empty argument key");
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(s->args[j].key, a->key)) REJECT(c, FF_REJECT_MALFORMED, "argument '%s' given twice", a->key);
        const msgpack_object *v = &kv->val;
        switch (v->type) {
        case MSGPACK_OBJECT_POSITIVE_INTEGER:
        case MSGPACK_OBJECT_NEGATIVE_INTEGER:
            a->type = FF_ARG_INT;
            if (get_i64(c, v, a->key, INT64_MIN, INT64_MAX, &a->v.i)) return -1;
            break;
        case MSGPACK_OBJECT_FLOAT32:
        case MSGPACK_OBJECT_FLOAT64:
            a->type = FF_ARG_FLOAT;
            a->v.f = v->via.f64;
            break;
        case MSGPACK_OBJECT_BOOLEAN:
            a->type = FF_ARG_BOOL;
            a->v.b = v->via.boolean;
            break;
        case MSGPACK_OBJECT_STR:
            a->type = FF_ARG_STR;
            a->v.s.p = v->via.str.ptr;
            a->v.s.len = v->via.str.size;
            break;
        case MSGPACK_OBJECT_BIN:
            a->type = FF_ARG_STR;
            a->v.s.p = v->via.bin.ptr;
            a->v.s.len = v->via.bin.size;
            break;
        default: REJECT(c, FF_REJECT_MALFORMED, "argument '%s' is not a scalar", a->key);
        }
        s->nargs++;
    }
    return 0;
}

/* The header in m->header against the nframes tensor frames in m->frames. */
static int decode_header(ff_msg_decoder *d, ff_msg *m, int nframes, ff_reject *reason) {
    const uint8_t *buf = zmq_msg_data(&m->header);
    size_t len = zmq_msg_size(&m->header);
    ctx cx = {reason, "message"}, *c = &cx;
    if (len == 0) REJECT(c, FF_REJECT_TRUNCATED, "empty header frame");
    if (len > FF_MSG_MAX_HEADER) REJECT(c, FF_REJECT_OVERSIZED, "header of %zu bytes (at most %d)", len, FF_MSG_MAX_HEADER);
    if (prescan(buf, len, reason) != 0) return -1;
    msgpack_zone_clear(&d->zone);
    msgpack_object root;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack((const char *)buf, len, &off, &d->zone, &root);
    if (ur != MSGPACK_UNPACK_SUCCESS)
        REJECT(c, ur == MSGPACK_UNPACK_NOMEM_ERROR ? FF_REJECT_OVERSIZED : FF_REJECT_MALFORMED,
               "msgpack parse failed (%d)", (int)ur);
    if (root.type != MSGPACK_OBJECT_ARRAY || root.via.array.size < 2)
        REJECT(c, FF_REJECT_MALFORMED, "header is not an array [version, type, ...]");
    const msgpack_object *f = root.via.array.ptr;
    uint32_t nf = root.via.array.size;
    int64_t version, type;
    if (get_i64(c, &f[0], "version", INT64_MIN, INT64_MAX, &version)) return -1;
    if (version != FF_PROTOCOL_VERSION)
        REJECT(c, FF_REJECT_VERSION, "protocol version %lld, this side speaks %d (hint: run the same fuseflow "
               "version on the controller and the workers)", (long long)version, FF_PROTOCOL_VERSION);
    if (get_i64(c, &f[1], "type", INT64_MIN, INT64_MAX, &type)) return -1;
    if (type <= 0 || type >= FF_MSG_TYPE_END) REJECT(c, FF_REJECT_UNKNOWN_TYPE, "unknown message type %lld", (long long)type);
    cx.type = ff_msg_type_name((int)type);
    static const uint32_t fields[FF_MSG_TYPE_END] = {
        [FF_MSG_HELLO] = 12, [FF_MSG_WELCOME] = 7, [FF_MSG_HEARTBEAT] = 9, [FF_MSG_SUBTASK] = 7, [FF_MSG_RESULT] = 9,
        [FF_MSG_ERROR] = 5, [FF_MSG_CANCEL] = 3, [FF_MSG_SHUTDOWN] = 3, [FF_MSG_GROUP_SETUP] = 9,
    };
    if (nf != fields[type]) REJECT(c, FF_REJECT_MALFORMED, "%u header fields, expected %u", nf, fields[type]);
    if (type != FF_MSG_SUBTASK && type != FF_MSG_RESULT && nframes)
        REJECT(c, FF_REJECT_FRAMES, "%d tensor frames follow a message type that carries none", nframes);
    m->type = (ff_msg_type)type;
    switch (m->type) {
    case FF_MSG_HELLO: {
        ff_msg_hello *h = &m->u.hello;
        uint32_t n, ng;
        const msgpack_object *caps, *gpus;
        if (get_i32(c, &f[2], "rank", -1, INT32_MAX, &h->rank) ||
            get_i64(c, &f[3], "pid", 0, INT64_MAX, &h->pid) ||
            get_str(c, &f[4], "host", h->host, sizeof h->host) ||
            get_str(c, &f[5], "device", h->device, sizeof h->device) ||
            !(caps = expect_array(c, &f[6], "caps", FF_MSG_MAX_CAPS, &n)) ||
            get_u64(c, &f[7], "max_frame", &h->max_frame) || get_u32(c, &f[8], "cores", &h->devices.cores) ||
            get_u32(c, &f[9], "cpus", &h->devices.cpus) || !(gpus = expect_array(c, &f[10], "gpus", FF_MSG_MAX_GPUS, &ng)) ||
            get_i32(c, &f[11], "local_index", -1, INT32_MAX, &h->devices.local_index))
            return -1;
        h->ncaps = (int)n;
        for (uint32_t i = 0; i < n; i++)
            if (get_str(c, &caps[i], "capability", h->caps[i], sizeof h->caps[i])) return -1;
        h->devices.ngpus = (int)ng;
        for (uint32_t i = 0; i < ng; i++)
            if (get_str(c, &gpus[i], "GPU", h->devices.gpus[i], sizeof h->devices.gpus[i])) return -1;
        break;
    }
    case FF_MSG_WELCOME: {
        ff_msg_welcome *w = &m->u.welcome;
        if (get_i32(c, &f[2], "rank", 0, INT32_MAX, &w->rank) || get_u32(c, &f[3], "heartbeat_ms", &w->heartbeat_ms) ||
            get_u32(c, &f[4], "timeout_ms", &w->timeout_ms) || get_u32(c, &f[5], "max_inflight", &w->max_inflight) ||
            get_u64(c, &f[6], "max_frame", &w->max_frame))
            return -1;
        break;
    }
    case FF_MSG_HEARTBEAT: {
        ff_msg_heartbeat *h = &m->u.heartbeat;
        if (get_u64(c, &f[2], "seq", &h->seq) || get_bool(c, &f[3], "reply", &h->reply) ||
            get_i64(c, &f[4], "t0", INT64_MIN, INT64_MAX, &h->t0) || get_i64(c, &f[5], "t1", INT64_MIN, INT64_MAX, &h->t1) ||
            get_i64(c, &f[6], "t2", INT64_MIN, INT64_MAX, &h->t2) || get_u32(c, &f[7], "busy", &h->busy) ||
            get_u64(c, &f[8], "errors", &h->errors))
            return -1;
        break;
    }
    case FF_MSG_SUBTASK: {
        ff_msg_subtask *s = &m->u.subtask;
        if (get_u64(c, &f[2], "id", &s->id) || get_str(c, &f[3], "kind", s->kind, sizeof s->kind) ||
            get_str(c, &f[4], "group", s->group, sizeof s->group) || get_args(c, &f[5], s) ||
            get_tensors(c, &f[6], m, nframes))
            return -1;
        if (!s->kind[0]) REJECT(c, FF_REJECT_MALFORMED, "empty kind");
        break;
    }
    case FF_MSG_RESULT: {
        ff_msg_result *r = &m->u.result;
        if (get_u64(c, &f[2], "id", &r->id) || get_i32(c, &f[3], "status", 0, FF_STATUS_END - 1, &r->status) ||
            get_str(c, &f[4], "error", r->error, sizeof r->error) ||
            get_i64(c, &f[5], "start_ns", INT64_MIN, INT64_MAX, &r->start_ns) ||
            get_i64(c, &f[6], "end_ns", INT64_MIN, INT64_MAX, &r->end_ns) || get_u32(c, &f[7], "queued", &r->queued) ||
            get_tensors(c, &f[8], m, nframes))
            return -1;
        break;
    }
    case FF_MSG_ERROR: {
        ff_msg_error *e = &m->u.error;
        if (get_i32(c, &f[2], "code", INT32_MIN, INT32_MAX, &e->code) || get_u64(c, &f[3], "ref", &e->ref) ||
            get_str(c, &f[4], "text", e->text, sizeof e->text))
            return -1;
        break;
    }
    case FF_MSG_CANCEL:
        if (get_u64(c, &f[2], "id", &m->u.cancel.id)) return -1;
        break;
    case FF_MSG_SHUTDOWN:
        if (get_str(c, &f[2], "reason", m->u.shutdown.reason, sizeof m->u.shutdown.reason)) return -1;
        break;
    case FF_MSG_GROUP_SETUP: {
        ff_msg_group_setup *g = &m->u.group;
        uint32_t n;
        const msgpack_object *mem;
        if (get_u64(c, &f[2], "id", &g->id) || get_str(c, &f[3], "name", g->name, sizeof g->name) ||
            get_i32(c, &f[4], "index", 0, INT32_MAX, &g->index) ||
            !(mem = expect_array(c, &f[5], "members", FF_MSG_MAX_MEMBERS, &n)) ||
            get_str(c, &f[6], "backend", g->backend, sizeof g->backend) ||
            get_u32(c, &f[8], "timeout_ms", &g->timeout_ms))
            return -1;
        if (!g->name[0]) REJECT(c, FF_REJECT_MALFORMED, "empty group name");
        if (n == 0) REJECT(c, FF_REJECT_MALFORMED, "group '%s' has no members", g->name);
        if (g->index >= (int32_t)n) REJECT(c, FF_REJECT_MALFORMED, "index %d outside %u members", g->index, n);
        if ((int)n > m->member_cap) {
            int32_t *b = realloc(m->member_buf, sizeof *b * n);
            if (!b) REJECT(c, FF_REJECT_OVERSIZED, "out of memory for %u members", n);
            m->member_buf = b;
            m->member_cap = (int)n;
        }
        for (uint32_t i = 0; i < n; i++)
            if (get_i32(c, &mem[i], "member", 0, INT32_MAX, &m->member_buf[i])) return -1;
        g->members = m->member_buf;
        g->nmembers = (int)n;
        if (f[7].type != MSGPACK_OBJECT_BIN) REJECT(c, FF_REJECT_MALFORMED, "field 'unique_id' is not bytes");
        if (f[7].via.bin.size > FF_MSG_MAX_UNIQUE_ID)
            REJECT(c, FF_REJECT_OVERSIZED, "unique id of %u bytes (at most %d)", f[7].via.bin.size, FF_MSG_MAX_UNIQUE_ID);
        g->unique_id_len = f[7].via.bin.size;
        if (g->unique_id_len) memcpy(g->unique_id, f[7].via.bin.ptr, g->unique_id_len);
        break;
    }
    default: REJECT(c, FF_REJECT_UNKNOWN_TYPE, "unknown message type %lld", (long long)type);
    }
    return 0;
}

/* After the header is valid: tensor data pointers, realigning frames ZeroMQ delivered at
 * addresses that are not a multiple of the element size. */
static int attach_tensors(ff_msg_decoder *d, ff_msg *m, int nframes) {
    for (int i = 0; i < nframes; i++) {
        ff_tensor *t = &m->tensors[i];
        t->data = t->nbytes ? zmq_msg_data(&m->frames[i]) : NULL;
        m->owned[i] = NULL;
        if (t->data && (uintptr_t)t->data % ff_dtype_size(t->dtype) != 0) {
            void *c = malloc(t->nbytes);
            if (!c) return ff_error_set("message", NULL, "out of memory realigning a %zu-byte tensor", t->nbytes);
            memcpy(c, t->data, t->nbytes);
            m->owned[i] = c;
            t->data = c;
            d->stats.realigned++;
        }
    }
    return 0;
}

/* A msgpack integer at buf[*off] (any width, either sign); -1 when it is not one. */
static int peek_int(const uint8_t *buf, size_t len, size_t *off, int64_t *v) {
    if (*off >= len) return -1;
    uint8_t b = buf[(*off)++];
    if (b <= 0x7f) return *v = b, 0;
    if (b >= 0xe0) return *v = (int8_t)b, 0;
    static const int widths[8] = {1, 2, 4, 8, 1, 2, 4, 8}; /* 0xcc..0xcf unsigned, 0xd0..0xd3 signed */
    if (b < 0xcc || b > 0xd3) return -1;
    int n = widths[b - 0xcc];
    if (len - *off < (size_t)n) return -1;
    uint64_t u = be(buf + *off, n);
    *off += (size_t)n;
    if (b >= 0xd0 && n < 8 && (u >> (8 * n - 1))) u |= ~0ULL << (8 * n); /* sign-extend */
    if (b == 0xcf && u > INT64_MAX) return -1;
    *v = (int64_t)u;
    return 0;
}

/* Type and id of a header that was refused, read without trusting the rest: [version, type,
 * id, ...] for the types whose third item is an id. Both 0 when unreadable. */
static void peek_rejected(const ff_msg *m, int *type, uint64_t *id) {
    *type = 0;
    *id = 0;
    if (!m->has_header) return;
    const uint8_t *buf = zmq_msg_data((zmq_msg_t *)&m->header);
    size_t len = zmq_msg_size((zmq_msg_t *)&m->header), off = 0;
    if (len < 1) return;
    uint8_t b = buf[off++];
    uint64_t items;
    if (b >= 0x90 && b <= 0x9f) items = b & 0x0f;
    else if (b == 0xdc && len >= 3) items = be(buf + 1, 2), off += 2;
    else if (b == 0xdd && len >= 5) items = be(buf + 1, 4), off += 4;
    else return;
    int64_t version, t, v;
    if (items < 3 || peek_int(buf, len, &off, &version) || peek_int(buf, len, &off, &t) ||
        peek_int(buf, len, &off, &v) || v <= 0)
        return;
    if (t != FF_MSG_SUBTASK && t != FF_MSG_RESULT && t != FF_MSG_GROUP_SETUP && t != FF_MSG_CANCEL) return;
    *type = (int)t;
    *id = (uint64_t)v;
}

/* Forget a refused message's frames, keeping m->peer and what peek_rejected found. */
static void reset_rejected(ff_msg *m) {
    int type;
    uint64_t id;
    peek_rejected(m, &type, &id);
    uint8_t peer[FF_MSG_MAX_ROUTING_ID];
    size_t peer_len = m->peer_len;
    memcpy(peer, m->peer, peer_len);
    ff_msg_reset(m);
    memcpy(m->peer, peer, peer_len);
    m->peer_len = peer_len;
    m->rejected_type = type;
    m->rejected_id = id;
}

/* m holds the header and nframes frames; validate, keeping m->peer on failure. */
static int finish(ff_msg_decoder *d, ff_msg *m, int nframes, ff_reject *reason) {
    ff_reject r = FF_REJECT_MALFORMED;
    d->stats.received++;
    for (int i = 0; i < nframes; i++) {
        if (zmq_msg_size(&m->frames[i]) > d->max_frame_bytes) {
            r = FF_REJECT_OVERSIZED;
            ff_error_set("message", "raise the receiver's max_frame_bytes (fuseflow worker --max-frame BYTES) or send "
                         "smaller tensors",
                         "tensor frame %d has %zu bytes (limit %zu)", i, zmq_msg_size(&m->frames[i]), d->max_frame_bytes);
            goto reject;
        }
    }
    if (decode_header(d, m, nframes, &r) != 0) goto reject;
    m->ntensors = nframes;
    if (attach_tensors(d, m, nframes) != 0) {
        r = FF_REJECT_OVERSIZED;
        goto reject;
    }
    return 0;
reject:
    d->stats.rejected++;
    d->stats.by_reason[r]++;
    if (reason) *reason = r;
    m->ntensors = nframes;
    reset_rejected(m);
    return -1;
}

int ff_msg_decode(ff_msg_decoder *d, ff_msg *m, const ff_frame *frames, int nframes, ff_reject *reason) {
    ff_msg_reset(m);
    if (nframes < 1 || nframes - 1 > FF_MSG_MAX_TENSORS) {
        d->stats.received++;
        d->stats.rejected++;
        ff_reject r = nframes < 1 ? FF_REJECT_TRUNCATED : FF_REJECT_OVERSIZED;
        d->stats.by_reason[r]++;
        if (reason) *reason = r;
        return ff_error_set("message", NULL, "%d frames (1 to %d)", nframes, FF_MSG_MAX_TENSORS + 1);
    }
    int nt = nframes - 1;
    if (msgs_reserve(m, nt) != 0) return -1;
    if (zmq_msg_init_size(&m->header, frames[0].len) != 0) return ff_error_set("message", NULL, "out of memory");
    m->has_header = true;
    if (frames[0].len) memcpy(zmq_msg_data(&m->header), frames[0].data, frames[0].len);
    for (int i = 0; i < nt; i++) {
        if (zmq_msg_init_size(&m->frames[i], frames[i + 1].len) != 0) {
            m->ntensors = i;
            ff_msg_reset(m);
            return ff_error_set("message", NULL, "out of memory");
        }
        if (frames[i + 1].len) memcpy(zmq_msg_data(&m->frames[i]), frames[i + 1].data, frames[i + 1].len);
        m->ntensors = i + 1;
    }
    m->ntensors = 0; /* finish() sets it once the frames are checked */
    return finish(d, m, nt, reason);
}

int ff_msg_recv(ff_msg_decoder *d, void *sock, bool router, ff_msg *m, ff_reject *reason) {
    ff_msg_reset(m);
    zmq_msg_t part;
    if (router) {
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
            int e = errno;
            zmq_msg_close(&part);
            errno = e;
            return e == EAGAIN ? 0 : -2;
        }
        size_t n = zmq_msg_size(&part);
        if (n > FF_MSG_MAX_ROUTING_ID) n = FF_MSG_MAX_ROUTING_ID;
        memcpy(m->peer, zmq_msg_data(&part), n);
        m->peer_len = n;
        int more = zmq_msg_more(&part);
        zmq_msg_close(&part);
        if (!more) {
            d->stats.received++;
            d->stats.rejected++;
            d->stats.by_reason[FF_REJECT_TRUNCATED]++;
            if (reason) *reason = FF_REJECT_TRUNCATED;
            return ff_error_set("message", NULL, "no header frame after the routing id");
        }
    }
    zmq_msg_init(&m->header);
    m->has_header = true;
    if (zmq_msg_recv(&m->header, sock, ZMQ_DONTWAIT) < 0) {
        int e = errno;
        zmq_msg_close(&m->header);
        m->has_header = false;
        errno = e;
        if (e == EAGAIN && !router) return 0;
        return -2;
    }
    int more = zmq_msg_more(&m->header), n = 0;
    bool too_many = false;
    while (more) {
        if (n < FF_MSG_MAX_TENSORS && msgs_reserve(m, n + 1) == 0) {
            zmq_msg_init(&m->frames[n]);
            if (zmq_msg_recv(&m->frames[n], sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m->frames[n]);
                break;
            }
            more = zmq_msg_more(&m->frames[n]);
            n++;
            m->ntensors = n; /* so a reset closes them */
        } else {
            /* drain and drop the excess so the next message starts clean */
            too_many = true;
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&part);
                break;
            }
            more = zmq_msg_more(&part);
            zmq_msg_close(&part);
        }
    }
    m->ntensors = 0;
    if (too_many) {
        d->stats.received++;
        d->stats.rejected++;
        d->stats.by_reason[FF_REJECT_OVERSIZED]++;
        if (reason) *reason = FF_REJECT_OVERSIZED;
        m->ntensors = n;
        reset_rejected(m);
        return ff_error_set("message", NULL, "more than %d tensor frames", FF_MSG_MAX_TENSORS);
    }
    return finish(d, m, n, reason) == 0 ? 1 : -1;
}

/* ---- argument lookup ---------------------------------------------------------------------- */
const ff_arg *ff_msg_find_arg(const ff_msg_subtask *s, const char *key) {
    for (int i = 0; i < s->nargs; i++)
        if (!strcmp(s->args[i].key, key)) return &s->args[i];
    return NULL;
}

static const char *arg_type_name(ff_arg_type t) {
    switch (t) {
    case FF_ARG_INT: return "an integer";
    case FF_ARG_FLOAT: return "a number";
    case FF_ARG_BOOL: return "a boolean";
    default: return "a string";
    }
}

int ff_msg_arg_int(const ff_msg_subtask *s, const char *key, int64_t *out) {
    const ff_arg *a = ff_msg_find_arg(s, key);
    if (!a) return ff_error_set(s->kind, "pass it in the subtask's args", "missing argument '%s'", key);
    if (a->type == FF_ARG_INT) *out = a->v.i;
    else if (a->type == FF_ARG_BOOL) *out = a->v.b;
    else return ff_error_set(s->kind, NULL, "argument '%s' is %s, expected an integer", key, arg_type_name(a->type));
    return 0;
}

int ff_msg_arg_float(const ff_msg_subtask *s, const char *key, double *out) {
    const ff_arg *a = ff_msg_find_arg(s, key);
    if (!a) return ff_error_set(s->kind, "pass it in the subtask's args", "missing argument '%s'", key);
    if (a->type == FF_ARG_FLOAT) *out = a->v.f;
    else if (a->type == FF_ARG_INT) *out = (double)a->v.i;
    else return ff_error_set(s->kind, NULL, "argument '%s' is %s, expected a number", key, arg_type_name(a->type));
    return 0;
}

int ff_msg_arg_str(const ff_msg_subtask *s, const char *key, const char **p, size_t *len) {
    const ff_arg *a = ff_msg_find_arg(s, key);
    if (!a) return ff_error_set(s->kind, "pass it in the subtask's args", "missing argument '%s'", key);
    if (a->type != FF_ARG_STR)
        return ff_error_set(s->kind, NULL, "argument '%s' is %s, expected a string", key, arg_type_name(a->type));
    *p = a->v.s.p;
    *len = a->v.s.len;
    return 0;
}

/* The wire, outgoing half: building messages, packing their msgpack headers, sending them
 * with tensor frames that are shared rather than copied. Decoding lives in decode.c. */
#include <assert.h>
#include <errno.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/msgs.h"
#include "fuseflow/util.h"
#include "msgs/internal.h"

static const char *const type_names[FF_MSG_TYPE_END] = {
    [FF_MSG_HELLO] = "hello",       [FF_MSG_WELCOME] = "welcome", [FF_MSG_HEARTBEAT] = "heartbeat",
    [FF_MSG_SUBTASK] = "subtask",   [FF_MSG_RESULT] = "result",   [FF_MSG_ERROR] = "error",
    [FF_MSG_CANCEL] = "cancel",     [FF_MSG_SHUTDOWN] = "shutdown", [FF_MSG_GROUP_SETUP] = "group-setup",
};

const char *ff_msg_type_name(int type) {
    if (type <= 0 || type >= FF_MSG_TYPE_END) return "unknown";
    return type_names[type];
}

static const char *const status_names[FF_STATUS_END] = {
    "ok", "failed", "cancelled", "unknown-kind", "bad-request", "worker-lost", "shutdown", "rejected",
};

const char *ff_status_name(int status) {
    if (status < 0 || status >= FF_STATUS_END) return "unknown";
    return status_names[status];
}

static const char *const reject_names[FF_REJECT_COUNT] = {
    "malformed", "truncated", "oversized", "unknown-type", "version", "frames",
};

const char *ff_reject_name(int reason) {
    if (reason < 0 || reason >= FF_REJECT_COUNT) return "unknown";
    return reject_names[reason];
}

static ff_arg arg_key(const char *key, ff_arg_type type) {
    ff_arg a;
    memset(&a, 0, sizeof a);
    snprintf(a.key, sizeof a.key, "%s", key);
    a.type = type;
    return a;
}

ff_arg ff_arg_int(const char *key, int64_t v) {
    ff_arg a = arg_key(key, FF_ARG_INT);
    a.v.i = v;
    return a;
}

ff_arg ff_arg_float(const char *key, double v) {
    ff_arg a = arg_key(key, FF_ARG_FLOAT);
    a.v.f = v;
    return a;
}

ff_arg ff_arg_bool(const char *key, bool v) {
    ff_arg a = arg_key(key, FF_ARG_BOOL);
    a.v.b = v;
    return a;
}

ff_arg ff_arg_str(const char *key, const char *s) {
    ff_arg a = arg_key(key, FF_ARG_STR);
    a.v.s.p = s;
    a.v.s.len = (uint32_t)strlen(s);
    return a;
}

int64_t ff_tensor_numel(const ff_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* ---- lifetime ---------------------------------------------------------------------------- */
void ff_msg_init(ff_msg *m) {
    memset(m, 0, sizeof *m);
}

void ff_msg_reset(ff_msg *m) {
    for (int i = 0; i < m->ntensors; i++) {
        zmq_msg_close(&m->frames[i]);
        free(m->owned[i]);
        m->owned[i] = NULL;
    }
    if (m->has_header) zmq_msg_close(&m->header);
    m->has_header = false;
    m->ntensors = 0;
    m->type = 0;
    m->peer_len = 0;
    m->rejected_type = 0;
    m->rejected_id = 0;
}

/* Bytes of the body of a type (zeroing the whole union would cost a few KiB per message). */
static size_t body_size(ff_msg_type type) {
    switch (type) {
    case FF_MSG_HELLO: return sizeof(ff_msg_hello);
    case FF_MSG_WELCOME: return sizeof(ff_msg_welcome);
    case FF_MSG_HEARTBEAT: return sizeof(ff_msg_heartbeat);
    case FF_MSG_SUBTASK: return sizeof(ff_msg_subtask);
    case FF_MSG_RESULT: return sizeof(ff_msg_result);
    case FF_MSG_ERROR: return sizeof(ff_msg_error);
    case FF_MSG_CANCEL: return sizeof(ff_msg_cancel);
    case FF_MSG_SHUTDOWN: return sizeof(ff_msg_shutdown);
    case FF_MSG_GROUP_SETUP: return sizeof(ff_msg_group_setup);
    default: return sizeof(((ff_msg *)0)->u);
    }
}

void ff_msg_free(ff_msg *m) {
    ff_msg_reset(m);
    free(m->tensors);
    free(m->frames);
    free(m->owned);
    free(m->member_buf);
    memset(m, 0, sizeof *m);
}

void ff_msg_begin(ff_msg *m, ff_msg_type type) {
    ff_msg_reset(m);
    m->type = type;
    memset(&m->u, 0, body_size(type));
}

/* Room for n tensors. zmq_msg_t may not be copied bytewise, so frames move with
 * zmq_msg_move into the new array. */
int msgs_reserve(ff_msg *m, int n) {
    if (n <= m->cap) return 0;
    int cap = m->cap ? m->cap : 4;
    while (cap < n) cap *= 2;
    ff_tensor *t = ff_malloc(sizeof *t * (size_t)cap);
    zmq_msg_t *f = ff_malloc(sizeof *f * (size_t)cap);
    void **o = ff_calloc((size_t)cap, sizeof *o);
    if (!t || !f || !o) {
        free(t);
        free(f);
        free(o);
        return -1;
    }
    for (int i = 0; i < m->ntensors; i++) {
        t[i] = m->tensors[i];
        zmq_msg_init(&f[i]);
        zmq_msg_move(&f[i], &m->frames[i]);
        zmq_msg_close(&m->frames[i]);
        o[i] = m->owned[i];
    }
    free(m->tensors);
    free(m->frames);
    free(m->owned);
    m->tensors = t;
    m->frames = f;
    m->owned = o;
    m->cap = cap;
    return 0;
}

int ff_msg_set_members(ff_msg *m, const int32_t *ranks, int n) {
    if (n < 0 || n > FF_MSG_MAX_MEMBERS)
        return ff_error_set("group setup", "split the group", "%d members (at most %d)", n, FF_MSG_MAX_MEMBERS);
    if (n > m->member_cap) {
        int32_t *b = ff_realloc(m->member_buf, sizeof *b * (size_t)n);
        if (!b) return -1;
        m->member_buf = b;
        m->member_cap = n;
    }
    if (n) memcpy(m->member_buf, ranks, sizeof *ranks * (size_t)n);
    m->u.group.members = m->member_buf;
    m->u.group.nmembers = n;
    return 0;
}

/* ---- tensors ---------------------------------------------------------------------------- */
/* Checks a description and fills the tensor slot; returns its byte size or -1. */
static long long describe(ff_tensor *t, const char *name, ff_dtype dtype, int ndim, const int64_t *shape) {
    if (!name) name = "";
    if (strlen(name) >= FF_MSG_NAME_MAX)
        return ff_error_set("tensor", "use a shorter name", "name '%.40s...' is longer than %d bytes", name,
                            FF_MSG_NAME_MAX - 1);
    if ((int)dtype < 0 || dtype >= FF_DTYPE_COUNT) return ff_error_set("tensor", NULL, "'%s': bad dtype %d", name, dtype);
    if (ndim < 0 || ndim > FF_MSG_MAX_DIMS)
        return ff_error_set("tensor", NULL, "'%s': %d dimensions (at most %d)", name, ndim, FF_MSG_MAX_DIMS);
    unsigned long long numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return ff_error_set("tensor", NULL, "'%s': negative dimension %lld", name, (long long)shape[i]);
        if (shape[i] && numel > (1ULL << 62) / (unsigned long long)shape[i])
            return ff_error_set("tensor", NULL, "'%s': shape overflows", name);
        numel *= (unsigned long long)shape[i];
    }
    unsigned long long bytes = numel * ff_dtype_size(dtype);
    if (bytes > (1ULL << 62)) return ff_error_set("tensor", NULL, "'%s': shape overflows", name);
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = (size_t)bytes;
    return (long long)bytes;
}

ff_tensor *ff_msg_add_tensor(ff_msg *m, const char *name, ff_dtype dtype, int ndim, const int64_t *shape, void *data,
                             void (*free_fn)(void *, void *), void *hint) {
    ff_tensor tmp;
    long long bytes = describe(&tmp, name, dtype, ndim, shape);
    if (bytes < 0 || m->ntensors >= FF_MSG_MAX_TENSORS || msgs_reserve(m, m->ntensors + 1) < 0) {
        if (bytes >= 0 && m->ntensors >= FF_MSG_MAX_TENSORS)
            ff_error_set("tensor", "send fewer tensors per message", "more than %d tensors", FF_MSG_MAX_TENSORS);
        if (free_fn) free_fn(data, hint);
        return NULL;
    }
    zmq_msg_t *f = &m->frames[m->ntensors];
    if (bytes == 0) {
        zmq_msg_init(f);
        if (free_fn) free_fn(data, hint);
    } else if (free_fn) {
        if (zmq_msg_init_data(f, data, (size_t)bytes, free_fn, hint) != 0) {
            free_fn(data, hint);
            ff_error_set("tensor", NULL, "'%s': zmq_msg_init_data: %s", tmp.name, zmq_strerror(errno));
            return NULL;
        }
    } else {
        if (zmq_msg_init_size(f, (size_t)bytes) != 0) {
            ff_error_set("tensor", NULL, "'%s': out of memory for %lld bytes", tmp.name, bytes);
            return NULL;
        }
        memcpy(zmq_msg_data(f), data, (size_t)bytes);
    }
    tmp.data = bytes ? zmq_msg_data(f) : NULL;
    m->owned[m->ntensors] = NULL;
    m->tensors[m->ntensors] = tmp;
    return &m->tensors[m->ntensors++];
}

ff_tensor *ff_msg_add_tensor_ref(ff_msg *m, const ff_msg *src, int index, const char *name) {
    assert(index >= 0 && index < src->ntensors);
    const ff_tensor *s = &src->tensors[index];
    if (m->ntensors >= FF_MSG_MAX_TENSORS) {
        ff_error_set("tensor", "send fewer tensors per message", "more than %d tensors", FF_MSG_MAX_TENSORS);
        return NULL;
    }
    if (name && strlen(name) >= FF_MSG_NAME_MAX) {
        ff_error_set("tensor", "use a shorter name", "name longer than %d bytes", FF_MSG_NAME_MAX - 1);
        return NULL;
    }
    if (msgs_reserve(m, m->ntensors + 1) < 0) return NULL;
    zmq_msg_t *f = &m->frames[m->ntensors];
    ff_tensor *t = &m->tensors[m->ntensors];
    *t = *s;
    if (name) snprintf(t->name, sizeof t->name, "%s", name);
    m->owned[m->ntensors] = NULL;
    if (src->owned[index]) {
        /* a realigned copy: the frame we hold is the misaligned original; copy the bytes */
        if (zmq_msg_init_size(f, s->nbytes) != 0) {
            ff_error_set("tensor", NULL, "out of memory");
            return NULL;
        }
        memcpy(zmq_msg_data(f), s->data, s->nbytes);
    } else {
        zmq_msg_init(f);
        /* zmq_msg_copy shares the bytes of long messages (a reference count); it takes a
         * non-const source because it marks the message shared. */
        if (zmq_msg_copy(f, (zmq_msg_t *)&src->frames[index]) != 0) {
            zmq_msg_close(f);
            ff_error_set("tensor", NULL, "zmq_msg_copy: %s", zmq_strerror(errno));
            return NULL;
        }
    }
    t->data = s->nbytes ? zmq_msg_data(f) : NULL;
    if (t->data && src->owned[index] == NULL && ((uintptr_t)t->data % ff_dtype_size(t->dtype)) != 0) {
        /* the source was realigned on receive but we took the raw frame: keep an aligned copy */
        void *c = malloc(t->nbytes);
        if (!c) {
            zmq_msg_close(f);
            ff_error_set("tensor", NULL, "out of memory");
            return NULL;
        }
        memcpy(c, t->data, t->nbytes);
        m->owned[m->ntensors] = c;
        t->data = c;
    }
    m->ntensors++;
    return t;
}

ff_tensor_ref *ff_tensor_ref_new(const ff_msg *m, int index) {
    assert(index >= 0 && index < m->ntensors);
    ff_tensor_ref *r = ff_calloc(1, sizeof *r);
    if (!r) return NULL;
    r->t = m->tensors[index];
    zmq_msg_init(&r->frame);
    if (m->owned[index]) {
        /* a realigned copy: the frame itself is misaligned, keep our own aligned bytes */
        r->owned = ff_malloc(r->t.nbytes ? r->t.nbytes : 1);
        if (!r->owned) {
            free(r);
            return NULL;
        }
        memcpy(r->owned, m->owned[index], r->t.nbytes);
        r->t.data = r->owned;
    } else if (zmq_msg_copy(&r->frame, (zmq_msg_t *)&m->frames[index]) != 0) {
        ff_error_set("tensor", NULL, "zmq_msg_copy: %s", zmq_strerror(errno));
        zmq_msg_close(&r->frame);
        free(r);
        return NULL;
    } else {
        r->t.data = r->t.nbytes ? zmq_msg_data(&r->frame) : NULL;
    }
    return r;
}

void ff_tensor_ref_free(ff_tensor_ref **pr) {
    ff_tensor_ref *r = *pr;
    if (!r) return;
    zmq_msg_close(&r->frame);
    free(r->owned);
    free(r);
    *pr = NULL;
}

struct ff_shared_buf {
    atomic_int refs;
    void *data;
    void (*free_fn)(void *, void *);
    void *hint;
};

ff_shared_buf *ff_shared_buf_new(void *data, void (*free_fn)(void *, void *), void *hint) {
    ff_shared_buf *b = ff_malloc(sizeof *b);
    if (!b) {
        if (free_fn) free_fn(data, hint);
        return NULL;
    }
    atomic_init(&b->refs, 1);
    b->data = data;
    b->free_fn = free_fn;
    b->hint = hint;
    return b;
}

void ff_shared_buf_release(ff_shared_buf *b) {
    if (!b) return;
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        if (b->free_fn) b->free_fn(b->data, b->hint);
        free(b);
    }
}

static void shared_frame_free(void *data, void *hint) {
    (void)data;
    ff_shared_buf_release(hint);
}

ff_tensor *ff_msg_add_tensor_shared(ff_msg *m, const char *name, ff_dtype dtype, int ndim, const int64_t *shape,
                                    ff_shared_buf *b, size_t offset) {
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return ff_msg_add_tensor(m, name, dtype, ndim, shape, (char *)b->data + offset, shared_frame_free, b);
}

/* ---- packing ---------------------------------------------------------------------------- */
typedef struct wbuf {
    char *p;
    size_t len, cap;
    bool overflow;
} wbuf;

static int wbuf_write(void *data, const char *buf, size_t len) {
    wbuf *w = data;
    if (w->overflow || len > w->cap - w->len) {
        w->overflow = true;
        return -1;
    }
    memcpy(w->p + w->len, buf, len);
    w->len += len;
    return 0;
}

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static int check_name(const char *what, const char *s) {
    if (strnlen(s, FF_MSG_NAME_MAX) >= FF_MSG_NAME_MAX)
        return ff_error_set(what, "use a shorter name", "'%.40s...' is longer than %d bytes", s, FF_MSG_NAME_MAX - 1);
    return 0;
}

static void pack_tensors(msgpack_packer *pk, const ff_msg *m) {
    msgpack_pack_array(pk, (size_t)m->ntensors);
    for (int i = 0; i < m->ntensors; i++) {
        const ff_tensor *t = &m->tensors[i];
        msgpack_pack_array(pk, 3);
        pack_str(pk, t->name);
        pack_str(pk, ff_dtype_name(t->dtype));
        msgpack_pack_array(pk, (size_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) msgpack_pack_int64(pk, t->shape[d]);
    }
}

/* Text fields are cut to fit rather than refused: an error report must always go out. */
static void pack_text(msgpack_packer *pk, const char *s) {
    size_t n = strnlen(s, FF_MSG_TEXT_MAX - 1);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

long ff_msg_pack(const ff_msg *m, void *buf, size_t cap) {
    wbuf w = {buf, 0, cap, false};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &w, wbuf_write);
    const bool has_tensors = m->type == FF_MSG_SUBTASK || m->type == FF_MSG_RESULT;
    if (!has_tensors && m->ntensors)
        return ff_error_set(ff_msg_type_name(m->type), NULL, "this message type carries no tensors");
    switch (m->type) {
    case FF_MSG_HELLO: {
        const ff_msg_hello *h = &m->u.hello;
        if (check_name("hello host", h->host) || check_name("hello device", h->device)) return -1;
        if (h->ncaps < 0 || h->ncaps > FF_MSG_MAX_CAPS) return ff_error_set("hello", NULL, "%d capabilities", h->ncaps);
        const ff_devices *dv = &h->devices;
        if (dv->ngpus < 0 || dv->ngpus > FF_MSG_MAX_GPUS) return ff_error_set("hello", NULL, "%d GPUs", dv->ngpus);
        msgpack_pack_array(&pk, 12);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_int32(&pk, h->rank);
        msgpack_pack_int64(&pk, h->pid);
        pack_str(&pk, h->host);
        pack_str(&pk, h->device);
        msgpack_pack_array(&pk, (size_t)h->ncaps);
        for (int i = 0; i < h->ncaps; i++) {
            if (check_name("hello capability", h->caps[i])) return -1;
            pack_str(&pk, h->caps[i]);
        }
        msgpack_pack_uint64(&pk, h->max_frame);
        msgpack_pack_uint32(&pk, dv->cores);
        msgpack_pack_uint32(&pk, dv->cpus);
        msgpack_pack_array(&pk, (size_t)dv->ngpus);
        for (int i = 0; i < dv->ngpus; i++) {
            if (check_name("hello GPU", dv->gpus[i])) return -1;
            pack_str(&pk, dv->gpus[i]);
        }
        msgpack_pack_int32(&pk, dv->local_index);
        break;
    }
    case FF_MSG_WELCOME: {
        const ff_msg_welcome *wl = &m->u.welcome;
        msgpack_pack_array(&pk, 7);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_int32(&pk, wl->rank);
        msgpack_pack_uint32(&pk, wl->heartbeat_ms);
        msgpack_pack_uint32(&pk, wl->timeout_ms);
        msgpack_pack_uint32(&pk, wl->max_inflight);
        msgpack_pack_uint64(&pk, wl->max_frame);
        break;
    }
    case FF_MSG_HEARTBEAT: {
        const ff_msg_heartbeat *h = &m->u.heartbeat;
        msgpack_pack_array(&pk, 9);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_uint64(&pk, h->seq);
        if (h->reply) msgpack_pack_true(&pk);
        else msgpack_pack_false(&pk);
        msgpack_pack_int64(&pk, h->t0);
        msgpack_pack_int64(&pk, h->t1);
        msgpack_pack_int64(&pk, h->t2);
        msgpack_pack_uint32(&pk, h->busy);
        msgpack_pack_uint64(&pk, h->errors);
        break;
    }
    case FF_MSG_SUBTASK: {
        const ff_msg_subtask *s = &m->u.subtask;
        if (check_name("subtask kind", s->kind) || check_name("subtask group", s->group)) return -1;
        if (s->nargs < 0 || s->nargs > FF_MSG_MAX_ARGS)
            return ff_error_set("subtask", "pass fewer arguments or a tensor", "%d arguments (at most %d)", s->nargs,
                                FF_MSG_MAX_ARGS);
        msgpack_pack_array(&pk, 7);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_uint64(&pk, s->id);
        pack_str(&pk, s->kind);
        pack_str(&pk, s->group);
        msgpack_pack_map(&pk, (size_t)s->nargs);
        for (int i = 0; i < s->nargs; i++) {
            const ff_arg *a = &s->args[i];
            size_t kl = strnlen(a->key, sizeof a->key);
            if (kl == 0 || kl >= sizeof a->key) return ff_error_set("subtask argument", NULL, "empty or unterminated key");
            for (int j = 0; j < i; j++)
                if (!strcmp(s->args[j].key, a->key))
                    return ff_error_set("subtask argument", NULL, "key '%s' given twice", a->key);
            msgpack_pack_str(&pk, kl);
            msgpack_pack_str_body(&pk, a->key, kl);
            switch (a->type) {
            case FF_ARG_INT: msgpack_pack_int64(&pk, a->v.i); break;
            case FF_ARG_FLOAT: msgpack_pack_double(&pk, a->v.f); break;
            case FF_ARG_BOOL:
                if (a->v.b) msgpack_pack_true(&pk);
                else msgpack_pack_false(&pk);
                break;
            case FF_ARG_STR:
                msgpack_pack_str(&pk, a->v.s.len);
                msgpack_pack_str_body(&pk, a->v.s.p, a->v.s.len);
                break;
            default: return ff_error_set("subtask argument", NULL, "'%s': bad type %d", a->key, a->type);
            }
        }
        pack_tensors(&pk, m);
        break;
    }
    case FF_MSG_RESULT: {
        const ff_msg_result *r = &m->u.result;
        msgpack_pack_array(&pk, 9);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_uint64(&pk, r->id);
        msgpack_pack_int32(&pk, r->status);
        pack_text(&pk, r->error);
        msgpack_pack_int64(&pk, r->start_ns);
        msgpack_pack_int64(&pk, r->end_ns);
        msgpack_pack_uint32(&pk, r->queued);
        pack_tensors(&pk, m);
        break;
    }
    case FF_MSG_ERROR: {
        const ff_msg_error *e = &m->u.error;
        msgpack_pack_array(&pk, 5);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_int32(&pk, e->code);
        msgpack_pack_uint64(&pk, e->ref);
        pack_text(&pk, e->text);
        break;
    }
    case FF_MSG_CANCEL:
        msgpack_pack_array(&pk, 3);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_uint64(&pk, m->u.cancel.id);
        break;
    case FF_MSG_SHUTDOWN:
        msgpack_pack_array(&pk, 3);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        pack_text(&pk, m->u.shutdown.reason);
        break;
    case FF_MSG_GROUP_SETUP: {
        const ff_msg_group_setup *g = &m->u.group;
        if (check_name("group name", g->name) || check_name("group backend", g->backend)) return -1;
        if (g->unique_id_len > FF_MSG_MAX_UNIQUE_ID)
            return ff_error_set("group setup", NULL, "unique id of %u bytes (at most %d)", g->unique_id_len,
                                FF_MSG_MAX_UNIQUE_ID);
        if (g->nmembers < 0 || g->nmembers > FF_MSG_MAX_MEMBERS)
            return ff_error_set("group setup", NULL, "%d members (at most %d)", g->nmembers, FF_MSG_MAX_MEMBERS);
        msgpack_pack_array(&pk, 9);
        msgpack_pack_int(&pk, FF_PROTOCOL_VERSION);
        msgpack_pack_int(&pk, m->type);
        msgpack_pack_uint64(&pk, g->id);
        pack_str(&pk, g->name);
        msgpack_pack_int32(&pk, g->index);
        msgpack_pack_array(&pk, (size_t)g->nmembers);
        for (int i = 0; i < g->nmembers; i++) msgpack_pack_int32(&pk, g->members[i]);
        pack_str(&pk, g->backend);
        msgpack_pack_bin(&pk, g->unique_id_len);
        msgpack_pack_bin_body(&pk, g->unique_id, g->unique_id_len);
        msgpack_pack_uint32(&pk, g->timeout_ms);
        break;
    }
    default: return ff_error_set("message", NULL, "cannot pack message type %d", (int)m->type);
    }
    if (w.overflow)
        return ff_error_set(ff_msg_type_name(m->type), "send fewer or shorter arguments, or data as tensors",
                            "header larger than %zu bytes", cap);
    return (long)w.len;
}

/* ---- sending ---------------------------------------------------------------------------- */
/* Sends header and frames; frames are shared (zmq_msg_copy), never consumed. An owned[i]
 * (a realigned copy of a received frame) is sent instead of frames[i]. */
static int send_parts(void *sock, const void *peer, size_t peer_len, const void *hdr, size_t hdr_len,
                      zmq_msg_t *frames, void *const *owned, const ff_tensor *tensors, int n) {
    /* (callers look at errno, which ff_error_set keeps: EHOSTUNREACH means the peer is gone) */
    if (peer && zmq_send(sock, peer, peer_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return ff_error_set("send", NULL, "to peer: %s", zmq_strerror(errno));
    if (zmq_send(sock, hdr, hdr_len, (n ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
        return ff_error_set("send", NULL, "header: %s", zmq_strerror(errno));
    for (int i = 0; i < n; i++) {
        zmq_msg_t f;
        if (owned && owned[i]) {
            if (zmq_msg_init_size(&f, tensors[i].nbytes) != 0) return ff_error_set("send", NULL, "out of memory");
            memcpy(zmq_msg_data(&f), owned[i], tensors[i].nbytes);
        } else {
            zmq_msg_init(&f);
            if (zmq_msg_copy(&f, &frames[i]) != 0) {
                zmq_msg_close(&f);
                return ff_error_set("send", NULL, "zmq_msg_copy: %s", zmq_strerror(errno));
            }
        }
        if (zmq_msg_send(&f, sock, (i + 1 < n ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
            int e = errno;
            zmq_msg_close(&f);
            errno = e;
            return ff_error_set("send", NULL, "tensor frame %d: %s", i, zmq_strerror(e));
        }
    }
    return 0;
}

int ff_msg_send_packed(void *sock, const void *peer, size_t peer_len, const void *hdr, size_t hdr_len, const ff_msg *m) {
    return send_parts(sock, peer, peer_len, hdr, hdr_len, m->frames, (void *const *)m->owned, m->tensors, m->ntensors);
}

int ff_msg_send_frames(void *sock, const void *peer, size_t peer_len, const void *hdr, size_t hdr_len,
                       zmq_msg_t *frames, int nframes) {
    return send_parts(sock, peer, peer_len, hdr, hdr_len, frames, NULL, NULL, nframes);
}

int ff_msg_send(void *sock, const void *peer, size_t peer_len, const ff_msg *m) {
    char buf[FF_MSG_MAX_HEADER];
    long n = ff_msg_pack(m, buf, sizeof buf);
    if (n < 0) return -1;
    return ff_msg_send_packed(sock, peer, peer_len, buf, (size_t)n, m);
}

void ff_msg_send_error(void *sock, const void *peer, size_t peer_len, int code, uint64_t ref, const char *text) {
    ff_msg m;
    ff_msg_init(&m);
    m.type = FF_MSG_ERROR;
    m.u.error.code = code;
    m.u.error.ref = ref;
    ff_text_fit(m.u.error.text, sizeof m.u.error.text, text ? text : "");
    char buf[FF_MSG_TEXT_MAX + 64];
    long n = ff_msg_pack(&m, buf, sizeof buf);
    if (n > 0) (void)ff_msg_send_packed(sock, peer, peer_len, buf, (size_t)n, &m);
    ff_msg_free(&m);
}

/* Named host tensors (see include/fuseflow/tensor_set.h). Linear lookup: sets hold a few
 * hundred tensors and are searched at load time, never in a hot loop. */
#include "fuseflow/tensor_set.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/util.h"

ff_tensor_set *ff_tensor_set_new(void) { return ff_calloc(1, sizeof(ff_tensor_set)); }

void ff_tensor_set_destroy(ff_tensor_set **ps) {
    if (!ps || !*ps) return;
    ff_tensor_set *s = *ps;
    for (size_t i = 0; i < s->n; i++) {
        free(s->items[i].name);
        free(s->items[i].data);
    }
    free(s->items);
    free(s);
    *ps = NULL;
}

int64_t ff_host_tensor_numel(const ff_host_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

ff_host_tensor *ff_tensor_set_find(const ff_tensor_set *s, const char *name) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->items[i].name, name)) return &s->items[i];
    return NULL;
}

ff_host_tensor *ff_tensor_set_add(ff_tensor_set *s, const char *name, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > FF_MAX_DIMS) {
        ff_error_set(name, NULL, "tensor has %d dimensions, at most %d are supported", ndim, FF_MAX_DIMS);
        return NULL;
    }
    if (ff_tensor_set_find(s, name)) {
        ff_error_set(name, NULL, "tensor name appears twice");
        return NULL;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        ff_host_tensor *it = ff_realloc(s->items, cap * sizeof *it);
        if (!it) return NULL;
        s->items = it;
        s->cap = cap;
    }
    ff_host_tensor t = {0};
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            ff_error_set(name, NULL, "negative dimension %lld", (long long)shape[i]);
            return NULL;
        }
        t.shape[i] = shape[i];
    }
    int64_t numel = ff_host_tensor_numel(&t);
    t.name = ff_strdup(name);
    t.data = ff_calloc((size_t)numel, sizeof(float));
    if (!t.name || !t.data) {
        free(t.name);
        free(t.data);
        return NULL;
    }
    s->items[s->n] = t;
    return &s->items[s->n++];
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t off = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && off < cap; i++) off += (size_t)snprintf(buf + off, cap - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < cap) snprintf(buf + off, cap - off, "]");
}

int ff_host_tensor_expect(const ff_host_tensor *t, int ndim, const int64_t *shape, const char *where) {
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (ok) return 0;
    if (where) {
        char a[256], b[256];
        shape_str(a, sizeof a, t->ndim, t->shape);
        shape_str(b, sizeof b, ndim, shape);
        ff_error_set(where, "the weights do not match config.json", "tensor '%s' has shape %s, expected %s", t->name, a, b);
    }
    return -1;
}

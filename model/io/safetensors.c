/* safetensors files: validation on open (mmap), conversion to host fp32, atomic writing, and
 * sharded checkpoints (see include/fuseflow/safetensors.h). The header is parsed with
 * jansson; nothing in the data section is trusted before the header has been checked
 * against the file's size. */
#include "fuseflow/safetensors.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuseflow/util.h"
#include "fuseflow/modelio.h"
#include "fuseflow/train_dir.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian; so must the host be");

struct ff_safetensors {
    char *name;
    const uint8_t *map; /* whole file (mapped or borrowed) */
    size_t map_len;
    int mapped;
    const uint8_t *data; /* start of the data section */
    uint64_t data_len;
    ff_st_entry *entries; /* sorted by begin */
    size_t n;
    char **meta; /* key, value, key, value, ... */
    size_t n_meta;
};

/* The hint for a file whose bytes are wrong: inside a run's checkpoint folder, the
 * checkpoint before it (a copy elsewhere does not exist); otherwise, to copy it again. */
static const char *damaged_hint(const char *path, const char *otherwise) {
    static _Thread_local char buf[16384];
    return ff_checkpoint_hint(path, buf, sizeof buf) == 0 ? buf : otherwise;
}
static const char *k_copy_again = "the file is truncated or damaged; copy or download it again";

void ff_safetensors_close(ff_safetensors **pf) {
    if (!pf || !*pf) return;
    ff_safetensors *f = *pf;
    for (size_t i = 0; i < f->n; i++) free((char *)f->entries[i].name);
    free(f->entries);
    for (size_t i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->meta);
    if (f->mapped && f->map) munmap((void *)f->map, f->map_len);
    free(f->name);
    free(f);
    *pf = NULL;
}

static int cmp_entry_begin(const void *a, const void *b) {
    const ff_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* "tensor 'x'" part of messages; names are bounded so a hostile header cannot flood them. */
#define NAMEFMT "tensor '%.200s'"

static int parse_metadata(ff_safetensors *f, json_t *meta) {
    if (!json_is_object(meta)) return ff_error_set(f->name, NULL, "\"__metadata__\" must be an object of strings");
    size_t n = json_object_size(meta);
    f->meta = ff_calloc(2 * n + 1, sizeof(char *));
    if (!f->meta) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return ff_error_set(f->name, NULL, "\"__metadata__\" value of '%.200s' is not a string", key);
        f->meta[2 * f->n_meta] = ff_strdup(key);
        f->meta[2 * f->n_meta + 1] = ff_strdup(json_string_value(v));
        f->n_meta++;
        if (!f->meta[2 * f->n_meta - 2] || !f->meta[2 * f->n_meta - 1]) return -1;
    }
    return 0;
}

static int get_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_entry(ff_safetensors *f, const char *name, json_t *v, ff_st_entry *e) {
    if (!json_is_object(v)) return ff_error_set(f->name, NULL, NAMEFMT ": header entry is not an object", name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return ff_error_set(f->name, NULL, NAMEFMT ": missing or non-string \"dtype\"", name);
    if (ff_dtype_parse(json_string_value(jd), &e->dtype) != 0)
        return ff_error_set(f->name, "convert the checkpoint to F32, BF16 or F16", NAMEFMT ": unsupported dtype '%.40s' (supported: F32, BF16, F16, F64, I64, I32, I16, I8, U8, BOOL)",
                            name, json_string_value(jd));
    if (!json_is_array(js)) return ff_error_set(f->name, NULL, NAMEFMT ": missing or non-array \"shape\"", name);
    size_t nd = json_array_size(js);
    if (nd > FF_MAX_DIMS) return ff_error_set(f->name, NULL, NAMEFMT ": %zu dimensions, at most %d are supported", name, nd, FF_MAX_DIMS);
    e->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (get_u64(json_array_get(js, i), &d) != 0 || d > (uint64_t)INT64_MAX)
            return ff_error_set(f->name, NULL, NAMEFMT ": shape entry %zu is not a non-negative integer", name, i);
        e->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(numel, d, &numel))
            return ff_error_set(f->name, damaged_hint(f->name, k_copy_again), NAMEFMT ": shape is too large (element count overflows)", name);
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 || get_u64(json_array_get(jo, 0), &e->begin) != 0 ||
        get_u64(json_array_get(jo, 1), &e->end) != 0)
        return ff_error_set(f->name, NULL, NAMEFMT ": \"data_offsets\" must be [begin, end] with non-negative integers", name);
    if (e->end < e->begin)
        return ff_error_set(f->name, damaged_hint(f->name, k_copy_again), NAMEFMT ": data_offsets end %llu is before begin %llu", name, (unsigned long long)e->end,
                            (unsigned long long)e->begin);
    if (e->end > f->data_len)
        return ff_error_set(f->name, damaged_hint(f->name, k_copy_again), NAMEFMT ": data ends at byte %llu but the data section has only %llu bytes", name,
                            (unsigned long long)e->end, (unsigned long long)f->data_len);
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)ff_dtype_size(e->dtype), &bytes) || bytes != e->end - e->begin)
        return ff_error_set(f->name, damaged_hint(f->name, k_copy_again), NAMEFMT ": data_offsets span %llu bytes but shape and dtype %s need %llu", name,
                            (unsigned long long)(e->end - e->begin), ff_dtype_name(e->dtype),
                            (unsigned long long)(numel * (uint64_t)ff_dtype_size(e->dtype)));
    e->name = ff_strdup(name);
    return e->name ? 0 : -1;
}

static int parse_header(ff_safetensors *f) {
    const char *hint_notst = damaged_hint(f->name, "is this a safetensors file? it may be truncated");
    if (f->map_len < 8)
        return ff_error_set(f->name, hint_notst, "file has %zu bytes, too short for the 8-byte header length", f->map_len);
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > f->map_len - 8)
        return ff_error_set(f->name, hint_notst, "header length %llu goes beyond the end of the file (%zu bytes)", (unsigned long long)hlen, f->map_len);
    if (hlen > FF_SAFETENSORS_MAX_HEADER)
        return ff_error_set(f->name, NULL, "header length %llu is over the %u-byte limit", (unsigned long long)hlen, FF_SAFETENSORS_MAX_HEADER);
    if (hlen < 2 || f->map[8] != '{') return ff_error_set(f->name, hint_notst, "header does not start with a JSON object");
    f->data = f->map + 8 + hlen;
    f->data_len = f->map_len - 8 - hlen;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ff_error_set(f->name, hint_notst, "malformed JSON header at byte %d: %s", jerr.position, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) {
        ff_error_set(f->name, NULL, "header is not a JSON object");
        goto out;
    }
    size_t cap = json_object_size(root);
    f->entries = ff_calloc(cap ? cap : 1, sizeof *f->entries);
    if (!f->entries) goto out;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (parse_metadata(f, v) != 0) goto out;
            continue;
        }
        if (parse_entry(f, key, v, &f->entries[f->n]) != 0) goto out;
        f->n++;
    }
    qsort(f->entries, f->n, sizeof *f->entries, cmp_entry_begin);
    for (size_t i = 1; i < f->n; i++) {
        const ff_st_entry *a = &f->entries[i - 1], *b = &f->entries[i];
        if (b->begin < a->end) {
            ff_error_set(f->name, damaged_hint(f->name, k_copy_again), "tensors '%.200s' [%llu, %llu) and '%.200s' [%llu, %llu) overlap", a->name,
                         (unsigned long long)a->begin, (unsigned long long)a->end, b->name, (unsigned long long)b->begin,
                         (unsigned long long)b->end);
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

ff_safetensors *ff_safetensors_parse(const void *data, size_t len, const char *name) {
    ff_safetensors *f = ff_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->name = ff_strdup(name ? name : "<buffer>");
    f->map = data;
    f->map_len = len;
    if (!f->name || parse_header(f) != 0) {
        ff_safetensors_close(&f);
        return NULL;
    }
    return f;
}

ff_safetensors *ff_safetensors_open(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ff_error_set(path, errno == ENOENT ? "check the path" : NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ff_error_set(path, NULL, "not a regular file");
        close(fd);
        return NULL;
    }
    ff_safetensors *f = ff_calloc(1, sizeof *f);
    if (!f || !(f->name = ff_strdup(path))) {
        free(f);
        close(fd);
        return NULL;
    }
    f->map_len = (size_t)st.st_size;
    if (f->map_len > 0) {
        void *m = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            ff_error_set(path, NULL, "cannot map: %s", strerror(errno));
            close(fd);
            ff_safetensors_close(&f);
            return NULL;
        }
        f->map = m;
        f->mapped = 1;
    }
    close(fd);
    if (parse_header(f) != 0) {
        ff_safetensors_close(&f);
        return NULL;
    }
    return f;
}

const char *ff_safetensors_name(const ff_safetensors *f) { return f->name; }
size_t ff_safetensors_count(const ff_safetensors *f) { return f->n; }

const ff_st_entry *ff_safetensors_entry(const ff_safetensors *f, size_t i) { return i < f->n ? &f->entries[i] : NULL; }

const ff_st_entry *ff_safetensors_find(const ff_safetensors *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
    return NULL;
}

const void *ff_safetensors_bytes(const ff_safetensors *f, const ff_st_entry *e) { return f->data + e->begin; }

const char *ff_safetensors_metadata(const ff_safetensors *f, const char *key) {
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

/* Convert n elements at src (any alignment) to fp32. The shared converters read through
 * typed pointers, so misaligned sources go through an aligned bounce buffer. */
static void convert_to_f32(ff_dtype dt, const uint8_t *src, float *dst, size_t n) {
    size_t sz = ff_dtype_size(dt);
    if (dt == FF_DTYPE_BOOL) {
        for (size_t i = 0; i < n; i++) dst[i] = src[i] ? 1.0f : 0.0f;
        return;
    }
    if (((uintptr_t)src % sz) == 0) {
        ff_dtype_to_f32(dt, src, dst, n);
        return;
    }
    enum { CHUNK = 4096 };
    uint64_t bounce[CHUNK]; /* 8-byte aligned, holds CHUNK elements of any dtype */
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        memcpy(bounce, src + i * sz, m * sz);
        ff_dtype_to_f32(dt, bounce, dst + i, m);
    }
}

/* Drop the mapped pages of [p, p + n) from this process's resident memory. They are clean
 * pages of a read-only file mapping: a later read maps them again from the page cache (or
 * the file), so this changes nothing but the memory held while a whole checkpoint is
 * converted one tensor after the other (the fp32 copies plus, without it, every page of the
 * file read so far). */
static void drop_pages(const ff_safetensors *f, const uint8_t *p, size_t n) {
    if (!f->mapped || n == 0) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(page - 1), b = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    madvise((void *)a, b - a, MADV_DONTNEED);
}

int ff_safetensors_read(const ff_safetensors *f, const ff_st_entry *e, ff_tensor_set *out, const char *as) {
    ff_host_tensor *t = ff_tensor_set_add(out, as ? as : e->name, e->ndim, e->shape);
    if (!t) return ff_error_wrap("%s", f->name);
    /* in chunks, each chunk's pages dropped before the next: an embedding of a large
     * vocabulary is hundreds of MiB on its own */
    enum { CHUNK = 1 << 20 }; /* elements */
    const size_t n = (size_t)ff_host_tensor_numel(t), sz = ff_dtype_size(e->dtype);
    const uint8_t *src = f->data + e->begin;
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        convert_to_f32(e->dtype, src + i * sz, t->data + i, m);
        drop_pages(f, src + i * sz, m * sz);
    }
    return 0;
}

/* rows [r0, r0 + nr) x columns [c0, c0 + nc) of e seen as 2-D: 0, or -1 + error naming the file */
static int block_check(const ff_safetensors *f, const ff_st_entry *e, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    if (e->ndim < 1 || e->ndim > 2)
        return ff_error_set(f->name, "read the whole tensor", "tensor '%.200s' has %d dimensions; a block needs 1 or 2",
                            e->name, e->ndim);
    const int64_t rows = e->shape[0], cols = e->ndim > 1 ? e->shape[1] : 1;
    if (r0 < 0 || nr < 0 || r0 > rows - nr || c0 < 0 || nc < 0 || c0 > cols - nc)
        return ff_error_set(f->name, NULL, "block rows [%lld, +%lld) columns [%lld, +%lld) is outside tensor '%.200s' [%lld, %lld]",
                            (long long)r0, (long long)nr, (long long)c0, (long long)nc, e->name, (long long)rows,
                            (long long)cols);
    return 0;
}

/* that block (checked) to fp32 out [nr, nc]; drop: its mapped pages then dropped */
static void block_convert(const ff_safetensors *f, const ff_st_entry *e, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out,
                          bool drop) {
    const int64_t cols = e->ndim > 1 ? e->shape[1] : 1;
    const size_t sz = ff_dtype_size(e->dtype);
    const uint8_t *base = f->data + e->begin;
    if (nc == cols) { /* whole rows: one range */
        convert_to_f32(e->dtype, base + (size_t)(r0 * cols) * sz, out, (size_t)(nr * nc));
    } else {
        for (int64_t r = 0; r < nr; r++)
            convert_to_f32(e->dtype, base + (size_t)((r0 + r) * cols + c0) * sz, out + (size_t)(r * nc), (size_t)nc);
    }
    if (drop && nr > 0) drop_pages(f, base + (size_t)(r0 * cols + c0) * sz, (size_t)((nr - 1) * cols + nc) * sz);
}

int ff_safetensors_read_block(const ff_safetensors *f, const ff_st_entry *e, int64_t r0, int64_t nr, int64_t c0,
                              int64_t nc, ff_tensor_set *out, const char *as) {
    if (block_check(f, e, r0, nr, c0, nc)) return -1;
    int64_t shape[2] = {nr, nc};
    ff_host_tensor *t = ff_tensor_set_add(out, as ? as : e->name, e->ndim, shape);
    if (!t) return ff_error_wrap("%s", f->name);
    block_convert(f, e, r0, nr, c0, nc, t->data, false);
    return 0;
}

int ff_safetensors_read_rows(const ff_safetensors *f, const ff_st_entry *e, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                             float *out) {
    if (block_check(f, e, r0, nr, c0, nc)) return -1;
    block_convert(f, e, r0, nr, c0, nc, out, true);
    return 0;
}

/* ---- a model folder's checkpoint, open ------------------------------------------------------ */

static char *dir_of(const char *path);

struct ff_st_dir {
    ff_safetensors **files; /* [n_files] */
    size_t n_files;
    struct st_dir_item {
        const ff_safetensors *f;
        const ff_st_entry *e;
    } *items;
    size_t n;
};

static int dir_add_file(ff_st_dir *d, ff_safetensors *f) {
    ff_safetensors **fs = ff_realloc(d->files, (d->n_files + 1) * sizeof *fs);
    if (!fs) {
        ff_safetensors_close(&f);
        return -1;
    }
    d->files = fs;
    d->files[d->n_files++] = f;
    return 0;
}

static int dir_add_item(ff_st_dir *d, const ff_safetensors *f, const ff_st_entry *e) {
    struct st_dir_item *it = ff_realloc(d->items, (d->n + 1) * sizeof *it);
    if (!it) return -1;
    d->items = it;
    d->items[d->n++] = (struct st_dir_item){f, e};
    return 0;
}

/* The index file's JSON and its "weight_map" (name -> shard file), every shard name a plain
 * file name of the index's folder: *root (the caller json_decref's it) and *wm, or -1 + error. */
static int index_read(const char *index_path, json_t **root, json_t **wm) {
    json_error_t jerr;
    *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root) {
        if (access(index_path, R_OK) != 0) return ff_error_set(index_path, "check the path", "cannot open: %s", strerror(errno));
        return ff_error_set(index_path, NULL, "malformed JSON at line %d: %s", jerr.line, jerr.text);
    }
    *wm = json_object_get(*root, "weight_map");
    if (!json_is_object(*wm) || json_object_size(*wm) == 0)
        return ff_error_set(index_path, NULL, "no \"weight_map\" object (name -> shard file)");
    const char *name;
    json_t *v;
    json_object_foreach(*wm, name, v) {
        const char *file = json_string_value(v);
        if (!file || !*file || strchr(file, '/') || !strcmp(file, "..") || !strcmp(file, "."))
            return ff_error_set(index_path, "shards must be plain file names in the index's folder",
                                "weight_map entry '%.200s' has a bad shard name", name);
    }
    return 0;
}

static int dir_open_index(ff_st_dir *d, const char *index_path) {
    int rc = -1;
    char *dir = NULL;
    json_t *root = NULL, *wm = NULL, *v;
    const char *name;
    if (index_read(index_path, &root, &wm) || !(dir = dir_of(index_path))) goto out;
    json_object_foreach(wm, name, v) {
        const char *file = json_string_value(v);
        const ff_safetensors *f = NULL;
        for (size_t i = 0; i < d->n_files && !f; i++) {
            const char *fn = strrchr(d->files[i]->name, '/');
            if (!strcmp(fn ? fn + 1 : d->files[i]->name, file)) f = d->files[i];
        }
        if (!f) {
            char path[FF_PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", dir, file);
            ff_safetensors *nf = ff_safetensors_open(path);
            if (!nf) {
                ff_error_wrap("%s (shard of tensor '%.200s')", index_path, name);
                goto out;
            }
            if (dir_add_file(d, nf)) goto out;
            f = nf;
        }
        const ff_st_entry *e = ff_safetensors_find(f, name);
        if (!e) {
            ff_error_set(f->name, damaged_hint(f->name, k_copy_again), "tensor '%.200s' is listed in %s but not in this shard", name, index_path);
            goto out;
        }
        if (dir_add_item(d, f, e)) goto out;
    }
    rc = 0;
out:
    free(dir);
    json_decref(root);
    return rc;
}

ff_st_dir *ff_st_dir_open(const char *dir) {
    ff_st_dir *d = ff_calloc(1, sizeof *d);
    if (!d) return NULL;
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc;
    if (access(path, F_OK) == 0) {
        ff_safetensors *f = ff_safetensors_open(path);
        rc = !f || dir_add_file(d, f) ? -1 : 0;
        for (size_t i = 0; rc == 0 && i < f->n; i++) rc = dir_add_item(d, f, &f->entries[i]);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (access(path, F_OK) == 0) rc = dir_open_index(d, path);
        else
            rc = ff_error_set(dir, "a model folder holds model.safetensors (or model.safetensors.index.json and its shards)",
                              "no model.safetensors or model.safetensors.index.json");
    }
    if (rc) {
        ff_checkpoint_error(path);
        ff_st_dir_close(&d);
    }
    return d;
}

void ff_st_dir_close(ff_st_dir **pd) {
    if (!pd || !*pd) return;
    ff_st_dir *d = *pd;
    for (size_t i = 0; i < d->n_files; i++) ff_safetensors_close(&d->files[i]);
    free(d->files);
    free(d->items);
    free(d);
    *pd = NULL;
}

size_t ff_st_dir_count(const ff_st_dir *d) { return d->n; }

const ff_st_entry *ff_st_dir_entry(const ff_st_dir *d, size_t i, const ff_safetensors **file) {
    assert(i < d->n);
    if (file) *file = d->items[i].f;
    return d->items[i].e;
}

const ff_st_entry *ff_st_dir_find(const ff_st_dir *d, const char *name, const ff_safetensors **file) {
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->items[i].e->name, name)) {
            if (file) *file = d->items[i].f;
            return d->items[i].e;
        }
    return NULL;
}

/* ff_safetensors_read, or the block a chooser wants (the whole tensor when it leaves the
 * preset block alone) */
typedef struct reader {
    ff_st_block_fn fn;
    void *ctx;
} reader;

static int read_as(const reader *rd, const ff_safetensors *f, const ff_st_entry *e, ff_tensor_set *out) {
    if (!rd || !rd->fn || e->ndim < 1 || e->ndim > 2) return ff_safetensors_read(f, e, out, NULL);
    int64_t r0 = 0, nr = e->shape[0], c0 = 0, nc = e->ndim > 1 ? e->shape[1] : 1;
    rd->fn(rd->ctx, e, &r0, &nr, &c0, &nc);
    if (nr < 0) return 0; /* not wanted: not read */
    return ff_safetensors_read_block(f, e, r0, nr, c0, nc, out, NULL);
}

static int load_file(const char *path, const reader *rd, ff_tensor_set *out) {
    ff_safetensors *f = ff_safetensors_open(path);
    if (!f) return ff_checkpoint_error(path);
    int rc = 0;
    for (size_t i = 0; i < f->n && rc == 0; i++) rc = read_as(rd, f, &f->entries[i], out);
    ff_safetensors_close(&f);
    return rc ? ff_checkpoint_error(path) : 0;
}

int ff_safetensors_load(const char *path, ff_tensor_set *out) { return load_file(path, NULL, out); }

/* ---- sharded checkpoints ---------------------------------------------------------------- */

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return ff_strdup(".");
    size_t n = (size_t)(slash - path);
    char *d = ff_malloc(n + 2);
    if (!d) return NULL;
    if (n == 0) {
        strcpy(d, "/");
    } else {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

static int load_index(const char *index_path, const reader *rd, ff_tensor_set *out) {
    int rc = -1;
    char *dir = NULL;
    ff_safetensors *shard = NULL;
    json_t *done = NULL; /* shard files read */
    json_t *root = NULL, *wm = NULL;
    const char *name;
    json_t *v;
    if (index_read(index_path, &root, &wm) || !(dir = dir_of(index_path))) goto out;
    /* Open each shard once: walk the map, and for each shard not opened yet, load all of its
     * tensors (those the reader wants) */
    if (!(done = json_object())) goto out;
    json_object_foreach(wm, name, v) {
        const char *file = json_string_value(v);
        if (json_object_get(done, file)) continue;
        if (json_object_set_new(done, file, json_true()) != 0) goto out;
        char path[FF_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (!(shard = ff_safetensors_open(path))) {
            ff_error_wrap("%s (shard of tensor '%.200s')", index_path, name);
            goto out;
        }
        const char *n2;
        json_t *v2;
        json_object_foreach(wm, n2, v2) {
            if (strcmp(json_string_value(v2), file) != 0) continue;
            const ff_st_entry *e = ff_safetensors_find(shard, n2);
            if (!e) {
                ff_error_set(path, damaged_hint(path, k_copy_again), "tensor '%.200s' is listed in %s but not in this shard", n2, index_path);
                goto out;
            }
            if (read_as(rd, shard, e, out) != 0) goto out;
        }
        ff_safetensors_close(&shard);
    }
    rc = 0;
out:
    ff_safetensors_close(&shard);
    free(dir);
    json_decref(done);
    json_decref(root);
    return rc;
}

int ff_safetensors_load_index(const char *index_path, ff_tensor_set *out) { return load_index(index_path, NULL, out); }

int ff_safetensors_load_dir_blocks(const char *dir, ff_st_block_fn fn, void *ctx, ff_tensor_set *out) {
    const reader rd = {fn, ctx};
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) return load_file(path, &rd, out);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) return load_index(path, &rd, out);
    return ff_error_set(dir, "a model folder holds model.safetensors (or model.safetensors.index.json and its shards)",
                        "no model.safetensors or model.safetensors.index.json");
}

int ff_safetensors_load_dir(const char *dir, ff_tensor_set *out) { return ff_safetensors_load_dir_blocks(dir, NULL, NULL, out); }

/* ---- writing ---------------------------------------------------------------------------- */

static json_t *make_header(const ff_tensor_set *set, const size_t *idx, size_t n, ff_dtype dtype, const char *const *metadata,
                           uint64_t *data_len) {
    json_t *h = json_object();
    if (!h) return NULL;
    if (metadata && metadata[0]) {
        json_t *m = json_object();
        for (size_t i = 0; metadata[i] && metadata[i + 1]; i += 2) json_object_set_new(m, metadata[i], json_string(metadata[i + 1]));
        json_object_set_new(h, "__metadata__", m);
    }
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        const ff_host_tensor *t = &set->items[idx ? idx[k] : k];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        uint64_t bytes = (uint64_t)ff_host_tensor_numel(t) * ff_dtype_size(dtype);
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", ff_dtype_name(dtype), "shape", shape, "data_offsets", (json_int_t)off,
                              (json_int_t)(off + bytes));
        if (!e || json_object_set_new(h, t->name, e) != 0) {
            json_decref(h);
            ff_error_set(t->name, NULL, "cannot build the safetensors header");
            return NULL;
        }
        off += bytes;
    }
    *data_len = off;
    return h;
}

/* Write tensors idx[0..n) (all of the set when idx is NULL) as one file. */
static int save_file(const char *path, const ff_tensor_set *set, const size_t *idx, size_t n, ff_dtype dtype, const char *const *metadata) {
    if (dtype != FF_DTYPE_F32 && dtype != FF_DTYPE_BF16 && dtype != FF_DTYPE_F16)
        return ff_error_set(path, NULL, "cannot write dtype %s (F32, BF16 or F16)", ff_dtype_name(dtype));
    uint64_t data_len;
    json_t *h = make_header(set, idx, n, dtype, metadata, &data_len);
    if (!h) return -1;
    char *hs = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!hs) return ff_error_set(path, NULL, "cannot serialise the safetensors header");
    /* pad the header with spaces so the data starts 8-byte aligned, as Hugging Face does */
    size_t hlen = strlen(hs), padded = (hlen + 7) & ~(size_t)7;
    char *hb = ff_malloc(8 + padded);
    if (!hb) {
        free(hs);
        return -1;
    }
    uint64_t le = padded;
    memcpy(hb, &le, 8);
    memcpy(hb + 8, hs, hlen);
    memset(hb + 8 + hlen, ' ', padded - hlen);
    free(hs);
    ff_atomic_file af;
    int rc = ff_atomic_file_begin(&af, path);
    if (rc == 0) rc = ff_atomic_file_write(&af, hb, 8 + padded);
    free(hb);
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = NULL;
    if (rc == 0 && dtype != FF_DTYPE_F32 && !(buf = ff_malloc(CHUNK * sizeof *buf))) rc = -1;
    for (size_t k = 0; k < n && rc == 0; k++) {
        const ff_host_tensor *t = &set->items[idx ? idx[k] : k];
        size_t numel = (size_t)ff_host_tensor_numel(t);
        if (dtype == FF_DTYPE_F32) {
            rc = ff_atomic_file_write(&af, t->data, numel * sizeof(float));
            continue;
        }
        for (size_t i = 0; i < numel && rc == 0; i += CHUNK) {
            size_t m = numel - i < CHUNK ? numel - i : CHUNK;
            ff_dtype_from_f32(dtype, t->data + i, buf, m);
            rc = ff_atomic_file_write(&af, buf, m * sizeof *buf);
        }
    }
    free(buf);
    if (rc == 0) return ff_atomic_file_commit(&af);
    ff_atomic_file_abort(&af);
    return -1;
}

int ff_safetensors_save(const char *path, const ff_tensor_set *set, ff_dtype dtype, const char *const *metadata) {
    return save_file(path, set, NULL, set->n, dtype, metadata);
}

int ff_safetensors_save_sharded(const char *dir, const ff_tensor_set *set, ff_dtype dtype, uint64_t max_shard_bytes) {
    const char *const fmt_meta[] = {"format", "pt", NULL};
    size_t n = set->n;
    size_t *shard_of = ff_calloc(n ? n : 1, sizeof *shard_of);
    size_t *idx = ff_calloc(n ? n : 1, sizeof *idx);
    if (!shard_of || !idx) {
        free(shard_of);
        free(idx);
        return -1;
    }
    /* greedy: fill a shard until the next tensor would overflow it */
    size_t n_shards = 0;
    uint64_t filled = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)ff_host_tensor_numel(&set->items[i]) * ff_dtype_size(dtype);
        if (n_shards == 0 || (filled > 0 && filled + bytes > max_shard_bytes)) {
            n_shards++;
            filled = 0;
        }
        shard_of[i] = n_shards - 1;
        filled += bytes;
    }
    char path[FF_PATH_MAX], other[FF_PATH_MAX];
    int rc = 0;
    if (n_shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = save_file(path, set, NULL, n, dtype, fmt_meta);
        snprintf(other, sizeof other, "%s/model.safetensors.index.json", dir);
        if (rc == 0) unlink(other); /* a stale index would describe other weights */
        free(shard_of);
        free(idx);
        return rc;
    }
    json_t *wm = json_object();
    uint64_t total = 0;
    for (size_t s = 0; s < n_shards && rc == 0; s++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (shard_of[i] == s) {
                idx[m++] = i;
                json_object_set_new(wm, set->items[i].name, json_string(file));
                total += (uint64_t)ff_host_tensor_numel(&set->items[i]) * ff_dtype_size(dtype);
            }
        rc = save_file(path, set, idx, m, dtype, fmt_meta);
    }
    if (rc == 0) {
        json_t *index = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
        wm = NULL;
        char *text = index ? json_dumps(index, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        json_decref(index);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        rc = text ? ff_write_file_atomic(path, text, strlen(text)) : ff_error_set(path, NULL, "cannot serialise the index");
        free(text);
        snprintf(other, sizeof other, "%s/model.safetensors", dir);
        if (rc == 0) unlink(other); /* load_dir prefers model.safetensors: a stale one would win */
    }
    json_decref(wm);
    free(shard_of);
    free(idx);
    return rc;
}

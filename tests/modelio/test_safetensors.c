/* safetensors: round trips in every writable dtype, sharded checkpoints, a file written by
 * Hugging Face's own library, blocks of tensors (rows, columns, through a chooser over a
 * sharded folder), every way a header can lie (each must be refused with a message naming
 * the problem), and reading that gives the mapped pages back. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/safetensors.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static char g_dir[256];

static ff_tensor_set *make_set(void) {
    ff_tensor_set *s = ff_tensor_set_new();
    int64_t sa[2] = {3, 5}, sb[1] = {7}, sc[3] = {2, 1, 2};
    ff_host_tensor *a = ff_tensor_set_add(s, "model.embed_tokens.weight", 2, sa);
    for (int i = 0; i < 15; i++) a->data[i] = (float)(i - 7) * 0.25f; /* exact in bf16 and f16 */
    ff_host_tensor *b = ff_tensor_set_add(s, "model.norm.weight", 1, sb);
    for (int i = 0; i < 7; i++) b->data[i] = 1.0f + (float)i / 8.0f;
    ff_host_tensor *c = ff_tensor_set_add(s, "x.scalarish", 3, sc);
    for (int i = 0; i < 4; i++) c->data[i] = -(float)i;
    int64_t sd[1] = {0};
    ff_tensor_set_add(s, "empty", 1, sd);
    return s;
}

static int same_sets(const ff_tensor_set *a, const ff_tensor_set *b) {
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++) {
        const ff_host_tensor *x = &a->items[i], *y = ff_tensor_set_find(b, x->name);
        if (!y || ff_host_tensor_expect(y, x->ndim, x->shape, NULL) != 0) return 0;
        if (memcmp(x->data, y->data, (size_t)ff_host_tensor_numel(x) * 4) != 0) return 0;
    }
    return 1;
}

static void test_roundtrip(void) {
    ff_tensor_set *s = make_set();
    ff_dtype types[3] = {FF_DTYPE_F32, FF_DTYPE_BF16, FF_DTYPE_F16};
    for (int k = 0; k < 3; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/rt_%s.safetensors", g_dir, ff_dtype_name(types[k]));
        const char *meta[] = {"format", "pt", "note", "hello", NULL};
        REQUIRE(ff_safetensors_save(path, s, types[k], meta) == 0);
        ff_safetensors *f = ff_safetensors_open(path);
        REQUIRE(f);
        CHECK_EQ_INT(ff_safetensors_count(f), 4);
        CHECK(ff_safetensors_metadata(f, "note") && !strcmp(ff_safetensors_metadata(f, "note"), "hello"));
        CHECK(ff_safetensors_metadata(f, "nope") == NULL);
        const ff_st_entry *e = ff_safetensors_find(f, "model.norm.weight");
        REQUIRE(e);
        CHECK_EQ_INT(e->dtype, types[k]);
        CHECK_EQ_INT(e->end - e->begin, 7 * ff_dtype_size(types[k]));
        /* data starts 8-byte aligned, as Hugging Face writes it */
        CHECK_EQ_INT((uintptr_t)ff_safetensors_bytes(f, ff_safetensors_entry(f, 0)) % 8, 0);
        ff_safetensors_close(&f);
        CHECK(f == NULL);
        ff_tensor_set *t = ff_tensor_set_new();
        REQUIRE(ff_safetensors_load(path, t) == 0);
        CHECK(same_sets(s, t));
        ff_tensor_set_destroy(&t);
        /* no temporary file left behind */
        char tmp[600];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        CHECK(access(tmp, F_OK) != 0);
    }
    ff_tensor_set_destroy(&s);
}

static void test_bf16_rounding(void) {
    ff_tensor_set *s = ff_tensor_set_new();
    int64_t sh[1] = {2};
    ff_host_tensor *t = ff_tensor_set_add(s, "w", 1, sh);
    t->data[0] = 1.0f + 1.0f / 256.0f + 1.0f / 512.0f; /* between two bf16 values */
    t->data[1] = 3.14159265f;
    char path[512];
    snprintf(path, sizeof path, "%s/round.safetensors", g_dir);
    REQUIRE(ff_safetensors_save(path, s, FF_DTYPE_BF16, NULL) == 0);
    ff_tensor_set *u = ff_tensor_set_new();
    REQUIRE(ff_safetensors_load(path, u) == 0);
    CHECK_CLOSE(u->items[0].data[0], ff_bf16_to_f32(ff_f32_to_bf16(t->data[0])), 0, 0);
    CHECK_CLOSE(u->items[0].data[1], 3.140625, 0, 0);
    ff_tensor_set_destroy(&s);
    ff_tensor_set_destroy(&u);
}

static void test_sharded(void) {
    ff_tensor_set *s = make_set();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sharded", g_dir);
    REQUIRE(ff_mkdirs(dir) == 0);
    /* 60 bytes per shard at most: the 15-float tensor gets its own shard */
    REQUIRE(ff_safetensors_save_sharded(dir, s, FF_DTYPE_F32, 40) == 0);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK(access(p, F_OK) == 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/model-00001-of-00003.safetensors", dir);
    CHECK(access(p, F_OK) == 0);
    ff_tensor_set *t = ff_tensor_set_new();
    REQUIRE(ff_safetensors_load_dir(dir, t) == 0);
    CHECK(same_sets(s, t));
    ff_tensor_set_destroy(&t);

    /* a shard missing from disk, and an index that lists a tensor its shard lacks */
    snprintf(p, sizeof p, "%s/model-00002-of-00003.safetensors", dir);
    char moved[700];
    snprintf(moved, sizeof moved, "%s.bak", p);
    REQUIRE(rename(p, moved) == 0);
    t = ff_tensor_set_new();
    CHECK(ff_safetensors_load_dir(dir, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "model-00002-of-00003.safetensors");
    CHECK_STR_CONTAINS(ff_error_message(), "cannot open");
    ff_tensor_set_destroy(&t);
    REQUIRE(rename(moved, p) == 0);

    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *lie = "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00003.safetensors\", \"ghost\": "
                      "\"model-00001-of-00003.safetensors\"}}";
    REQUIRE(ff_write_file_atomic(p, lie, strlen(lie)) == 0);
    t = ff_tensor_set_new();
    CHECK(ff_safetensors_load_dir(dir, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "'ghost' is listed in");
    ff_tensor_set_destroy(&t);

    const char *escape = "{\"weight_map\": {\"a\": \"../x.safetensors\"}}";
    REQUIRE(ff_write_file_atomic(p, escape, strlen(escape)) == 0);
    t = ff_tensor_set_new();
    CHECK(ff_safetensors_load_dir(dir, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "bad shard name");
    ff_tensor_set_destroy(&t);

    REQUIRE(ff_write_file_atomic(p, "{\"weight_map\": ", 15) == 0);
    t = ff_tensor_set_new();
    CHECK(ff_safetensors_load_dir(dir, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "malformed JSON");
    ff_tensor_set_destroy(&t);

    /* one shard: a plain model.safetensors, and the stale index is gone */
    REQUIRE(ff_safetensors_save_sharded(dir, s, FF_DTYPE_F32, 1u << 30) == 0);
    CHECK(access(p, F_OK) != 0);
    t = ff_tensor_set_new();
    REQUIRE(ff_safetensors_load_dir(dir, t) == 0);
    CHECK(same_sets(s, t));
    ff_tensor_set_destroy(&t);
    ff_tensor_set_destroy(&s);

    t = ff_tensor_set_new();
    CHECK(ff_safetensors_load_dir(g_dir, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "no model.safetensors");
    ff_tensor_set_destroy(&t);
}

/* A file written by Hugging Face's safetensors library (tests/modelio/make_fixtures.py). */
/* rows [1, 3) of the embedding, every other tensor whole: a chooser like a tensor-parallel
 * rank's (ff_model_tp_read_weights) */
static void rows_1_3(void *ctx, const ff_st_entry *e, int64_t *r0, int64_t *nr, int64_t *c0, int64_t *nc) {
    (void)ctx, (void)c0, (void)nc;
    if (!strcmp(e->name, "model.embed_tokens.weight")) *r0 = 1, *nr = 2;
}

static void test_blocks(void) {
    ff_tensor_set *s = make_set();
    const float *emb = ff_tensor_set_find(s, "model.embed_tokens.weight")->data; /* [3, 5] */
    for (int k = 0; k < 2; k++) { /* f32, and bf16 converted per row */
        ff_dtype dt = k ? FF_DTYPE_BF16 : FF_DTYPE_F32;
        char path[512];
        snprintf(path, sizeof path, "%s/blocks_%d.safetensors", g_dir, k);
        REQUIRE(ff_safetensors_save(path, s, dt, NULL) == 0);
        ff_safetensors *f = ff_safetensors_open(path);
        REQUIRE(f);
        const ff_st_entry *e = ff_safetensors_find(f, "model.embed_tokens.weight");
        ff_tensor_set *t = ff_tensor_set_new();
        REQUIRE(ff_safetensors_read_block(f, e, 1, 2, 0, 5, t, "rows") == 0);
        REQUIRE(ff_safetensors_read_block(f, e, 0, 3, 2, 2, t, "cols") == 0);
        const ff_host_tensor *r = ff_tensor_set_find(t, "rows"), *c = ff_tensor_set_find(t, "cols");
        CHECK(r->shape[0] == 2 && r->shape[1] == 5 && c->shape[0] == 3 && c->shape[1] == 2);
        CHECK(memcmp(r->data, emb + 5, 10 * 4) == 0); /* the values are exact in bf16 */
        for (int i = 0; i < 3; i++) CHECK(c->data[2 * i] == emb[5 * i + 2] && c->data[2 * i + 1] == emb[5 * i + 3]);
        const ff_st_entry *v = ff_safetensors_find(f, "model.norm.weight"); /* a vector: rows only */
        REQUIRE(ff_safetensors_read_block(f, v, 4, 3, 0, 1, t, "tail") == 0);
        CHECK(ff_tensor_set_find(t, "tail")->ndim == 1 && ff_tensor_set_find(t, "tail")->data[0] == 1.5f);
        CHECK(ff_safetensors_read_block(f, e, 2, 2, 0, 5, t, "bad") == -1);
        CHECK_STR_CONTAINS(ff_error_message(), "outside tensor 'model.embed_tokens.weight' [3, 5]");
        CHECK(ff_safetensors_read_block(f, e, 0, 1, 4, 2, t, "bad") == -1);
        CHECK(ff_safetensors_read_block(f, ff_safetensors_find(f, "x.scalarish"), 0, 1, 0, 1, t, "bad") == -1);
        CHECK_STR_CONTAINS(ff_error_message(), "has 3 dimensions");
        ff_safetensors_close(&f);
        ff_tensor_set_destroy(&t);
    }
    /* through a chooser, over a sharded folder: the chosen block, every other tensor whole */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/blocks_sharded", g_dir);
    REQUIRE(ff_mkdirs(dir) == 0);
    REQUIRE(ff_safetensors_save_sharded(dir, s, FF_DTYPE_F32, 40) == 0);
    ff_tensor_set *t = ff_tensor_set_new();
    REQUIRE(ff_safetensors_load_dir_blocks(dir, rows_1_3, NULL, t) == 0);
    CHECK_EQ_INT(t->n, s->n);
    const ff_host_tensor *r = ff_tensor_set_find(t, "model.embed_tokens.weight");
    CHECK(r && r->shape[0] == 2 && memcmp(r->data, emb + 5, 10 * 4) == 0);
    const ff_host_tensor *x = ff_tensor_set_find(t, "x.scalarish");
    CHECK(x && x->ndim == 3 && x->data[3] == -3.0f);
    ff_tensor_set_destroy(&t);
    ff_tensor_set_destroy(&s);
}

static void test_hf_fixture(void) {
    ff_safetensors *f = ff_safetensors_open("tests/modelio/data/hf_written.safetensors");
    REQUIRE(f);
    CHECK(ff_safetensors_metadata(f, "format") && !strcmp(ff_safetensors_metadata(f, "format"), "pt"));
    ff_tensor_set *t = ff_tensor_set_new();
    for (size_t i = 0; i < ff_safetensors_count(f); i++) REQUIRE(ff_safetensors_read(f, ff_safetensors_entry(f, i), t, NULL) == 0);
    ff_safetensors_close(&f);
    /* values: arange(n) * 0.5 - 1 in each float dtype; arange(n) - 2 in the integer ones */
    const char *names[] = {"f32", "bf16", "f16", "f64", "i64", "i32", "i8", "u8", "bool"};
    for (int k = 0; k < 9; k++) {
        ff_host_tensor *x = ff_tensor_set_find(t, names[k]);
        REQUIRE(x);
        CHECK_EQ_INT(x->ndim, 2);
        CHECK_EQ_INT(x->shape[0], 2);
        CHECK_EQ_INT(x->shape[1], 3);
        for (int i = 0; i < 6; i++) {
            double want = k < 4 ? i * 0.5 - 1 : (k == 7 ? i : (k == 8 ? (i % 2) : i - 2));
            CHECK_CLOSE(x->data[i], want, 0, 0);
        }
    }
    ff_tensor_set_destroy(&t);
}

/* Build "8-byte length + header + data" in memory. */
static size_t build(uint8_t *buf, size_t cap, const char *header, size_t data_len, long long lie_len) {
    uint64_t n = lie_len >= 0 ? (uint64_t)lie_len : strlen(header);
    memcpy(buf, &n, 8);
    size_t h = strlen(header);
    REQUIRE(8 + h + data_len <= cap);
    memcpy(buf + 8, header, h);
    memset(buf + 8 + h, 0x3f, data_len);
    return 8 + h + data_len;
}

static void expect_bad(const char *header, size_t data_len, long long lie_len, const char *needle) {
    uint8_t buf[4096];
    size_t len = build(buf, sizeof buf, header, data_len, lie_len);
    ff_safetensors *f = ff_safetensors_parse(buf, len, "bad.safetensors");
    if (f) {
        fprintf(stderr, "accepted a bad header: %s\n", header);
        ff_test_failures++;
        ff_safetensors_close(&f);
        return;
    }
    CHECK_STR_CONTAINS(ff_error_message(), "bad.safetensors");
    CHECK_STR_CONTAINS(ff_error_message(), needle);
}

static void test_lying_headers(void) {
    uint8_t tiny[4] = {1, 2, 3, 4};
    CHECK(ff_safetensors_parse(tiny, 4, "short") == NULL);
    CHECK_STR_CONTAINS(ff_error_message(), "too short");
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint8_t buf[4096];
    size_t len = build(buf, sizeof buf, ok, 8, -1);
    ff_safetensors *f = ff_safetensors_parse(buf, len, "ok");
    REQUIRE(f);
    ff_safetensors_close(&f);

    expect_bad(ok, 8, 100000, "goes beyond the end of the file");
    expect_bad(ok, 4, -1, "data ends at byte 8 but the data section has only 4 bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, -1, "end 0 is before begin 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12, -1, "span 8 bytes but shape and dtype F32 need 12");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
               -1, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1, "unsupported dtype 'F8_E4M3'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8, -1, "malformed JSON");
    expect_bad("[1,2,3]", 8, -1, "header does not start with a JSON object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, -1, "shape entry 0 is not a non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, -1, "shape entry 0");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, -1, "data_offsets");
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -1, "dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, -1, "shape");
    expect_bad("{\"a\":5}", 8, -1, "not an object");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, -1, "not a string");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, -1, "overflows");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, -1, "at most 8");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               -1, "duplicate");

    /* data at an odd offset (header length not a multiple of 8) still converts correctly */
    const char *odd = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[1,5]}}";
    len = build(buf, sizeof buf, odd, 5, -1);
    uint16_t v[2] = {ff_f32_to_bf16(1.5f), ff_f32_to_bf16(-2.0f)};
    memcpy(buf + 8 + strlen(odd) + 1, v, 4);
    f = ff_safetensors_parse(buf, len, "odd");
    REQUIRE(f);
    ff_tensor_set *t = ff_tensor_set_new();
    REQUIRE(ff_safetensors_read(f, ff_safetensors_find(f, "a"), t, "renamed") == 0);
    CHECK_CLOSE(ff_tensor_set_find(t, "renamed")->data[0], 1.5, 0, 0);
    CHECK_CLOSE(ff_tensor_set_find(t, "renamed")->data[1], -2.0, 0, 0);
    ff_tensor_set_destroy(&t);
    ff_safetensors_close(&f);
}

static void test_files(void) {
    ff_tensor_set *t = ff_tensor_set_new();
    CHECK(ff_safetensors_load("/nonexistent/model.safetensors", t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent/model.safetensors: cannot open");

    /* empty file, then a file cut in the middle of its data */
    char path[512];
    snprintf(path, sizeof path, "%s/empty.safetensors", g_dir);
    REQUIRE(ff_write_file_atomic(path, "", 0) == 0);
    CHECK(ff_safetensors_load(path, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "too short");

    ff_tensor_set *s = make_set();
    snprintf(path, sizeof path, "%s/cut.safetensors", g_dir);
    REQUIRE(ff_safetensors_save(path, s, FF_DTYPE_F32, NULL) == 0);
    size_t len;
    char *bytes = ff_read_file(path, &len);
    REQUIRE(bytes);
    REQUIRE(ff_write_file_atomic(path, bytes, len - 10) == 0);
    CHECK(ff_safetensors_load(path, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cut.safetensors");
    CHECK_STR_CONTAINS(ff_error_message(), "truncated");
    /* cut inside the header */
    REQUIRE(ff_write_file_atomic(path, bytes, 40) == 0);
    CHECK(ff_safetensors_load(path, t) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "goes beyond the end of the file");
    free(bytes);
    CHECK_EQ_INT(t->n, 0);

    /* writing into a folder that does not exist fails cleanly */
    CHECK(ff_safetensors_save("/nonexistent/dir/x.safetensors", s, FF_DTYPE_F32, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot create");
    CHECK(ff_safetensors_save(path, s, FF_DTYPE_I32, NULL) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "cannot write dtype I32");
    ff_tensor_set_destroy(&s);
    ff_tensor_set_destroy(&t);
}

/* RssFile of /proc/self/status: the file-backed pages this process holds, in bytes. */
static uint64_t rss_file(void) {
    FILE *f = fopen("/proc/self/status", "r");
    REQUIRE(f);
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = sscanf(line, "RssFile: %llu kB", &kib) == 1;
    fclose(f);
    REQUIRE(found);
    return (uint64_t)kib * 1024;
}

/* Reading a tensor drops its mapped pages: converting a whole file holds the fp32 copies,
 * not the file as well. Read again, the bytes come back unchanged. */
static void test_pages_released(void) {
    ff_tensor_set *s = ff_tensor_set_new();
    int64_t shape[2] = {1024, 1024};
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", k);
        ff_host_tensor *t = ff_tensor_set_add(s, name, 2, shape);
        REQUIRE(t);
        for (int64_t i = 0; i < 1024 * 1024; i++) t->data[i] = (float)((i * 7 + k) % 251) - 125.0f;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/pages.safetensors", g_dir);
    REQUIRE(ff_safetensors_save(path, s, FF_DTYPE_BF16, NULL) == 0); /* 8 MiB of data */
    ff_safetensors *f = ff_safetensors_open(path);
    REQUIRE(f);
    ff_tensor_set *a = ff_tensor_set_new(), *b = ff_tensor_set_new();
    uint64_t before = rss_file();
    for (size_t i = 0; i < ff_safetensors_count(f); i++) REQUIRE(ff_safetensors_read(f, ff_safetensors_entry(f, i), a, NULL) == 0);
    uint64_t after = rss_file();
    printf("reading 8 MiB of mapped tensors left %lld KiB of them resident\n",
           (long long)((int64_t)after - (int64_t)before) / 1024);
    CHECK(after < before + (1u << 20)); /* all 8 MiB without the drop */
    CHECK(same_sets(s, a));
    for (size_t i = 0; i < ff_safetensors_count(f); i++) REQUIRE(ff_safetensors_read(f, ff_safetensors_entry(f, i), b, NULL) == 0);
    CHECK(same_sets(a, b));
    ff_safetensors_close(&f);
    ff_tensor_set_destroy(&a);
    ff_tensor_set_destroy(&b);
    ff_tensor_set_destroy(&s);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ff_test_st_%d", (int)getpid());
    REQUIRE(ff_mkdirs(g_dir) == 0);
    test_roundtrip();
    test_bf16_rounding();
    test_sharded();
    test_blocks();
    test_hf_fixture();
    test_lying_headers();
    test_files();
    test_pages_released();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_MAIN_END();
}

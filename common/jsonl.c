/* JSON Lines reader (see include/fuseflow/jsonl.h). Lines of any length; one jansson parse
 * per line, so a bad line is reported with its number and nothing after it is read. */
#include "fuseflow/jsonl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/util.h"

struct ff_jsonl {
    FILE *f;
    char *path;
    char *buf;
    size_t cap;
    int line;
    bool own; /* close f with the reader */
};

ff_jsonl *ff_jsonl_open(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        ff_error_set(path, errno == ENOENT ? "check the path" : NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    ff_jsonl *r = ff_calloc(1, sizeof *r);
    if (!r || !(r->path = ff_strdup(path))) {
        free(r);
        fclose(f);
        return NULL;
    }
    r->f = f;
    r->own = true;
    return r;
}

ff_jsonl *ff_jsonl_open_stream(FILE *f, const char *name) {
    ff_jsonl *r = ff_calloc(1, sizeof *r);
    if (!r || !(r->path = ff_strdup(name))) {
        free(r);
        return NULL;
    }
    r->f = f;
    return r;
}

void ff_jsonl_close(ff_jsonl **pr) {
    if (!pr || !*pr) return;
    ff_jsonl *r = *pr;
    if (r->own) fclose(r->f);
    free(r->buf);
    free(r->path);
    free(r);
    *pr = NULL;
}

int ff_jsonl_next(ff_jsonl *r, json_t **out) {
    *out = NULL;
    for (;;) {
        ssize_t n = getline(&r->buf, &r->cap, r->f);
        if (n < 0) {
            if (ferror(r->f)) return ff_error_set(r->path, NULL, "read error: %s", strerror(errno));
            return 0;
        }
        r->line++;
        size_t skip = strspn(r->buf, " \t\r\n");
        if ((ssize_t)skip == n) continue;
        json_error_t err;
        /* "\u0000" is valid JSON: strings may hold NUL, so readers take json_string_length */
        json_t *j = json_loadb(r->buf, (size_t)n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
        char where[FF_PATH_MAX];
        snprintf(where, sizeof where, "%s:%d", r->path, r->line);
        if (!j) return ff_error_set(where, "each line must be one complete JSON object", "malformed JSON at column %d: %s", err.column, err.text);
        if (!json_is_object(j)) {
            json_decref(j);
            return ff_error_set(where, NULL, "expected a JSON object");
        }
        *out = j;
        return 1;
    }
}

int ff_jsonl_line(const ff_jsonl *r) { return r->line; }
const char *ff_jsonl_path(const ff_jsonl *r) { return r->path; }

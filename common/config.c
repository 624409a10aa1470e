/* Configuration trees from YAML (libyaml's event parser), dotted overrides, typed getters
 * that record what was read, and the unknown-key check. See include/fuseflow/config.h.
 *
 * Not supported, with a clear error: anchors and aliases, tags, several documents in one
 * file, non-scalar map keys. */
#include "fuseflow/config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"

struct ff_cnode {
    ff_cnode_kind kind;
    char *key;          /* key when this node is the value of a map entry */
    char *text;         /* scalar text */
    bool plain;         /* scalar written without quotes (so `null` and `~` mean null) */
    bool used;
    int line;           /* 1-based; 0 for overrides */
    const char *source; /* file name, or the override text; owned by the config */
    ff_cnode *parent;
    ff_cnode **items;   /* children, in order */
    size_t n, cap;
    char **asked;       /* keys that readers asked this map for and did not find */
    size_t n_asked;
    char *wanted;       /* a plain value or list that a reader asked for this key of: a map was
                           expected (reported by ff_config_check_unused) */
};

struct ff_config {
    ff_cnode *root;
    char **sources;
    size_t n_sources;
};

/* ---- nodes ----------------------------------------------------------------------------- */

static ff_cnode *node_new(ff_cnode_kind kind, const char *source, int line) {
    ff_cnode *n = ff_calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->source = source;
    n->line = line;
    return n;
}

static void node_free(ff_cnode *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n; i++) node_free(n->items[i]);
    for (size_t i = 0; i < n->n_asked; i++) free(n->asked[i]);
    free(n->asked);
    free(n->wanted);
    free(n->items);
    free(n->key);
    free(n->text);
    free(n);
}

static int node_append(ff_cnode *parent, ff_cnode *child) {
    if (parent->n == parent->cap) {
        size_t cap = parent->cap ? parent->cap * 2 : 4;
        ff_cnode **it = ff_realloc(parent->items, cap * sizeof *it);
        if (!it) return -1;
        parent->items = it;
        parent->cap = cap;
    }
    parent->items[parent->n++] = child;
    child->parent = parent;
    return 0;
}

static ff_cnode *map_lookup(const ff_cnode *map, const char *key, size_t keylen) {
    for (size_t i = 0; i < map->n; i++) {
        const char *k = map->items[i]->key;
        if (k && strlen(k) == keylen && !memcmp(k, key, keylen)) return map->items[i];
    }
    return NULL;
}

static const char *add_source(ff_config *c, const char *s) {
    char **ns = ff_realloc(c->sources, (c->n_sources + 1) * sizeof *ns);
    if (!ns) return NULL;
    c->sources = ns;
    char *d = ff_strdup(s);
    if (!d) return NULL;
    c->sources[c->n_sources++] = d;
    return d;
}

const char *ff_cnode_where(const ff_cnode *n, char *buf, size_t cap) {
    if (n->line > 0)
        snprintf(buf, cap, "%s:%d", n->source, n->line);
    else
        snprintf(buf, cap, "override '%s'", n->source ? n->source : "?");
    return buf;
}

/* "a.b.c" for messages. */
static void node_path(const ff_cnode *n, char *buf, size_t cap) {
    const ff_cnode *chain[64];
    int depth = 0;
    for (const ff_cnode *p = n; p && p->parent && depth < 64; p = p->parent) chain[depth++] = p;
    size_t off = 0;
    buf[0] = '\0';
    for (int i = depth - 1; i >= 0; i--) {
        const ff_cnode *p = chain[i];
        char part[256];
        if (p->key)
            snprintf(part, sizeof part, "%s", p->key);
        else {
            size_t idx = 0;
            for (size_t j = 0; j < p->parent->n; j++)
                if (p->parent->items[j] == p) idx = j;
            snprintf(part, sizeof part, "%zu", idx);
        }
        int w = snprintf(buf + off, cap - off, "%s%s", off ? "." : "", part);
        if (w < 0 || (size_t)w >= cap - off) break;
        off += (size_t)w;
    }
}

static bool is_null(const ff_cnode *n) {
    return n->kind == FF_CNODE_SCALAR && n->plain && (!strcmp(n->text, "null") || !strcmp(n->text, "~") || !n->text[0]);
}

/* "file:line: 'trainer' must be a map ..." for a section written as a plain value or a list. */
static int not_a_map(const ff_cnode *n, const char *key, size_t klen) {
    char w[512], full[512], hint[700];
    ff_cnode_where(n, w, sizeof w);
    node_path(n, full, sizeof full);
    if (n->line > 0)
        snprintf(hint, sizeof hint, "give it keys, e.g. %s: {%.*s: ...}, or indented on the lines below '%s:'", n->key ? n->key : full,
                 (int)klen, key, n->key ? n->key : full);
    else
        snprintf(hint, sizeof hint, "an override sets one key of a section: %s.%.*s=VALUE", full, (int)klen, key);
    if (n->kind == FF_CNODE_SCALAR)
        return ff_error_set(w, hint, "'%s' is a section (a map of keys such as '%.*s'), not the plain value '%s'", full, (int)klen, key,
                            n->text);
    return ff_error_set(w, hint, "'%s' is a section (a map of keys such as '%.*s'), not a list", full, (int)klen, key);
}

/* ---- parsing --------------------------------------------------------------------------- */

static char *strndup_checked(const unsigned char *s, size_t n) {
    char *d = ff_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Parse a YAML stream into a tree whose nodes carry `source`. Returns the root, NULL + error. */
static ff_cnode *parse_yaml(const char *text, size_t len, const char *source, int line_base) {
    yaml_parser_t parser;
    yaml_event_t ev;
    if (!yaml_parser_initialize(&parser)) {
        ff_error_set(source, NULL, "cannot initialise the YAML parser");
        return NULL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);

    ff_cnode *root = NULL;
    ff_cnode *stack[256];
    int depth = 0;
    char *pending_key = NULL; /* a map's key waiting for its value */
    int pending_key_line = 0;
    int docs = 0;
    bool ok = true;

#define LINE_OF(e) ((int)(e).start_mark.line + 1 + line_base)
#define FAIL(line, hint, ...)                                                             \
    do {                                                                                  \
        char w_[512];                                                                     \
        if (line > 0) snprintf(w_, sizeof w_, "%s:%d", source, line);                     \
        else snprintf(w_, sizeof w_, "override '%s'", source);                            \
        ff_error_set(w_, hint, __VA_ARGS__);                                              \
        ok = false;                                                                       \
    } while (0)

    for (bool done = false; !done && ok;) {
        if (!yaml_parser_parse(&parser, &ev)) {
            int line = (int)parser.problem_mark.line + 1 + line_base;
            FAIL(line, "check indentation, colons and quotes", "YAML syntax error: %s%s%s", parser.problem ? parser.problem : "?",
                 parser.context ? " " : "", parser.context ? parser.context : "");
            break;
        }
        int line = LINE_OF(ev);
        ff_cnode *top = depth ? stack[depth - 1] : NULL;
        ff_cnode *made = NULL;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) FAIL(line, "put everything in one document", "more than one YAML document");
            break;
        case YAML_ALIAS_EVENT:
            FAIL(line, "write the value out instead of using an alias", "YAML aliases (*name) are not supported");
            break;
        case YAML_SCALAR_EVENT:
            if (ev.data.scalar.anchor) {
                FAIL(line, "remove the &anchor", "YAML anchors are not supported");
                break;
            }
            if (top && top->kind == FF_CNODE_MAP && !pending_key) {
                pending_key = strndup_checked(ev.data.scalar.value, ev.data.scalar.length);
                pending_key_line = line;
                if (!pending_key) ok = false;
                else if (map_lookup(top, pending_key, strlen(pending_key))) {
                    FAIL(line, "remove one of them", "duplicate key '%s'", pending_key);
                }
                break;
            }
            made = node_new(FF_CNODE_SCALAR, source, line);
            if (!made) { ok = false; break; }
            made->text = strndup_checked(ev.data.scalar.value, ev.data.scalar.length);
            made->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
            if (!made->text) ok = false;
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
            bool is_map = ev.type == YAML_MAPPING_START_EVENT;
            if (top && top->kind == FF_CNODE_MAP && !pending_key) {
                FAIL(line, "use plain text keys", "a map key must be a scalar");
                break;
            }
            if ((is_map ? ev.data.mapping_start.anchor : ev.data.sequence_start.anchor)) {
                FAIL(line, "remove the &anchor", "YAML anchors are not supported");
                break;
            }
            made = node_new(is_map ? FF_CNODE_MAP : FF_CNODE_SEQ, source, line);
            if (!made) ok = false;
            break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        default:
            break;
        }
        if (made && ok) {
            if (!top) {
                root = made;
            } else {
                if (top->kind == FF_CNODE_MAP) {
                    made->key = pending_key;
                    made->line = made->kind == FF_CNODE_SCALAR ? made->line : pending_key_line;
                    pending_key = NULL;
                }
                if (node_append(top, made) != 0) {
                    node_free(made);
                    ok = false;
                }
            }
            if (ok && made->kind != FF_CNODE_SCALAR) {
                if (depth == (int)(sizeof stack / sizeof stack[0])) {
                    FAIL(line, NULL, "nesting deeper than %d levels", depth);
                } else {
                    stack[depth++] = made;
                }
            }
        } else if (made) {
            node_free(made);
        }
        yaml_event_delete(&ev);
    }
#undef FAIL
#undef LINE_OF
    free(pending_key);
    yaml_parser_delete(&parser);
    if (!ok) {
        node_free(root);
        return NULL;
    }
    if (!root) root = node_new(FF_CNODE_MAP, source, 1); /* empty document */
    return root;
}

ff_config *ff_config_parse(const char *text, size_t len, const char *name) {
    ff_config *c = ff_calloc(1, sizeof *c);
    if (!c) return NULL;
    const char *src = add_source(c, name ? name : "<string>");
    if (!src) {
        ff_config_destroy(&c);
        return NULL;
    }
    c->root = parse_yaml(text, len, src, 0);
    if (!c->root) {
        ff_config_destroy(&c);
        return NULL;
    }
    if (c->root->kind != FF_CNODE_MAP) {
        ff_error_set(src, "a config file is a map of keys at the top level", "the document is not a map");
        ff_config_destroy(&c);
        return NULL;
    }
    return c;
}

ff_config *ff_config_load(const char *path) {
    size_t len = 0;
    char *text = ff_read_file(path, &len);
    if (!text) return NULL;
    ff_config *c = ff_config_parse(text, len, path);
    free(text);
    return c;
}

ff_config *ff_config_new(void) { return ff_config_parse("{}", 2, "<empty>"); }

void ff_config_destroy(ff_config **pc) {
    if (!pc || !*pc) return;
    ff_config *c = *pc;
    node_free(c->root);
    for (size_t i = 0; i < c->n_sources; i++) free(c->sources[i]);
    free(c->sources);
    free(c);
    *pc = NULL;
}

/* ---- overrides ------------------------------------------------------------------------- */

static bool parse_index(const char *s, size_t n, size_t *out) {
    if (n == 0 || n > 9) return false;
    size_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

int ff_config_set(ff_config *c, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return ff_error_set(assignment, "write overrides as key.sub=value", "not an override");
    const char *src = add_source(c, assignment);
    if (!src) return -1;
    /* The value is a plain string unless it is a flow list or map ("[1, 2]", "{a: 1}"), so
     * "prompt=Q: 2+2?" stays a string. Quotes make a string that is never null. */
    const char *value = eq + 1;
    size_t vlen = strlen(value);
    ff_cnode *vroot;
    if (value[0] == '[' || value[0] == '{') {
        vroot = parse_yaml(value, vlen, src, -1000000); /* line <= 0 marks an override */
        if (!vroot) return -1;
        ff_cnode *todo[256];
        int nt = 0;
        todo[nt++] = vroot;
        while (nt) {
            ff_cnode *x = todo[--nt];
            x->line = 0;
            for (size_t i = 0; i < x->n && nt < 256; i++) todo[nt++] = x->items[i];
        }
    } else {
        vroot = node_new(FF_CNODE_SCALAR, src, 0);
        if (!vroot) return -1;
        bool quoted = vlen >= 2 && (value[0] == '"' || value[0] == '\'') && value[vlen - 1] == value[0];
        vroot->text = quoted ? strndup_checked((const unsigned char *)value + 1, vlen - 2) : ff_strdup(value);
        vroot->plain = !quoted;
        if (!vroot->text) {
            node_free(vroot);
            return -1;
        }
    }

    ff_cnode *cur = c->root;
    const char *p = assignment;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(eq - p));
        const char *end = dot ? dot : eq;
        size_t klen = (size_t)(end - p);
        if (klen == 0) {
            node_free(vroot);
            return ff_error_set(src, "keys are separated by single dots", "empty key in the path");
        }
        bool last = dot == NULL;
        if (cur->kind == FF_CNODE_SEQ) {
            size_t idx;
            if (!parse_index(p, klen, &idx) || idx >= cur->n) {
                node_free(vroot);
                return ff_error_set(src, "index an existing list element (0-based)", "'%.*s' is not an index of a list of %zu", (int)klen, p,
                                    cur->n);
            }
            if (last) {
                vroot->parent = cur;
                node_free(cur->items[idx]);
                cur->items[idx] = vroot;
                return 0;
            }
            cur = cur->items[idx];
        } else if (cur->kind == FF_CNODE_MAP) {
            ff_cnode *child = map_lookup(cur, p, klen);
            if (last) {
                vroot->key = strndup_checked((const unsigned char *)p, klen);
                if (!vroot->key) {
                    node_free(vroot);
                    return -1;
                }
                if (child) {
                    for (size_t i = 0; i < cur->n; i++)
                        if (cur->items[i] == child) {
                            node_free(child);
                            cur->items[i] = vroot;
                            vroot->parent = cur;
                        }
                    return 0;
                }
                if (node_append(cur, vroot) != 0) {
                    node_free(vroot);
                    return -1;
                }
                return 0;
            }
            if (!child) {
                child = node_new(FF_CNODE_MAP, src, 0);
                if (!child) {
                    node_free(vroot);
                    return -1;
                }
                child->key = strndup_checked((const unsigned char *)p, klen);
                if (!child->key || node_append(cur, child) != 0) {
                    node_free(child);
                    node_free(vroot);
                    return -1;
                }
            }
            if (is_null(child)) { /* `trainer:` left empty: the override starts the section */
                free(child->text);
                child->text = NULL;
                child->kind = FF_CNODE_MAP;
            }
            cur = child;
        } else {
            node_free(vroot);
            char w[512], full[512];
            ff_cnode_where(cur, w, sizeof w);
            node_path(cur, full, sizeof full);
            char ow[600];
            snprintf(ow, sizeof ow, "override '%s'", assignment);
            return ff_error_set(ow, "check the key's spelling and level", "'%s' holds the plain value '%s' (%s), not a map, so it has no key '%.*s'",
                                full, cur->text, w, (int)klen, p);
        }
        p = end + 1;
    }
}

int ff_config_apply_overrides(ff_config *c, int argc, char *const *argv) {
    for (int i = 0; i < argc; i++)
        if (ff_config_set(c, argv[i]) != 0) return -1;
    return 0;
}

/* ---- writing --------------------------------------------------------------------------- */

static int emit(yaml_emitter_t *em, yaml_event_t *ev) { return yaml_emitter_emit(em, ev) ? 0 : -1; }

static int emit_scalar(yaml_emitter_t *em, const char *s, bool plain) {
    yaml_event_t ev;
    yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), plain, !plain,
                                 plain ? YAML_ANY_SCALAR_STYLE : YAML_DOUBLE_QUOTED_SCALAR_STYLE);
    return emit(em, &ev);
}

static int emit_node(yaml_emitter_t *em, const ff_cnode *n) {
    yaml_event_t ev;
    switch (n->kind) {
    case FF_CNODE_SCALAR:
        return emit_scalar(em, n->text, n->plain);
    case FF_CNODE_SEQ:
        yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_ANY_SEQUENCE_STYLE);
        if (emit(em, &ev)) return -1;
        for (size_t i = 0; i < n->n; i++)
            if (emit_node(em, n->items[i])) return -1;
        yaml_sequence_end_event_initialize(&ev);
        return emit(em, &ev);
    case FF_CNODE_MAP:
        yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_ANY_MAPPING_STYLE);
        if (emit(em, &ev)) return -1;
        for (size_t i = 0; i < n->n; i++) {
            if (emit_scalar(em, n->items[i]->key, true)) return -1;
            if (emit_node(em, n->items[i])) return -1;
        }
        yaml_mapping_end_event_initialize(&ev);
        return emit(em, &ev);
    }
    return -1;
}

int ff_config_write(const ff_config *c, FILE *out) {
    yaml_emitter_t em;
    yaml_event_t ev;
    if (!yaml_emitter_initialize(&em)) return ff_error_set(NULL, NULL, "cannot initialise the YAML emitter");
    yaml_emitter_set_output_file(&em, out);
    yaml_emitter_set_unicode(&em, 1);
    int rc = 0;
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    rc |= emit(&em, &ev);
    yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
    rc |= emit(&em, &ev);
    rc |= emit_node(&em, c->root);
    yaml_document_end_event_initialize(&ev, 1);
    rc |= emit(&em, &ev);
    yaml_stream_end_event_initialize(&ev);
    rc |= emit(&em, &ev);
    if (rc) ff_error_set(NULL, NULL, "writing YAML failed: %s", em.problem ? em.problem : "?");
    yaml_emitter_delete(&em);
    return rc ? -1 : 0;
}

/* ---- lookup ---------------------------------------------------------------------------- */

ff_cnode *ff_config_root(ff_config *c) { return c->root; }

static void record_asked(ff_cnode *map, const char *key, size_t len) {
    for (size_t i = 0; i < map->n_asked; i++)
        if (strlen(map->asked[i]) == len && !memcmp(map->asked[i], key, len)) return;
    char **na = realloc(map->asked, (map->n_asked + 1) * sizeof *na);
    if (!na) return; /* only suggestions are lost */
    map->asked = na;
    char *k = strndup_checked((const unsigned char *)key, len);
    if (k) map->asked[map->n_asked++] = k;
}

/* The node at path below base, marking the way as read; NULL when absent. A null on the way
 * is an empty section (absent below it). A plain value or a list on the way, where the path
 * asks it for a key, is not absence but a section of the wrong type: *blocked is that node
 * and *key the key asked for (klen bytes). */
static ff_cnode *walk(ff_cnode *base, const char *path, ff_cnode **blocked, const char **key, size_t *klen_out) {
    ff_cnode *cur = base;
    const char *p = path;
    *blocked = NULL;
    cur->used = true;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t klen = dot ? (size_t)(dot - p) : strlen(p);
        ff_cnode *next = NULL;
        size_t idx;
        if (cur->kind == FF_CNODE_MAP) {
            next = map_lookup(cur, p, klen);
            if (!next) record_asked(cur, p, klen);
        } else if (cur->kind == FF_CNODE_SEQ && parse_index(p, klen, &idx)) {
            if (idx < cur->n) next = cur->items[idx];
        } else if (!is_null(cur)) {
            *blocked = cur, *key = p, *klen_out = klen;
        }
        if (!next) return NULL;
        next->used = true;
        cur = next;
        if (!dot) break;
        p = dot + 1;
    }
    return cur;
}

ff_cnode *ff_cnode_find(ff_cnode *base, const char *path) {
    ff_cnode *blocked;
    const char *key;
    size_t klen;
    ff_cnode *n = walk(base, path, &blocked, &key, &klen);
    if (blocked && !blocked->wanted) blocked->wanted = strndup_checked((const unsigned char *)key, klen); /* NULL: the report is lost */
    return n;
}

ff_cnode_kind ff_cnode_kind_of(const ff_cnode *n) { return n->kind; }
size_t ff_cnode_len(const ff_cnode *n) { return n->kind == FF_CNODE_SCALAR ? 0 : n->n; }
const char *ff_cnode_key(const ff_cnode *n) { return n->key; }
const char *ff_cnode_scalar(const ff_cnode *n) { return n->kind == FF_CNODE_SCALAR ? n->text : NULL; }

ff_cnode *ff_cnode_at(ff_cnode *n, size_t i) {
    if (n->kind == FF_CNODE_SCALAR || i >= n->n) return NULL;
    n->items[i]->used = true;
    return n->items[i];
}

void ff_cnode_mark_used(ff_cnode *n) {
    n->used = true;
    for (size_t i = 0; i < n->n; i++) ff_cnode_mark_used(n->items[i]);
}

/* ---- typed getters --------------------------------------------------------------------- */

/* Find path for a typed getter: NULL when absent or null (a 1 return); sets *bad (with the
 * error) on a non-scalar, or on a section of the wrong type on the way. */
static ff_cnode *find_scalar(ff_cnode *base, const char *path, const char *expected, bool *bad) {
    *bad = false;
    ff_cnode *blocked;
    const char *key;
    size_t klen;
    ff_cnode *n = walk(base, path, &blocked, &key, &klen);
    if (blocked) {
        not_a_map(blocked, key, klen);
        *bad = true;
        return NULL;
    }
    if (!n || is_null(n)) return NULL;
    if (n->kind != FF_CNODE_SCALAR) {
        char w[512], full[512];
        ff_cnode_where(n, w, sizeof w);
        node_path(n, full, sizeof full);
        ff_error_set(w, NULL, "'%s' must be %s, not a %s", full, expected, n->kind == FF_CNODE_MAP ? "map" : "list");
        *bad = true;
        return NULL;
    }
    return n;
}

static int bad_value(const ff_cnode *n, const char *expected) {
    char w[512], full[512];
    ff_cnode_where(n, w, sizeof w);
    node_path(n, full, sizeof full);
    return ff_error_set(w, NULL, "'%s' must be %s, got '%s'", full, expected, n->text);
}

int ff_cnode_get_int(ff_cnode *base, const char *path, int64_t dflt, int64_t *out) {
    bool bad;
    ff_cnode *n = find_scalar(base, path, "an integer", &bad);
    if (bad) return -1;
    if (!n) {
        *out = dflt;
        return 1;
    }
    /* YAML 1.1 allows 1_000_000; accept it, nothing else. */
    char buf[64];
    size_t k = 0;
    for (const char *s = n->text; *s && k + 1 < sizeof buf; s++)
        if (*s != '_') buf[k++] = *s;
    buf[k] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (buf[0] && !*end && errno == ERANGE) {
        char w[512], full[512];
        ff_cnode_where(n, w, sizeof w);
        node_path(n, full, sizeof full);
        return ff_error_set(w, NULL, "'%s' = %s is past the 64-bit integer range", full, n->text);
    }
    if (!buf[0] || *end || errno) {
        double d = strtod(buf, &end); /* 3e9: a number, but not written as an integer */
        if (buf[0] && !*end && isfinite(d) && d == floor(d) && fabs(d) < 9.2e18) {
            char w[512], full[512], hint[128];
            ff_cnode_where(n, w, sizeof w);
            node_path(n, full, sizeof full);
            snprintf(hint, sizeof hint, "write the digits: %.0f", d);
            return ff_error_set(w, hint, "'%s' must be an integer, got '%s'", full, n->text);
        }
        return bad_value(n, "an integer");
    }
    *out = v;
    return 0;
}

int ff_cnode_get_int_in(ff_cnode *base, const char *path, int64_t dflt, int64_t lo, int64_t hi, int64_t *out) {
    int rc = ff_cnode_get_int(base, path, dflt, out);
    if (rc != 0 || (*out >= lo && *out <= hi)) return rc;
    ff_cnode *n = ff_cnode_find(base, path);
    char w[512], full[512];
    ff_cnode_where(n, w, sizeof w);
    node_path(n, full, sizeof full);
    return ff_error_set(w, NULL, "'%s' must be in [%lld, %lld], got %lld", full, (long long)lo, (long long)hi, (long long)*out);
}

int ff_cnode_get_double_in(ff_cnode *base, const char *path, double dflt, double lo, double hi, double *out) {
    int rc = ff_cnode_get_double(base, path, dflt, out);
    if (rc != 0 || (*out >= lo && *out <= hi)) return rc;
    ff_cnode *n = ff_cnode_find(base, path);
    char w[512], full[512];
    ff_cnode_where(n, w, sizeof w);
    node_path(n, full, sizeof full);
    return ff_error_set(w, NULL, "'%s' must be in [%g, %g], got %g", full, lo, hi, *out);
}

int ff_cnode_get_double(ff_cnode *base, const char *path, double dflt, double *out) {
    bool bad;
    ff_cnode *n = find_scalar(base, path, "a number", &bad);
    if (bad) return -1;
    if (!n) {
        *out = dflt;
        return 1;
    }
    char *end;
    errno = 0;
    double v = strtod(n->text, &end);
    if (!n->text[0] || *end || errno || !isfinite(v)) return bad_value(n, "a finite number");
    *out = v;
    return 0;
}

int ff_cnode_get_bool(ff_cnode *base, const char *path, bool dflt, bool *out) {
    bool bad;
    ff_cnode *n = find_scalar(base, path, "true or false", &bad);
    if (bad) return -1;
    if (!n) {
        *out = dflt;
        return 1;
    }
    static const char *yes[] = {"true", "True", "TRUE", "yes", "on", "1"};
    static const char *no[] = {"false", "False", "FALSE", "no", "off", "0"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        if (!strcmp(n->text, yes[i])) {
            *out = true;
            return 0;
        }
        if (!strcmp(n->text, no[i])) {
            *out = false;
            return 0;
        }
    }
    return bad_value(n, "true or false");
}

int ff_cnode_get_str(ff_cnode *base, const char *path, const char *dflt, const char **out) {
    bool bad;
    ff_cnode *n = find_scalar(base, path, "a string", &bad);
    if (bad) return -1;
    if (!n) {
        *out = dflt;
        return 1;
    }
    *out = n->text;
    return 0;
}

/* "one of: a, b, c" into buf. */
static const char *choices_of(const char *const *names, int count, char *buf, size_t cap) {
    size_t off = (size_t)snprintf(buf, cap, "one of: ");
    for (int i = 0; i < count && off < cap; i++) {
        int w = snprintf(buf + off, cap - off, "%s%s", i ? ", " : "", names[i]);
        if (w < 0) break;
        off += (size_t)w;
    }
    return buf;
}

int ff_cnode_get_enum(ff_cnode *base, const char *path, const char *const *names, int count, int dflt, int *out) {
    const char *s;
    int rc = ff_cnode_get_str(base, path, NULL, &s);
    if (rc < 0) return -1;
    if (rc == 1) {
        *out = dflt;
        return 1;
    }
    for (int i = 0; i < count; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    char expected[600];
    return bad_value(ff_cnode_find(base, path), choices_of(names, count, expected, sizeof expected));
}

int ff_cnode_get_flags(ff_cnode *base, const char *path, const char *const *names, int count, unsigned dflt, unsigned *out) {
    assert(count > 0 && count <= 32);
    ff_cnode *blocked;
    const char *key;
    size_t klen;
    ff_cnode *n = walk(base, path, &blocked, &key, &klen);
    if (blocked) return not_a_map(blocked, key, klen);
    if (!n || is_null(n)) {
        if (n) n->used = true;
        *out = dflt;
        return 1;
    }
    ff_cnode_mark_used(n); /* read, right or wrong: its error is the one to show */
    char expected[600], w[512], full[512];
    choices_of(names, count, expected, sizeof expected);
    if (n->kind == FF_CNODE_MAP) {
        ff_cnode_where(n, w, sizeof w);
        node_path(n, full, sizeof full);
        return ff_error_set(w, "write a list: [a, b]", "'%s' must be a list of names (%s), not a map", full, expected);
    }
    size_t items = n->kind == FF_CNODE_SCALAR ? 1 : n->n;
    unsigned mask = 0;
    for (size_t k = 0; k < items; k++) {
        ff_cnode *e = n->kind == FF_CNODE_SCALAR ? n : n->items[k];
        if (e->kind != FF_CNODE_SCALAR) {
            ff_cnode_where(e, w, sizeof w);
            node_path(e, full, sizeof full);
            return ff_error_set(w, NULL, "'%s' must be a name (%s), not a %s", full, expected, e->kind == FF_CNODE_MAP ? "map" : "list");
        }
        int i = 0;
        while (i < count && strcmp(e->text, names[i])) i++;
        if (i == count) return bad_value(e, expected);
        mask |= 1u << i;
    }
    *out = mask;
    return 0;
}

int ff_cnode_get_loggers(ff_cnode *base, const char *path, unsigned *out) {
    static const char *const names[] = {"console", "jsonl", "tensorboard"};
    return ff_cnode_get_flags(base, path, names, 3, FF_LOGGERS_DEFAULT, out);
}

int ff_config_get_int(ff_config *c, const char *p, int64_t d, int64_t *o) { return ff_cnode_get_int(c->root, p, d, o); }
int ff_config_get_int_in(ff_config *c, const char *p, int64_t d, int64_t lo, int64_t hi, int64_t *o) {
    return ff_cnode_get_int_in(c->root, p, d, lo, hi, o);
}
int ff_config_get_double(ff_config *c, const char *p, double d, double *o) { return ff_cnode_get_double(c->root, p, d, o); }
int ff_config_get_double_in(ff_config *c, const char *p, double d, double lo, double hi, double *o) {
    return ff_cnode_get_double_in(c->root, p, d, lo, hi, o);
}
int ff_config_get_bool(ff_config *c, const char *p, bool d, bool *o) { return ff_cnode_get_bool(c->root, p, d, o); }
int ff_config_get_str(ff_config *c, const char *p, const char *d, const char **o) { return ff_cnode_get_str(c->root, p, d, o); }
int ff_config_get_enum(ff_config *c, const char *p, const char *const *names, int n, int d, int *o) {
    return ff_cnode_get_enum(c->root, p, names, n, d, o);
}
int ff_config_get_loggers(ff_config *c, const char *p, unsigned *o) { return ff_cnode_get_loggers(c->root, p, o); }

/* ---- unknown keys ---------------------------------------------------------------------- */

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    size_t prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof *prev);
    }
    return prev[lb];
}

static const ff_cnode *first_unused(const ff_cnode *n) {
    for (size_t i = 0; i < n->n; i++) {
        const ff_cnode *c = n->items[i];
        if (!c->used) return c;
        const ff_cnode *u = first_unused(c);
        if (u) return u;
    }
    return NULL;
}

static const ff_cnode *first_wanted(const ff_cnode *n) {
    if (n->wanted) return n;
    for (size_t i = 0; i < n->n; i++) {
        const ff_cnode *w = first_wanted(n->items[i]);
        if (w) return w;
    }
    return NULL;
}

int ff_config_check_unused(ff_config *c) {
    const ff_cnode *wanted = first_wanted(c->root);
    if (wanted) return not_a_map(wanted, wanted->wanted, strlen(wanted->wanted));
    const ff_cnode *u = first_unused(c->root);
    if (!u) return 0;
    char w[512], full[512], hint[600] = "";
    ff_cnode_where(u, w, sizeof w);
    node_path(u, full, sizeof full);
    const ff_cnode *parent = u->parent;
    if (u->key && parent) {
        /* suggest the closest key that a reader asked for or read at the same level */
        const char *best = NULL;
        size_t best_d = 3;
        for (size_t i = 0; i < parent->n_asked; i++) {
            size_t d = edit_distance(u->key, parent->asked[i]);
            if (d < best_d) best_d = d, best = parent->asked[i];
        }
        for (size_t i = 0; i < parent->n; i++) {
            const ff_cnode *s = parent->items[i];
            if (s == u || !s->used || !s->key) continue;
            size_t d = edit_distance(u->key, s->key);
            if (d < best_d) best_d = d, best = s->key;
        }
        if (best) {
            char ppath[512];
            node_path(parent, ppath, sizeof ppath);
            snprintf(hint, sizeof hint, "did you mean '%s%s%s'?", ppath, ppath[0] ? "." : "", best);
        } else {
            snprintf(hint, sizeof hint, "remove it, or check the documentation for the keys this section takes");
        }
        return ff_error_set(w, hint, "unknown key '%s'", full);
    }
    return ff_error_set(w, "remove it", "unexpected value at '%s' that nothing reads", full);
}

/* ---- comparing ------------------------------------------------------------------------- */

typedef struct leaf {
    char *key;
    const char *text;
} leaf;

typedef struct leaves {
    leaf *v;
    size_t n, cap;
} leaves;

/* Every non-null scalar under n as (dotted path, text); prefix is n's path. */
static int flatten(const ff_cnode *n, const char *prefix, leaves *out) {
    if (n->kind == FF_CNODE_SCALAR) {
        if (is_null(n)) return 0;
        if (out->n == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 64;
            leaf *v = ff_realloc(out->v, cap * sizeof *v);
            if (!v) return -1;
            out->v = v;
            out->cap = cap;
        }
        if (!(out->v[out->n].key = ff_strdup(prefix))) return -1;
        out->v[out->n++].text = n->text;
        return 0;
    }
    for (size_t i = 0; i < n->n; i++) {
        const ff_cnode *c = n->items[i];
        char path[1024];
        if (n->kind == FF_CNODE_MAP) snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", c->key);
        else snprintf(path, sizeof path, "%s%s%zu", prefix, prefix[0] ? "." : "", i);
        if (flatten(c, path, out) != 0) return -1;
    }
    return 0;
}

static int leaf_cmp(const void *a, const void *b) { return strcmp(((const leaf *)a)->key, ((const leaf *)b)->key); }

static bool same_value(const char *a, const char *b) {
    if (!strcmp(a, b)) return true;
    char *ea, *eb;
    double x = strtod(a, &ea), y = strtod(b, &eb);
    return ea != a && eb != b && !*ea && !*eb && x == y;
}

static void leaves_free(leaves *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].key);
    free(l->v);
}

void ff_config_changes_free(ff_config_change **changes, int n) {
    if (!*changes) return;
    for (int i = 0; i < n; i++) {
        free((*changes)[i].key);
        free((*changes)[i].was);
        free((*changes)[i].now);
    }
    free(*changes);
    *changes = NULL;
}

int ff_config_diff(const ff_config *a, const ff_config *b, ff_config_change **out) {
    *out = NULL;
    leaves la = {0}, lb = {0};
    ff_config_change *ch = NULL;
    int n = 0, rc = -1;
    if (flatten(a->root, "", &la) != 0 || flatten(b->root, "", &lb) != 0) goto done;
    qsort(la.v, la.n, sizeof *la.v, leaf_cmp);
    qsort(lb.v, lb.n, sizeof *lb.v, leaf_cmp);
    if (!(ch = ff_calloc(la.n + lb.n + 1, sizeof *ch))) goto done;
    for (size_t i = 0, j = 0; i < la.n || j < lb.n;) {
        int c = i == la.n ? 1 : j == lb.n ? -1 : strcmp(la.v[i].key, lb.v[j].key);
        const leaf *x = c <= 0 ? &la.v[i] : NULL, *y = c >= 0 ? &lb.v[j] : NULL;
        i += c <= 0;
        j += c >= 0;
        if (x && y && same_value(x->text, y->text)) continue;
        ff_config_change *d = &ch[n++];
        d->key = ff_strdup(x ? x->key : y->key);
        d->was = x ? ff_strdup(x->text) : NULL;
        d->now = y ? ff_strdup(y->text) : NULL;
        if (!d->key || (x && !d->was) || (y && !d->now)) goto done;
    }
    rc = 0;
done:
    leaves_free(&la);
    leaves_free(&lb);
    if (rc != 0) {
        ff_config_changes_free(&ch, n);
        return -1;
    }
    if (n == 0) ff_config_changes_free(&ch, 0);
    *out = ch;
    return n;
}

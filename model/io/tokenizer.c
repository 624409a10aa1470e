/* Hugging Face tokenizer.json with a BPE model (see include/fuseflow/tokenizer.h).
 *
 * Encoding follows the Rust `tokenizers` library step by step, because the point is to
 * produce the same ids:
 *   1. added tokens that are not "normalized" are cut out of the raw text (leftmost-longest,
 *      with lstrip / rstrip / single_word; the automaton is tokenizer_added.c);
 *   2. each remaining piece is normalized (NFC, Prepend, Replace, ...), then the "normalized"
 *      added tokens are cut out of it;
 *   3. each remaining piece goes through the pre-tokenizer steps (Split, Digits, Metaspace,
 *      ByteLevel), each turning a list of pieces into a finer list (GPT-2, Llama 3 and Qwen2
 *      patterns by the scanners of tokenizer_scan.c, other regexes by PCRE2);
 *   4. each final piece (a "word") is split into chars (bytes mapped to GPT-2's chars after
 *      ByteLevel; <0xXX> tokens for chars the vocabulary lacks under byte_fallback) and merged
 *      by BPE rank;
 *   5. the post-processor template adds special tokens around the sequence, if asked.
 * Decoding maps the tokens (added ones too) through the decoder chain (ByteLevel, Replace,
 * ByteFallback, Fuse, Strip, Metaspace), each step as Hugging Face's decode_chain.
 *
 * Not here: offsets, truncation and padding (the callers handle lengths), pair templates.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "fuseflow/tokenizer.h"

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "fuseflow/modelio.h"
#include "fuseflow/util.h"
#include "model/io/tok_internal.h"

/* ---- hash maps ------------------------------------------------------------------------------ */

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* string -> id; keys are borrowed (they live in the tokenizer's JSON or its own copies) */
typedef struct smap_slot {
    const char *key;
    uint32_t len;
    int32_t id;
} smap_slot;
typedef struct smap {
    smap_slot *slots;
    size_t cap;
} smap;

static int smap_init(smap *m, size_t n) {
    m->cap = pow2_at_least(2 * n + 1);
    m->slots = ff_calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

static smap_slot *smap_slot_of(const smap *m, const char *key, size_t len) {
    size_t i = ff_hash_fnv1a(key, len, FF_HASH_FNV1A_INIT) & (m->cap - 1);
    while (m->slots[i].key && (m->slots[i].len != len || memcmp(m->slots[i].key, key, len) != 0)) i = (i + 1) & (m->cap - 1);
    return &m->slots[i];
}

static int32_t smap_get(const smap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    const smap_slot *s = smap_slot_of(m, key, len);
    return s->key ? s->id : -1;
}

/* (a, b) -> (rank, merged id) */
typedef struct pmap_slot {
    uint64_t key; /* UINT64_MAX: empty */
    int32_t rank, id;
} pmap_slot;
typedef struct pmap {
    pmap_slot *slots;
    size_t cap;
} pmap;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int pmap_init(pmap *m, size_t n) {
    m->cap = pow2_at_least(2 * n + 1);
    m->slots = ff_malloc(m->cap * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < m->cap; i++) m->slots[i].key = UINT64_MAX;
    return 0;
}

static pmap_slot *pmap_slot_of(const pmap *m, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = mix64(key) & (m->cap - 1);
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key) i = (i + 1) & (m->cap - 1);
    return &m->slots[i];
}

static const pmap_slot *pmap_get(const pmap *m, int32_t a, int32_t b) {
    if (!m->cap) return NULL;
    const pmap_slot *s = pmap_slot_of(m, a, b);
    return s->key == UINT64_MAX ? NULL : s;
}

/* ---- the tokenizer ---------------------------------------------------------------------- */

typedef enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef struct norm_step {
    norm_kind kind;
    char *a, *b; /* PREPEND: a; REPLACE: every a becomes b */
    size_t la, lb;
} norm_step;
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } split_behavior;
typedef enum { PRE_SPLIT, PRE_DIGITS, PRE_BYTELEVEL, PRE_METASPACE } pre_kind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

typedef struct pre_step {
    pre_kind kind;
    ff_scan_kind scan; /* GPT-2, Llama 3, Qwen2 patterns: the scanner, not PCRE2 */
    pcre2_code *re;   /* any other Split regex */
    char *literal;    /* Split with a string; Metaspace's replacement */
    size_t literal_len;
    split_behavior behavior;
    bool invert;
    bool individual_digits;
    bool add_prefix_space;
    prepend_scheme prepend; /* Metaspace */
    bool split;             /* Metaspace: split before each replacement */
} pre_step;

typedef struct added_tok {
    int32_t id;
    char *content; /* normalized when `normalized` (matched against normalized text) */
    size_t len;
    bool special, lstrip, rstrip, single_word, normalized;
} added_tok;

typedef enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE } dec_kind;
typedef struct dec_step {
    dec_kind kind;
    char *a, *b; /* REPLACE: every a becomes b; STRIP: a, the char stripped; METASPACE: a, the replacement */
    size_t la, lb;
    int start, stop;        /* STRIP: at most this many chars from the start, the end */
    prepend_scheme prepend; /* METASPACE */
} dec_step;

enum { FLAG_SPECIAL = 1, FLAG_ADDED = 2 };

struct ff_tokenizer {
    char *name;
    json_t *root;   /* tokenizer.json as loaded, written back unchanged */
    json_t *config; /* tokenizer_config.json, or NULL (big integers read as reals) */
    char *config_text; /* ... and its text, written back unchanged */
    int32_t n_ids;
    const char **tok_str; /* [n_ids] token strings (borrowed from root / added contents) */
    uint8_t *flags;       /* [n_ids] FLAG_* */
    smap vocab;           /* model vocabulary */
    smap all;             /* vocabulary and added tokens, for token_id() */
    pmap merges;
    bool ignore_merges;
    int32_t unk_id;
    bool fuse_unk;
    bool byte_level;       /* the pre-tokenizer ends with ByteLevel: words are bytes mapped to chars */
    bool byte_fallback;    /* a char missing from the vocabulary becomes its <0xXX> tokens */
    int32_t byte_sym[256]; /* id of byte b's char, -1 when the vocabulary lacks it */
    int32_t byte_fb[256];  /* id of "<0xXX>", -1 */
    uint32_t byte_cp[256]; /* GPT-2 byte -> code point */
    int16_t cp_byte[324];  /* code point -> byte, -1 */
    norm_step norms[8];
    int n_norms;
    pre_step pre[16];
    int n_pre;
    added_tok *added;
    int n_added;
    ff_acmatch *match[2];  /* over the added tokens that are not / are "normalized" */
    int *match_tok[2];     /* [patterns] the matcher's pattern -> index into added */
    dec_step decs[8];
    int n_decs;
    bool has_decoder; /* without one, Hugging Face joins the tokens with spaces */
    int32_t tmpl_pre[8], tmpl_post[8];
    int n_tmpl_pre, n_tmpl_post;
    int32_t bos, eos, pad;
};

void ff_tokenizer_destroy(ff_tokenizer **pt) {
    if (!pt || !*pt) return;
    ff_tokenizer *t = *pt;
    for (int i = 0; i < t->n_pre; i++) {
        pcre2_code_free(t->pre[i].re);
        free(t->pre[i].literal);
    }
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    for (int i = 0; i < t->n_decs; i++) {
        free(t->decs[i].a);
        free(t->decs[i].b);
    }
    for (int k = 0; k < 2; k++) {
        ff_acmatch_destroy(&t->match[k]);
        free(t->match_tok[k]);
    }
    free(t->added);
    free(t->tok_str);
    free(t->flags);
    free(t->vocab.slots);
    free(t->all.slots);
    free(t->merges.slots);
    json_decref(t->root);
    json_decref(t->config);
    free(t->config_text);
    free(t->name);
    free(t);
    *pt = NULL;
}

/* GPT-2's reversible byte <-> printable char map: printable Latin-1 bytes map to themselves,
 * the others to 256, 257, ... in byte order. */
static void byte_map_init(ff_tokenizer *t) {
    int next = 256;
    for (int i = 0; i < 324; i++) t->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        t->byte_cp[b] = printable ? (uint32_t)b : (uint32_t)next++;
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

/* UTF-8 of code point cp into out (at most 4 bytes); returns the length. */
static size_t put_cp(uint32_t cp, char *out) { return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out); }

/* ---- normalization ------------------------------------------------------------------------ */

/* Apply the normalizers to s[0..n); *out is malloc'd (NULL + *out_len = n when there are
 * none: use s). 0 or -1 + error. */
static int normalize(const ff_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = n;
    if (t->n_norms == 0) return 0;
    char *cur = NULL;
    for (int i = 0; i < t->n_norms; i++) {
        const norm_step *ns = &t->norms[i];
        const char *in = cur ? cur : s;
        size_t n_in = *out_len;
        char *next = NULL;
        size_t n_next = 0;
        if (ns->kind == NORM_PREPEND) { /* Hugging Face prepends to non-empty text only */
            if (n_in == 0) continue;
            if (!(next = ff_malloc(ns->la + n_in + 1))) goto oom;
            memcpy(next, ns->a, ns->la);
            memcpy(next + ns->la, in, n_in);
            n_next = ns->la + n_in;
        } else if (ns->kind == NORM_REPLACE) {
            size_t hits = 0;
            for (const char *q = in; (q = memmem(q, n_in - (size_t)(q - in), ns->a, ns->la)); q += ns->la) hits++;
            if (hits == 0) continue;
            if (!(next = ff_malloc(n_in + hits * ns->lb + 1))) goto oom;
            for (const char *q = in, *end = in + n_in;;) {
                const char *h = memmem(q, (size_t)(end - q), ns->a, ns->la);
                size_t keep = (size_t)((h ? h : end) - q);
                memcpy(next + n_next, q, keep);
                n_next += keep;
                if (!h) break;
                memcpy(next + n_next, ns->b, ns->lb);
                n_next += ns->lb;
                q = h + ns->la;
            }
        } else {
            utf8proc_option_t opt = UTF8PROC_STABLE;
            switch (ns->kind) {
            case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
            case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
            case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
            default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
            }
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n_in, &dst, opt);
            if (r < 0) {
                free(cur);
                return ff_error_set(NULL, NULL, "cannot normalize the text: %s", utf8proc_errmsg(r));
            }
            next = (char *)dst;
            n_next = (size_t)r;
        }
        free(cur);
        cur = next;
        *out_len = n_next;
    }
    if (!cur) { /* every step left the text as it was */
        if (!(cur = ff_malloc(n + 1))) return -1;
        memcpy(cur, s, n);
    }
    cur[*out_len] = '\0'; /* each buffer above has the room */
    *out = cur;
    return 0;
oom:
    free(cur);
    return -1;
}

/* ---- character classes (Rust's char methods and regex \w, \s), Unicode 16 ----------------- */

static bool cp_is_whitespace(int32_t c) { return c >= 0 && (ff_uc_class((uint32_t)c) & FF_UC_SPACE); }

static bool cp_is_numeric(int32_t c) { return c >= 0 && (ff_uc_class((uint32_t)c) & FF_UC_N); }

static bool cp_is_word(int32_t c) {
    return c >= 0 && ((ff_uc_class((uint32_t)c) & (FF_UC_L | FF_UC_M | FF_UC_ND_NL | FF_UC_PC)) || c == 0x200c || c == 0x200d);
}

/* the code point that ends at s[n) (text is valid UTF-8) */
static int32_t last_cp(const char *s, size_t n) {
    size_t i = n;
    while (i > 0 && ((uint8_t)s[i - 1] & 0xc0) == 0x80) i--;
    if (i == 0) return -1;
    utf8proc_int32_t c;
    utf8proc_iterate((const utf8proc_uint8_t *)s + i - 1, (utf8proc_ssize_t)(n - i + 1), &c);
    return c;
}

static int32_t first_cp(const char *s, size_t n, size_t *clen) {
    utf8proc_int32_t c = -1;
    utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (clen) *clen = r > 0 ? (size_t)r : 1;
    return r > 0 ? c : -1;
}

/* ---- encoding work space -------------------------------------------------------------------- */

typedef struct piece {
    size_t off, len; /* into work.buf */
    int32_t token;   /* >= 0: an added token, already an id */
    bool at_start;   /* begins at offset 0 of the text (Metaspace's prepend_scheme "first") */
} piece;

typedef struct plist {
    piece *v;
    size_t n, cap;
} plist;

typedef struct seg {
    size_t s, e;
    bool match;
} seg;

typedef struct heap_item {
    int32_t rank, pos;
    int32_t a, b; /* the pair when pushed, to detect stale entries */
} heap_item;

typedef struct work {
    char *buf; /* text arena: input, normalized pieces, prefixed pieces */
    size_t len, cap;
    plist a, b;
    seg *segs;
    size_t n_segs, cap_segs;
    int32_t *ids;
    size_t n_ids, cap_ids;
    int32_t *sym, *prev, *next; /* BPE symbols of one word */
    size_t cap_sym;
    heap_item *heap;
    size_t n_heap, cap_heap;
    char *mapped;
    size_t cap_mapped;
    pcre2_match_data *md;
} work;

static void work_free(work *w) {
    free(w->buf);
    free(w->a.v);
    free(w->b.v);
    free(w->segs);
    free(w->ids);
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->heap);
    free(w->mapped);
    pcre2_match_data_free(w->md);
}

/* grow *p (elements of size sz) to hold at least n; 0 or -1 + error */
static int grow(void **p, size_t *cap, size_t n, size_t sz) {
    if (n <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < n) c *= 2;
    void *q = ff_realloc(*p, c * sz);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* append bytes to the arena; returns their offset or (size_t)-1 */
static size_t arena_put(work *w, const char *s, size_t n, const char *prefix, size_t np) {
    /* s may point into the arena itself, which the realloc may move */
    uintptr_t us = (uintptr_t)s, ub = (uintptr_t)w->buf;
    bool inside = w->buf && us >= ub && us < ub + w->cap;
    size_t s_off = inside ? (size_t)(us - ub) : 0;
    if (grow((void **)&w->buf, &w->cap, w->len + n + np + 1, 1) != 0) return (size_t)-1;
    if (inside) s = w->buf + s_off;
    size_t off = w->len;
    if (np) memcpy(w->buf + w->len, prefix, np);
    memmove(w->buf + w->len + np, s, n);
    w->len += n + np;
    return off;
}

static int plist_push(plist *l, size_t off, size_t len, int32_t token, bool at_start) {
    if (grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) != 0) return -1;
    l->v[l->n++] = (piece){off, len, token, at_start};
    return 0;
}

static int push_id(work *w, int32_t id) {
    if (grow((void **)&w->ids, &w->cap_ids, w->n_ids + 1, sizeof *w->ids) != 0) return -1;
    w->ids[w->n_ids++] = id;
    return 0;
}

static int push_seg(work *w, size_t s, size_t e, bool match) {
    if (grow((void **)&w->segs, &w->cap_segs, w->n_segs + 1, sizeof *w->segs) != 0) return -1;
    w->segs[w->n_segs++] = (seg){s, e, match};
    return 0;
}

/* ---- added tokens ------------------------------------------------------------------------ */

/* Cut the added tokens of one kind (normalized or not) out of piece p of w->a, appending the
 * resulting pieces to `out`. Leftmost-longest, as Hugging Face's Aho-Corasick search. */
static int split_added(const ff_tokenizer *t, work *w, piece p, bool normalized_set, bool parse_special, plist *out) {
    const char *s = w->buf + p.off;
    size_t n = p.len, start_offset = 0, i = 0;
    const ff_acmatch *am = t->match[normalized_set];
    while (am && i < n) {
        size_t start;
        int k = ff_acmatch_find(am, s, n, i, &start);
        if (k < 0) break;
        const added_tok *a = &t->added[t->match_tok[normalized_set][k]];
        size_t stop = start + a->len;
        i = stop;
        if (a->special && !parse_special) continue;
        if (a->single_word) {
            bool start_ok = start == 0 || !cp_is_word(last_cp(s, start));
            bool stop_ok = stop == n || !cp_is_word(first_cp(s + stop, n - stop, NULL));
            if (!start_ok || !stop_ok) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > start_offset) {
                int32_t c = last_cp(s, ns);
                if (!cp_is_whitespace(c)) break;
                size_t back = 1;
                while (ns - back > 0 && ((uint8_t)s[ns - back] & 0xc0) == 0x80) back++;
                ns -= back;
            }
            start = ns;
        }
        if (a->rstrip) {
            while (stop < n) {
                size_t clen;
                int32_t c = first_cp(s + stop, n - stop, &clen);
                if (!cp_is_whitespace(c)) break;
                stop += clen;
            }
            i = stop;
        }
        if (start_offset < start && plist_push(out, p.off + start_offset, start - start_offset, -1, p.at_start && start_offset == 0) != 0) return -1;
        if (plist_push(out, p.off + start, stop - start, a->id, false) != 0) return -1;
        start_offset = stop;
    }
    if (start_offset < n && plist_push(out, p.off + start_offset, n - start_offset, -1, p.at_start && start_offset == 0) != 0) return -1;
    return 0;
}

/* ---- pre-tokenization ---------------------------------------------------------------------- */

/* Cover s[0..n) with (range, is_match) segments for one step's pattern. */
static int find_matches(const pre_step *st, work *w, const char *s, size_t n) {
    w->n_segs = 0;
    size_t prev = 0;
    if (st->kind == PRE_DIGITS) {
        for (size_t i = 0; i < n;) {
            size_t clen;
            int32_t c = first_cp(s + i, n - i, &clen);
            if (cp_is_numeric(c)) {
                if (prev < i && push_seg(w, prev, i, false) != 0) return -1;
                if (push_seg(w, i, i + clen, true) != 0) return -1;
                prev = i + clen;
            }
            i += clen;
        }
    } else if (st->scan) {
        for (size_t i = 0; i < n;) {
            size_t e = ff_scan_next(st->scan, s, n, i);
            if (push_seg(w, i, e, true) != 0) return -1;
            i = e;
        }
        prev = n;
    } else if (st->re) {
        size_t pos = 0, last_match_end = (size_t)-1;
        while (pos <= n) {
            /* the input was checked once; pieces are cut at character boundaries */
            int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, w->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return ff_error_set(NULL, NULL, "pre-tokenizer regex failed: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            size_t ms = ov[0], me = ov[1];
            if (ms == me) { /* empty match: skip one character, as Oniguruma's iterator does */
                if (ms != last_match_end) {
                    if (prev < ms && push_seg(w, prev, ms, false) != 0) return -1;
                    if (push_seg(w, ms, me, true) != 0) return -1;
                    prev = me;
                }
                last_match_end = me;
                if (ms >= n) break;
                size_t clen;
                first_cp(s + ms, n - ms, &clen);
                pos = ms + clen;
                continue;
            }
            if (prev < ms && push_seg(w, prev, ms, false) != 0) return -1;
            if (push_seg(w, ms, me, true) != 0) return -1;
            prev = last_match_end = me;
            pos = me;
        }
    } else if (st->literal_len > 0) {
        for (size_t i = 0; i + st->literal_len <= n;) {
            const char *hit = memmem(s + i, n - i, st->literal, st->literal_len);
            if (!hit) break;
            size_t ms = (size_t)(hit - s);
            if (prev < ms && push_seg(w, prev, ms, false) != 0) return -1;
            if (push_seg(w, ms, ms + st->literal_len, true) != 0) return -1;
            prev = i = ms + st->literal_len;
        }
    }
    if (prev < n && push_seg(w, prev, n, false) != 0) return -1;
    return 0;
}

/* Turn the segments into pieces per the split behaviour (Hugging Face's
 * NormalizedString::split), appending non-empty kept ones to `out` (offsets relative to
 * base). */
static int apply_behavior(work *w, split_behavior b, bool invert, size_t base, bool at_start, plist *out) {
    seg *g = w->segs;
    size_t n = w->n_segs;
    if (invert)
        for (size_t i = 0; i < n; i++) g[i].match = !g[i].match;
    /* keep[i] = segment survives; merged segments are folded in place */
    size_t m = 0; /* result count, reusing g[] (fold never outruns the reader) */
    bool prev_match = false;
    switch (b) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++) g[i].match = false;
        m = n;
        break;
    case SPLIT_REMOVED:
        m = n; /* match = removed */
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool im = g[i].match;
            if (im == prev_match && m > 0)
                g[m - 1].e = g[i].e;
            else
                g[m++] = (seg){g[i].s, g[i].e, false};
            prev_match = im;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            bool im = g[i].match;
            if (im && !prev_match && m > 0)
                g[m - 1].e = g[i].e;
            else
                g[m++] = (seg){g[i].s, g[i].e, false};
            prev_match = im;
        }
        break;
    case SPLIT_MERGED_NEXT: {
        /* the same fold from the right: results are built at the end of g[] */
        size_t top = n; /* results live in g[top..n) */
        for (size_t k = n; k-- > 0;) {
            bool im = g[k].match;
            seg cur = g[k];
            if (im && !prev_match && top < n)
                g[top].s = cur.s;
            else
                g[--top] = (seg){cur.s, cur.e, false};
            prev_match = im;
        }
        memmove(g, g + top, (n - top) * sizeof *g);
        m = n - top;
        break;
    }
    }
    for (size_t i = 0; i < m; i++)
        if (!g[i].match && g[i].e > g[i].s && plist_push(out, base + g[i].s, g[i].e - g[i].s, -1, at_start && g[i].s == 0) != 0) return -1;
    return 0;
}

/* Metaspace on one piece, rewritten in the arena: every ' ' becomes the replacement, which is
 * also prepended (always, or to the piece that starts the text) unless the piece now starts
 * with it, as Hugging Face's Metaspace pre-tokenizer does. */
static int metaspace(const pre_step *st, work *w, piece *p) {
    const char *r = st->literal;
    size_t rl = st->literal_len, spaces = 0;
    for (size_t i = 0; i < p->len; i++) spaces += w->buf[p->off + i] == ' ';
    bool starts = p->len > 0 && (w->buf[p->off] == ' ' || (p->len >= rl && memcmp(w->buf + p->off, r, rl) == 0));
    bool prepend = !starts && (st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && p->at_start));
    size_t n = p->len + spaces * (rl - 1) + (prepend ? rl : 0);
    if (grow((void **)&w->buf, &w->cap, w->len + n + 1, 1) != 0) return -1;
    char *dst = w->buf + w->len;
    const char *src = w->buf + p->off; /* after the grow: the arena may have moved */
    size_t m = 0;
    if (prepend) {
        memcpy(dst, r, rl);
        m = rl;
    }
    for (size_t i = 0; i < p->len; i++) {
        if (src[i] == ' ') {
            memcpy(dst + m, r, rl);
            m += rl;
        } else {
            dst[m++] = src[i];
        }
    }
    p->off = w->len;
    p->len = m;
    w->len += m;
    return 0;
}

/* One pre-tokenizer step over every text piece of `in`, into `out`. */
static int pre_step_apply(const pre_step *st, work *w, plist *in, plist *out) {
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        piece p = in->v[i];
        if (p.token >= 0) {
            if (plist_push(out, p.off, p.len, p.token, false) != 0) return -1;
            continue;
        }
        if (st->kind == PRE_METASPACE) {
            if (metaspace(st, w, &p) != 0) return -1;
            if (!st->split) {
                if (p.len > 0 && plist_push(out, p.off, p.len, -1, p.at_start) != 0) return -1;
                continue;
            }
        }
        if (st->kind == PRE_BYTELEVEL) {
            if (st->add_prefix_space && (p.len == 0 || w->buf[p.off] != ' ')) {
                size_t off = arena_put(w, w->buf + p.off, p.len, " ", 1);
                if (off == (size_t)-1) return -1;
                p.off = off;
                p.len += 1;
            }
            if (!st->re && !st->scan) {
                if (p.len > 0 && plist_push(out, p.off, p.len, -1, p.at_start) != 0) return -1;
                continue;
            }
        }
        if (find_matches(st, w, w->buf + p.off, p.len) != 0) return -1;
        split_behavior b = st->kind == PRE_SPLIT       ? st->behavior
                           : st->kind == PRE_DIGITS    ? (st->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS)
                           : st->kind == PRE_METASPACE ? SPLIT_MERGED_NEXT
                                                       : SPLIT_ISOLATED;
        if (apply_behavior(w, b, st->kind == PRE_SPLIT && st->invert, p.off, p.at_start, out) != 0) return -1;
    }
    return 0;
}

/* ---- BPE ------------------------------------------------------------------------------------ */

static void heap_push(work *w, heap_item it) {
    /* capacity is reserved by the caller */
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        heap_item *p = &w->heap[parent];
        if (p->rank < it.rank || (p->rank == it.rank && p->pos <= it.pos)) break;
        w->heap[i] = *p;
        i = parent;
    }
    w->heap[i] = it;
}

static heap_item heap_pop(work *w) {
    heap_item top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && (w->heap[c + 1].rank < w->heap[c].rank || (w->heap[c + 1].rank == w->heap[c].rank && w->heap[c + 1].pos < w->heap[c].pos)))
            c++;
        if (last.rank < w->heap[c].rank || (last.rank == w->heap[c].rank && last.pos <= w->heap[c].pos)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

static void push_pair(const ff_tokenizer *t, work *w, int32_t left) {
    int32_t right = w->next[left];
    if (right < 0) return;
    const pmap_slot *m = pmap_get(&t->merges, w->sym[left], w->sym[right]);
    if (m) heap_push(w, (heap_item){m->rank, left, w->sym[left], w->sym[right]});
}

/* BPE over one word (raw bytes s[0..n)), appending its ids to w->ids. */
static int bpe_word(const ff_tokenizer *t, work *w, const char *s, size_t n) {
    if (t->ignore_merges) { /* a word that is itself a token is not merged (Llama 3) */
        int32_t id;
        if (t->byte_level) {
            if (grow((void **)&w->mapped, &w->cap_mapped, 2 * n + 1, 1) != 0) return -1;
            size_t m = 0;
            for (size_t i = 0; i < n; i++) m += put_cp(t->byte_cp[(uint8_t)s[i]], w->mapped + m);
            id = smap_get(&t->vocab, w->mapped, m);
        } else {
            id = smap_get(&t->vocab, s, n);
        }
        if (id >= 0) return push_id(w, id);
    }
    if (n > w->cap_sym) { /* sym, prev and next share one capacity */
        size_t cap = 2 * n;
        int32_t *a = ff_realloc(w->sym, cap * sizeof *a);
        if (a) w->sym = a;
        int32_t *b = a ? ff_realloc(w->prev, cap * sizeof *b) : NULL;
        if (b) w->prev = b;
        int32_t *c = b ? ff_realloc(w->next, cap * sizeof *c) : NULL;
        if (!c) return -1;
        w->next = c;
        w->cap_sym = cap;
    }
    /* each merge pushes at most two pairs: 3n entries in all */
    if (grow((void **)&w->heap, &w->cap_heap, 3 * n + 1, sizeof *w->heap) != 0) return -1;
    /* initial symbols: one per char of the word (per byte for byte-level BPE, whose chars are
     * the bytes mapped). As Hugging Face's BPE::merge_word: a char missing from the
     * vocabulary becomes its <0xXX> byte tokens under byte_fallback, else unk (pending, so
     * that a run of them is fused when fuse_unk; dropped when there is no unk token). */
    int32_t m = 0;
    bool pending_unk = false;
#define ADD_SYM(id_)                   \
    do {                               \
        w->sym[m] = (id_);             \
        w->prev[m] = m - 1;            \
        w->next[m] = m + 1;            \
        m++;                           \
    } while (0)
    for (size_t i = 0; i < n;) {
        size_t clen = 1;
        int32_t id;
        if (t->byte_level) {
            id = t->byte_sym[(uint8_t)s[i]];
        } else {
            uint8_t b = (uint8_t)s[i];
            clen = b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
            id = smap_get(&t->vocab, s + i, clen);
        }
        if (id >= 0) {
            if (pending_unk) ADD_SYM(t->unk_id);
            pending_unk = false;
            ADD_SYM(id);
        } else {
            bool fallback = t->byte_fallback;
            for (size_t k = 0; fallback && k < clen; k++) fallback = t->byte_fb[(uint8_t)s[i + k]] >= 0;
            if (fallback) {
                for (size_t k = 0; k < clen; k++) ADD_SYM(t->byte_fb[(uint8_t)s[i + k]]);
            } else if (t->unk_id >= 0) {
                if (pending_unk && !t->fuse_unk) ADD_SYM(t->unk_id);
                pending_unk = true;
            }
        }
        i += clen;
    }
    if (pending_unk) ADD_SYM(t->unk_id);
#undef ADD_SYM
    if (m == 0) return 0;
    w->next[m - 1] = -1;
    w->n_heap = 0;
    for (int32_t i = 0; i + 1 < m; i++) push_pair(t, w, i);
    while (w->n_heap > 0) {
        heap_item it = heap_pop(w);
        int32_t l = it.pos, r = w->next[l];
        if (w->sym[l] < 0 || r < 0 || w->sym[l] != it.a || w->sym[r] != it.b) continue; /* stale */
        const pmap_slot *mg = pmap_get(&t->merges, it.a, it.b);
        w->sym[l] = mg->id;
        w->sym[r] = -1;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        if (w->prev[l] >= 0) push_pair(t, w, w->prev[l]);
        push_pair(t, w, l);
    }
    for (int32_t i = 0; i >= 0; i = w->next[i])
        if (push_id(w, w->sym[i]) != 0) return -1;
    return 0;
}

/* ---- encode and decode ---------------------------------------------------------------------- */

int ff_tokenizer_encode(const ff_tokenizer *t, const char *text, size_t len, const ff_encode_opts *opts, int32_t **ids, int32_t *n) {
    *ids = NULL;
    *n = 0;
    ff_encode_opts o = {false, true};
    if (opts) o = *opts;
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &c);
        if (r <= 0) return ff_error_set(t->name, "give UTF-8 text", "the text is not valid UTF-8 (at byte %zu)", i);
        i += (size_t)r;
    }
    work w = {0};
    int rc = -1;
    if (!(w.md = pcre2_match_data_create(4, NULL))) {
        ff_error_set(NULL, NULL, "out of memory");
        goto out;
    }
    for (int i = 0; i < (o.add_special ? t->n_tmpl_pre : 0); i++)
        if (push_id(&w, t->tmpl_pre[i]) != 0) goto out;
    size_t off = arena_put(&w, text, len, NULL, 0);
    if (off == (size_t)-1) goto out;
    /* 1. raw added tokens */
    w.a.n = 0;
    if (split_added(t, &w, (piece){off, len, -1, true}, false, o.parse_special, &w.a) != 0) goto out;
    /* 2. normalize the text pieces, then cut normalized added tokens */
    w.b.n = 0;
    for (size_t i = 0; i < w.a.n; i++) {
        piece p = w.a.v[i];
        if (p.token >= 0) {
            if (plist_push(&w.b, p.off, p.len, p.token, false) != 0) goto out;
            continue;
        }
        if (t->n_norms) {
            char *nt;
            size_t nl;
            if (normalize(t, w.buf + p.off, p.len, &nt, &nl) != 0) goto out;
            p.off = arena_put(&w, nt, nl, NULL, 0);
            p.len = nl;
            free(nt);
            if (p.off == (size_t)-1) goto out;
        }
        if (split_added(t, &w, p, true, o.parse_special, &w.b) != 0) goto out;
    }
    /* 3. pre-tokenize */
    plist *in = &w.b, *outl = &w.a;
    for (int s = 0; s < t->n_pre; s++) {
        if (pre_step_apply(&t->pre[s], &w, in, outl) != 0) goto out;
        plist *tmp = in;
        in = outl;
        outl = tmp;
    }
    /* 4. BPE per word */
    for (size_t i = 0; i < in->n; i++) {
        piece p = in->v[i];
        if (p.token >= 0) {
            if (push_id(&w, p.token) != 0) goto out;
        } else if (bpe_word(t, &w, w.buf + p.off, p.len) != 0) {
            goto out;
        }
    }
    /* 5. template */
    for (int i = 0; i < (o.add_special ? t->n_tmpl_post : 0); i++)
        if (push_id(&w, t->tmpl_post[i]) != 0) goto out;
    if (w.n_ids > INT32_MAX) {
        ff_error_set(t->name, NULL, "text too long");
        goto out;
    }
    *n = (int32_t)w.n_ids;
    *ids = w.ids ? w.ids : ff_malloc(1);
    w.ids = NULL;
    rc = *ids ? 0 : -1;
out:
    work_free(&w);
    return rc;
}

/* a list of strings in one buffer, what the decoders pass along */
typedef struct strlist {
    char *buf;
    size_t len, cap;
    size_t *off, *n; /* [count] */
    size_t count, cap_items;
} strlist;

static void sl_free(strlist *l) {
    free(l->buf);
    free(l->off);
    free(l->n);
}

/* a new string s[0..n) at the end */
static int sl_add(strlist *l, const char *s, size_t n) {
    if (l->count == l->cap_items) {
        size_t c = l->cap_items ? 2 * l->cap_items : 64;
        size_t *o = ff_realloc(l->off, c * sizeof *o);
        if (o) l->off = o;
        size_t *k = o ? ff_realloc(l->n, c * sizeof *k) : NULL;
        if (!k) return -1;
        l->n = k;
        l->cap_items = c;
    }
    if (grow((void **)&l->buf, &l->cap, l->len + n + 1, 1) != 0) return -1;
    memcpy(l->buf + l->len, s, n);
    l->off[l->count] = l->len;
    l->n[l->count++] = n;
    l->len += n;
    return 0;
}

/* s[0..n) appended to the last string (which is the buffer's tail) */
static int sl_extend(strlist *l, const char *s, size_t n) {
    if (grow((void **)&l->buf, &l->cap, l->len + n + 1, 1) != 0) return -1;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
    l->n[l->count - 1] += n;
    return 0;
}

/* "<0xAB>" -> 0xAB, else -1 (Rust's u8::from_str_radix, which takes a leading '+') */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = s[3] == '+' ? 4 : 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (r <= 0) return false;
        i += (size_t)r;
    }
    return true;
}

/* One decoder over the strings of `in`, into `out` (Hugging Face's decode_chain). */
static int decode_step(const ff_tokenizer *t, const dec_step *d, const strlist *in, strlist *out) {
    out->len = out->count = 0;
    switch (d->kind) {
    case DEC_FUSE:
        if (sl_add(out, "", 0) != 0) return -1;
        for (size_t i = 0; i < in->count; i++)
            if (sl_extend(out, in->buf + in->off[i], in->n[i]) != 0) return -1;
        return 0;
    case DEC_BYTELEVEL: /* one string: a token whose chars all come from the byte map becomes
                           those bytes; any other token is copied as it is */
        if (sl_add(out, "", 0) != 0) return -1;
        for (size_t i = 0; i < in->count; i++) {
            const char *s = in->buf + in->off[i];
            size_t sl = in->n[i], k = 0;
            if (grow((void **)&out->buf, &out->cap, out->len + sl + 1, 1) != 0) return -1;
            char *o = out->buf + out->len;
            size_t m = 0;
            while (k < sl) {
                utf8proc_int32_t c;
                utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + k, (utf8proc_ssize_t)(sl - k), &c);
                if (r <= 0 || c >= 324 || t->cp_byte[c] < 0) break;
                o[m++] = (char)t->cp_byte[c];
                k += (size_t)r;
            }
            if (k < sl) { /* not all mapped */
                memcpy(o, s, sl);
                m = sl;
            }
            out->len += m;
            out->n[0] += m;
        }
        return 0;
    case DEC_BYTEFALLBACK: { /* runs of <0xXX> become their bytes, or one U+FFFD per byte when
                                those are not UTF-8 */
        size_t i = 0;
        while (i < in->count) {
            size_t j = i;
            while (j < in->count && byte_token(in->buf + in->off[j], in->n[j]) >= 0) j++;
            if (j > i) {
                char run[256];
                size_t nb = 0;
                bool ok = true;
                if (sl_add(out, "", 0) != 0) return -1;
                for (size_t k = i; k < j; k++) { /* in chunks: the validity is of the whole run */
                    run[nb++] = (char)byte_token(in->buf + in->off[k], in->n[k]);
                    if (nb == sizeof run || k + 1 == j) {
                        if (sl_extend(out, run, nb) != 0) return -1;
                        nb = 0;
                    }
                }
                size_t at = out->off[out->count - 1];
                ok = valid_utf8(out->buf + at, out->n[out->count - 1]);
                if (!ok) {
                    out->len = at;
                    out->count--;
                    for (size_t k = i; k < j; k++)
                        if (sl_add(out, "\xef\xbf\xbd", 3) != 0) return -1;
                }
                i = j;
                continue;
            }
            if (sl_add(out, in->buf + in->off[i], in->n[i]) != 0) return -1;
            i++;
        }
        return 0;
    }
    case DEC_REPLACE:
    case DEC_METASPACE:
        for (size_t i = 0; i < in->count; i++) {
            const char *s = in->buf + in->off[i], *end = s + in->n[i];
            /* Metaspace: the replacement is a space, but in the first token it is dropped */
            const char *to = d->kind == DEC_REPLACE ? d->b : " ";
            size_t lt = d->kind == DEC_REPLACE ? d->lb : (i == 0 && d->prepend != PREPEND_NEVER) ? 0 : 1;
            if (sl_add(out, "", 0) != 0) return -1;
            for (;;) {
                const char *h = memmem(s, (size_t)(end - s), d->a, d->la);
                if (sl_extend(out, s, (size_t)((h ? h : end) - s)) != 0) return -1;
                if (!h) break;
                if (sl_extend(out, to, lt) != 0) return -1;
                s = h + d->la;
            }
        }
        return 0;
    case DEC_STRIP:
        for (size_t i = 0; i < in->count; i++) {
            const char *s = in->buf + in->off[i];
            size_t b = 0, e = in->n[i];
            for (int k = 0; k < d->start && e - b >= d->la && memcmp(s + b, d->a, d->la) == 0; k++) b += d->la;
            for (int k = 0; k < d->stop && e - b >= d->la && memcmp(s + e - d->la, d->a, d->la) == 0; k++) e -= d->la;
            if (sl_add(out, s + b, e - b) != 0) return -1;
        }
        return 0;
    }
    return 0;
}

int ff_tokenizer_decode(const ff_tokenizer *t, const int32_t *ids, int32_t n, bool skip_special, char **text, size_t *len) {
    *text = NULL;
    strlist a = {0}, b = {0};
    int rc = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tok_str[id]) {
            ff_error_set(t->name, NULL, "token id %d at position %d is not in the vocabulary (%d ids)", id, i, t->n_ids);
            goto out;
        }
        if (skip_special && (t->flags[id] & FLAG_SPECIAL)) continue;
        if (sl_add(&a, t->tok_str[id], strlen(t->tok_str[id])) != 0) goto out;
    }
    strlist *cur = &a, *next = &b;
    for (int k = 0; k < t->n_decs; k++) {
        if (decode_step(t, &t->decs[k], cur, next) != 0) goto out;
        strlist *tmp = cur;
        cur = next;
        next = tmp;
    }
    /* the strings joined: with nothing between them, or with spaces when there is no decoder */
    size_t total = 0;
    for (size_t i = 0; i < cur->count; i++) total += cur->n[i] + 1;
    char *out = ff_malloc(total + 1);
    if (!out) goto out;
    size_t m = 0;
    for (size_t i = 0; i < cur->count; i++) {
        if (i > 0 && !t->has_decoder) out[m++] = ' ';
        memcpy(out + m, cur->buf + cur->off[i], cur->n[i]);
        m += cur->n[i];
    }
    out[m] = '\0';
    *text = out;
    if (len) *len = m;
    rc = 0;
out:
    sl_free(&a);
    sl_free(&b);
    return rc;
}

/* ---- loading -------------------------------------------------------------------------------- */

static int compile_re(const char *name, const char *pattern, pcre2_code **out) {
    int err;
    PCRE2_SIZE erroff;
    *out = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &erroff, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ff_error_set(name, NULL, "pre-tokenizer regex does not compile at offset %zu: %s", (size_t)erroff, (const char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* faster when available; fine without */
    return 0;
}

static int parse_normalizer(ff_tokenizer *t, json_t *n) {
    if (!n || json_is_null(n)) return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return ff_error_set(t->name, NULL, "normalizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        size_t i;
        json_t *x;
        if (!json_is_array(list)) return ff_error_set(t->name, NULL, "Sequence normalizer without a \"normalizers\" list");
        json_array_foreach(list, i, x) if (parse_normalizer(t, x) != 0) return -1;
        return 0;
    }
    static const char *names[6] = {"NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace"};
    for (int k = 0; k < 6; k++) {
        if (strcmp(type, names[k]) != 0) continue;
        if (t->n_norms == (int)(sizeof t->norms / sizeof t->norms[0])) return ff_error_set(t->name, NULL, "too many normalizers");
        norm_step *ns = &t->norms[t->n_norms++]; /* counted now, so destroy frees what it holds */
        *ns = (norm_step){.kind = (norm_kind)k};
        if (ns->kind == NORM_PREPEND) {
            const char *pre = json_string_value(json_object_get(n, "prepend"));
            if (!pre) return ff_error_set(t->name, NULL, "Prepend normalizer without a \"prepend\" string");
            if (!(ns->a = ff_strdup(pre))) return -1;
            ns->la = strlen(pre);
        } else if (ns->kind == NORM_REPLACE) {
            json_t *pat = json_object_get(n, "pattern");
            const char *from = json_string_value(json_object_get(pat, "String")), *to = json_string_value(json_object_get(n, "content"));
            if (json_object_get(pat, "Regex"))
                return ff_error_set(t->name, "only {\"String\": ...} patterns are supported", "Replace normalizer with a Regex pattern");
            if (!from || !*from || !to) return ff_error_set(t->name, NULL, "Replace normalizer needs a non-empty pattern {\"String\": ...} and a \"content\" string");
            if (!(ns->a = ff_strdup(from)) || !(ns->b = ff_strdup(to))) return -1;
            ns->la = strlen(from);
            ns->lb = strlen(to);
        }
        return 0;
    }
    return ff_error_set(t->name, "supported normalizers: NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence", "unsupported normalizer '%.64s'", type);
}

static int parse_behavior(const ff_tokenizer *t, const char *b, split_behavior *out) {
    static const struct {
        const char *name;
        split_behavior b;
    } k[] = {{"Removed", SPLIT_REMOVED},           {"Isolated", SPLIT_ISOLATED},         {"MergedWithPrevious", SPLIT_MERGED_PREV},
             {"MergedWithNext", SPLIT_MERGED_NEXT}, {"Contiguous", SPLIT_CONTIGUOUS}};
    for (size_t i = 0; b && i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(b, k[i].name)) {
            *out = k[i].b;
            return 0;
        }
    return ff_error_set(t->name, NULL, "Split pre-tokenizer with unknown behavior '%.64s'", b ? b : "(none)");
}

/* Metaspace's replacement and prepend_scheme (or, in older files, add_prefix_space) */
static int parse_metaspace(const ff_tokenizer *t, json_t *p, char **rep, size_t *rep_len, prepend_scheme *scheme) {
    const char *r = json_string_value(json_object_get(p, "replacement"));
    size_t clen;
    if (!r || first_cp(r, strlen(r), &clen) < 0 || clen != strlen(r))
        return ff_error_set(t->name, NULL, "Metaspace needs a \"replacement\" of one character");
    const char *ps = json_string_value(json_object_get(p, "prepend_scheme"));
    if (ps) {
        if (!strcmp(ps, "always"))
            *scheme = PREPEND_ALWAYS;
        else if (!strcmp(ps, "first"))
            *scheme = PREPEND_FIRST;
        else if (!strcmp(ps, "never"))
            *scheme = PREPEND_NEVER;
        else
            return ff_error_set(t->name, "use always, first or never", "Metaspace with unknown prepend_scheme '%.32s'", ps);
    } else {
        json_t *aps = json_object_get(p, "add_prefix_space");
        *scheme = !aps || json_is_true(aps) ? PREPEND_ALWAYS : PREPEND_NEVER;
    }
    if (!(*rep = ff_strdup(r))) return -1;
    *rep_len = strlen(r);
    return 0;
}

static int parse_pre_tokenizer(ff_tokenizer *t, json_t *p) {
    if (!p || json_is_null(p)) return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return ff_error_set(t->name, NULL, "pre_tokenizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *x;
        if (!json_is_array(list)) return ff_error_set(t->name, NULL, "Sequence pre_tokenizer without a \"pretokenizers\" list");
        json_array_foreach(list, i, x) if (parse_pre_tokenizer(t, x) != 0) return -1;
        return 0;
    }
    if (t->n_pre == (int)(sizeof t->pre / sizeof t->pre[0])) return ff_error_set(t->name, NULL, "too many pre-tokenizer steps");
    if (t->n_pre > 0 && t->pre[t->n_pre - 1].kind == PRE_BYTELEVEL)
        return ff_error_set(t->name, NULL, "a '%.64s' pre-tokenizer after ByteLevel is not supported (ByteLevel must be the last step)", type);
    pre_step *st = &t->pre[t->n_pre++]; /* counted now, so destroy frees what it holds */
    memset(st, 0, sizeof *st);
    if (!strcmp(type, "ByteLevel")) {
        st->kind = PRE_BYTELEVEL;
        st->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) st->scan = FF_SCAN_GPT2;
    } else if (!strcmp(type, "Split")) {
        st->kind = PRE_SPLIT;
        json_t *pat = json_object_get(p, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (re) {
            st->scan = ff_scan_kind_of(re);
            if (!st->scan && compile_re(t->name, re, &st->re) != 0) return -1;
        } else if (lit) {
            if (!(st->literal = ff_strdup(lit))) return -1;
            st->literal_len = strlen(lit);
        } else {
            return ff_error_set(t->name, NULL, "Split pre-tokenizer needs a pattern {\"Regex\": ...} or {\"String\": ...}");
        }
        if (parse_behavior(t, json_string_value(json_object_get(p, "behavior")), &st->behavior) != 0) return -1;
        st->invert = json_is_true(json_object_get(p, "invert"));
    } else if (!strcmp(type, "Digits")) {
        st->kind = PRE_DIGITS;
        st->individual_digits = json_is_true(json_object_get(p, "individual_digits"));
    } else if (!strcmp(type, "Metaspace")) {
        st->kind = PRE_METASPACE;
        if (parse_metaspace(t, p, &st->literal, &st->literal_len, &st->prepend) != 0) return -1;
        json_t *split = json_object_get(p, "split");
        st->split = !split || json_is_true(split); /* files older than the option always split */
    } else {
        return ff_error_set(t->name, "supported pre-tokenizers: ByteLevel, Split, Digits, Metaspace, Sequence", "unsupported pre_tokenizer '%.64s'", type);
    }
    return 0;
}

static int parse_decoder(ff_tokenizer *t, json_t *d) {
    if (!d || json_is_null(d)) return 0;
    t->has_decoder = true;
    const char *type = json_string_value(json_object_get(d, "type"));
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders");
        size_t i;
        json_t *x;
        if (!json_is_array(list)) return ff_error_set(t->name, NULL, "Sequence decoder without a \"decoders\" list");
        json_array_foreach(list, i, x) if (parse_decoder(t, x) != 0) return -1;
        return 0;
    }
    static const char *names[6] = {"ByteLevel", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"};
    for (int k = 0; type && k < 6; k++) {
        if (strcmp(type, names[k]) != 0) continue;
        if (t->n_decs == (int)(sizeof t->decs / sizeof t->decs[0])) return ff_error_set(t->name, NULL, "too many decoders");
        dec_step *ds = &t->decs[t->n_decs++]; /* counted now, so destroy frees what it holds */
        *ds = (dec_step){.kind = (dec_kind)k};
        if (ds->kind == DEC_REPLACE) {
            json_t *pat = json_object_get(d, "pattern");
            const char *from = json_string_value(json_object_get(pat, "String")), *to = json_string_value(json_object_get(d, "content"));
            if (!from || !*from || !to) return ff_error_set(t->name, "only {\"String\": ...} patterns are supported", "Replace decoder needs a non-empty pattern {\"String\": ...} and a \"content\" string");
            if (!(ds->a = ff_strdup(from)) || !(ds->b = ff_strdup(to))) return -1;
            ds->la = strlen(from);
            ds->lb = strlen(to);
        } else if (ds->kind == DEC_STRIP) {
            const char *c = json_string_value(json_object_get(d, "content"));
            json_t *st = json_object_get(d, "start"), *sp = json_object_get(d, "stop");
            size_t clen;
            if (!c || first_cp(c, strlen(c), &clen) < 0 || clen != strlen(c) || !json_is_integer(st) || !json_is_integer(sp) ||
                json_integer_value(st) < 0 || json_integer_value(sp) < 0)
                return ff_error_set(t->name, NULL, "Strip decoder needs a one-character \"content\" and counts \"start\", \"stop\"");
            if (!(ds->a = ff_strdup(c))) return -1;
            ds->la = clen;
            ds->start = (int)(json_integer_value(st) < 1000 ? json_integer_value(st) : 1000);
            ds->stop = (int)(json_integer_value(sp) < 1000 ? json_integer_value(sp) : 1000);
        } else if (ds->kind == DEC_METASPACE) {
            if (parse_metaspace(t, d, &ds->a, &ds->la, &ds->prepend) != 0) return -1;
        }
        return 0;
    }
    return ff_error_set(t->name, "supported decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence", "unsupported decoder '%.64s'",
                        type ? type : "(no type)");
}

static int parse_template(ff_tokenizer *t, json_t *pp) {
    if (!pp || json_is_null(pp)) return 0;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && !strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pp, "processors");
        size_t i;
        json_t *x;
        if (!json_is_array(list)) return ff_error_set(t->name, NULL, "Sequence post_processor without a \"processors\" list");
        json_array_foreach(list, i, x) if (parse_template(t, x) != 0) return -1;
        return 0;
    }
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return ff_error_set(t->name, "supported post-processors: TemplateProcessing, ByteLevel, Sequence", "unsupported post_processor '%.64s'",
                            type ? type : "none");
    json_t *single = json_object_get(pp, "single"), *specials = json_object_get(pp, "special_tokens");
    if (!json_is_array(single)) return ff_error_set(t->name, NULL, "TemplateProcessing without a \"single\" template");
    bool seen_a = false;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item) {
        json_t *seq = json_object_get(item, "Sequence"), *sp = json_object_get(item, "SpecialToken");
        if (seq) {
            const char *which = json_string_value(json_object_get(seq, "id"));
            if (!which || strcmp(which, "A") != 0 || seen_a) return ff_error_set(t->name, NULL, "the single template must hold sequence A once");
            seen_a = true;
            continue;
        }
        const char *key = json_string_value(json_object_get(sp, "id"));
        json_t *ids = key ? json_object_get(json_object_get(specials, key), "ids") : NULL;
        if (!json_is_array(ids)) return ff_error_set(t->name, NULL, "template special token '%.64s' has no ids", key ? key : "?");
        size_t k;
        json_t *x;
        json_array_foreach(ids, k, x) {
            int32_t id = (int32_t)json_integer_value(x);
            if (!json_is_integer(x) || id < 0 || id >= t->n_ids) return ff_error_set(t->name, NULL, "template special token '%.64s' has a bad id", key);
            int *cnt = seen_a ? &t->n_tmpl_post : &t->n_tmpl_pre;
            int32_t *dst = seen_a ? t->tmpl_post : t->tmpl_pre;
            if (*cnt == 8) return ff_error_set(t->name, NULL, "template adds too many tokens");
            dst[(*cnt)++] = id;
        }
    }
    return 0;
}

/* model.vocab, model.merges, and the model's options */
static int parse_model(ff_tokenizer *t, json_t *m, int32_t *max_id) {
    const char *type = json_string_value(json_object_get(m, "type"));
    if (!type || strcmp(type, "BPE") != 0)
        return ff_error_set(t->name, "fuseflow reads byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2 style)", "unsupported tokenizer model '%.64s'",
                            type ? type : "none");
    json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
        return ff_error_set(t->name, "set \"dropout\" to null", "BPE dropout is not supported (it is for training tokenizers)");
    t->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
    const char *cs = json_string_value(json_object_get(m, "continuing_subword_prefix"));
    const char *ew = json_string_value(json_object_get(m, "end_of_word_suffix"));
    if ((cs && *cs) || (ew && *ew)) return ff_error_set(t->name, NULL, "BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
    t->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    t->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
    json_t *vocab = json_object_get(m, "vocab");
    if (!json_is_object(vocab)) return ff_error_set(t->name, NULL, "model has no \"vocab\" object");
    if (smap_init(&t->vocab, json_object_size(vocab)) != 0) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= (1 << 30)) return ff_error_set(t->name, NULL, "vocab entry '%.64s' has a bad id", key);
        smap_slot *s = smap_slot_of(&t->vocab, key, strlen(key));
        s->key = key;
        s->len = (uint32_t)strlen(key);
        s->id = (int32_t)id;
        if (id > *max_id) *max_id = (int32_t)id;
    }
    const char *unk = json_string_value(json_object_get(m, "unk_token"));
    t->unk_id = unk ? smap_get(&t->vocab, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0) return ff_error_set(t->name, NULL, "unk_token '%.64s' is not in the vocabulary", unk);
    return 0;
}

static int parse_merges(ff_tokenizer *t, json_t *m) {
    json_t *merges = json_object_get(m, "merges");
    if (!merges || json_is_null(merges)) return pmap_init(&t->merges, 0);
    if (!json_is_array(merges)) return ff_error_set(t->name, NULL, "\"merges\" must be a list");
    if (pmap_init(&t->merges, json_array_size(merges)) != 0) return -1;
    size_t i;
    json_t *x;
    char buf[1024];
    json_array_foreach(merges, i, x) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(x)) { /* "a b" */
            const char *s = json_string_value(x), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) return ff_error_set(t->name, NULL, "merge %zu '%.64s' is not two tokens separated by one space", i, s);
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(x) && json_array_size(x) == 2 && json_is_string(json_array_get(x, 0)) && json_is_string(json_array_get(x, 1))) {
            a = json_string_value(json_array_get(x, 0));
            b = json_string_value(json_array_get(x, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            return ff_error_set(t->name, NULL, "merge %zu is neither \"a b\" nor [\"a\", \"b\"]", i);
        }
        if (la + lb >= sizeof buf) return ff_error_set(t->name, NULL, "merge %zu is too long", i);
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t ia = smap_get(&t->vocab, a, la), ib = smap_get(&t->vocab, b, lb), im = smap_get(&t->vocab, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0)
            return ff_error_set(t->name, NULL, "merge %zu ('%.*s' + '%.*s') uses a token that is not in the vocabulary", i, (int)la, a, (int)lb, b);
        pmap_slot *s = pmap_slot_of(&t->merges, ia, ib);
        s->key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib; /* a repeated pair keeps its last rank, as in HF */
        s->rank = (int32_t)i;
        s->id = im;
    }
    return 0;
}

static int parse_added(ff_tokenizer *t, json_t *list, int32_t *max_id) {
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return ff_error_set(t->name, NULL, "\"added_tokens\" must be a list");
    t->added = ff_calloc(json_array_size(list) + 1, sizeof *t->added);
    if (!t->added) return -1;
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x) {
        const char *content = json_string_value(json_object_get(x, "content"));
        json_t *jid = json_object_get(x, "id");
        if (!content || !json_is_integer(jid) || json_integer_value(jid) < 0 || json_integer_value(jid) >= (1 << 30))
            return ff_error_set(t->name, NULL, "added token %zu needs a \"content\" string and an \"id\"", i);
        added_tok *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(jid);
        a->special = json_is_true(json_object_get(x, "special"));
        a->lstrip = json_is_true(json_object_get(x, "lstrip"));
        a->rstrip = json_is_true(json_object_get(x, "rstrip"));
        a->single_word = json_is_true(json_object_get(x, "single_word"));
        a->normalized = json_is_true(json_object_get(x, "normalized"));
        if (a->normalized && t->n_norms) { /* matched against normalized text, so normalize it too */
            if (normalize(t, content, strlen(content), &a->content, &a->len) != 0) return ff_error_wrap("%s: added token %zu", t->name, i);
        } else {
            if (!(a->content = ff_strdup(content))) return -1;
            a->len = strlen(content);
        }
        if (a->id > *max_id) *max_id = a->id;
    }
    return 0;
}

/* one matcher per kind of added token (raw text, normalized text) */
static int build_matchers(ff_tokenizer *t) {
    const char **pats = ff_malloc(((size_t)t->n_added + 1) * sizeof *pats);
    size_t *lens = ff_malloc(((size_t)t->n_added + 1) * sizeof *lens);
    int rc = pats && lens ? 0 : -1;
    for (int k = 0; k < 2 && rc == 0; k++) {
        int n = 0;
        if (!(t->match_tok[k] = ff_malloc(((size_t)t->n_added + 1) * sizeof *t->match_tok[k]))) rc = -1;
        for (int i = 0; rc == 0 && i < t->n_added; i++)
            if (t->added[i].normalized == (k == 1) && t->added[i].len > 0) {
                pats[n] = t->added[i].content;
                lens[n] = t->added[i].len;
                t->match_tok[k][n++] = i;
            }
        if (rc == 0 && n > 0 && !(t->match[k] = ff_acmatch_new(pats, lens, n))) rc = -1;
    }
    free(pats);
    free(lens);
    return rc;
}

static ff_tokenizer *from_json(json_t *root, const char *name) {
    ff_tokenizer *t = ff_calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return NULL;
    }
    t->root = root;
    t->bos = t->eos = t->pad = -1;
    t->unk_id = -1;
    byte_map_init(t);
    if (!(t->name = ff_strdup(name))) goto fail;
    if (!json_is_object(root)) {
        ff_error_set(name, NULL, "tokenizer.json must be a JSON object");
        goto fail;
    }
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        ff_error_set(name, NULL, "no \"model\" object");
        goto fail;
    }
    int32_t max_id = -1;
    if (parse_model(t, model, &max_id) != 0 || parse_normalizer(t, json_object_get(root, "normalizer")) != 0 ||
        parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer")) != 0 || parse_added(t, json_object_get(root, "added_tokens"), &max_id) != 0 ||
        build_matchers(t) != 0)
        goto fail;
    t->byte_level = t->n_pre > 0 && t->pre[t->n_pre - 1].kind == PRE_BYTELEVEL;
    if (parse_decoder(t, json_object_get(root, "decoder")) != 0 || parse_merges(t, model) != 0) goto fail;
    t->n_ids = max_id + 1;
    t->tok_str = ff_calloc((size_t)t->n_ids + 1, sizeof *t->tok_str);
    t->flags = ff_calloc((size_t)t->n_ids + 1, 1);
    if (!t->tok_str || !t->flags || smap_init(&t->all, json_object_size(json_object_get(model, "vocab")) + (size_t)t->n_added) != 0) goto fail;
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(model, "vocab"), key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->tok_str[id]) {
            ff_error_set(name, NULL, "vocab ids must be unique: '%.64s' and '%.64s' both have id %d", t->tok_str[id], key, id);
            goto fail;
        }
        t->tok_str[id] = key;
    }
    for (int i = 0; i < t->n_added; i++) {
        /* an added token may repeat a vocab entry: its content wins; a normalized one reads
         * back normalized ("ﬁ" -> "fi" under NFKC), as in Hugging Face */
        const added_tok *a = &t->added[i];
        t->tok_str[a->id] = a->content;
        t->flags[a->id] |= FLAG_ADDED | (a->special ? FLAG_SPECIAL : 0);
    }
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->tok_str[id]) continue;
        smap_slot *s = smap_slot_of(&t->all, t->tok_str[id], strlen(t->tok_str[id]));
        if (!s->key || (t->flags[id] & FLAG_ADDED)) {
            s->key = t->tok_str[id];
            s->len = (uint32_t)strlen(t->tok_str[id]);
            s->id = id;
        }
    }
    for (int b = 0; b < 256; b++) {
        char c[8];
        size_t l = put_cp(t->byte_cp[b], c);
        t->byte_sym[b] = smap_get(&t->vocab, c, l);
        snprintf(c, sizeof c, "<0x%02X>", b);
        t->byte_fb[b] = smap_get(&t->vocab, c, 6);
    }
    if (parse_template(t, json_object_get(root, "post_processor")) != 0) goto fail;
    return t;
fail:
    ff_tokenizer_destroy(&t);
    return NULL;
}

ff_tokenizer *ff_tokenizer_parse(const char *text, size_t len, const char *name) {
    json_error_t err;
    if (!name) name = "tokenizer.json";
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        ff_error_set(name, NULL, "malformed JSON at line %d: %s", err.line, err.text);
        return NULL;
    }
    return from_json(root, name);
}

ff_tokenizer *ff_tokenizer_load(const char *path) {
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) return NULL;
    ff_tokenizer *t = ff_tokenizer_parse(text, len, path);
    free(text);
    return t;
}

/* bos_token etc. in tokenizer_config.json: a string or {"content": "..."} */
static int32_t role_id(const ff_tokenizer *t, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    const char *s = json_is_object(v) ? json_string_value(json_object_get(v, "content")) : json_string_value(v);
    return s ? ff_tokenizer_token_id(t, s) : -1;
}

ff_tokenizer *ff_tokenizer_load_dir(const char *dir) {
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ff_tokenizer *t = ff_tokenizer_load(path);
    if (!t) return NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        fclose(f);
        json_error_t err;
        size_t len;
        /* model_max_length is often 1e30 written as an integer: read integers as reals */
        if (!(t->config_text = ff_read_file(path, &len))) {
            ff_tokenizer_destroy(&t);
            return NULL;
        }
        t->config = json_loadb(t->config_text, len, JSON_DECODE_INT_AS_REAL, &err);
        if (!t->config || !json_is_object(t->config)) {
            ff_error_set(path, NULL, "malformed JSON at line %d: %s", err.line, t->config ? "not an object" : err.text);
            ff_tokenizer_destroy(&t);
            return NULL;
        }
        t->bos = role_id(t, t->config, "bos_token");
        t->eos = role_id(t, t->config, "eos_token");
        t->pad = role_id(t, t->config, "pad_token");
    }
    return t;
}

/* ---- the byte-level tokenizer ---------------------------------------------------------------- */

ff_tokenizer *ff_tokenizer_new_bytes(void) {
    ff_tokenizer tmp; /* only for the byte map */
    byte_map_init(&tmp);
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[5] = {0};
        put_cp(tmp.byte_cp[b], c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    json_t *added = json_array();
    const char *names[3] = {"<|bos|>", "<|eos|>", "<|pad|>"};
    for (int i = 0; i < 3; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", FF_BYTES_BOS + i, "content", names[i], "single_word", 0,
                                               "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:n, s:{s:s, s:b, s:b, s:b}, s:n, s:{s:s, s:b, s:b, s:b}, "
                             "s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:[]}}",
                             "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", "type", "ByteLevel",
                             "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0, "post_processor", "decoder", "type", "ByteLevel",
                             "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "dropout", "unk_token",
                             "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab",
                             vocab, "merges");
    if (!root) {
        ff_error_set(NULL, NULL, "cannot build the byte tokenizer");
        return NULL;
    }
    ff_tokenizer *t = from_json(root, "<byte tokenizer>");
    if (!t) return NULL;
    t->config = json_pack("{s:s, s:s, s:s, s:s, s:b, s:b}", "tokenizer_class", "PreTrainedTokenizerFast", "bos_token", "<|bos|>", "eos_token",
                          "<|eos|>", "pad_token", "<|pad|>", "add_bos_token", 0, "clean_up_tokenization_spaces", 0);
    t->config_text = t->config ? json_dumps(t->config, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    if (!t->config_text) {
        ff_error_set(NULL, NULL, "out of memory");
        ff_tokenizer_destroy(&t);
        return NULL;
    }
    t->bos = FF_BYTES_BOS;
    t->eos = FF_BYTES_EOS;
    t->pad = FF_BYTES_PAD;
    return t;
}

/* ---- accessors and saving -------------------------------------------------------------------- */

int32_t ff_tokenizer_vocab_size(const ff_tokenizer *t) { return t->n_ids; }
int32_t ff_tokenizer_bos(const ff_tokenizer *t) { return t->bos; }
int32_t ff_tokenizer_eos(const ff_tokenizer *t) { return t->eos; }
int32_t ff_tokenizer_pad(const ff_tokenizer *t) { return t->pad; }

int32_t ff_tokenizer_token_id(const ff_tokenizer *t, const char *token) { return smap_get(&t->all, token, strlen(token)); }

const char *ff_tokenizer_token(const ff_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids ? t->tok_str[id] : NULL; }

bool ff_tokenizer_is_special(const ff_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids && (t->flags[id] & FLAG_SPECIAL); }

char *ff_utf8_lossy(const char *s, size_t len, size_t *out_len) {
    char *out = ff_malloc(3 * len + 1); /* each bad byte becomes at most 3 bytes */
    if (!out) return NULL;
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, m = 0;
    while (i < len) {
        uint8_t b = p[i];
        size_t need;
        uint8_t lo = 0x80, hi = 0xbf; /* range of the second byte */
        if (b < 0x80) {
            out[m++] = (char)b;
            i++;
            continue;
        } else if (b >= 0xc2 && b <= 0xdf) {
            need = 1;
        } else if (b >= 0xe0 && b <= 0xef) {
            need = 2;
            if (b == 0xe0) lo = 0xa0;
            if (b == 0xed) hi = 0x9f;
        } else if (b >= 0xf0 && b <= 0xf4) {
            need = 3;
            if (b == 0xf0) lo = 0x90;
            if (b == 0xf4) hi = 0x8f;
        } else {
            need = 0; /* never valid as a lead byte */
        }
        size_t k = 1;
        while (need && k <= need && i + k < len) {
            uint8_t c = p[i + k];
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf)) break;
            k++;
        }
        if (need && k == need + 1) { /* complete and valid */
            memcpy(out + m, p + i, k);
            m += k;
        } else { /* the maximal invalid prefix becomes one U+FFFD */
            memcpy(out + m, "\xef\xbf\xbd", 3);
            m += 3;
        }
        i += k;
    }
    out[m] = '\0';
    if (out_len) *out_len = m;
    return out;
}

static int save_json(json_t *j, const char *path, size_t flags) {
    char *s = json_dumps(j, flags | JSON_PRESERVE_ORDER);
    if (!s) return ff_error_set(path, NULL, "cannot serialise JSON");
    int rc = ff_write_file_atomic(path, s, strlen(s));
    free(s);
    return rc;
}

int ff_tokenizer_save_dir(const ff_tokenizer *t, const char *dir) {
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (save_json(t->root, path, JSON_INDENT(2)) != 0) return -1;
    if (!t->config_text) return 0;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    return ff_write_file_atomic(path, t->config_text, strlen(t->config_text));
}

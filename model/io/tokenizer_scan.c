/* The pre-tokenizer regexes of GPT-2, Llama 3 and Qwen2 as scanners over code points
 * (model/io/tok_internal.h). Two reasons: the classes are Unicode 16's (the tables of
 * unicode_tables.c), where the system's PCRE2 has older ones and counts U+180E as \s; and a
 * scanner that knows the pattern is several times faster than a backtracking engine.
 *
 * Each function follows its regex's alternatives in order, as a leftmost-first engine tries
 * them at position i, with the backtracking worked out by hand where the regex needs it
 * (\s+(?!\S) gives back the last space when a non-space follows; \s*[\r\n]+ ends at the
 * last line break of the run of spaces).
 *
 * Not here: other patterns (PCRE2 runs them, tokenizer.c), what is done with the matches. */
#include <string.h>

#include "model/io/tok_internal.h"

const char ff_scan_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char k_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

ff_scan_kind ff_scan_kind_of(const char *p) {
    if (!strcmp(p, ff_scan_gpt2_pattern)) return FF_SCAN_GPT2;
    if (!strcmp(p, k_llama3)) return FF_SCAN_LLAMA3;
    if (!strcmp(p, k_qwen2)) return FF_SCAN_QWEN2;
    return FF_SCAN_NONE;
}

enum { C_END = 0x80 }; /* past the end of the text: in no class, and not "other" either */

/* the code point at s[i] (valid UTF-8), its class bits and its length */
typedef struct ch {
    uint32_t cp;
    uint8_t cls;
    uint8_t len;
} ch;

static inline ch at(const uint8_t *s, size_t n, size_t i) {
    if (i >= n) return (ch){0, C_END, 0};
    uint8_t b = s[i];
    uint32_t cp;
    uint8_t len;
    if (b < 0x80) {
        cp = b;
        len = 1;
    } else if (b < 0xe0) {
        cp = ((uint32_t)(b & 0x1f) << 6) | (s[i + 1] & 0x3f);
        len = 2;
    } else if (b < 0xf0) {
        cp = ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(s[i + 1] & 0x3f) << 6) | (s[i + 2] & 0x3f);
        len = 3;
    } else {
        cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3f) << 12) | ((uint32_t)(s[i + 2] & 0x3f) << 6) | (s[i + 3] & 0x3f);
        len = 4;
    }
    return (ch){cp, ff_uc_class(cp), len};
}

static inline bool is_l(ch c) { return c.cls & FF_UC_L; }
static inline bool is_n(ch c) { return c.cls & FF_UC_N; }
static inline bool is_s(ch c) { return c.cls & FF_UC_SPACE; }
/* [^\s\p{L}\p{N}] */
static inline bool is_other(ch c) { return !(c.cls & (FF_UC_L | FF_UC_N | FF_UC_SPACE | C_END)); }
static inline bool is_crlf(ch c) { return c.cp == '\r' || c.cp == '\n'; }

/* the end of the run of characters with any of the class bits, from i */
static size_t run_of(const uint8_t *s, size_t n, size_t i, uint8_t bits) {
    for (;;) {
        ch c = at(s, n, i);
        if (!(c.cls & bits) || (c.cls & C_END)) return i;
        i += c.len;
    }
}

static size_t run_other(const uint8_t *s, size_t n, size_t i) {
    for (;;) {
        ch c = at(s, n, i);
        if (!is_other(c)) return i;
        i += c.len;
    }
}

/* 's 't 're 've 'm 'll 'd after the apostrophe at i: the match's end, or 0. Case-insensitive
 * as (?i:...) is in Unicode: 's' also matches 'S' and U+017F LATIN SMALL LETTER LONG S. */
static size_t contraction(const uint8_t *s, size_t n, size_t i, bool fold) {
    size_t j = i + 1;
    if (j >= n) return 0;
    uint8_t a = s[j], b = j + 1 < n ? s[j + 1] : 0;
    if (fold) {
        if (a == 0xc5 && b == 0xbf) return j + 2; /* U+017F */
        a = (uint8_t)(a | (a >= 'A' && a <= 'Z' ? 0x20 : 0));
        b = (uint8_t)(b | (b >= 'A' && b <= 'Z' ? 0x20 : 0));
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return j + 1;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return j + 2;
    return 0;
}

/* \s+(?!\S)|\s+ at a space: the whole run when it ends the text or is one character, else
 * all but its last character (which goes with what follows) */
static size_t spaces(const uint8_t *s, size_t n, size_t i) {
    size_t last = i, j = i;
    for (;;) {
        ch c = at(s, n, j);
        if (!is_s(c)) break;
        last = j;
        j += c.len;
    }
    if (j >= n || last == i) return j;
    return last;
}

static size_t scan_gpt2(const uint8_t *s, size_t n, size_t i) {
    ch c = at(s, n, i);
    if (c.cp == '\'') {
        size_t e = contraction(s, n, i, false);
        if (e) return e;
    }
    size_t j = c.cp == ' ' ? i + 1 : i;
    ch d = j == i ? c : at(s, n, j);
    if (is_l(d)) return run_of(s, n, j, FF_UC_L);
    if (is_n(d)) return run_of(s, n, j, FF_UC_N);
    if (is_other(d)) return run_other(s, n, j);
    return spaces(s, n, i);
}

static size_t scan_llama3(const uint8_t *s, size_t n, size_t i, int max_digits) {
    ch c = at(s, n, i);
    if (c.cp == '\'') {
        size_t e = contraction(s, n, i, true);
        if (e) return e;
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (is_l(c)) return run_of(s, n, i, FF_UC_L);
    if (!is_crlf(c) && !is_n(c) && is_l(at(s, n, i + c.len))) return run_of(s, n, i + c.len, FF_UC_L);
    /* \p{N}{1,max} */
    if (is_n(c)) {
        size_t j = i;
        for (int k = 0; k < max_digits; k++) {
            ch d = at(s, n, j);
            if (!is_n(d)) break;
            j += d.len;
        }
        return j;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = c.cp == ' ' && is_other(at(s, n, i + 1)) ? i + 1 : i;
    if (is_other(at(s, n, j))) {
        j = run_other(s, n, j);
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    /* \s*[\r\n]+: through the last line break of the run of spaces */
    size_t k = i, brk = 0;
    for (;;) {
        ch d = at(s, n, k);
        if (!is_s(d)) break;
        k += d.len;
        if (is_crlf(d)) brk = k;
    }
    if (brk) return brk;
    return spaces(s, n, i);
}

size_t ff_scan_next(ff_scan_kind k, const char *text, size_t n, size_t i) {
    const uint8_t *s = (const uint8_t *)text;
    switch (k) {
    case FF_SCAN_GPT2: return scan_gpt2(s, n, i);
    case FF_SCAN_LLAMA3: return scan_llama3(s, n, i, 3);
    case FF_SCAN_QWEN2: return scan_llama3(s, n, i, 1);
    case FF_SCAN_NONE: break;
    }
    return n;
}

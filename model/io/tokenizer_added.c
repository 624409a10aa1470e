/* The added-token matcher (model/io/tok_internal.h): Aho-Corasick with leftmost-longest
 * matches, what Hugging Face's AddedVocabulary builds from its added tokens.
 *
 * The trie keeps children as sorted edge lists (added tokens are few and share prefixes such
 * as "<|"), except the root's, which is a table of 256 so that the common case, a byte that
 * starts no token, costs one load. Failure links make the search one pass: after reading
 * s[..i) the state is the longest suffix of it that prefixes a pattern, and out[state] the
 * longest pattern that ends at i. A match starting at `b` is final once no prefix in flight
 * can start at or before b (i - depth > b).
 *
 * Not here: what a match means (lstrip, rstrip, single_word: tokenizer.c). */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/util.h"
#include "model/io/tok_internal.h"

typedef struct ac_edge {
    uint8_t byte;
    int32_t to;
} ac_edge;

struct ff_acmatch {
    int32_t n_states;
    int32_t *edge_first; /* [n_states + 1] the state's edges are edges[edge_first[s] .. edge_first[s+1]) */
    ac_edge *edges;      /* sorted by byte within a state */
    int32_t *fail;       /* [n_states] */
    int32_t *out;        /* [n_states] longest pattern ending here, or -1 */
    int32_t *depth;      /* [n_states] bytes from the root */
    size_t *pat_len;     /* [n_pats] */
    int32_t root[256];   /* root transitions: the child, or 0 (the root itself) */
};

void ff_acmatch_destroy(ff_acmatch **pm) {
    if (!pm || !*pm) return;
    ff_acmatch *m = *pm;
    free(m->edge_first);
    free(m->edges);
    free(m->fail);
    free(m->out);
    free(m->depth);
    free(m->pat_len);
    free(m);
    *pm = NULL;
}

static int32_t child(const ff_acmatch *m, int32_t s, uint8_t c) {
    if (s == 0) return m->root[c] ? m->root[c] : -1;
    int32_t lo = m->edge_first[s], hi = m->edge_first[s + 1];
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (m->edges[mid].byte < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < m->edge_first[s + 1] && m->edges[lo].byte == c ? m->edges[lo].to : -1;
}

static int32_t step(const ff_acmatch *m, int32_t s, uint8_t c) {
    for (;;) {
        int32_t to = child(m, s, c);
        if (to >= 0) return to;
        if (s == 0) return 0;
        s = m->fail[s];
    }
}

/* building: a trie with linked children, then flattened */
typedef struct bnode {
    int32_t first_child, next_sibling, pat;
    uint8_t byte;
} bnode;

static int cmp_edge(const void *a, const void *b) { return (int)((const ac_edge *)a)->byte - (int)((const ac_edge *)b)->byte; }

ff_acmatch *ff_acmatch_new(const char *const *pats, const size_t *pats_len, int n) {
    size_t total = 1;
    for (int i = 0; i < n; i++) total += pats_len[i];
    if (total > INT32_MAX) return NULL;
    ff_acmatch *m = ff_calloc(1, sizeof *m);
    bnode *b = ff_malloc(total * sizeof *b);
    int32_t *queue = ff_malloc(total * sizeof *queue);
    if (!m || !b || !queue) goto fail;
    int32_t ns = 1;
    b[0] = (bnode){-1, -1, -1, 0};
    for (int p = 0; p < n; p++) {
        int32_t s = 0;
        for (size_t k = 0; k < pats_len[p]; k++) {
            uint8_t c = (uint8_t)pats[p][k];
            int32_t ch = b[s].first_child;
            while (ch >= 0 && b[ch].byte != c) ch = b[ch].next_sibling;
            if (ch < 0) {
                ch = ns++;
                b[ch] = (bnode){-1, b[s].first_child, -1, c};
                b[s].first_child = ch;
            }
            s = ch;
        }
        if (s != 0 && b[s].pat < 0) b[s].pat = p; /* the first of equal patterns wins */
    }
    m->n_states = ns;
    m->edge_first = ff_malloc(((size_t)ns + 1) * sizeof *m->edge_first);
    m->edges = ff_malloc((size_t)ns * sizeof *m->edges);
    m->fail = ff_calloc((size_t)ns, sizeof *m->fail);
    m->out = ff_malloc((size_t)ns * sizeof *m->out);
    m->depth = ff_calloc((size_t)ns, sizeof *m->depth);
    m->pat_len = ff_malloc(((size_t)n + 1) * sizeof *m->pat_len);
    if (!m->edge_first || !m->edges || !m->fail || !m->out || !m->depth || !m->pat_len) goto fail;
    for (int p = 0; p < n; p++) m->pat_len[p] = pats_len[p];
    int32_t ne = 0;
    for (int32_t s = 0; s < ns; s++) {
        m->edge_first[s] = ne;
        int32_t start = ne;
        for (int32_t ch = b[s].first_child; ch >= 0; ch = b[ch].next_sibling) m->edges[ne++] = (ac_edge){b[ch].byte, ch};
        qsort(m->edges + start, (size_t)(ne - start), sizeof *m->edges, cmp_edge);
    }
    m->edge_first[ns] = ne;
    for (int32_t e = m->edge_first[0]; e < m->edge_first[1]; e++) m->root[m->edges[e].byte] = m->edges[e].to;
    /* failure links and outputs in breadth-first order: a state's fail is shallower */
    size_t qh = 0, qt = 0;
    m->out[0] = -1;
    for (int32_t e = m->edge_first[0]; e < m->edge_first[1]; e++) {
        int32_t ch = m->edges[e].to;
        m->fail[ch] = 0;
        m->depth[ch] = 1;
        queue[qt++] = ch;
    }
    while (qh < qt) {
        int32_t s = queue[qh++];
        m->out[s] = b[s].pat >= 0 ? b[s].pat : m->out[m->fail[s]];
        for (int32_t e = m->edge_first[s]; e < m->edge_first[s + 1]; e++) {
            int32_t ch = m->edges[e].to;
            m->fail[ch] = step(m, m->fail[s], m->edges[e].byte);
            m->depth[ch] = m->depth[s] + 1;
            queue[qt++] = ch;
        }
    }
    free(b);
    free(queue);
    return m;
fail:
    free(b);
    free(queue);
    ff_acmatch_destroy(&m);
    return NULL;
}

int ff_acmatch_find(const ff_acmatch *m, const char *s, size_t n, size_t from, size_t *start) {
    int best = -1;
    size_t best_start = 0, i = from;
    int32_t st = 0;
    for (;;) {
        if (best >= 0 && i - (size_t)m->depth[st] > best_start) break;
        if (st == 0)
            while (i < n && !m->root[(uint8_t)s[i]]) i++;
        if (i >= n) break;
        st = step(m, st, (uint8_t)s[i++]);
        int o = m->out[st];
        if (o >= 0) {
            size_t b = i - m->pat_len[o];
            if (best < 0 || b < best_start || (b == best_start && m->pat_len[o] > m->pat_len[best])) {
                best = o;
                best_start = b;
            }
        }
    }
    if (best >= 0) *start = best_start;
    return best;
}

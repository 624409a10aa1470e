/* Balancing by token count: k-way Karmarkar-Karp (the largest differencing method), optionally
 * with equal item counts per bin, and the plan that splits a mini-batch over DP ranks and
 * into micro-batches.
 *
 * LDM keeps a heap of partial partitions (k subsets each, sorted by sum) keyed by their
 * spread (largest sum - smallest sum). It repeatedly merges the two with the largest spread,
 * pairing the heaviest subset of one with the lightest of the other, until one partition is
 * left. With equal counts the items are first sorted and dealt in groups of k, one item per
 * subset, so every merge keeps the counts equal (verl's get_seqlen_balanced_partitions does
 * the same). Ties are broken by index and creation order, so results are deterministic.
 *
 * Not here: what the weights are (the caller passes tokens; attention's quadratic part is
 * small for RL-length sequences). */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/microbatch.h"

typedef struct subset {
    int64_t sum;
    int32_t head, tail, count; /* items as a linked list through next[] (-1 = none) */
} subset;

typedef struct ldm {
    int32_t k;
    subset *sub;     /* [n_parts * k]: partition p owns sub[p * k .. p * k + k), sorted by sum desc */
    int32_t *next;   /* [items] */
    int32_t *heap;   /* partition ids */
    int64_t *seq;    /* [n_parts] creation order (ties) */
    int32_t n_heap;
} ldm;

static int64_t spread(const ldm *L, int32_t p) {
    const subset *s = L->sub + (size_t)p * L->k;
    return s[0].sum - s[L->k - 1].sum;
}

/* a before b in the heap: larger spread, then older */
static bool heap_less(const ldm *L, int32_t a, int32_t b) {
    int64_t sa = spread(L, a), sb = spread(L, b);
    if (sa != sb) return sa > sb;
    return L->seq[a] < L->seq[b];
}

static void heap_push(ldm *L, int32_t p) {
    int32_t i = L->n_heap++;
    L->heap[i] = p;
    while (i > 0) {
        int32_t up = (i - 1) / 2;
        if (!heap_less(L, L->heap[i], L->heap[up])) break;
        int32_t t = L->heap[i];
        L->heap[i] = L->heap[up];
        L->heap[up] = t;
        i = up;
    }
}

static int32_t heap_pop(ldm *L) {
    int32_t top = L->heap[0];
    L->heap[0] = L->heap[--L->n_heap];
    int32_t i = 0;
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, best = i;
        if (l < L->n_heap && heap_less(L, L->heap[l], L->heap[best])) best = l;
        if (r < L->n_heap && heap_less(L, L->heap[r], L->heap[best])) best = r;
        if (best == i) break;
        int32_t t = L->heap[i];
        L->heap[i] = L->heap[best];
        L->heap[best] = t;
        i = best;
    }
    return top;
}

/* sort the k subsets of a partition by sum, descending; ties by their first item */
static int cmp_subset(const void *pa, const void *pb) {
    const subset *a = pa, *b = pb;
    if (a->sum != b->sum) return a->sum > b->sum ? -1 : 1;
    return (a->head > b->head) - (a->head < b->head);
}

typedef struct witem {
    int64_t w;
    int32_t i;
} witem;

static int cmp_witem(const void *pa, const void *pb) {
    const witem *a = pa, *b = pb;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

int ff_balance_kk(const int64_t *w, int32_t n, int32_t k, bool equal_count, int32_t *bin_of) {
    assert(n >= 0 && (w || n == 0) && (bin_of || n == 0));
    if (k < 1) return ff_error_set("balance", NULL, "%d bins (at least 1)", k);
    if (n == 0) return 0;
    int32_t n_items = equal_count ? (n + k - 1) / k * k : n; /* padded with zero-weight dummies */
    int32_t n_parts = equal_count ? n_items / k : n;
    ldm L = {.k = k};
    witem *order = ff_malloc((size_t)n_items * sizeof *order);
    L.sub = ff_calloc((size_t)n_parts * (size_t)k, sizeof *L.sub);
    L.next = ff_malloc((size_t)n_items * sizeof *L.next);
    L.heap = ff_malloc((size_t)n_parts * sizeof *L.heap);
    L.seq = ff_malloc((size_t)n_parts * sizeof *L.seq);
    int rc = -1;
    if (!order || !L.sub || !L.next || !L.heap || !L.seq) goto out;
    for (int32_t i = 0; i < n_items; i++) {
        order[i] = (witem){i < n ? w[i] : 0, i};
        L.next[i] = -1;
    }
    qsort(order, (size_t)n, sizeof *order, cmp_witem); /* dummies stay last */
    for (int32_t p = 0; p < n_parts; p++) {
        subset *s = L.sub + (size_t)p * k;
        for (int32_t j = 0; j < k; j++) s[j] = (subset){0, -1, -1, 0};
        int32_t per = equal_count ? k : 1;
        for (int32_t j = 0; j < per; j++) {
            witem it = order[p * per + j];
            s[j] = (subset){it.w, it.i, it.i, 1};
        }
        qsort(s, (size_t)k, sizeof *s, cmp_subset);
        L.seq[p] = p;
        heap_push(&L, p);
    }
    int64_t seq = n_parts;
    while (L.n_heap > 1) {
        int32_t a = heap_pop(&L), b = heap_pop(&L);
        subset *sa = L.sub + (size_t)a * k, *sb = L.sub + (size_t)b * k;
        for (int32_t j = 0; j < k; j++) { /* heaviest of a with lightest of b */
            subset *x = &sa[j], *y = &sb[k - 1 - j];
            if (y->count == 0) continue;
            if (x->count == 0) {
                *x = *y;
            } else {
                L.next[x->tail] = y->head;
                x->tail = y->tail;
                x->sum += y->sum;
                x->count += y->count;
            }
        }
        qsort(sa, (size_t)k, sizeof *sa, cmp_subset);
        L.seq[a] = seq++;
        heap_push(&L, a);
    }
    const subset *fin = L.sub + (size_t)L.heap[0] * k;
    for (int32_t j = 0; j < k; j++)
        for (int32_t it = fin[j].head; it >= 0; it = L.next[it])
            if (it < n) bin_of[it] = j;
    rc = 0;
out:
    free(order);
    free(L.sub);
    free(L.next);
    free(L.heap);
    free(L.seq);
    return rc;
}

/* ---- mini-batch plans -------------------------------------------------------------------------- */

void ff_mb_plan_free(ff_mb_plan *p) {
    if (!p) return;
    free(p->items);
    free(p->mb_start);
    free(p->rank_mb);
    free(p->mb_tokens);
    memset(p, 0, sizeof *p);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Split items[0..n) (weights w[items[i]]) into m bins; bin_of [n]. Fits: no bin over max_n
 * items or over max_t tokens unless it holds one item. */
static int split_fits(const int64_t *w, const int32_t *items, int32_t n, int32_t m, int32_t max_n, int64_t max_t,
                      bool equal_count, int64_t *scratch_w, int32_t *bin_of, int64_t *bin_t, int32_t *bin_n, bool *fits) {
    for (int32_t i = 0; i < n; i++) scratch_w[i] = w[items[i]];
    if (ff_balance_kk(scratch_w, n, m, equal_count, bin_of)) return -1;
    for (int32_t b = 0; b < m; b++) bin_t[b] = bin_n[b] = 0;
    for (int32_t i = 0; i < n; i++) {
        bin_t[bin_of[i]] += scratch_w[i];
        bin_n[bin_of[i]]++;
    }
    *fits = true;
    for (int32_t b = 0; b < m; b++)
        if ((max_n > 0 && bin_n[b] > max_n) || (max_t > 0 && bin_n[b] > 1 && bin_t[b] > max_t)) *fits = false;
    return 0;
}

int ff_mb_plan_make(const int64_t *tokens, int32_t n, int32_t n_ranks, int32_t micro_batch_size, int32_t micro_batch_tokens,
                    ff_mb_plan *out) {
    assert(out && (tokens || n == 0));
    memset(out, 0, sizeof *out);
    if (n_ranks < 1) return ff_error_set("micro-batch plan", NULL, "%d DP ranks (at least 1)", n_ranks);
    if (n < 0 || micro_batch_size < 0 || micro_batch_tokens < 0)
        return ff_error_set("micro-batch plan", NULL, "negative sizes (n %d, micro_batch_size %d, micro_batch_tokens %d)", n,
                            micro_batch_size, micro_batch_tokens);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0) return ff_error_set("micro-batch plan", NULL, "sample %d has %lld tokens", i, (long long)tokens[i]);
    size_t nn = (size_t)(n > 0 ? n : 1);
    int32_t *rank_of = ff_malloc(nn * sizeof *rank_of), *rank_items = ff_malloc(nn * sizeof *rank_items);
    int32_t *rank_start = ff_calloc((size_t)n_ranks + 1, sizeof *rank_start);
    int32_t *bin_of = ff_malloc(nn * sizeof *bin_of), *bin_n = ff_malloc((nn + (size_t)n_ranks) * sizeof *bin_n);
    int64_t *scratch = ff_malloc(nn * sizeof *scratch), *bin_t = ff_malloc(nn * sizeof *bin_t);
    int32_t *m_rank = ff_calloc((size_t)n_ranks, sizeof *m_rank);
    int rc = -1;
    if (!rank_of || !rank_items || !rank_start || !bin_of || !bin_n || !scratch || !bin_t || !m_rank) goto out;
    /* 1. ranks: equal counts, balanced tokens */
    if (ff_balance_kk(tokens, n, n_ranks, true, rank_of)) goto out;
    for (int32_t i = 0; i < n; i++) rank_start[rank_of[i] + 1]++;
    for (int32_t r = 0; r < n_ranks; r++) rank_start[r + 1] += rank_start[r];
    {
        int32_t *fill = bin_n; /* reuse as a cursor */
        for (int32_t r = 0; r < n_ranks; r++) fill[r] = rank_start[r];
        for (int32_t i = 0; i < n; i++) rank_items[fill[rank_of[i]]++] = i; /* ascending within a rank */
    }
    /* 2. the fewest micro-batches that fit, per rank; then the most of those for every rank */
    bool equal = micro_batch_size > 0;
    int32_t m_all = 1;
    for (int32_t r = 0; r < n_ranks; r++) {
        int32_t nr = rank_start[r + 1] - rank_start[r];
        const int32_t *it = rank_items + rank_start[r];
        int64_t tot = 0; /* a lower bound: an oversized sample fills one micro-batch alone */
        for (int32_t i = 0; i < nr; i++)
            tot += micro_batch_tokens > 0 && tokens[it[i]] > micro_batch_tokens ? micro_batch_tokens : tokens[it[i]];
        int32_t m = 1;
        if (micro_batch_size > 0 && (nr + micro_batch_size - 1) / micro_batch_size > m) m = (nr + micro_batch_size - 1) / micro_batch_size;
        if (micro_batch_tokens > 0 && (tot + micro_batch_tokens - 1) / micro_batch_tokens > m)
            m = (int32_t)((tot + micro_batch_tokens - 1) / micro_batch_tokens);
        if (m > nr) m = nr > 0 ? nr : 1;
        for (;; m++) {
            bool fits;
            if (nr == 0 || m >= nr) break;
            if (split_fits(tokens, it, nr, m, micro_batch_size, micro_batch_tokens, equal, scratch, bin_of, bin_t, bin_n, &fits))
                goto out;
            if (fits) break;
        }
        m_rank[r] = m;
        if (m > m_all) m_all = m;
    }
    /* 3. cut every rank into m_all micro-batches */
    out->n_ranks = n_ranks;
    out->n_micro = n_ranks * m_all;
    out->items = ff_malloc(nn * sizeof *out->items);
    out->mb_start = ff_malloc(((size_t)out->n_micro + 1) * sizeof *out->mb_start);
    out->rank_mb = ff_malloc(((size_t)n_ranks + 1) * sizeof *out->rank_mb);
    out->mb_tokens = ff_calloc((size_t)out->n_micro, sizeof *out->mb_tokens);
    if (!out->items || !out->mb_start || !out->rank_mb || !out->mb_tokens) goto out;
    int32_t pos = 0;
    for (int32_t r = 0; r < n_ranks; r++) {
        int32_t nr = rank_start[r + 1] - rank_start[r];
        const int32_t *it = rank_items + rank_start[r];
        out->rank_mb[r] = r * m_all;
        for (int32_t i = 0; i < nr; i++) scratch[i] = tokens[it[i]];
        if (ff_balance_kk(scratch, nr, m_all, equal, bin_of)) goto out;
        for (int32_t b = 0; b < m_all; b++) {
            int32_t mb = r * m_all + b, s0 = pos;
            out->mb_start[mb] = pos;
            for (int32_t i = 0; i < nr; i++)
                if (bin_of[i] == b) {
                    out->items[pos++] = it[i];
                    out->mb_tokens[mb] += tokens[it[i]];
                }
            qsort(out->items + s0, (size_t)(pos - s0), sizeof *out->items, cmp_i32);
        }
    }
    out->mb_start[out->n_micro] = pos;
    out->rank_mb[n_ranks] = out->n_micro;
    rc = 0;
out:
    free(rank_of);
    free(rank_items);
    free(rank_start);
    free(bin_of);
    free(bin_n);
    free(scratch);
    free(bin_t);
    free(m_rank);
    if (rc) ff_mb_plan_free(out);
    return rc;
}

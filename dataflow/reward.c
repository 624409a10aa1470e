/* Rule-based reward functions for tasks with a verifiable answer (the bundled arithmetic
 * task: dataset lines {"prompt": "...", "response": "...", "answer": "..."}).
 *
 *   arith_exact_match  score if the extracted answer equals the reference, format_score if the
 *                      response is well formed but wrong, 0 otherwise
 *   format             score if the response is well formed, 0 otherwise
 *   repeat_match       the long-tail task's (`fuseflow dataset repeat`: the answer is one
 *                      letter N times): score x max(0, 1 - (|k - N| + extra) / N), where k is
 *                      the length of the response's leading run of that letter and extra the
 *                      characters after it (trailing whitespace aside); score when exact
 *
 * Extraction: with a `marker` (e.g. "####" or "Answer:") the answer is the number right after
 * its last occurrence; without one, the first number in the response (`extract: first`, the
 * default: the bundled task's answer starts the response, whatever the model generates after
 * it) or the last (`extract: last`, for responses that reason first). Well formed: the
 * response, trimmed, is exactly one number (after the marker when there is one). Numbers are
 * compared as text after normalisation (sign, leading zeros, thousands commas, trailing
 * fractional zeros), so 20-digit integers compare exactly.
 *
 * Not here: the reward-server client (the RL controller's, controller/rl/reward_remote.c). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "dataflow/internal.h"
#include "fuseflow/error.h"
#include "fuseflow/registry.h"
#include "fuseflow/reward.h"
#include "fuseflow/util.h"

/* Scan a number at s: [+-]digits[,digits...][.digits]. Returns its length (0 if none). */
static size_t scan_number(const char *s) {
    size_t i = 0;
    if (s[i] == '+' || s[i] == '-') i++;
    size_t d0 = i;
    while (isdigit((unsigned char)s[i]) || (s[i] == ',' && i > d0 && isdigit((unsigned char)s[i + 1]))) i++;
    if (i == d0) return 0;
    if (s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        i++;
        while (isdigit((unsigned char)s[i])) i++;
    }
    return i;
}

int ff_reward_normalize_number(const char *s, size_t len, char *out, size_t cap) {
    if (cap < 4 || len == 0 || len >= cap) return -1;
    size_t i = 0, o = 0;
    bool neg = false;
    if (s[i] == '+' || s[i] == '-') neg = s[i++] == '-';
    char digits[256], frac[256];
    size_t nd = 0, nf = 0;
    for (; i < len && s[i] != '.'; i++) {
        if (s[i] == ',') continue;
        if (!isdigit((unsigned char)s[i]) || nd + 1 >= sizeof digits) return -1;
        if (nd == 0 && s[i] == '0') continue; /* leading zeros */
        digits[nd++] = s[i];
    }
    if (i < len) {
        for (i++; i < len; i++) {
            if (!isdigit((unsigned char)s[i]) || nf + 1 >= sizeof frac) return -1;
            frac[nf++] = s[i];
        }
        while (nf && frac[nf - 1] == '0') nf--; /* trailing fractional zeros */
    }
    if (nd == 0) digits[nd++] = '0';
    bool zero = nd == 1 && digits[0] == '0' && nf == 0;
    if (nd + nf + 3 > cap) return -1;
    if (neg && !zero) out[o++] = '-';
    memcpy(out + o, digits, nd), o += nd;
    if (nf) {
        out[o++] = '.';
        memcpy(out + o, frac, nf), o += nf;
    }
    out[o] = '\0';
    return 0;
}

/* The last occurrence of marker in s, or NULL. */
static const char *last_of(const char *s, const char *marker) {
    const char *hit = NULL;
    for (const char *p = strstr(s, marker); p; p = strstr(p + 1, marker)) hit = p;
    return hit;
}

int ff_reward_extract_answer(const char *response, const char *marker, bool last, char *out, size_t cap) {
    const char *from = response;
    if (marker && marker[0]) {
        const char *m = last_of(response, marker);
        if (!m) return 0;
        from = m + strlen(marker);
        while (isspace((unsigned char)*from)) from++;
        size_t n = scan_number(from);
        return n && ff_reward_normalize_number(from, n, out, cap) == 0 ? 1 : 0;
    }
    const char *best = NULL;
    size_t best_n = 0;
    for (const char *p = from; *p;) {
        /* a number starts at a digit, or at a sign right before one that does not follow a digit */
        bool start = isdigit((unsigned char)*p) ||
                     ((*p == '-' || *p == '+') && isdigit((unsigned char)p[1]) && (p == from || !isalnum((unsigned char)p[-1])));
        if (start && (p == from || !isdigit((unsigned char)p[-1]))) {
            size_t n = scan_number(p);
            if (n) {
                best = p, best_n = n;
                if (!last) break;
                p += n;
                continue;
            }
        }
        p++;
    }
    return best && ff_reward_normalize_number(best, best_n, out, cap) == 0 ? 1 : 0;
}

bool ff_reward_well_formed(const char *response, const char *marker) {
    const char *p = response;
    if (marker && marker[0]) {
        while (isspace((unsigned char)*p)) p++;
        size_t ml = strlen(marker);
        if (strncmp(p, marker, ml) != 0) return false;
        p += ml;
    }
    while (isspace((unsigned char)*p)) p++;
    size_t n = scan_number(p);
    if (!n) return false;
    for (p += n; *p; p++)
        if (!isspace((unsigned char)*p)) return false;
    return true;
}

/* ---- the registered functions -------------------------------------------------------------- */

typedef struct rule_state {
    const char *marker; /* points into the config tree, which outlives the graph */
    bool last;          /* extract the last number instead of the first */
    double score, format_score;
} rule_state;

static int rule_create(ff_cnode *p, void **state, bool exact) {
    rule_state *s = ff_calloc(1, sizeof *s);
    if (!s) return -1;
    s->score = 1.0;
    static const char *const pos[] = {"first", "last"};
    int which = 0;
    if (p && (ff_cnode_get_str(p, "marker", NULL, &s->marker) < 0 || ff_cnode_get_double(p, "score", 1.0, &s->score) < 0 ||
              (exact && (ff_cnode_get_double(p, "format_score", 0.0, &s->format_score) < 0 ||
                         ff_cnode_get_enum(p, "extract", pos, 2, 0, &which) < 0)))) {
        free(s);
        return -1;
    }
    s->last = which == 1;
    *state = s;
    return 0;
}

static int exact_create(ff_cnode *p, void **state) { return rule_create(p, state, true); }
static int format_create(ff_cnode *p, void **state) { return rule_create(p, state, false); }

static int exact_score(void *state, const ff_reward_item *items, size_t n, float *scores) {
    rule_state *s = state;
    for (size_t i = 0; i < n; i++) {
        if (!items[i].answer)
            return ff_error_set("arith_exact_match", "the dataset lines need an \"answer\" field (data.answer_key)",
                                "item %zu has no reference answer", i);
        char want[300], got[300];
        if (ff_reward_normalize_number(items[i].answer, strlen(items[i].answer), want, sizeof want) != 0)
            snprintf(want, sizeof want, "%s", items[i].answer); /* not a number: compare as text */
        int found = ff_reward_extract_answer(items[i].response ? items[i].response : "", s->marker, s->last, got, sizeof got);
        if (found && !strcmp(got, want))
            scores[i] = (float)s->score;
        else if (ff_reward_well_formed(items[i].response ? items[i].response : "", s->marker))
            scores[i] = (float)s->format_score;
        else
            scores[i] = 0.0f;
    }
    return 0;
}

static int format_score(void *state, const ff_reward_item *items, size_t n, float *scores) {
    rule_state *s = state;
    for (size_t i = 0; i < n; i++)
        scores[i] = ff_reward_well_formed(items[i].response ? items[i].response : "", s->marker) ? (float)s->score : 0.0f;
    return 0;
}

/* The long-tail task's graded reward (top of file). */
static int repeat_score(void *state, const ff_reward_item *items, size_t n, float *scores) {
    rule_state *s = state;
    for (size_t i = 0; i < n; i++) {
        const char *want = items[i].answer;
        if (!want || !want[0])
            return ff_error_set("repeat_match", "the dataset lines need an \"answer\" field (fuseflow dataset repeat writes it)",
                                "item %zu has no reference answer", i);
        const size_t N = strlen(want);
        for (size_t j = 1; j < N; j++)
            if (want[j] != want[0])
                return ff_error_set("repeat_match", "this reward scores `fuseflow dataset repeat` lines",
                                    "item %zu's answer is not one character repeated", i);
        const char *r = items[i].response ? items[i].response : "";
        size_t len = strlen(r), k = 0;
        while (len > 0 && isspace((unsigned char)r[len - 1])) len--;
        while (k < len && r[k] == want[0]) k++;
        double miss = (double)(k > N ? k - N : N - k) + (double)(len - k);
        double v = 1.0 - miss / (double)N;
        scores[i] = (float)(s->score * (v > 0 ? v : 0));
    }
    return 0;
}

int ff_rewards_register(ff_registry *r) {
    const ff_reward_def defs[] = {
        {"arith_exact_match", "score when the extracted number equals the answer, format_score when well formed (extract, marker, score, format_score)",
         exact_create, exact_score, free},
        {"format", "score when the response is exactly one number, after the marker if any (marker, score)", format_create,
         format_score, free},
        {"repeat_match", "score x how close the response's run of the answer's letter is to its length, the long-tail task's (score)",
         format_create, repeat_score, free},
    };
    for (size_t i = 0; i < sizeof defs / sizeof *defs; i++)
        if (ff_registry_add_reward(r, &defs[i]) != 0) return -1;
    return 0;
}

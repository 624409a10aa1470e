/* `fuseflow dataset arith`: the bundled task. Multi-digit arithmetic problems with a
 * verifiable answer, as JSONL prompt/response pairs for SFT and prompts with answers for RL
 * (docs/model-files.md, "The arithmetic task"). `fuseflow dataset repeat`: the long-tail
 * workload, "17*q=" -> seventeen q's, whose response lengths follow a log-normal the user sets
 * (docs/model-files.md, "The repeat task").
 *
 *   {"prompt": "12+345=", "response": "357", "answer": "357"}
 *
 * Each operand has a number of digits drawn uniformly from [min-digits, digits], then a value
 * uniformly among the numbers of that many digits, so short problems (easy) and long ones
 * (hard) are both common. The test set holds distinct problems and no training problem is in
 * it. Same seed, same files, on every machine (ff_rng). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/modelio.h"
#include "fuseflow/util.h"

static const char *CMD = "dataset";

static void help(void) {
    printf("usage: fuseflow dataset arith --out DIR [options]\n"
           "       fuseflow dataset repeat --out DIR [--median N] [--p99-ratio R] [--max N] [--train N] [--test N] [--seed S]\n\n"
           "Writes DIR/train.jsonl and DIR/test.jsonl: arithmetic problems with a checkable answer,\n"
           "one JSON object per line: {\"prompt\": \"12+345=\", \"response\": \"357\", \"answer\": \"357\"}.\n"
           "SFT trains on prompt -> response; the RL reward arith_exact_match compares the first number\n"
           "of a generated response with \"answer\". Test problems are distinct and never in train.jsonl.\n\n"
           "options:\n"
           "  --out DIR          output folder (created)\n"
           "  --digits N         most digits per operand, 1..9 (default 3)\n"
           "  --min-digits N     fewest digits per operand (default 1)\n"
           "  --ops OPS          operators to draw from, any of +-* (default +)\n"
           "  --train N          training examples (default 5000)\n"
           "  --test N           held-out examples (default 500)\n"
           "  --seed S           random seed (default 1)\n\n"
           "repeat: the long-tail workload. {\"prompt\": \"17*q=\", \"response\": \"qqqqqqqqqqqqqqqqq\", \"answer\": ...}: the\n"
           "response is the letter repeated N times, N log-normal with the given median and p99/median\n"
           "ratio, within 1..max (so response lengths are long-tailed by construction); the reward\n"
           "repeat_match scores how close the response's run of the letter is to N. Test problems are\n"
           "drawn from the same law and may repeat training ones (there are only 26 x max problems).\n"
           "  --median N         median repeat count (default 8)\n"
           "  --p99-ratio R      p99 / median of the count, >= 1 (default 10)\n"
           "  --max N            largest count, 1..4096 (default 128)\n\n"
           "examples:\n"
           "  fuseflow dataset arith --digits 3 --train 5000 --test 500 --seed 1 --out data/arith\n"
           "  fuseflow dataset repeat --median 8 --p99-ratio 10 --max 128 --out data/repeat\n");
}

typedef struct u64set {
    uint64_t *v; /* 0 = empty, so keys are stored + 1 */
    size_t cap, n;
} u64set;

static int set_add(u64set *s, uint64_t key) { /* 1 added, 0 present, -1 oom */
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        uint64_t *v = ff_calloc(cap, sizeof *v);
        if (!v) return -1;
        for (size_t i = 0; i < s->cap; i++)
            if (s->v[i]) {
                size_t j = ff_hash_fnv1a(&s->v[i], sizeof s->v[i], FF_HASH_FNV1A_INIT) & (cap - 1);
                while (v[j]) j = (j + 1) & (cap - 1);
                v[j] = s->v[i];
            }
        free(s->v);
        s->v = v;
        s->cap = cap;
    }
    key++;
    size_t j = ff_hash_fnv1a(&key, sizeof key, FF_HASH_FNV1A_INIT) & (s->cap - 1);
    while (s->v[j]) {
        if (s->v[j] == key) return 0;
        j = (j + 1) & (s->cap - 1);
    }
    s->v[j] = key;
    s->n++;
    return 1;
}

static bool set_has(const u64set *s, uint64_t key) {
    if (!s->cap) return false;
    key++;
    size_t j = ff_hash_fnv1a(&key, sizeof key, FF_HASH_FNV1A_INIT) & (s->cap - 1);
    while (s->v[j]) {
        if (s->v[j] == key) return true;
        j = (j + 1) & (s->cap - 1);
    }
    return false;
}

typedef struct arith {
    int min_digits, max_digits;
    char ops[4];
    int n_ops;
} arith;

static int64_t pow10i(int d) {
    int64_t p = 1;
    while (d-- > 0) p *= 10;
    return p;
}

static int64_t draw_operand(const arith *a, ff_rng *r) {
    int d = a->min_digits + (int)ff_rng_below(r, (uint64_t)(a->max_digits - a->min_digits + 1));
    int64_t lo = d == 1 ? 0 : pow10i(d - 1), hi = pow10i(d);
    return lo + (int64_t)ff_rng_below(r, (uint64_t)(hi - lo));
}

/* one problem: its key (a, op, b) for the sets, and the line */
static uint64_t draw(const arith *a, ff_rng *r, char *prompt, char *answer) {
    int64_t x = draw_operand(a, r), y = draw_operand(a, r);
    int k = (int)ff_rng_below(r, (uint64_t)a->n_ops);
    char op = a->ops[k];
    int64_t v = op == '+' ? x + y : op == '-' ? x - y : x * y;
    snprintf(prompt, 64, "%lld%c%lld=", (long long)x, op, (long long)y);
    snprintf(answer, 64, "%lld", (long long)v);
    return ((uint64_t)x * 1000000000ULL + (uint64_t)y) * 4 + (uint64_t)k;
}

static int write_line(ff_atomic_file *f, const char *prompt, const char *answer) {
    json_t *o = json_pack("{s:s, s:s, s:s}", "prompt", prompt, "response", answer, "answer", answer);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!s) return ff_error_set(f->path, NULL, "cannot format a line");
    int rc = ff_atomic_file_write(f, s, strlen(s));
    if (rc == 0) rc = ff_atomic_file_write(f, "\n", 1);
    free(s);
    return rc;
}

/* A task's two files, written whole or not at all: OUT/test.jsonl and OUT/train.jsonl. */
typedef struct split_files {
    ff_atomic_file test, train;
} split_files;

static int split_begin(const char *out, split_files *f) { /* 0, or -1 + error with nothing left open */
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/test.jsonl", out);
    if (ff_atomic_file_begin(&f->test, path) != 0) return -1;
    snprintf(path, sizeof path, "%s/train.jsonl", out);
    if (ff_atomic_file_begin(&f->train, path) != 0) {
        ff_atomic_file_abort(&f->test);
        return -1;
    }
    return 0;
}

/* Commit both when ok (a failed commit aborts the other), else abort both. 0 or -1 + error. */
static int split_end(split_files *f, bool ok) {
    if (!ok) {
        ff_atomic_file_abort(&f->test);
        ff_atomic_file_abort(&f->train);
        return -1;
    }
    if (ff_atomic_file_commit(&f->test) != 0) {
        ff_atomic_file_abort(&f->train);
        return -1;
    }
    return ff_atomic_file_commit(&f->train);
}

static int run_arith(int argc, char **argv) {
    const char *out = NULL, *ops = "+";
    int64_t digits = 3, min_digits = 1, n_train = 5000, n_test = 500, seed = 1;
    const ffio_opt opts[] = {
        {"out", FFIO_STR, &out, 0, 0},
        {"ops", FFIO_STR, &ops, 0, 0},
        {"digits", FFIO_INT, &digits, 1, 9},
        {"min-digits", FFIO_INT, &min_digits, 1, 9},
        {"train", FFIO_INT, &n_train, 0, 1e8},
        {"test", FFIO_INT, &n_test, 0, 1e8},
        {"seed", FFIO_INT, &seed, 0, 9e18},
    };
    char *pos[1];
    int n_pos;
    int pr = ffio_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), pos, 0, &n_pos);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (!out) return ffio_usage(CMD, "--out DIR is required");
    if (min_digits > digits) return ffio_usage(CMD, "--min-digits %lld is more than --digits %lld", (long long)min_digits, (long long)digits);
    arith a = {(int)min_digits, (int)digits, {0}, 0};
    for (const char *p = ops; *p; p++) {
        if (!strchr("+-*", *p)) return ffio_usage(CMD, "--ops takes characters from '+-*', got '%c'", *p);
        if (!memchr(a.ops, *p, (size_t)a.n_ops) && a.n_ops < 3) a.ops[a.n_ops++] = *p;
    }
    if (a.n_ops == 0) return ffio_usage(CMD, "--ops is empty");
    /* distinct problems: (numbers with min..max digits)^2 per operator */
    double operands = (double)pow10i((int)digits) - (min_digits > 1 ? (double)pow10i((int)min_digits - 1) : 0);
    double distinct = operands * operands * a.n_ops;
    if ((double)n_test > distinct / 2)
        return ffio_usage(CMD, "only %.0f distinct problems exist with these digits and operators; --test %lld must be at most half of that", distinct,
                          (long long)n_test);

    if (ff_mkdirs(out) != 0) return ffio_fail(CMD);
    ff_rng rng;
    ff_rng_seed(&rng, (uint64_t)seed);
    u64set test_keys = {0};
    split_files f;
    char prompt[64], answer[64];
    if (split_begin(out, &f) != 0) return ffio_fail(CMD);
    bool ok = true;
    for (int64_t i = 0; ok && i < n_test;) {
        int added = set_add(&test_keys, draw(&a, &rng, prompt, answer));
        ok = added >= 0 && (!added || write_line(&f.test, prompt, answer) == 0);
        i += added > 0;
    }
    for (int64_t i = 0; ok && i < n_train;) {
        if (set_has(&test_keys, draw(&a, &rng, prompt, answer))) continue;
        ok = write_line(&f.train, prompt, answer) == 0;
        i++;
    }
    free(test_keys.v);
    if (split_end(&f, ok) != 0) return ffio_fail(CMD);
    printf("wrote %s/train.jsonl (%lld problems) and %s/test.jsonl (%lld problems): %d-%d digits, ops '%.*s', seed %lld\n", out,
           (long long)n_train, out, (long long)n_test, (int)min_digits, (int)digits, a.n_ops, a.ops, (long long)seed);
    return 0;
}

/* ---- repeat: the long-tail workload -------------------------------------------------------- */

static int write_repeat(ff_atomic_file *f, ff_rng *r, double median, double sigma, int64_t max, int64_t *count) {
    double z = ff_rng_normal(r);
    double v = floor(median * exp(sigma * z) + 0.5);
    int64_t n = v < 1 ? 1 : v > (double)max ? max : (int64_t)v;
    char c = (char)('a' + ff_rng_below(r, 26));
    char prompt[32], *answer = malloc((size_t)n + 1);
    if (!answer) return ff_error_set(f->path, NULL, "out of memory");
    memset(answer, c, (size_t)n);
    answer[n] = 0;
    snprintf(prompt, sizeof prompt, "%lld*%c=", (long long)n, c);
    int rc = write_line(f, prompt, answer);
    free(answer);
    *count = n;
    return rc;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int run_repeat(int argc, char **argv) {
    const char *out = NULL;
    double median = 8, ratio = 10;
    int64_t max = 128, n_train = 5000, n_test = 500, seed = 1;
    const ffio_opt opts[] = {
        {"out", FFIO_STR, &out, 0, 0},
        {"median", FFIO_DOUBLE, &median, 1, 4096},
        {"p99-ratio", FFIO_DOUBLE, &ratio, 1, 1000},
        {"max", FFIO_INT, &max, 1, 4096},
        {"train", FFIO_INT, &n_train, 0, 1e8},
        {"test", FFIO_INT, &n_test, 0, 1e8},
        {"seed", FFIO_INT, &seed, 0, 9e18},
    };
    char *pos[1];
    int n_pos;
    int pr = ffio_parse(CMD, argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), pos, 0, &n_pos);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (!out) return ffio_usage(CMD, "--out DIR is required");
    if (median > (double)max) return ffio_usage(CMD, "--median %g is more than --max %lld", median, (long long)max);
    if (ff_mkdirs(out) != 0) return ffio_fail(CMD);
    const double sigma = log(ratio) / 2.3263478740408408; /* z of the 99th percentile */
    ff_rng rng;
    ff_rng_seed(&rng, (uint64_t)seed);
    int64_t *counts = ff_calloc((size_t)(n_train > 0 ? n_train : 1), sizeof *counts);
    if (!counts) return ffio_fail(CMD);
    split_files f;
    if (split_begin(out, &f) != 0) {
        free(counts);
        return ffio_fail(CMD);
    }
    int64_t n;
    bool ok = true;
    for (int64_t i = 0; ok && i < n_test; i++) ok = write_repeat(&f.test, &rng, median, sigma, max, &n) == 0;
    for (int64_t i = 0; ok && i < n_train; i++) ok = write_repeat(&f.train, &rng, median, sigma, max, &counts[i]) == 0;
    if (split_end(&f, ok) != 0) {
        free(counts);
        return ffio_fail(CMD);
    }
    qsort(counts, (size_t)n_train, sizeof *counts, cmp_i64);
    printf("wrote %s/train.jsonl (%lld problems) and %s/test.jsonl (%lld problems): repeat counts median %lld, p99 %lld, "
           "max %lld (law: median %g, p99 %gx, capped at %lld), seed %lld\n",
           out, (long long)n_train, out, (long long)n_test, n_train ? (long long)counts[n_train / 2] : 0LL,
           n_train ? (long long)counts[(int64_t)(0.99 * (double)(n_train - 1))] : 0LL, n_train ? (long long)counts[n_train - 1] : 0LL,
           median, ratio, (long long)max, (long long)seed);
    free(counts);
    return 0;
}

int ff_cmd_dataset(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        help();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "arith")) return run_arith(argc - 1, argv + 1);
    if (!strcmp(argv[1], "repeat")) return run_repeat(argc - 1, argv + 1);
    return ffio_usage(CMD, "unknown dataset '%s' (available: arith, repeat)", argv[1]);
}

/* bench_tokenizer: encoding speed of fuseflow's byte-level BPE beside OpenAI's tiktoken
 * encoder (Rust) and Hugging Face's `tokenizers` (Rust), one thread each, same documents,
 * same vocabulary, same run (bench/bench_tokenizer_ref.py is the Python side). The ids must
 * agree with Hugging Face's (the reference fuseflow follows) and are compared with tiktoken's
 * (a checksum over every id).
 *
 * The documents are a seeded mix of English prose, code, numbers, arithmetic, accented words,
 * CJK and emoji, cut into ~1 KB chat turns (<|im_start|>user ... <|im_end|>). Tokenizer: the
 * Qwen2 style fixture (tests/modelio/data/tok_qwen2.json) with 205 more special tokens
 * <|extra_N|>, as Qwen's 208, unless a path is given.
 *
 * usage: bench_tokenizer [TOKENIZER_JSON] [--mb N]   (run from the source root or set
 * FF_SOURCE_DIR; FF_PYTHON picks the interpreter that has tiktoken and tokenizers, default
 * the venv of scripts/deps.sh --bench, else python3)
 * Last line: tokenizer: <x> M tokens/s, <r>x tiktoken (target: >= 1.0x tiktoken) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

static const char *k_words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "I'm", "you're", "they'll", "we'd",
                                "don't", "Hello", "world", "model", "training", "tokens", "return", "def", "for", "in", "range",
                                "café", "naïve", "résumé", "Straße", "日本語", "テキスト", "中文", "😀", "👍🏽", "(x)", "{y};",
                                "->", "==", "!=", "#", "//", "\"quoted\"", "'single'"};

static size_t make_doc(ff_rng *r, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "<|im_start|>user\n");
    while (n + 80 < cap) {
        uint64_t k = ff_rng_below(r, 10);
        char piece[64];
        if (k < 6) {
            snprintf(piece, sizeof piece, "%s", k_words[ff_rng_below(r, sizeof k_words / sizeof k_words[0])]);
        } else if (k < 8) {
            snprintf(piece, sizeof piece, "%llu", (unsigned long long)ff_rng_below(r, 100000000));
        } else {
            unsigned long long a = ff_rng_below(r, 1000), b = ff_rng_below(r, 1000);
            snprintf(piece, sizeof piece, "%llu+%llu=%llu", a, b, a + b);
        }
        n += (size_t)snprintf(out + n, cap - n, "%s%s", piece, ff_rng_below(r, 12) == 0 ? "\n" : ff_rng_below(r, 20) == 0 ? "  " : " ");
    }
    n += (size_t)snprintf(out + n, cap - n, "<|im_end|>\n");
    return n;
}

/* tok_qwen2.json with <|extra_0|> .. <|extra_204|> added, written to path */
static int write_bench_tokenizer(const char *src_path, const char *path) {
    json_error_t err;
    json_t *root = json_load_file(src_path, 0, &err);
    if (!root) {
        fprintf(stderr, "bench_tokenizer: %s: %s\n", src_path, err.text);
        return -1;
    }
    json_t *added = json_object_get(root, "added_tokens");
    int32_t next = 0;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(json_object_get(root, "model"), "vocab"), k, v) if (json_integer_value(v) >= next) next = (int32_t)json_integer_value(v) + 1;
    size_t i;
    json_array_foreach(added, i, v) if (json_integer_value(json_object_get(v, "id")) >= next) next = (int32_t)json_integer_value(json_object_get(v, "id")) + 1;
    for (int e = 0; e < 205; e++) {
        char name[32];
        snprintf(name, sizeof name, "<|extra_%d|>", e);
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", next++, "content", name, "single_word", 0, "lstrip", 0,
                                               "rstrip", 0, "normalized", 0, "special", 1));
    }
    int rc = json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return rc;
}

int main(int argc, char **argv) {
    const char *src = getenv("FF_SOURCE_DIR");
    char src_path[FF_PATH_MAX], tmp_tok[] = "/tmp/ff_bench_tokenizer_json_XXXXXX";
    snprintf(src_path, sizeof src_path, "%s/tests/modelio/data/tok_qwen2.json", src ? src : ".");
    const char *tok_path = NULL;
    double mb = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atof(argv[++i]);
        else
            tok_path = argv[i];
    }
    if (!tok_path) {
        int tfd = mkstemp(tmp_tok);
        if (tfd < 0) return 1;
        close(tfd);
        if (write_bench_tokenizer(src_path, tmp_tok) != 0) return 1;
        tok_path = tmp_tok;
    }
    ff_tokenizer *t = ff_tokenizer_load(tok_path);
    if (!t) {
        fprintf(stderr, "bench_tokenizer: %s\n", ff_error_message());
        return 1;
    }
    /* documents, separated by U+001E in the corpus file for the Python side */
    size_t total = (size_t)(mb * 1e6), n_docs = total / 1000 + 1;
    char **docs = malloc(n_docs * sizeof *docs);
    size_t *lens = malloc(n_docs * sizeof *lens);
    ff_rng r;
    ff_rng_seed(&r, 42);
    char corpus[] = "/tmp/ff_bench_tokenizer_XXXXXX";
    int fd = mkstemp(corpus);
    FILE *cf = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!docs || !lens || !cf) return 1;
    size_t bytes = 0;
    for (size_t i = 0; i < n_docs; i++) {
        docs[i] = malloc(1100);
        lens[i] = make_doc(&r, docs[i], 1100);
        bytes += lens[i];
        fwrite(docs[i], 1, lens[i], cf);
        if (i + 1 < n_docs) fputc(0x1e, cf);
    }
    fclose(cf);

    double best = 1e30;
    uint64_t checksum = 0, n_tok = 0;
    for (int rep = 0; rep < 5; rep++) {
        checksum = 0;
        n_tok = 0;
        int64_t t0 = ff_now_ns();
        for (size_t i = 0; i < n_docs; i++) {
            int32_t *ids, n;
            if (ff_tokenizer_encode(t, docs[i], lens[i], NULL, &ids, &n) != 0) {
                fprintf(stderr, "bench_tokenizer: %s\n", ff_error_message());
                return 1;
            }
            for (int32_t k = 0; k < n; k++) checksum = (checksum * 1000003u + (uint64_t)ids[k] + 1) % (1ull << 61);
            n_tok += (uint64_t)n;
            free(ids);
        }
        double dt = (double)(ff_now_ns() - t0) / 1e9;
        if (dt < best) best = dt;
    }
    double ours = (double)n_tok / best;
    printf("fuseflow:      %6.2f M tokens/s (%.1f MB/s), %llu documents, %.1f MB, %llu tokens (%s)\n", ours / 1e6, (double)bytes / best / 1e6,
           (unsigned long long)n_docs, (double)bytes / 1e6, (unsigned long long)n_tok, tok_path);

    /* the reference side: one line per library, "NAME TOKENS_PER_S CHECKSUM NTOKENS" */
    const char *py = getenv("FF_PYTHON");
    char venv_py[FF_PATH_MAX];
    const char *home = getenv("HOME");
    snprintf(venv_py, sizeof venv_py, "%s/.cache/fuseflow/bench-venv/bin/python", home ? home : "/root");
    if (!py) py = access(venv_py, X_OK) == 0 ? venv_py : "python3";
    char cmd[3 * FF_PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s %s/bench/bench_tokenizer_ref.py '%s' '%s' 3", py, src ? src : ".", tok_path, corpus);
    FILE *p = popen(cmd, "r");
    char line[256];
    double tt = 0;
    bool hf_differs = false;
    while (p && fgets(line, sizeof line, p)) {
        char name[32];
        double rate;
        unsigned long long sum, n;
        if (sscanf(line, "%31s %lf %llu %llu", name, &rate, &sum, &n) != 4) {
            printf("%s", line);
            continue;
        }
        bool same = sum == checksum && n == n_tok;
        if (!strcmp(name, "tiktoken")) {
            tt = rate;
            printf("tiktoken:      %6.2f M tokens/s, %llu tokens; ids %s fuseflow's\n", rate / 1e6, n, same ? "identical to" : "DIFFER from");
        } else {
            hf_differs = !same;
            printf("HF tokenizers: %6.2f M tokens/s, %llu tokens; ids %s fuseflow's\n", rate / 1e6, n, same ? "identical to" : "DIFFER from");
        }
    }
    if (p) pclose(p);
    unlink(corpus);
    if (tok_path == tmp_tok) unlink(tmp_tok);
    if (tt > 0)
        printf("tokenizer: %.2f M tokens/s, %.2fx tiktoken (target: >= 1.0x tiktoken)\n", ours / 1e6, ours / tt);
    else
        printf("tokenizer: %.2f M tokens/s, tiktoken not measured (target: >= 1.0x tiktoken; scripts/deps.sh --bench installs it, or set FF_PYTHON)\n",
               ours / 1e6);
    for (size_t i = 0; i < n_docs; i++) free(docs[i]);
    free(docs);
    free(lens);
    ff_tokenizer_destroy(&t);
    return hf_differs ? 1 : 0;
}

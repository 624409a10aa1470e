/* bench_tokenizer: encoding speed of fuseflow's byte-level BPE beside Hugging Face's
 * `tokenizers` (Rust, the library a user would otherwise call), one thread each, same
 * documents, same run; the ids must agree (a checksum over every id).
 *
 * The documents are a seeded mix of English prose, code, numbers, arithmetic, accented words,
 * CJK and emoji, cut into ~1 KB pieces (prompt-sized). Tokenizer: the Llama 3 style fixture
 * (tests/modelio/data/tok_llama3.json) unless a path is given.
 *
 * usage: bench_tokenizer [TOKENIZER_JSON] [--mb N]   (run from the source root or set
 * FF_SOURCE_DIR; FF_PYTHON picks the interpreter that has `tokenizers`, default python3)
 * Last line: tokenizer_encode: <MB/s> MB/s (target: >= 1.0x Hugging Face tokenizers ...) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

static const char *k_words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "I'm", "you're", "they'll", "we'd",
                                "don't", "Hello", "world", "model", "training", "tokens", "return", "def", "for", "in", "range",
                                "café", "naïve", "résumé", "Straße", "日本語", "テキスト", "中文", "😀", "👍🏽", "(x)", "{y};",
                                "->", "==", "!=", "#", "//", "\"quoted\"", "'single'"};

static size_t make_doc(ff_rng *r, char *out, size_t cap) {
    size_t n = 0;
    while (n + 64 < cap) {
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
    return n;
}

int main(int argc, char **argv) {
    const char *src = getenv("FF_SOURCE_DIR");
    char path[FF_PATH_MAX];
    snprintf(path, sizeof path, "%s/tests/modelio/data/tok_llama3.json", src ? src : ".");
    const char *tok_path = path;
    double mb = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = atof(argv[++i]);
        else
            tok_path = argv[i];
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
    for (int rep = 0; rep < 3; rep++) {
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
    double ours = (double)bytes / best / 1e6;
    printf("fuseflow:  %.2f MB/s, %llu documents, %.1f MB, %llu tokens (%s)\n", ours, (unsigned long long)n_docs, (double)bytes / 1e6,
           (unsigned long long)n_tok, tok_path);

    const char *py = getenv("FF_PYTHON");
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "%s %s/bench/bench_tokenizer_hf.py '%s' '%s' 3", py ? py : "python3", src ? src : ".", tok_path, corpus);
    FILE *p = popen(cmd, "r");
    char line[256] = "";
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = '\0';
        pclose(p);
    }
    unlink(corpus);
    double hf = 0;
    unsigned long long hf_sum = 0, hf_n = 0;
    int ok = sscanf(line, "%lf %llu %llu", &hf, &hf_sum, &hf_n) == 3;
    if (ok) {
        printf("HF tokenizers: %.2f MB/s, %llu tokens; ids %s\n", hf, hf_n, hf_sum == checksum && hf_n == n_tok ? "identical" : "DIFFER");
        printf("tokenizer_encode: %.2f MB/s (target: >= 1.0x Hugging Face tokenizers, one thread each; HF %.2f MB/s, %.2fx)\n", ours, hf, ours / hf);
    } else {
        printf("tokenizer_encode: %.2f MB/s (target: >= 1.0x Hugging Face tokenizers; not measured: pip install tokenizers, or set FF_PYTHON)\n", ours);
    }
    for (size_t i = 0; i < n_docs; i++) free(docs[i]);
    free(docs);
    free(lens);
    ff_tokenizer_destroy(&t);
    return ok && (hf_sum != checksum || hf_n != n_tok) ? 1 : 0;
}

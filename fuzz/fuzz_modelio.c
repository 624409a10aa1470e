/* libFuzzer target for the model-file readers: byte 0 picks the reader, the rest is its input.
 *   0: a safetensors file (ff_safetensors_parse); whatever validates must convert every
 *      tensor to fp32 without reading outside the buffer;
 *   1: config.json (ff_hf_config_parse); whatever parses must dump and parse back equal;
 *   2: text for the GPT-2 style fixture tokenizer (the byte tokenizer when the fixture is not
 *      found): encode, decode back to the same bytes (byte-level BPE is lossless), and
 *      decode the input read as token ids;
 *   3: a tokenizer.json (ff_tokenizer_parse), then encode a short string with it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/modelio.h"
#include "fuseflow/safetensors.h"
#include "fuseflow/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_safetensors(const uint8_t *d, size_t n) {
    ff_safetensors *f = ff_safetensors_parse(d, n, "fuzz");
    if (!f) return;
    ff_tensor_set *s = ff_tensor_set_new();
    uint64_t total = 0;
    for (size_t i = 0; i < ff_safetensors_count(f); i++) {
        const ff_st_entry *e = ff_safetensors_entry(f, i);
        total += (e->end - e->begin) / ff_dtype_size(e->dtype);
        if (total > (1u << 22)) break; /* zero-size-shape tricks could ask for huge fp32 sets */
        if (ff_safetensors_read(f, e, s, NULL) != 0) break;
    }
    ff_tensor_set_destroy(&s);
    ff_safetensors_close(&f);
}

static void fuzz_config(const uint8_t *d, size_t n) {
    ff_model_config a, b;
    if (ff_hf_config_parse((const char *)d, n, "fuzz", &a) != 0) return;
    char *text = ff_hf_config_dump(&a, "float32");
    if (!text) abort();
    if (ff_hf_config_parse(text, strlen(text), "dumped", &b) != 0) abort();
    if (a.vocab_size != b.vocab_size || a.hidden_size != b.hidden_size || a.n_eos != b.n_eos || a.head_dim != b.head_dim) abort();
    free(text);
}

static void fuzz_text(const uint8_t *d, size_t n) {
    static ff_tokenizer *t;
    if (!t) t = ff_tokenizer_load("tests/modelio/data/tok_gpt2.json");
    if (!t) t = ff_tokenizer_new_bytes();
    int32_t *ids, m;
    ff_encode_opts o = {true, false}; /* specials as text: decoding must give the input back */
    if (ff_tokenizer_encode(t, (const char *)d, n, &o, &ids, &m) == 0) {
        char *back;
        size_t bl;
        if (ff_tokenizer_decode(t, ids, m, true, &back, &bl) != 0 || bl != n || memcmp(back, d, n) != 0) abort();
        free(back);
        free(ids);
    }
    char *text;
    size_t tl;
    if (ff_tokenizer_decode(t, (const int32_t *)(const void *)d, (int32_t)(n / 4), false, &text, &tl) == 0) {
        char *clean = ff_utf8_lossy(text, tl, NULL);
        free(clean);
        free(text);
    }
}

static void fuzz_tokenizer_json(const uint8_t *d, size_t n) {
    ff_tokenizer *t = ff_tokenizer_parse((const char *)d, n, "fuzz");
    if (!t) return;
    int32_t *ids, m;
    if (ff_tokenizer_encode(t, "Hello, world! 123  x", 20, NULL, &ids, &m) == 0) free(ids);
    ff_tokenizer_destroy(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    /* an aligned private copy, so the safetensors reader sees ordinary heap memory */
    uint8_t *copy = malloc(size);
    if (!copy) return 0;
    memcpy(copy, data + 1, size - 1);
    switch (data[0] % 4) {
    case 0: fuzz_safetensors(copy, size - 1); break;
    case 1: fuzz_config(copy, size - 1); break;
    case 2: fuzz_text(copy, size - 1); break;
    default: fuzz_tokenizer_json(copy, size - 1); break;
    }
    free(copy);
    return 0;
}

/* fuseflow: tokenizers. One implementation, Hugging Face's tokenizer.json with a BPE model,
 * covers every kind fuseflow uses, with Hugging Face's ids and decodings:
 *
 *  - the byte-level tokenizer of the bundled tasks (ff_tokenizer_new_bytes): ids 0..255 are
 *    the bytes themselves, then the special tokens <|bos|> = 256, <|eos|> = 257,
 *    <|pad|> = 258 (FF_BYTES_VOCAB = 259 ids). It is written out as an ordinary
 *    tokenizer.json (a BPE model without merges), so Hugging Face's libraries load it too.
 *  - byte-level BPE (GPT-2, Llama 3, Qwen2) and SentencePiece-style BPE (Llama 2, Mistral,
 *    Gemma): normalizer (none, NFC/NFD/NFKC/NFKD, Prepend, Replace, Sequence), pre-tokenizer
 *    (ByteLevel with or without its regex, Split with a regex or string in any of its
 *    behaviours, Digits, Metaspace, Sequence), BPE merges (string or pair form,
 *    ignore_merges, byte_fallback, unk/fuse_unk), added and special tokens (lstrip, rstrip,
 *    single_word, normalized), TemplateProcessing post-processor, decoders (ByteLevel,
 *    Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence).
 *
 * The GPT-2, Llama 3 and Qwen2 pre-tokenizer regexes run as scanners over Unicode 16 classes
 * (as Hugging Face's Oniguruma and tiktoken see them); other Split regexes run through the
 * system's PCRE2 (UTF + UCP), whose Unicode may be older. Normalization uses utf8proc.
 * Refused at load with a message naming the component: other models (WordPiece, Unigram),
 * BPE dropout, unknown normalizers, pre-tokenizers, decoders or post-processors.
 *
 * A tokenizer is immutable after loading, so one may be shared by threads.
 */
#ifndef FUSEFLOW_TOKENIZER_H
#define FUSEFLOW_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

enum { FF_BYTES_BOS = 256, FF_BYTES_EOS = 257, FF_BYTES_PAD = 258, FF_BYTES_VOCAB = 259 };

typedef struct ff_tokenizer ff_tokenizer;

/* The byte-level tokenizer (ids above). NULL + error only when out of memory. */
ff_tokenizer *ff_tokenizer_new_bytes(void);
/* Parse tokenizer.json text; name is used in messages. NULL + error naming the problem. */
ff_tokenizer *ff_tokenizer_parse(const char *json, size_t len, const char *name);
ff_tokenizer *ff_tokenizer_load(const char *tokenizer_json_path);
/* DIR/tokenizer.json, plus bos/eos/pad from DIR/tokenizer_config.json when present. */
ff_tokenizer *ff_tokenizer_load_dir(const char *dir);
void ff_tokenizer_destroy(ff_tokenizer **t);

/* Write DIR/tokenizer.json (the JSON the tokenizer was loaded from, unchanged) and
 * DIR/tokenizer_config.json (the one loaded with it, or a minimal one naming bos/eos/pad),
 * each atomically. 0 or -1 + error. */
int ff_tokenizer_save_dir(const ff_tokenizer *t, const char *dir);

/* One more than the largest id (vocabulary and added tokens). */
int32_t ff_tokenizer_vocab_size(const ff_tokenizer *t);
/* Special roles: -1 when unknown. From tokenizer_config.json's bos_token/eos_token/
 * pad_token, or fixed for the byte tokenizer. */
int32_t ff_tokenizer_bos(const ff_tokenizer *t);
int32_t ff_tokenizer_eos(const ff_tokenizer *t);
int32_t ff_tokenizer_pad(const ff_tokenizer *t);
/* The id of a token's exact string (vocabulary or added token), or -1. */
int32_t ff_tokenizer_token_id(const ff_tokenizer *t, const char *token);
/* The token string of an id as stored (byte-level tokens use GPT-2's byte-to-char map,
 * e.g. "Ġthe"), or NULL when the id is out of range or unused. */
const char *ff_tokenizer_token(const ff_tokenizer *t, int32_t id);
bool ff_tokenizer_is_special(const ff_tokenizer *t, int32_t id);

typedef struct ff_encode_opts {
    bool add_special;   /* apply the post-processor's template (e.g. Llama 3's BOS) */
    bool parse_special; /* special tokens written in the text become their ids (HF's default);
                           false: they are encoded as plain text */
} ff_encode_opts;

/* Encode UTF-8 text (len bytes; need not be NUL-terminated). *ids is malloc'd (the caller
 * frees it), *n its length. opts NULL = {add_special false, parse_special true}. 0, or -1 +
 * error (text that is not valid UTF-8, out of memory). */
int ff_tokenizer_encode(const ff_tokenizer *t, const char *text, size_t len, const ff_encode_opts *opts, int32_t **ids, int32_t *n);
/* Decode ids to bytes (*text malloc'd and NUL-terminated, *len without the NUL). Byte-level
 * tokens become their bytes, so a partial UTF-8 character at the end stays partial. 0, or -1
 * + error for an id out of range. */
int ff_tokenizer_decode(const ff_tokenizer *t, const int32_t *ids, int32_t n, bool skip_special, char **text, size_t *len);

/* s[0..len) with every invalid UTF-8 sequence replaced by U+FFFD (one per maximal invalid
 * subpart, as Rust's String::from_utf8_lossy and Python's errors="replace"), e.g. to put
 * decoded text into JSON. malloc'd and NUL-terminated; NULL + error when out of memory. */
char *ff_utf8_lossy(const char *s, size_t len, size_t *out_len);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

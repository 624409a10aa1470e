/* A running sequence's state (ff_gen_seq_state, model.h) as bytes and back, for sending it
 * through a collective or a message to another engine; and its destructor.
 *
 * Layout (native byte order, both ends one build): a fixed header of HDR bytes, then the
 * tokens [prompt_len + n_gen] int32, the log-probs [n_gen] f32, the stop tokens [n_stop]
 * int32, zero padding to 8 bytes, and the KV rows when present ([layers, 2, positions,
 * kv_heads head_dim] f32). The header leads with a magic, a version, the total length and a
 * checksum of every byte after it, so a truncated or corrupted buffer is refused before any
 * field is used; the fields are then range-checked on their own (a sender's bug is not a
 * checksum error).
 *
 * Not here: taking a sequence out of a generator or putting it in (model/generate.c), the
 * transport (the caller's). */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "model/model_internal.h"

#define MAGIC 0x51455346u /* "FSEQ" read as a little-endian u32 */
#define VERSION 2u /* 2: the floor min_new_tokens */
#define HDR 152
#define SUM_AT 16 /* the checksum's offset; it covers [SUM_AT + 8, total) */
#define MAX_STOP 4096

void ff_gen_seq_state_free(ff_gen_seq_state *s) {
    if (!s) return;
    free(s->tokens);
    free(s->logprobs);
    free(s->stop);
    free(s->kv.data);
    memset(s, 0, sizeof *s);
}

/* FNV-1a's mixing over 64-bit words (8x fewer multiplies than over bytes; a state carries
 * megabytes of KV), then the tail bytewise. Any change of a single word changes the sum
 * (xor and multiplication by an odd constant are bijections). */
static uint64_t checksum(const unsigned char *p, size_t n) {
    uint64_t h = FF_HASH_FNV1A_INIT;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
    }
    return ff_hash_fnv1a(p + i, n - i, h);
}

static size_t kv_floats(const ff_gen_kv *kv) {
    return (size_t)kv->layers * 2 * (size_t)kv->positions * (size_t)kv->kv_heads * (size_t)kv->head_dim;
}

/* Bytes before the KV rows, padded to 8. */
static size_t head_bytes(int32_t prompt_len, int32_t n_gen, int32_t n_stop) {
    size_t n = HDR + ((size_t)prompt_len + (size_t)n_gen) * 4 + (size_t)n_gen * 4 + (size_t)n_stop * 4;
    return (n + 7) & ~(size_t)7;
}

size_t ff_gen_seq_state_size(const ff_gen_seq_state *s) {
    return head_bytes(s->prompt_len, s->n_gen, s->sampling.n_stop) + (s->kv.data ? kv_floats(&s->kv) * 4 : 0);
}

static unsigned char *put(unsigned char *p, const void *v, size_t n) {
    memcpy(p, v, n);
    return p + n;
}
static unsigned char *put_i32(unsigned char *p, int32_t v) { return put(p, &v, 4); }
static unsigned char *put_u64(unsigned char *p, uint64_t v) { return put(p, &v, 8); }

size_t ff_gen_seq_state_write(const ff_gen_seq_state *s, void *buf, size_t cap) {
    const size_t total = ff_gen_seq_state_size(s);
    if (cap < total)
        return ff_error_set("sequence state", "size the buffer with ff_gen_seq_state_size",
                            "%zu bytes of buffer for a state of %zu", cap, total),
               0;
    const ff_sampling *sp = &s->sampling;
    const ff_gen_kv *kv = &s->kv;
    unsigned char *b = buf, *p = b;
    uint32_t magic = MAGIC, version = VERSION;
    p = put(p, &magic, 4);
    p = put(p, &version, 4);
    p = put_u64(p, (uint64_t)total);
    p = put_u64(p, 0); /* the checksum, below */
    p = put_u64(p, s->id);
    p = put_u64(p, s->seed);
    p = put_i32(p, s->sample);
    p = put_i32(p, s->prompt_len);
    p = put_i32(p, s->n_gen);
    p = put_i32(p, sp->n_stop);
    p = put(p, &sp->temperature, 4);
    p = put_i32(p, sp->top_k);
    p = put(p, &sp->top_p, 4);
    p = put_i32(p, sp->max_new_tokens);
    p = put_i32(p, (int32_t)sp->logprob_mode);
    p = put_i32(p, kv->data ? 1 : 0);
    p = put_i32(p, sp->min_new_tokens);
    p = put_i32(p, 0); /* reserved, keeps the rng words 8-aligned */
    for (int i = 0; i < 4; i++) p = put_u64(p, s->rng.s[i]);
    const int32_t dims[8] = {kv->layers, kv->kv_heads, kv->head_dim, kv->positions, kv->tp_rank, kv->tp_size, (int32_t)kv->dtype,
                             kv->first_layer};
    p = put(p, dims, sizeof dims);
    assert(p - b == HDR);
    p = put(p, s->tokens, ((size_t)s->prompt_len + (size_t)s->n_gen) * 4);
    p = put(p, s->logprobs, (size_t)s->n_gen * 4);
    p = put(p, s->stop, (size_t)sp->n_stop * 4);
    size_t head = head_bytes(s->prompt_len, s->n_gen, sp->n_stop);
    memset(p, 0, head - (size_t)(p - b));
    if (kv->data) memcpy(b + head, kv->data, kv_floats(kv) * 4);
    uint64_t sum = checksum(b + SUM_AT + 8, total - SUM_AT - 8);
    memcpy(b + SUM_AT, &sum, 8);
    return total;
}

static const unsigned char *get(const unsigned char *p, void *v, size_t n) {
    memcpy(v, p, n);
    return p + n;
}

int ff_gen_seq_state_read(const void *buf, size_t n, ff_gen_seq_state *out) {
    const char *w = "sequence state";
    const char *hint = "send the bytes ff_gen_seq_state_write wrote, whole";
    memset(out, 0, sizeof *out);
    const unsigned char *b = buf, *p = b;
    if (!buf || n < HDR) return ff_error_set(w, hint, "truncated: %zu bytes, shorter than the %d-byte header", n, HDR);
    uint32_t magic, version;
    uint64_t total, sum;
    p = get(p, &magic, 4);
    p = get(p, &version, 4);
    p = get(p, &total, 8);
    p = get(p, &sum, 8);
    if (magic != MAGIC) return ff_error_set(w, hint, "not a sequence state (magic 0x%08x)", magic);
    if (version != VERSION) return ff_error_set(w, "send between engines of the same build", "version %u; this build reads %u", version, VERSION);
    if (total != n)
        return ff_error_set(w, hint, "%zu bytes, but the header says %llu (%s)", n, (unsigned long long)total,
                            n < total ? "truncated" : "trailing bytes");
    if (checksum(b + SUM_AT + 8, n - SUM_AT - 8) != sum)
        return ff_error_set(w, "send it again (the bytes changed on the way)", "checksum mismatch: the state is corrupt");
    ff_gen_seq_state s = {0};
    int32_t n_stop, mode, has_kv, reserved, dims[8];
    p = get(p, &s.id, 8);
    p = get(p, &s.seed, 8);
    p = get(p, &s.sample, 4);
    p = get(p, &s.prompt_len, 4);
    p = get(p, &s.n_gen, 4);
    p = get(p, &n_stop, 4);
    p = get(p, &s.sampling.temperature, 4);
    p = get(p, &s.sampling.top_k, 4);
    p = get(p, &s.sampling.top_p, 4);
    p = get(p, &s.sampling.max_new_tokens, 4);
    p = get(p, &mode, 4);
    p = get(p, &has_kv, 4);
    p = get(p, &s.sampling.min_new_tokens, 4);
    p = get(p, &reserved, 4);
    for (int i = 0; i < 4; i++) p = get(p, &s.rng.s[i], 8);
    p = get(p, dims, sizeof dims);
    assert(p - b == HDR);
    s.sampling.n_stop = n_stop;
    s.sampling.logprob_mode = (ff_logprob_mode)mode;
    s.kv = (ff_gen_kv){.layers = dims[0], .kv_heads = dims[1], .head_dim = dims[2], .positions = dims[3],
                       .tp_rank = dims[4], .tp_size = dims[5], .dtype = (ff_dtype)dims[6], .first_layer = dims[7]};
    /* the checksum held: what is wrong now was wrong when it was written */
    if (s.sample < 0 || s.prompt_len < 1 || s.n_gen < 1 || n_stop < 0 || n_stop > MAX_STOP || (has_kv != 0 && has_kv != 1) ||
        mode < 0 || mode > 2 || s.sampling.min_new_tokens < 0 || s.sampling.min_new_tokens > s.sampling.max_new_tokens || reserved != 0)
        return ff_error_set(w, hint,
                            "out of range: sample %d, prompt of %d tokens, %d generated, %d stop tokens, KV flag %d, logprob mode %d, "
                            "floor %d of a budget of %d",
                            s.sample, s.prompt_len, s.n_gen, n_stop, has_kv, mode, s.sampling.min_new_tokens, s.sampling.max_new_tokens);
    if (has_kv) {
        const ff_gen_kv *kv = &s.kv;
        if (kv->layers < 1 || kv->first_layer < 0 || kv->kv_heads < 1 || kv->head_dim < 1 || kv->tp_size < 1 || kv->tp_rank < 0 ||
            kv->tp_rank >= kv->tp_size || kv->dtype != FF_DTYPE_F32 || kv->positions != s.prompt_len + s.n_gen - 1)
            return ff_error_set(w, hint,
                                "KV header out of range: %d layers x %d kv heads x head dim %d, %d positions for %d tokens, TP rank %d of %d, dtype %d",
                                kv->layers, kv->kv_heads, kv->head_dim, kv->positions, s.prompt_len + s.n_gen, kv->tp_rank,
                                kv->tp_size, (int)kv->dtype);
    }
    /* sizes from the counts (each < 2^31, the KV product checked against what arrived) */
    const size_t head = head_bytes(s.prompt_len, s.n_gen, n_stop);
    const double kv_bytes = has_kv ? 8.0 * s.kv.layers * (double)s.kv.positions * s.kv.kv_heads * s.kv.head_dim : 0;
    if ((double)head + kv_bytes != (double)n)
        return ff_error_set(w, hint, "%zu bytes, but its counts make %.0f", n, (double)head + kv_bytes);
    const size_t nt = (size_t)s.prompt_len + (size_t)s.n_gen;
    s.tokens = ff_malloc(nt * 4);
    s.logprobs = ff_malloc((size_t)s.n_gen * 4);
    s.stop = ff_malloc((size_t)(n_stop > 0 ? n_stop : 1) * 4);
    if (has_kv) s.kv.data = ff_malloc((size_t)kv_bytes);
    if (!s.tokens || !s.logprobs || !s.stop || (has_kv && !s.kv.data)) {
        ff_gen_seq_state_free(&s);
        return ff_error_wrap("%s", w);
    }
    p = get(p, s.tokens, nt * 4);
    p = get(p, s.logprobs, (size_t)s.n_gen * 4);
    get(p, s.stop, (size_t)n_stop * 4);
    if (has_kv) memcpy(s.kv.data, b + head, (size_t)kv_bytes);
    s.sampling.stop_tokens = s.stop;
    *out = s;
    return 0;
}

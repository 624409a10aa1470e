/* Benchmark: moving a decoding sequence between two rollout engines in one process
 * (ff_rollout_export / ff_rollout_import, the state through bytes), with its KV rows and with
 * a recompute, at a few context lengths on a small random model; beside each, the cost
 * model's prediction (fuseflow/migrate.h) from rates measured apart from the moves (a plain
 * memcpy's bandwidth, a fresh request's prefill), and whether it picks the faster way.
 *
 * Times are of the whole move: export, write into the byte buffer, read it back, import. In
 * one process the "link" is the write and the read (two copies of the rows) and each end
 * stages the rows once more (device to host, host to device: memcpy on the CPU backend).
 *
 * usage: bench_migrate [--threads N] [--reps R] [--quick]
 * Last line: migrate: kv transfer <x> ms vs recompute <y> ms at <n> tokens (target: the cost
 * model picks the faster; ...) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/migrate.h"
#include "fuseflow/model.h"
#include "fuseflow/roles.h"
#include "fuseflow/util.h"
#include "bench_util.h"

static void die(const char *what) {
    fprintf(stderr, "bench_migrate: %s: %s\n", what, ff_error_message());
    exit(1);
}

/* A plain memcpy's bandwidth over 64 MiB, bytes/s (the staging copies' and, in one process,
 * the link's). */
static double memcpy_bps(void) {
    const size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) die("memory");
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = now_s();
        memcpy(b, a, n);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    volatile char sink = b[n / 2];
    (void)sink;
    free(a);
    free(b);
    return (double)n / best;
}

static ff_rollout *engine(ff_model *m, int32_t len) {
    ff_rollout_config c;
    ff_rollout_config_default(&c);
    c.max_slots = 2;
    c.max_seq_len = len + 16;
    c.max_prefill_tokens = len;
    ff_rollout *r = ff_rollout_new(m, &c);
    if (!r) die("engine");
    return r;
}

/* One timed move of (id, 0) from `from` to `to` through bytes; the sequence is then moved
 * back (untimed, with its rows) so the next repetition starts the same. */
static double move_once(ff_rollout *from, ff_rollout *to, uint64_t id, bool with_kv, unsigned char **buf, size_t *cap,
                        size_t *bytes) {
    ff_rollout_seq_state s, back;
    double t0 = now_s();
    if (ff_rollout_export(from, id, 0, with_kv, &s)) die("export");
    size_t n = ff_gen_seq_state_size(&s);
    if (n > *cap) {
        free(*buf);
        *buf = malloc(n);
        *cap = n;
        if (!*buf) die("memory");
    }
    if (ff_gen_seq_state_write(&s, *buf, n) != n) die("write");
    if (ff_gen_seq_state_read(*buf, n, &back)) die("read");
    if (ff_rollout_import(to, &back)) die("import");
    double t = now_s() - t0;
    ff_gen_seq_state_free(&s);
    ff_gen_seq_state_free(&back);
    *bytes = n;
    if (ff_rollout_export(to, id, 0, true, &s) || ff_rollout_import(from, &s)) die("moving it back");
    ff_gen_seq_state_free(&s);
    return t;
}

int main(int argc, char **argv) {
    int threads = 1, reps = 5;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else {
            fprintf(stderr, "usage: bench_migrate [--threads N] [--reps R] [--quick]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 64) reps = 5;
    char spec[32];
    snprintf(spec, sizeof spec, "cpu:%d", threads > 0 ? threads : 1);
    ff_backend *be = ff_backend_new(spec);
    if (!be) die("backend");

    /* a small Llama: 4 layers, hidden 256, GQA 8/4 heads of 32, vocab 1024 */
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = 1024;
    c.hidden_size = 256;
    c.intermediate_size = 704;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 32;
    c.max_position_embeddings = 4096;
    c.rope_theta = 10000;
    c.rms_norm_eps = 1e-5;
    c.bos_token_id = c.pad_token_id = -1;
    c.eos_token_ids[0] = 0;
    c.n_eos = 1;
    ff_tensor_set *w = ff_tensor_set_new();
    if (!w || ff_model_init_weights(&c, 1, 0.02, w)) die("weights");
    ff_model *ma = ff_model_new(be, &c, w), *mb = ff_model_new(be, &c, w);
    ff_tensor_set_destroy(&w);
    if (!ma || !mb) die("model");

    const double copy = memcpy_bps();
    const double kv_tok = ff_migrate_kv_bytes_per_token(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, 1, 4);
    printf("model: %d layers, %d kv heads x %d, KV %.0f bytes per token; memcpy %.2f GB/s; %d thread(s), median of %d\n",
           c.num_hidden_layers, c.num_key_value_heads, c.head_dim, kv_tok, copy * 1e-9, threads, reps);
    printf("%8s %12s %10s %10s %10s %10s %10s %9s %9s %14s %14s\n", "tokens", "state_bytes", "prefill/s", "kv_ms",
           "kv_model", "re_ms", "re_model", "faster", "picks", "10Gb/s picks", "break-even");

    const int32_t all[] = {64, 256, 1024, 2048};
    const int n_ctx = quick ? 2 : 4;
    int32_t *prompt = malloc(sizeof(int32_t) * 2048);
    if (!prompt) die("memory");
    ff_rng rng;
    ff_rng_seed(&rng, 7);
    for (int i = 0; i < 2048; i++) prompt[i] = 1 + (int32_t)ff_rng_below(&rng, (uint64_t)c.vocab_size - 1);
    unsigned char *buf = NULL;
    size_t cap = 0;
    bool all_right = true;
    double kv_last = 0, re_last = 0;
    int32_t n_last = 0;
    for (int ci = 0; ci < n_ctx; ci++) {
        const int32_t n = all[ci]; /* KV positions of the moved sequence */
        ff_rollout *a = engine(ma, n), *b = engine(mb, n);
        ff_rollout_request q = {.id = 1, .prompt = prompt, .prompt_len = n - 1, .n = 1, .seed = 3};
        ff_sampling_default(&q.sampling);
        q.sampling.max_new_tokens = 8;
        /* the prefill rate, apart from any move: a fresh request's first step (its prefill
         * and one decode token), the median over reps */
        double pt[64];
        for (int r = 0; r < reps; r++) {
            ff_rollout *p = engine(ma, n);
            if (ff_rollout_add(p, &q)) die("request");
            double t0 = now_s();
            if (ff_rollout_step(p) < 0) die("step");
            pt[r] = now_s() - t0;
            ff_rollout_destroy(&p);
        }
        const double prefill_rate = (double)(n - 1) / median(pt, reps);
        if (ff_rollout_add(a, &q) || ff_rollout_step(a) < 0) die("the sequence to move");
        double tk[64], tr[64];
        size_t kv_bytes = 0, re_bytes = 0;
        for (int r = 0; r < reps; r++) tk[r] = move_once(a, b, 1, true, &buf, &cap, &kv_bytes);
        for (int r = 0; r < reps; r++) tr[r] = move_once(a, b, 1, false, &buf, &cap, &re_bytes);
        const double kv_s = median(tk, reps), re_s = median(tr, reps);
        /* the model: the link is the write and the read (two copies), staging one copy each end */
        ff_migrate_costs mc = {.kv_bytes_per_token = kv_tok, .link_bytes_per_s = copy / 2, .copy_bytes_per_s = copy,
                               .prefill_tokens_per_s = prefill_rate};
        const bool kv_faster = kv_s <= re_s;
        const bool picks_kv = ff_migrate_choose(&mc, n) == FF_MIGRATE_KV;
        ff_migrate_costs net = mc;
        net.link_bytes_per_s = 1.25e9;
        if (picks_kv != kv_faster) all_right = false;
        printf("%8d %12zu %10.0f %10.3f %10.3f %10.3f %10.3f %9s %9s %14s %11.2f GB/s\n", n, kv_bytes, prefill_rate,
               kv_s * 1e3, ff_migrate_kv_s(&mc, n) * 1e3, re_s * 1e3, ff_migrate_recompute_s(&mc, n) * 1e3,
               kv_faster ? "kv" : "recompute", picks_kv ? "kv" : "recompute",
               ff_migrate_choose(&net, n) == FF_MIGRATE_KV ? "kv" : "recompute",
               ff_migrate_breakeven_bytes_per_s(&mc, n) * 1e-9);
        if ((double)(kv_bytes - re_bytes) != kv_tok * n) all_right = false; /* the rows are what the model counts */
        kv_last = kv_s, re_last = re_s, n_last = n;
        ff_rollout_destroy(&a);
        ff_rollout_destroy(&b);
    }
    free(buf);
    free(prompt);
    ff_model_destroy(&ma);
    ff_model_destroy(&mb);
    ff_backend_destroy(&be);
    printf("migrate: kv transfer %.3f ms vs recompute %.3f ms at %d tokens (target: the cost model picks the faster; %s)\n",
           kv_last * 1e3, re_last * 1e3, n_last, all_right ? "it did at every length" : "it did NOT at every length");
    return 0;
}

/* bench_model: training and decoding speed of the model engine beside PyTorch, and how
 * close its matrix products come to cblas_sgemm alone.
 *
 * For a tiny (~1M parameter) and a small (~25M parameter) Llama-style model it measures:
 *   train   tokens/s of one step: forward, token-mean cross-entropy, backward, grad-norm
 *           clipping and AdamW (best of a few steps)
 *   decode  generated tokens/s of a batch of prompts, temperature sampling, KV cache
 *   sgemm   every matrix product of a training step (and of a decode step) at its shape,
 *           through the backend (split over its thread pool) and as one cblas_sgemm call
 *           with OpenBLAS's own threads; the ratio of the totals, time-weighted; and the
 *           same through a backend without batch invariance (FF_BATCH_INVARIANT=0): the
 *           target is on that split alone, the padding's cost printed beside it
 * and right after each size runs bench/torch_model.py on the same config (same thread
 * count, same run; once as installed and once with OPENBLAS_NUM_THREADS=1, PyTorch credited
 * with its better number), then prints the ratios. The last line is the headline: the worst
 * of the four ratios against PyTorch.
 *
 * Usage: bench_model [--threads N] [--quick] [--no-torch] [--verbose]
 * Run from the source root, or set FF_SOURCE_DIR, so that bench/torch_model.py is found;
 * PyTorch is Debian's python3-torch (scripts/deps.sh --bench). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/kernels.h"
#include "fuseflow/model.h"
#include "fuseflow/util.h"
#include "bench_util.h"

typedef struct size_spec {
    const char *name;
    int V, H, inter, L, Hq, Hkv, tied;
    int seqs, len, steps;      /* training batch: seqs sequences of len tokens */
    int dB, dprompt, dnew;     /* decoding: batch, prompt length, new tokens */
} size_spec;

static const size_spec SIZES[2] = {
    {"tiny", 256, 128, 352, 5, 4, 2, 0, 8, 64, 12, 8, 32, 96},
    {"small", 8192, 512, 1408, 7, 8, 4, 1, 4, 256, 3, 8, 32, 96},
};

typedef struct result {
    double train_tps, decode_tps, params;
    double gemm_ours_s, gemm_blas_s, step_s; /* training step */
    double dgemm_ours_s, dgemm_blas_s;       /* one decode step */
    double gemm_plain_s, dgemm_plain_s;      /* the same through a backend with FF_BATCH_INVARIANT=0 */
    double torch_train, torch_decode;
} result;

static ff_model_config config_of(const size_spec *s) {
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = s->V;
    c.hidden_size = s->H;
    c.intermediate_size = s->inter;
    c.num_hidden_layers = s->L;
    c.num_attention_heads = s->Hq;
    c.num_key_value_heads = s->Hkv;
    c.max_position_embeddings = 4096;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = s->tied;
    c.bos_token_id = c.pad_token_id = -1;
    return c;
}

static int die(const char *what) {
    fprintf(stderr, "bench_model: %s: %s\n", what, ff_error_message());
    return 1;
}

/* ---- training and decoding ------------------------------------------------------------------ */

static int bench_train(ff_model *m, const size_spec *s, int steps, result *r) {
    int32_t T = s->seqs * s->len, *tok = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
    int32_t *ss = malloc(((size_t)s->seqs + 1) * 4);
    float *lp = malloc((size_t)T * 4), *d = malloc((size_t)T * 4), *mask = malloc((size_t)T * 4);
    ff_rng rng;
    ff_rng_seed(&rng, 0);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)ff_rng_below(&rng, (uint64_t)s->V);
    for (int i = 0; i <= s->seqs; i++) ss[i] = i * s->len;
    ff_batch_shift_targets(tok, ss, s->seqs, tg);
    for (int i = 0; i < T; i++) mask[i] = tg[i] >= 0;
    ff_batch b = {.n_tokens = T, .n_seqs = s->seqs, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-4;
    ff_optimizer *o = ff_optimizer_new(m, &ac);
    int rc = o ? 0 : -1;
    double best = INFINITY;
    for (int k = 0; k <= steps && !rc; k++) { /* step 0 warms up */
        double t0 = now_s();
        ff_forward_opts tr = {.train = true};
        ff_forward_out fo = {.logprobs = lp};
        ff_model_zero_grad(m);
        rc = ff_model_forward(m, &b, &tr, &fo);
        if (!rc) ff_sft_loss(lp, mask, T, 1.0f, d);
        if (!rc) rc = ff_model_backward(m, d, NULL, NULL);
        ff_optim_stats st;
        if (!rc) rc = ff_optimizer_step(o, &st);
        double dt = now_s() - t0;
        if (k > 0 && dt < best) best = dt;
    }
    r->step_s = best;
    r->train_tps = T / best;
    ff_optimizer_destroy(&o);
    free(tok), free(tg), free(ss), free(lp), free(d), free(mask);
    return rc;
}

static int bench_decode(ff_model *m, const size_spec *s, int reps, result *r) {
    ff_generator_config gc = {.max_slots = s->dB, .max_seq_len = s->dprompt + s->dnew + 1};
    ff_generator *g = ff_generator_new(m, &gc);
    if (!g) return -1;
    int32_t *prompts = malloc((size_t)s->dB * s->dprompt * 4);
    ff_rng rng;
    ff_rng_seed(&rng, 1);
    for (int i = 0; i < s->dB * s->dprompt; i++) prompts[i] = (int32_t)ff_rng_below(&rng, (uint64_t)s->V);
    double best = INFINITY;
    int rc = 0;
    for (int k = 0; k <= reps && !rc; k++) {
        double t0 = now_s();
        for (int i = 0; i < s->dB && !rc; i++) {
            ff_gen_request q;
            memset(&q, 0, sizeof q);
            q.id = (uint64_t)i;
            q.prompt = prompts + (size_t)i * s->dprompt;
            q.prompt_len = s->dprompt;
            q.n_samples = 1;
            ff_sampling_default(&q.sampling);
            q.sampling.temperature = 0.8f;
            q.sampling.max_new_tokens = s->dnew;
            q.seed = (uint64_t)(k * 1000 + i);
            rc = ff_generator_submit(g, &q);
        }
        int64_t produced = 0;
        while (!rc && ff_generator_pending(g) > 0) rc = ff_generator_step(g);
        ff_gen_output out;
        while (ff_generator_pop(g, &out)) {
            produced += out.n_tokens;
            ff_gen_output_free(&out);
        }
        double dt = now_s() - t0;
        if (!rc && produced != (int64_t)s->dB * s->dnew) {
            fprintf(stderr, "bench_model: decode produced %lld tokens, expected %d\n", (long long)produced, s->dB * s->dnew);
            rc = -1;
        }
        if (k > 0 && dt < best) best = dt;
    }
    r->decode_tps = (double)s->dB * s->dnew / best;
    ff_generator_destroy(&g);
    free(prompts);
    return rc;
}

/* ---- matrix products against cblas_sgemm alone --------------------------------------------- */

typedef struct gemm_shape {
    ff_trans ta, tb;
    int M, N, K, count;
} gemm_shape;

/* The products of one training step (forward, backward of L layers, LM head). */
static int train_shapes(const size_spec *s, gemm_shape *g) {
    int T = s->seqs * s->len, H = s->H, D = s->H / s->Hq, QKV = (s->Hq + 2 * s->Hkv) * D, HD = s->Hq * D, In = s->inter;
    int L = s->L, n = 0;
    gemm_shape list[] = {
        {FF_NO_TRANS, FF_TRANS, T, QKV, H, L}, {FF_NO_TRANS, FF_TRANS, T, H, HD, L},
        {FF_NO_TRANS, FF_TRANS, T, 2 * In, H, L}, {FF_NO_TRANS, FF_TRANS, T, H, In, L},
        {FF_NO_TRANS, FF_NO_TRANS, T, In, H, L}, {FF_TRANS, FF_NO_TRANS, H, In, T, L},
        {FF_NO_TRANS, FF_NO_TRANS, T, H, 2 * In, L}, {FF_TRANS, FF_NO_TRANS, 2 * In, H, T, L},
        {FF_NO_TRANS, FF_NO_TRANS, T, HD, H, L}, {FF_TRANS, FF_NO_TRANS, H, HD, T, L},
        {FF_NO_TRANS, FF_NO_TRANS, T, H, QKV, L}, {FF_TRANS, FF_NO_TRANS, QKV, H, T, L},
        {FF_NO_TRANS, FF_TRANS, T, s->V, H, 1}, {FF_NO_TRANS, FF_NO_TRANS, T, H, s->V, 1},
        {FF_TRANS, FF_NO_TRANS, s->V, H, T, 1},
    };
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) g[n++] = list[i];
    return n;
}

/* The products of one decode step of B sequences. */
static int decode_shapes(const size_spec *s, gemm_shape *g) {
    int B = s->dB, H = s->H, D = s->H / s->Hq, QKV = (s->Hq + 2 * s->Hkv) * D, HD = s->Hq * D, In = s->inter, L = s->L;
    gemm_shape list[] = {
        {FF_NO_TRANS, FF_TRANS, B, QKV, H, L}, {FF_NO_TRANS, FF_TRANS, B, H, HD, L},
        {FF_NO_TRANS, FF_TRANS, B, 2 * In, H, L}, {FF_NO_TRANS, FF_TRANS, B, H, In, L},
        {FF_NO_TRANS, FF_TRANS, B, s->V, H, 1},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) g[n++] = list[i];
    return n;
}

/* The best of reps runs of g through one backend (its buffer holds A, B and C in that order),
 * into *best. */
static void best_of_backend(ff_backend *be, ff_buffer *buf, const gemm_shape *g, const float *A, const float *B,
                            int lda, int ldb, int reps, double *best) {
    size_t na = (size_t)g->M * g->K, nb = (size_t)g->K * g->N;
    ff_stream *st = ff_backend_stream(be);
    ff_dptr a = ff_dptr_of(buf, 0), b = ff_dptr_f32(buf, na), c = ff_dptr_f32(buf, na + nb);
    ff_memcpy_h2d(st, a, A, na * 4);
    ff_memcpy_h2d(st, b, B, nb * 4);
    for (int k = 0; k < reps; k++) {
        double t0 = now_s();
        ff_gemm(st, g->ta, g->tb, g->M, g->N, g->K, 1.0f, a, lda, b, ldb, 0.0f, c, g->N);
        ff_stream_sync(st);
        double dt = now_s() - t0;
        if (dt < *best) *best = dt;
    }
}

/* Best-of time of one product through the backend and through cblas_sgemm alone. */
static void time_gemm(ff_backend *be, ff_backend *plain, const gemm_shape *g, int threads, double *ours,
                      double *ours_plain, double *blas) {
    size_t na = (size_t)g->M * g->K, nb = (size_t)g->K * g->N, nc = (size_t)g->M * g->N;
    ff_buffer *buf = ff_buffer_new(be, (na + nb + nc) * 4), *pbuf = ff_buffer_new(plain, (na + nb + nc) * 4);
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4);
    for (size_t i = 0; i < na; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)((i * 104729) % 1000) * 1e-3f;
    int lda = g->ta == FF_NO_TRANS ? g->K : g->M, ldb = g->tb == FF_NO_TRANS ? g->N : g->K;
    double flops = 2.0 * g->M * g->N * g->K;
    int reps = (int)fmin(50, fmax(3, 2e9 / flops));
    double best_ours = INFINITY, best_plain = INFINITY, best_blas = INFINITY;
    for (int round = 0; round < 2; round++) { /* alternate, so all three see the same noise */
        best_of_backend(be, buf, g, A, B, lda, ldb, reps, &best_ours);
        best_of_backend(plain, pbuf, g, A, B, lda, ldb, reps, &best_plain);
        openblas_set_num_threads(threads);
        for (int k = 0; k < reps; k++) {
            double t0 = now_s();
            cblas_sgemm(CblasRowMajor, g->ta == FF_TRANS ? CblasTrans : CblasNoTrans,
                        g->tb == FF_TRANS ? CblasTrans : CblasNoTrans, g->M, g->N, g->K, 1.0f, A, lda, B, ldb, 0.0f, C,
                        g->N);
            double dt = now_s() - t0;
            if (dt < best_blas) best_blas = dt;
        }
        openblas_set_num_threads(1); /* the backend's setting */
    }
    *ours = best_ours;
    *ours_plain = best_plain;
    *blas = best_blas;
    ff_buffer_destroy(&buf);
    ff_buffer_destroy(&pbuf);
    free(A), free(B), free(C);
}

static void bench_gemms(ff_backend *be, ff_backend *plain, const size_spec *s, int threads, bool verbose, result *r) {
    gemm_shape g[32];
    for (int which = 0; which < 2; which++) {
        int n = which ? decode_shapes(s, g) : train_shapes(s, g);
        double ours = 0, ours_plain = 0, blas = 0;
        for (int i = 0; i < n; i++) {
            double o, op, b;
            time_gemm(be, plain, &g[i], threads, &o, &op, &b);
            ours += o * g[i].count;
            ours_plain += op * g[i].count;
            blas += b * g[i].count;
            if (verbose)
                printf("  %s %-6s %c%c M=%-5d N=%-5d K=%-5d x%-2d  ours %6.1f GFLOP/s  sgemm alone %6.1f GFLOP/s\n",
                       s->name, which ? "decode" : "train", g[i].ta ? 'T' : 'N', g[i].tb ? 'T' : 'N', g[i].M, g[i].N,
                       g[i].K, g[i].count, 2.0 * g[i].M * g[i].N * g[i].K / o * 1e-9,
                       2.0 * g[i].M * g[i].N * g[i].K / b * 1e-9);
        }
        if (which) {
            r->dgemm_ours_s = ours;
            r->dgemm_plain_s = ours_plain;
            r->dgemm_blas_s = blas;
        } else {
            r->gemm_ours_s = ours;
            r->gemm_plain_s = ours_plain;
            r->gemm_blas_s = blas;
        }
    }
}

/* ---- PyTorch ---------------------------------------------------------------------------------- */

/* One run of the PyTorch script for one size with an environment prefix; keeps PyTorch's
 * better numbers (its best setting counts). */
static int run_torch_once(const char *env, int i, int threads, bool quick, result *r) {
    const char *src = getenv("FF_SOURCE_DIR");
    char script[1024], cmd[4096];
    snprintf(script, sizeof script, "%s/bench/torch_model.py", src && *src ? src : ".");
    FILE *f = fopen(script, "r");
    if (!f) {
        fprintf(stderr, "bench_model: %s not found (run from the source root or set FF_SOURCE_DIR)\n", script);
        return -1;
    }
    fclose(f);
    const size_spec *s = &SIZES[i];
    snprintf(cmd, sizeof cmd,
             "%s /usr/bin/python3 %s --threads %d --reps %d --size %s,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", env,
             script, threads, quick ? 1 : 3, s->name, s->V, s->H, s->inter, s->L, s->Hq, s->Hkv, s->tied, s->seqs,
             s->len, quick ? 1 : s->steps, s->dB, s->dprompt, s->dnew);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[256], kind[32], name[32];
    double v;
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        if (sscanf(line, "%31s %31s %lf", kind, name, &v) != 3 || strcmp(name, s->name)) continue;
        if (!strcmp(kind, "train")) r->torch_train = fmax(r->torch_train, v), got++;
        if (!strcmp(kind, "decode")) r->torch_decode = fmax(r->torch_decode, v), got++;
    }
    int st = pclose(p);
    if (st != 0 || got != 2) {
        fprintf(stderr, "bench_model: the PyTorch side failed (is python3-torch installed? scripts/deps.sh --bench)\n");
        return -1;
    }
    return 0;
}

/* Debian's PyTorch calls the pthreads OpenBLAS beside its own OpenMP threads; with
 * OPENBLAS_NUM_THREADS=1 it is often faster (the oversubscription our backend avoids).
 * Both settings run; PyTorch is credited with the better one for each number. */
static int run_torch(int i, int threads, bool quick, result *r) {
    if (run_torch_once("", i, threads, quick, r)) return -1;
    return run_torch_once("OPENBLAS_NUM_THREADS=1", i, threads, quick, r);
}

int main(int argc, char **argv) {
    int threads = 0;
    bool quick = false, torch = true, verbose = false, torch_failed = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--no-torch")) torch = false;
        else if (!strcmp(argv[i], "--verbose")) verbose = true;
        else {
            fprintf(stderr, "usage: bench_model [--threads N] [--quick] [--no-torch] [--verbose]\n");
            return 2;
        }
    }
    ff_backend *be = ff_backend_cpu_new(threads);
    if (!be) return die("backend");
    /* the products once more without batch invariance (cpu_backend.c): what its padding costs */
    const char *inv = getenv("FF_BATCH_INVARIANT");
    char *inv_saved = inv ? strdup(inv) : NULL;
    setenv("FF_BATCH_INVARIANT", "0", 1);
    ff_backend *plain = ff_backend_cpu_new(threads);
    if (inv_saved) setenv("FF_BATCH_INVARIANT", inv_saved, 1);
    else unsetenv("FF_BATCH_INVARIANT");
    free(inv_saved);
    if (!plain) return die("backend");
    threads = ff_backend_threads(be);
    printf("bench_model: %d threads (the backend's pool; OpenBLAS at 1 thread inside it)\n", threads);
    result res[2];
    memset(res, 0, sizeof res);
    for (int i = 0; i < 2; i++) {
        const size_spec *s = &SIZES[i];
        ff_model_config c = config_of(s);
        ff_tensor_set *w = ff_tensor_set_new();
        if (!w || ff_model_init_weights(&c, 1, 0.02, w)) return die("init");
        ff_model *m = ff_model_new(be, &c, w);
        ff_tensor_set_destroy(&w);
        if (!m) return die("model");
        res[i].params = (double)ff_model_param_count(m);
        if (bench_train(m, s, quick ? 1 : s->steps, &res[i])) return die("train");
        if (bench_decode(m, s, quick ? 1 : 3, &res[i])) return die("decode");
        bench_gemms(be, plain, s, threads, verbose, &res[i]);
        ff_model_destroy(&m);
        printf("%-5s %5.2fM params: train %8.0f tok/s (batch %dx%d)   decode %7.0f tok/s (batch %d)\n", s->name,
               res[i].params * 1e-6, res[i].train_tps, s->seqs, s->len, res[i].decode_tps, s->dB);
        printf("      matrix products: train step %.1f ms (%.0f%% of the step) = %.0f%% of sgemm alone; decode step "
               "%.2f ms = %.0f%% of sgemm alone\n"
               "      without batch invariance (FF_BATCH_INVARIANT=0): train step %.1f ms = %.0f%%; decode step %.2f ms = "
               "%.0f%% (the padding costs %.2fx, %.2fx)\n",
               res[i].gemm_ours_s * 1e3, 100 * res[i].gemm_ours_s / res[i].step_s,
               100 * res[i].gemm_blas_s / res[i].gemm_ours_s, res[i].dgemm_ours_s * 1e3,
               100 * res[i].dgemm_blas_s / res[i].dgemm_ours_s, res[i].gemm_plain_s * 1e3,
               100 * res[i].gemm_blas_s / res[i].gemm_plain_s, res[i].dgemm_plain_s * 1e3,
               100 * res[i].dgemm_blas_s / res[i].dgemm_plain_s, res[i].gemm_ours_s / res[i].gemm_plain_s,
               res[i].dgemm_ours_s / res[i].dgemm_plain_s);
        fflush(stdout);
        if (torch && run_torch(i, threads, quick, &res[i])) torch_failed = true; /* right after ours */
    }
    /* The target is the split's own overhead (the products as OpenBLAS chooses them); batch
     * invariance is a choice beside it, its cost printed with it */
    double gemm_eff = 1e9, inv_eff = 1e9;
    for (int i = 0; i < 2; i++) {
        gemm_eff = fmin(gemm_eff, res[i].gemm_blas_s / res[i].gemm_plain_s);
        gemm_eff = fmin(gemm_eff, res[i].dgemm_blas_s / res[i].dgemm_plain_s);
        inv_eff = fmin(inv_eff, res[i].gemm_blas_s / res[i].gemm_ours_s);
        inv_eff = fmin(inv_eff, res[i].dgemm_blas_s / res[i].dgemm_ours_s);
    }
    ff_backend_destroy(&be);
    ff_backend_destroy(&plain);
    if (!torch || torch_failed) {
        printf("bench_model_sgemm: %.0f %% of cblas_sgemm alone, worst of train/decode at both sizes (target: >= 80; "
               "batch-invariant, the default: %.0f %%)\n",
               100 * gemm_eff, 100 * inv_eff);
        return torch ? 1 : 0;
    }
    double worst = 1e9;
    for (int i = 0; i < 2; i++) {
        double rt = res[i].train_tps / res[i].torch_train, rd = res[i].decode_tps / res[i].torch_decode;
        printf("%-5s vs PyTorch (%d threads): train %8.0f vs %8.0f tok/s = %.2fx   decode %7.0f vs %7.0f tok/s = %.2fx\n",
               SIZES[i].name, threads, res[i].train_tps, res[i].torch_train, rt, res[i].decode_tps, res[i].torch_decode,
               rd);
        worst = fmin(worst, fmin(rt, rd));
    }
    printf("bench_model: %.2f x PyTorch, worst of train/decode at tiny and small (target: >= 1.0, tiny faster; "
           "matrix products %.0f%% of sgemm alone, target >= 80%%, batch-invariant %.0f%%)\n",
           worst, 100 * gemm_eff, 100 * inv_eff);
    return 0;
}

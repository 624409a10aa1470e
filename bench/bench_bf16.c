/* bench_bf16: bf16 weights (ff_model_opts.bf16_weights) against fp32 weights on the CPU
 * backend, in one process: a random Llama-shaped model of about 120M parameters (larger than
 * the caches, so that decoding reads its weights from memory every step), the same weights
 * given to each model:
 *   fp32        the default backend (OpenBLAS products, padded for batch invariance where its
 *               rows allow; the fixed-order products elsewhere)
 *   fp32 fixed  FF_BATCH_INVARIANT=fixed: the fixed-order products that bf16 weights use, so
 *               that the difference from bf16 is the bytes read alone
 *   bf16        the weight matrices in bf16, widened in the product's registers
 * measured alternately, best of a few repetitions after an untimed warm-up:
 *   decode      greedy generation, B sequences of a 16-token prompt, 32 new tokens each
 *               (B = 1 and 8): generated tokens/s
 *   score       log-probs of a packed batch of 512 tokens (4 sequences of 128): tokens/s
 * and the parameter bytes each model holds, and how far bf16's log-probs are from fp32's.
 * The last line is the headline: bf16's decode tokens/s at batch 1 over fp32's.
 *
 * Usage: bench_bf16 [--threads N] [--quick] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/model.h"
#include "fuseflow/util.h"
#include "bench_util.h"

enum { PROMPT = 16, NEW = 32, SCORE_SEQS = 4, SCORE_LEN = 128, SCORE_T = SCORE_SEQS * SCORE_LEN, KINDS = 3, BATCHES = 2 };
static const int batch[BATCHES] = {1, 8};
static const char *kind_name[KINDS] = {"fp32", "fp32 fixed", "bf16"};

static int die(const char *what) {
    fprintf(stderr, "bench_bf16: %s: %s\n", what, ff_error_message());
    return 1;
}

/* greedy decode of B sequences; seconds, the tokens into toks [B, NEW] */
static double decode(ff_model *m, int B, const int32_t *prompts, int32_t *toks) {
    ff_gen_request q[8];
    for (int i = 0; i < B; i++) {
        memset(&q[i], 0, sizeof q[i]);
        q[i].id = (uint64_t)i;
        q[i].prompt = prompts + (size_t)i * PROMPT;
        q[i].prompt_len = PROMPT;
        q[i].n_samples = 1;
        ff_sampling_default(&q[i].sampling);
        q[i].sampling.temperature = 0.0f;
        q[i].sampling.max_new_tokens = NEW;
    }
    ff_generator_config gc = {.max_slots = B, .max_seq_len = PROMPT + NEW, .max_prefill_tokens = 8 * PROMPT};
    ff_gen_output *o = NULL;
    int32_t n = 0;
    double t0 = now_s();
    if (ff_model_generate(m, &gc, q, B, &o, &n) != 0 || n != B) return -1;
    double dt = now_s() - t0;
    for (int i = 0; i < n; i++) {
        if (o[i].n_tokens != NEW) dt = -1;
        else memcpy(toks + (size_t)o[i].id * NEW, o[i].tokens, NEW * 4);
        ff_gen_output_free(&o[i]);
    }
    free(o);
    return dt;
}

static double score(ff_model *m, const int32_t *tokens, float *lp) {
    int32_t ss[SCORE_SEQS + 1], tg[SCORE_T];
    for (int s = 0; s <= SCORE_SEQS; s++) ss[s] = s * SCORE_LEN;
    ff_batch_shift_targets(tokens, ss, SCORE_SEQS, tg);
    ff_batch b = {.n_tokens = SCORE_T, .n_seqs = SCORE_SEQS, .tokens = tokens, .seq_start = ss, .targets = tg};
    ff_forward_opts fo = {.temperature = 1.0f};
    ff_forward_out out = {.logprobs = lp};
    double t0 = now_s();
    if (ff_model_forward(m, &b, &fo, &out) != 0) return -1;
    return now_s() - t0;
}

int main(int argc, char **argv) {
    int threads = 0, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) reps = 1;
        else {
            fprintf(stderr, "usage: bench_bf16 [--threads N] [--quick]\n");
            return 2;
        }
    }
    char name[32];
    snprintf(name, sizeof name, threads > 0 ? "cpu:%d" : "cpu", threads);
    ff_backend *be = ff_backend_new(name);
    setenv("FF_BATCH_INVARIANT", "fixed", 1); /* read when a backend is made */
    ff_backend *fixed = ff_backend_new(name);
    unsetenv("FF_BATCH_INVARIANT");
    if (!be || !fixed) return die("backend");
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = 16384;
    c.hidden_size = 1024;
    c.intermediate_size = 2816;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 1024;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.bos_token_id = c.pad_token_id = -1; /* no eos: every sequence runs its NEW tokens */
    ff_tensor_set *w = ff_tensor_set_new();
    if (!w || ff_model_init_weights(&c, 1, 0.02, w)) return die("init");
    ff_model *m[KINDS] = {
        ff_model_new_opts(be, &c, w, &(ff_model_opts){.inference = true}),
        ff_model_new_opts(fixed, &c, w, &(ff_model_opts){.inference = true}),
        ff_model_new_opts(be, &c, w, &(ff_model_opts){.inference = true, .bf16_weights = true}),
    };
    ff_tensor_set_destroy(&w);
    for (int k = 0; k < KINDS; k++)
        if (!m[k]) return die("model");
    int32_t *prompts = malloc(8 * PROMPT * sizeof *prompts), *stoks = malloc(SCORE_T * sizeof *stoks);
    int32_t *toks = malloc((size_t)KINDS * 8 * NEW * sizeof *toks);
    float *lp = malloc((size_t)KINDS * SCORE_T * sizeof *lp);
    if (!prompts || !stoks || !toks || !lp) return die("memory");
    ff_rng rng;
    ff_rng_seed(&rng, 1);
    for (int i = 0; i < 8 * PROMPT; i++) prompts[i] = (int32_t)ff_rng_below(&rng, (uint64_t)c.vocab_size);
    for (int i = 0; i < SCORE_T; i++) stoks[i] = (int32_t)ff_rng_below(&rng, (uint64_t)c.vocab_size);
    printf("bench_bf16: %d threads; %.1fM parameters\n", ff_backend_threads(be), (double)ff_model_param_count(m[0]) / 1e6);

    double dec[KINDS][BATCHES] = {{0}}, sc[KINDS] = {0};
    for (int r = 0; r <= reps; r++) /* r = 0 warms up, untimed */
        for (int k = 0; k < KINDS; k++) {
            for (int b = 0; b < BATCHES; b++) {
                double t = decode(m[k], batch[b], prompts, toks + (size_t)k * 8 * NEW);
                if (t < 0) return die("decode");
                if (r && (dec[k][b] == 0 || t < dec[k][b])) dec[k][b] = t;
            }
            double t = score(m[k], stoks, lp + (size_t)k * SCORE_T);
            if (t < 0) return die("score");
            if (r && (sc[k] == 0 || t < sc[k])) sc[k] = t;
        }
    double worst = 0;
    for (int i = 0; i < SCORE_T; i++) worst = fmax(worst, fabs((double)lp[2 * SCORE_T + i] - lp[i]));
    int same_tokens = 0;
    for (int i = 0; i < 8 * NEW; i++) same_tokens += toks[i] == toks[2 * 8 * NEW + i];
    printf("%-11s %14s %14s %14s %12s\n", "weights", "decode B=1", "decode B=8", "score T=512", "param MiB");
    for (int k = 0; k < KINDS; k++) {
        ff_model_memory mm;
        ff_model_memory_of(m[k], &mm);
        printf("%-11s %10.1f t/s %10.1f t/s %10.0f t/s %12.1f\n", kind_name[k], NEW / dec[k][0], 8 * NEW / dec[k][1],
               SCORE_T / sc[k], (double)mm.params / 1048576.0);
    }
    printf("bf16 / fp32: decode B=1 %.2fx, B=8 %.2fx, score %.2fx; bf16 / fp32 fixed: decode B=1 %.2fx, B=8 %.2fx, score %.2fx\n",
           dec[0][0] / dec[2][0], dec[0][1] / dec[2][1], sc[0] / sc[2], dec[1][0] / dec[2][0], dec[1][1] / dec[2][1], sc[1] / sc[2]);
    printf("bf16 against fp32: max |d logprob| %.3g over %d tokens; greedy tokens equal at %d of %d places (B = 8)\n", worst, SCORE_T,
           same_tokens, 8 * NEW);
    ff_model_memory m16, m32;
    ff_model_memory_of(m[2], &m16);
    ff_model_memory_of(m[0], &m32);
    printf("bench_bf16: bf16 weights decode %.2fx fp32's tokens/s at batch 1, in %.2fx the parameter memory (target: >= 1.3x, <= 0.55x)\n",
           dec[0][0] / dec[2][0], (double)m16.params / (double)m32.params);
    free(prompts), free(stoks), free(toks), free(lp);
    for (int k = 0; k < KINDS; k++) ff_model_destroy(&m[k]);
    ff_backend_destroy(&be);
    ff_backend_destroy(&fixed);
    return 0;
}

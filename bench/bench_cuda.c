/* bench_cuda: the model engine on the CUDA backend at real sizes, random weights.
 *
 * For a Qwen2.5-0.5B-shaped and a Llama-3.2-1B-shaped model (the published configs; random
 * weights, std 0.02, norms 1, biases 0) it measures:
 *   train   tokens/s of an SFT step on --accum sequences (4) of --seq tokens (2048) each: per
 *           sequence a training forward, token-mean cross-entropy on the host and a backward
 *           that adds to the gradients, then grad-norm clipping and AdamW once (an RLHF
 *           mini-batch of several micro-batches per optimizer step; --accum 1: the optimizer
 *           every sequence, where AdamW's pass over the fp32 masters and states, about 35 GB
 *           for the 1B shape, costs as much as a third of a sequence's forward and backward).
 *           The LM head's chunk is the default (ff_model_logits_chunk_of: on a GPU of 80 GB
 *           a sequence's [seq, V] logits stay whole for the backward, as PyTorch keeps them;
 *           the memory line says which); the median of --steps steps after two warm-up steps. Model FLOP
 *           utilisation = flops per token x tokens/s / 989 TFLOP/s (the H200's dense bf16
 *           peak; what the issue measures against), with flops per token = 6 x the matrix
 *           parameters (every projection and the LM head, embeddings' gather excluded) +
 *           6 x layers x hidden x seq / 2 x 2 (causal attention's QK^T and PV, fwd + bwd).
 *   decode  generated tokens/s of a batch of B prompts (--prompt tokens each, B in
 *           --batches, 32,1,256), temperature-1 sampling, --new tokens per sequence, KV cache
 *           (ff_generator: continuous batching, one slot per sequence); the wall time from
 *           submit to the last token, prefill included. Each decode step is a replayed CUDA
 *           graph (the default; ff_generator_graph_stats), and the same decode runs again
 *           kernel by kernel (ff_generator_config.eager) beside it:
 *             MODEL decode batch B: X tok/s with graphs (...), Y tok/s kernel by kernel (X/Y x)
 *           At the batch nearest 32, the same decode on a view of a trained model (what a
 *           colocated RL run generates with; under bf16 products it reads the model's bf16 copy):
 *             MODEL decode batch B on a colocated view of the trained model: X tok/s (...), Y
 *             tok/s with bf16 weights of its own (X/Y x)
 * Numbers: training keeps fp32 tensors between kernels (include/fuseflow/backend.h) and multiplies
 * in bf16 (the backend's default unless FF_CUDA_MATH says otherwise: bf16 products, the model's bf16 copy of
 * its weights made once an optimizer step, docs/model.md "bf16 products"). The decoding model is an
 * inference model with bf16 weights (ff_model_opts.bf16_weights, ff_gemm_bf16w: the weights
 * stored bf16 and read as they are, activations rounded to bf16 per product, fp32 between
 * kernels) unless --decode-weights fp32, and a KV cache in bf16 (ff_generator_config.kv_bf16)
 * unless --decode-kv fp32, as HF generate holds a bf16 model's; say which beside any comparison.
 *
 * Each line is one measurement; the last lines are the headlines:
 *   bench_cuda_train MODEL: X tok/s, MFU Y % (target on llama1b: >= 40 %, >= PyTorch eager)
 *   bench_cuda_decode MODEL batch B: X tok/s (target at batch 32: >= 3x HF generate)
 * bench/bench_cuda_torch.py prints the same lines for PyTorch; scripts/gpu-check.sh runs both.
 *
 * Before them, the training attention alone (fwd + bwd, one sequence of --seq tokens with each
 * model's heads) on the tensor-core kernels and on the fp32 CUDA-core ones side by side:
 *   bench_cuda_attention MODEL: fwd+bwd X ms on tensor cores, ... fp32 cores Y ms (X/Y)
 * The training step's attention is FF_CUDA_ATTENTION's (bf16 tensor cores by default). With
 * FF_CUDA_ATTENTION=fp32 set, the tensor-core kernels are not run at all (no such lines) and
 * the training headline says FF_CUDA_ATTENTION=fp32: gpu-check's second run, where the first
 * one failed on the device.
 *
 * With bf16 products, each training measurement is followed by the same model with them off
 * (every operand rounded per product instead of the weights' copy and gradients rounded once),
 * side by side:
 *   MODEL train with bf16 products: X tok/s with the weights' bf16 copy, Y tok/s rounding every
 *   operand per product (X/Y)
 * Then, time left, the training step again with TF32 products (FF_CUDA_MATH=tf32, fp32 operands):
 *   bench_cuda_train_tf32 MODEL: X tok/s, MFU Y %
 *
 * Then, time left, decoding at a long context (--long BATCH:PROMPT, 4:4032): few sequences of
 * thousands of keys, the first model asked for, its attention's keys split over blocks (the
 * default) beside one block a head group (FF_CUDA_DECODE_SPLIT=0); decode tokens/s, the prefills'
 * time taken out:
 *   bench_cuda_decode_long MODEL batch B, context C: X decode tok/s with the keys split, Y ... (X/Y)
 * Last, time left, the kernels of the largest model's training step (bf16 products) timed one
 * by one (FF_PROFILE_KERNELS): "bench_cuda_profile MODEL: ...", then the backend's table of
 * calls, ms and share per kernel (on stderr; gpu-check keeps it): where the step's time goes.
 *
 * Usage: bench_cuda [--device cuda:0] [--models llama1b,qwen0.5b] [--seq 2048] [--accum 4] [--steps 5]
 *                   [--batches 32,1,256] [--prompt 32] [--new 64] [--budget SECONDS]
 *                   [--tf32-train 0|1] [--profile 0|1] [--long BATCH:PROMPT] [--decode-weights bf16|fp32] [--decode-kv bf16|fp32]
 * --budget: stop starting new measurements once this much wall time has passed (default
 * 240), so a slow kernel cannot make the GPU check overrun; what was skipped is printed. The
 * models go in the order --models names them, each its training then its decode batches in
 * --batches' order: by default what the targets are about comes first (the 1B model's
 * training, then its decoding at batch 32), so a budget spent early cuts the rest. Each model's
 * decoding starts after one untimed decode (batch 1, 4 new tokens) that loads its kernels and
 * makes its stream's workspace, so no measured batch pays for them (bench_cuda_torch.py warms
 * HF generate the same way).
 * --models tiny (a 2-layer, 128-wide model) is for smoke tests: tests/kernels/test_bench_cuda_emu.sh
 * runs this program on the CUDA emulator with it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/error.h"
#include "fuseflow/kernels.h"
#include "fuseflow/model.h"
#include "fuseflow/util.h"

#define PEAK_TFLOPS 989.0 /* H200 (and H100 SXM) dense bf16 */

typedef struct spec {
    const char *name;
    ff_model_config cfg;
} spec;

static ff_model_config base_cfg(int V, int H, int I, int L, int Hq, int Hkv, bool tied, bool bias, double theta) {
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, bias ? "qwen2" : "llama");
    c.vocab_size = V;
    c.hidden_size = H;
    c.intermediate_size = I;
    c.num_hidden_layers = L;
    c.num_attention_heads = Hq;
    c.num_key_value_heads = Hkv;
    c.head_dim = H / Hq;
    c.max_position_embeddings = 32768;
    c.rope_theta = theta;
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = tied;
    c.attention_bias = bias;
    c.bos_token_id = -1;
    c.pad_token_id = -1;
    c.n_eos = 0; /* random weights: never stop early, every sequence decodes --new tokens */
    return c;
}

/* Fast random weights: ff_model_init_weights draws Box-Muller normals, about a minute for
 * a billion parameters; uniform with the same std from an xorshift is seconds. */
static ff_tensor_set *random_weights(const ff_model_config *c) {
    ff_tensor_set *w = ff_tensor_set_new();
    if (!w || ff_model_expected_tensors(c, w)) {
        ff_tensor_set_destroy(&w);
        return NULL;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    const float a = 0.02f * sqrtf(3.0f);
    for (size_t i = 0; i < w->n; i++) {
        ff_host_tensor *t = &w->items[i];
        int64_t n = ff_host_tensor_numel(t);
        bool norm = strstr(t->name, "norm") != NULL, bias = strstr(t->name, "bias") != NULL;
        for (int64_t j = 0; j < n; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            t->data[j] = norm ? 1.0f : bias ? 0.0f : a * (float)((double)(x >> 11) * 0x1.0p-52 - 1.0);
        }
    }
    return w;
}

static ff_model *random_model(ff_backend *be, const ff_model_config *c, bool inference, bool w16) {
    ff_tensor_set *w = random_weights(c);
    if (!w) return NULL;
    ff_model_opts o = {.inference = inference, .bf16_weights = w16};
    return ff_model_new_from(be, c, &w, &o);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Matrix parameters per token, the FLOP model above. */
static double flops_per_token(const ff_model_config *c, int seq) {
    double H = c->hidden_size, I = c->intermediate_size, D = c->head_dim, L = c->num_hidden_layers;
    double per_layer = H * (c->num_attention_heads + 2.0 * c->num_key_value_heads) * D + c->num_attention_heads * D * H +
                       3.0 * H * I;
    double matrix = L * per_layer + H * (double)c->vocab_size; /* the LM head, tied or not */
    return 6.0 * matrix + 6.0 * L * c->num_attention_heads * D * seq; /* causal: half of 12 L H seq */
}

/* The headline lines, printed as soon as measured (a run stopped by a time limit keeps them)
 * and again together at the end. */
/* sequences a training step (--accum): each its forward and backward, one optimizer step after */
static int accum = 4;

static void head_train(const char *tag, const char *name, double tok_s, double mfu, int seq, const char *note) {
    printf("%s %s: %.0f tok/s, MFU %.1f %% of %.0f TFLOP/s (seq %d, %d a step%s)\n", tag, name, tok_s, mfu, PEAK_TFLOPS, seq,
           accum, note);
    fflush(stdout);
}
static void head_decode(const char *name, int B, double tok_s) {
    printf("bench_cuda_decode %s batch %d: %.0f tok/s (target at batch 32: >= 3x HF generate)\n", name, B, tok_s);
    fflush(stdout);
}
#define TRAIN_NOTE "; target on llama1b: >= 40 %, >= PyTorch eager"

/* Training attention alone, fwd + bwd over one sequence of seq tokens with the model's
 * heads: the median of 5 timed calls (after one warm-up) in ms. flops: the FLOP model's
 * causal attention, 6 Hq D seq^2 (the backward's recomputation of P not counted). */
static int bench_attention(ff_backend *be, const spec *s, int seq, double *ms) {
    const ff_model_config *c = &s->cfg;
    const int Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim, T = seq;
    const int ld = (Hq + 2 * Hkv) * D;
    ff_stream *st = ff_backend_stream(be);
    ff_buffer *qkv = ff_buffer_new(be, (size_t)T * ld * 4), *dqkv = ff_buffer_new(be, (size_t)T * ld * 4);
    ff_buffer *out = ff_buffer_new(be, (size_t)T * Hq * D * 4), *dout = ff_buffer_new(be, (size_t)T * Hq * D * 4);
    ff_buffer *lse = ff_buffer_new(be, (size_t)T * Hq * 4), *delta = ff_buffer_new(be, (size_t)T * Hq * 4);
    ff_buffer *ssb = ff_buffer_new(be, 8);
    int rc = -1;
    if (qkv && dqkv && out && dout && lse && delta && ssb) {
        float *h = malloc((size_t)T * ld * 4);
        ff_rng rng;
        ff_rng_seed(&rng, 3);
        for (size_t i = 0; h && i < (size_t)T * ld; i++) h[i] = (float)(ff_rng_uniform(&rng) * 2 - 1);
        int32_t ss[2] = {0, T};
        if (h) {
            ff_memcpy_h2d(st, ff_dptr_of(qkv, 0), h, (size_t)T * ld * 4);
            ff_memcpy_h2d(st, ff_dptr_of(dout, 0), h, (size_t)T * Hq * D * 4);
            ff_memcpy_h2d(st, ff_dptr_of(ssb, 0), ss, 8);
            double t[6];
            for (int i = 0; i < 6; i++) {
                int64_t t0 = ff_now_ns();
                ff_attention_fwd(st, ff_dptr_of(qkv, 0), ld, ff_dptr_of(ssb, 0), 1, T, Hq, Hkv, D, ff_dptr_of(out, 0),
                                 ff_dptr_of(lse, 0));
                ff_attention_bwd(st, ff_dptr_of(qkv, 0), ld, ff_dptr_of(ssb, 0), ss, 1, T, Hq, Hkv, D, ff_dptr_of(out, 0),
                                 ff_dptr_of(lse, 0), ff_dptr_of(dout, 0), ff_dptr_of(delta, 0), ff_dptr_of(dqkv, 0));
                if (ff_stream_sync(st)) break;
                t[i] = (double)(ff_now_ns() - t0) * 1e-6;
                if (i == 5) {
                    qsort(t + 1, 5, sizeof t[0], cmp_double);
                    *ms = t[3];
                    rc = 0;
                }
            }
            free(h);
        }
    }
    if (rc) fprintf(stderr, "bench_cuda: %s attention on %s: %s\n", s->name, ff_backend_name(be), ff_error_message());
    ff_buffer *all[] = {qkv, dqkv, out, dout, lse, delta, ssb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ff_buffer_destroy(&all[i]);
    return rc;
}

/* Both attention kernels side by side (FF_CUDA_ATTENTION=fp32 and bf16 backends, the same
 * device) on each model's heads: one line each, the ratio against the fp32 CUDA cores. */
static void attention_side_by_side(const char *device, const spec *specs, const bool *chosen, int n, int seq) {
    const char *keep = getenv("FF_CUDA_ATTENTION");
    char saved[32] = "";
    if (keep) snprintf(saved, sizeof saved, "%s", keep);
    setenv("FF_CUDA_ATTENTION", "fp32", 1);
    ff_backend *b32 = ff_backend_new(device);
    setenv("FF_CUDA_ATTENTION", "bf16", 1);
    ff_backend *btc = ff_backend_new(device);
    if (keep) setenv("FF_CUDA_ATTENTION", saved, 1);
    else unsetenv("FF_CUDA_ATTENTION");
    for (int k = 0; b32 && btc && k < n; k++) {
        if (!chosen[k]) continue;
        double m32 = 0, mtc = 0;
        if (bench_attention(b32, &specs[k], seq, &m32) || bench_attention(btc, &specs[k], seq, &mtc)) continue;
        const ff_model_config *c = &specs[k].cfg;
        double fl = 6.0 * c->num_attention_heads * c->head_dim * (double)seq * seq;
        printf("bench_cuda_attention %s: fwd+bwd %.2f ms on tensor cores, %.1f TFLOP/s; fp32 cores %.2f ms, %.1f TFLOP/s "
               "(%.2fx the fp32 kernels' time; seq %d, %d/%d heads, head_dim %d)\n",
               specs[k].name, mtc, fl / mtc * 1e-9, m32, fl / m32 * 1e-9, mtc / m32, seq, c->num_attention_heads,
               c->num_key_value_heads, c->head_dim);
        fflush(stdout);
    }
    ff_backend_destroy(&b32);
    ff_backend_destroy(&btc);
}

/* The median tokens/s of `steps` timed training steps (after two warm-up steps) of model m, its
 * optimizer o: each step `accum` forwards and backwards of batch b, then one optimizer step;
 * 0 or -1. */
static int time_steps(ff_model *m, ff_optimizer *o, const spec *s, const ff_batch *b, const float *mask, int steps,
                      const char *label, float *lp, float *dlp, double *dt, double *tok_s) {
    const int seq = b->n_tokens;
    ff_forward_opts fo = {.train = true};
    for (int i = 0; i < steps + 2; i++) {
        int64_t t0 = ff_now_ns();
        ff_forward_out out = {.logprobs = lp};
        if (ff_model_zero_grad(m)) return -1;
        double loss = 0;
        for (int a = 0; a < accum; a++) { /* the gradients add up over the step's sequences */
            if (ff_model_forward(m, b, &fo, &out)) return -1;
            loss += ff_sft_loss(lp, mask, seq, 1.0f / (float)accum, dlp) / accum; /* the token mean already */
            if (ff_model_backward(m, dlp, NULL, NULL)) return -1;
        }
        ff_optim_stats st;
        if (ff_optimizer_step(o, &st)) return -1; /* the norm syncs */
        dt[i] = (double)(ff_now_ns() - t0) * 1e-9;
        printf("  %s train step %d%s: %.1f ms, loss %.4f, grad norm %.3f%s\n", s->name, i, label, dt[i] * 1e3, loss,
               st.grad_norm, i < 2 ? " (warm-up)" : "");
        fflush(stdout);
    }
    qsort(dt + 2, (size_t)steps, sizeof(double), cmp_double);
    *tok_s = (double)seq * accum / dt[2 + steps / 2];
    return 0;
}

/* Training tokens/s and MFU of an SFT step (the file's comment). With bf16 products on the
 * backend (FF_CUDA_MATH=bf16), the same model then trains again with them off (every operand
 * rounded per product instead of the weights' copy and gradients rounded once): *tok_s_off, the
 * side-by-side figure (0 when not measured; tok_s_off NULL: not run). */
static int bench_train(ff_backend *be, const spec *s, int seq, int steps, double *tok_s, double *mfu, double *tok_s_off) {
    ff_backend_memory before, after;
    ff_backend_memory_of(be, &before);
    ff_backend_memory_reset_peak(be); /* the training's peak, less what was held before (as bench_cuda_torch.py takes it) */
    ff_model *m = random_model(be, &s->cfg, false, false);
    if (!m) return -1;
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.max_grad_norm = 1.0;
    ff_optimizer *o = ff_optimizer_new(m, &ac);
    int32_t *tok = malloc((size_t)seq * 4), *tg = malloc((size_t)seq * 4), ss[2] = {0, seq};
    float *lp = malloc((size_t)seq * 4), *dlp = malloc((size_t)seq * 4), *mask = malloc((size_t)seq * 4);
    double *dt = malloc((size_t)(steps + 2) * sizeof(double));
    int rc = -1;
    if (!o || !tok || !tg || !lp || !dlp || !mask || !dt) goto out;
    ff_rng rng;
    ff_rng_seed(&rng, 1);
    for (int t = 0; t < seq; t++) tok[t] = (int32_t)ff_rng_below(&rng, (uint64_t)s->cfg.vocab_size);
    ff_batch_shift_targets(tok, ss, 1, tg);
    for (int t = 0; t < seq; t++) mask[t] = tg[t] >= 0 ? 1.0f : 0.0f;
    ff_batch b = {.n_tokens = seq, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
    if (time_steps(m, o, s, &b, mask, steps, ff_model_bf16_products(m) ? " (bf16 products, the weights' copy)" : "", lp, dlp,
                   dt, tok_s))
        goto out;
    *mfu = 100.0 * flops_per_token(&s->cfg, seq) * *tok_s / (PEAK_TFLOPS * 1e12);
    ff_backend_memory_of(be, &after);
    printf("  %s train peak device memory: %.2f GiB (the backend's buffers and workspace: weights, gradients, AdamW, "
           "activations; %d x %d tokens a step; %s)\n",
           s->name, (double)(after.peak - before.in_use) / 1073741824.0, accum, seq,
           ff_model_bf16_products(m) ? "bf16 products" : "fp32 operands");
    if (ff_model_bf16_products(m))
        printf("  %s: the weights' bf16 copy made %lld times in %d forwards (once an optimizer step)\n", s->name,
               (long long)ff_model_bf16_copies(m), (steps + 2) * accum);
    ff_model_memory mm;
    ff_model_memory_of(m, &mm);
    const int32_t chunk = ff_model_logits_chunk_of(m, seq);
    printf("  %s: %.0f M params, %.2f GFLOP/token, device memory: params %.2f GiB, grads %.2f GiB, workspace %.2f GiB "
           "(activations %.2f GiB), AdamW %.2f GiB; LM head in chunks of %d tokens (%s)\n",
           s->name, ff_model_param_count(m) * 1e-6, flops_per_token(&s->cfg, seq) * 1e-9, mm.params / 1073741824.0,
           mm.grads / 1073741824.0, mm.workspace / 1073741824.0, mm.activations / 1073741824.0,
           ff_optimizer_state_bytes(o) / 1073741824.0, chunk,
           chunk == seq ? "the logits kept for the backward" : "the backward computes them again");
    if (tok_s_off) *tok_s_off = 0;
    if (tok_s_off && ff_model_bf16_products(m)) {
        if (ff_model_set_bf16_products(m, false) ||
            time_steps(m, o, s, &b, mask, steps, " (every operand rounded per product)", lp, dlp, dt, tok_s_off))
            goto out;
        ff_model_memory off;
        ff_model_memory_of(m, &off);
        printf("  %s train with bf16 products: %.0f tok/s with the weights' bf16 copy and bf16 saved inputs (activations "
               "%.2f GiB), %.0f tok/s rounding every operand per product (%.2f GiB) (%.2fx)\n",
               s->name, *tok_s, mm.activations / 1073741824.0, *tok_s_off, off.activations / 1073741824.0,
               *tok_s / *tok_s_off);
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "bench_cuda: %s train: %s\n", s->name, ff_error_message());
    ff_optimizer_destroy(&o);
    ff_model_destroy(&m);
    free(tok), free(tg), free(lp), free(dlp), free(mask), free(dt);
    return rc;
}

/* Decoding B prompts of `prompt` tokens, n_new tokens each: *tok_s over the wall time from
 * submit to the last token; *dec_tok_s (NULL: not wanted) the tokens after each sequence's
 * first over that time less the prefills' (ff_generator_prefill_stats). */
static int bench_decode(ff_model *m, const spec *s, int B, int prompt, int n_new, bool kv16, bool eager, double *tok_s,
                        ff_generator_graph_stats *gs, double *dec_tok_s) {
    ff_generator_config gc = {.max_slots = B, .max_seq_len = prompt + n_new + 1,
                              .max_prefill_tokens = B * prompt < 8192 ? B * prompt : 8192, /* every prompt in one or a few steps */
                              .kv_bf16 = kv16, .eager = eager};
    ff_generator *g = ff_generator_new(m, &gc);
    if (!g) return -1;
    int32_t *p = malloc((size_t)B * prompt * 4);
    ff_rng rng;
    ff_rng_seed(&rng, 2);
    for (int i = 0; i < B * prompt; i++) p[i] = (int32_t)ff_rng_below(&rng, (uint64_t)s->cfg.vocab_size);
    int rc = -1;
    int64_t t0 = ff_now_ns(), made = 0;
    for (int i = 0; i < B; i++) {
        ff_gen_request r;
        memset(&r, 0, sizeof r);
        r.id = (uint64_t)i;
        r.prompt = p + (size_t)i * prompt;
        r.prompt_len = prompt;
        r.n_samples = 1;
        ff_sampling_default(&r.sampling);
        r.sampling.max_new_tokens = n_new;
        r.seed = (uint64_t)i;
        if (ff_generator_submit(g, &r)) goto out;
    }
    while (ff_generator_pending(g) > 0) {
        if (ff_generator_step(g)) goto out;
        ff_gen_output o;
        while (ff_generator_pop(g, &o) == 1) {
            made += o.n_tokens;
            ff_gen_output_free(&o);
        }
    }
    const double wall = (double)(ff_now_ns() - t0) * 1e-9;
    *tok_s = (double)made / wall;
    ff_generator_graph_stats_of(g, gs);
    if (dec_tok_s) {
        int64_t ptok;
        double psec;
        ff_generator_prefill_stats(g, &ptok, &psec);
        *dec_tok_s = wall > psec ? (double)(made - B) / (wall - psec) : 0.0;
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "bench_cuda: %s decode batch %d%s: %s\n", s->name, B, eager ? " (eager)" : "", ff_error_message());
    ff_generator_destroy(&g);
    free(p);
    return rc;
}

/* A colocated RL run decodes on a view of the trained model (docs/run.md "Memory of the
 * colocated copy"); under bf16 products the view's products read the model's bf16 copy of its
 * weights, the bytes an inference model's bf16 weights are. The same decode as bench_decode's
 * with graphs, on such a view, beside own_tok_s (an inference model's with bf16 weights). */
static int bench_colocated(ff_backend *be, const spec *s, int B, int prompt, int n_new, bool kv16, double own_tok_s) {
    ff_tensor_set *w = random_weights(&s->cfg);
    ff_model *mt = w ? ff_model_new(be, &s->cfg, w) : NULL;
    const ff_model_opts ov = {.inference = true, .view_of = mt};
    ff_model *mv = mt ? ff_model_new_opts(be, &s->cfg, w, &ov) : NULL;
    ff_tensor_set_destroy(&w);
    int rc = -1;
    double tok_s = 0;
    ff_generator_graph_stats gs;
    if (mv && bench_decode(mv, s, B, prompt, n_new, kv16, false, &tok_s, &gs, NULL) == 0) {
        printf("  %s decode batch %d on a colocated view of the trained model: %.0f tok/s (%s, made %lld time%s), %.0f tok/s "
               "with bf16 weights of its own (%.2fx)\n",
               s->name, B, tok_s, ff_model_bf16_copies(mt) ? "the model's bf16 copy" : "its fp32 weights rounded per product",
               (long long)ff_model_bf16_copies(mt), ff_model_bf16_copies(mt) == 1 ? "" : "s", own_tok_s,
               own_tok_s > 0 ? tok_s / own_tok_s : 0.0);
        rc = 0;
    }
    if (rc) fprintf(stderr, "bench_cuda: %s decode on a colocated view: %s\n", s->name, ff_error_message());
    ff_model_destroy(&mv);
    ff_model_destroy(&mt);
    return rc;
}

int main(int argc, char **argv) {
    const char *device = "cuda", *models = "llama1b,qwen0.5b", *batches = "32,1,256";
    int seq = 2048, steps = 5, prompt = 32, n_new = 64, tf32_train = 1, profile = 1, long_b = 4, long_prompt = 4032;
    bool decode_w16 = true, decode_kv16 = true;
    double budget = 240;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_cuda: %s needs a value (see the usage at the top of bench/bench_cuda.c)\n", a);
            return 2;
        }
        if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--models")) models = v;
        else if (!strcmp(a, "--batches")) batches = v;
        else if (!strcmp(a, "--seq")) seq = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--accum")) accum = atoi(v);
        else if (!strcmp(a, "--prompt")) prompt = atoi(v);
        else if (!strcmp(a, "--new")) n_new = atoi(v);
        else if (!strcmp(a, "--budget")) budget = atof(v);
        else if (!strcmp(a, "--tf32-train")) tf32_train = atoi(v);
        else if (!strcmp(a, "--profile")) profile = atoi(v);
        else if (!strcmp(a, "--long")) {
            if (sscanf(v, "%d:%d", &long_b, &long_prompt) != 2 || long_b < 0 || long_prompt < 1) {
                fprintf(stderr, "bench_cuda: --long wants BATCH:PROMPT (0:1 for none), got '%s'\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--decode-weights")) {
            if (strcmp(v, "bf16") && strcmp(v, "fp32")) {
                fprintf(stderr, "bench_cuda: --decode-weights wants bf16 or fp32, got '%s'\n", v);
                return 2;
            }
            decode_w16 = !strcmp(v, "bf16");
        } else if (!strcmp(a, "--decode-kv")) {
            if (strcmp(v, "bf16") && strcmp(v, "fp32")) {
                fprintf(stderr, "bench_cuda: --decode-kv wants bf16 or fp32, got '%s'\n", v);
                return 2;
            }
            decode_kv16 = !strcmp(v, "bf16");
        }
        else {
            fprintf(stderr, "bench_cuda: unknown option %s (see the usage at the top of bench/bench_cuda.c)\n", a);
            return 2;
        }
    }
    if (seq < 2 || steps < 1 || accum < 1 || prompt < 1 || n_new < 1) {
        fprintf(stderr, "bench_cuda: --seq >= 2, --steps, --accum, --prompt and --new >= 1\n");
        return 2;
    }
    spec specs[] = {
        {"qwen0.5b", base_cfg(151936, 896, 4864, 24, 14, 2, true, true, 1000000.0)},
        {"llama1b", base_cfg(128256, 2048, 8192, 16, 32, 8, true, false, 500000.0)},
        /* only when named: a smoke test of this program (tests/kernels/test_bench_cuda_emu.sh) */
        {"tiny", base_cfg(512, 128, 256, 2, 4, 2, true, false, 10000.0)},
    };
    enum { NSPEC = 3, MAXB = 8 };
    int order[NSPEC], norder = 0; /* --models, in its order */
    bool chosen[NSPEC] = {0};
    for (const char *c = models; *c;) {
        const size_t len = strcspn(c, ",");
        int k = 0;
        while (k < NSPEC && (strlen(specs[k].name) != len || strncmp(specs[k].name, c, len))) k++;
        if (k == NSPEC || chosen[k]) {
            fprintf(stderr, "bench_cuda: --models: %s '%.*s' (known: qwen0.5b, llama1b, tiny)\n",
                    k == NSPEC ? "unknown model" : "a model named twice:", (int)len, c);
            return 2;
        }
        chosen[k] = true;
        order[norder++] = k;
        c += len;
        if (*c) c++;
    }
    int bs[MAXB], nb = 0;
    for (const char *c = batches; *c;) {
        char *end;
        const long b = strtol(c, &end, 10);
        if (end == c || (*end && *end != ',') || b < 1 || b > 4096 || nb == MAXB) {
            fprintf(stderr, "bench_cuda: --batches wants up to %d batch sizes of 1 to 4096 separated by commas, got '%s'\n",
                    MAXB, batches);
            return 2;
        }
        bs[nb++] = (int)b;
        c = *end ? end + 1 : end;
    }
    if (norder == 0 || nb == 0) {
        fprintf(stderr, "bench_cuda: --models and --batches each want at least one entry\n");
        return 2;
    }
    ff_backend *be = ff_backend_new(device);
    if (!be) {
        fprintf(stderr, "bench_cuda: %s\n", ff_error_message());
        return 1;
    }
    const char *math = getenv("FF_CUDA_MATH"), *att = getenv("FF_CUDA_ATTENTION");
    /* the products: FF_CUDA_MATH where it is set, else the backend's default, bf16 (what the
     * targets are about) */
    const char *train_math = math && *math ? math : "bf16";
    /* FF_CUDA_ATTENTION=fp32 asked for (gpu-check's second run where the first failed): the
     * tensor-core kernels stay unrun, and the headline says which attention trained */
    const bool att_fp32 = att && !strcmp(att, "fp32");
    char train_note[192];
    snprintf(train_note, sizeof train_note, ", FF_CUDA_MATH=%s%s%s", train_math, att_fp32 ? ", FF_CUDA_ATTENTION=fp32" : "",
             TRAIN_NOTE);
    printf("bench_cuda: %s, training's FF_CUDA_MATH=%s, decoding's %s, FF_CUDA_ATTENTION=%s, seq %d, %d a step, %d timed steps, decode prompt %d + %d new tokens, %s decode weights, "
           "%s KV cache\n",
           ff_backend_name(be), train_math, math && *math ? math : "bf16 (default)",
           att && *att ? att : (math && !strcmp(math, "fp32") ? "fp32 (as the products)" : "bf16 (default)"), seq, accum, steps, prompt, n_new, decode_w16 ? "bf16" : "fp32",
           decode_kv16 ? "bf16" : "fp32");
    if (att_fp32)
        printf("bench_cuda: the tensor-core attention not run (FF_CUDA_ATTENTION=fp32): no bench_cuda_attention lines\n");
    else
        attention_side_by_side(device, specs, chosen, NSPEC, seq);
    double tr[NSPEC] = {0}, mfu[NSPEC] = {0}, dec[NSPEC][MAXB] = {{0}};
    bool ran_tr[NSPEC] = {0}, ran_dec[NSPEC][MAXB] = {{0}};
    int64_t start = ff_now_ns();
    int failures = 0;
#define OVER_BUDGET() ((double)(ff_now_ns() - start) * 1e-9 > budget)
    for (int oi = 0; oi < norder; oi++) {
        const int k = order[oi];
        if (OVER_BUDGET()) {
            printf("  %s: skipped (budget of %.0f s spent)\n", specs[k].name, budget);
            continue;
        }
        double unused;
        if (bench_train(be, &specs[k], seq, steps, &tr[k], &mfu[k], &unused) == 0) {
            ran_tr[k] = true;
            head_train("bench_cuda_train", specs[k].name, tr[k], mfu[k], seq, train_note);
        } else {
            failures++;
        }
        ff_model *m = NULL;
        for (int j = 0; j < nb; j++) {
            if (OVER_BUDGET()) {
                printf("  %s decode batch %d: skipped (budget of %.0f s spent)\n", specs[k].name, bs[j], budget);
                continue;
            }
            if (!m) {
                ff_generator_graph_stats gw;
                double unused_tok_s;
                if (!(m = random_model(be, &specs[k].cfg, true, decode_w16)) ||
                    bench_decode(m, &specs[k], 1, prompt, 4, decode_kv16, false, &unused_tok_s, &gw, NULL)) {
                    fprintf(stderr, "bench_cuda: %s (the untimed warm-up decode): %s\n", specs[k].name, ff_error_message());
                    failures++;
                    break;
                }
                printf("  %s decode warm-up (untimed): batch 1, 4 new tokens\n", specs[k].name);
            }
            /* the default (decode steps as CUDA graphs), then kernel by kernel, side by side */
            ff_generator_graph_stats gs, ge;
            double eager_tok_s = 0;
            if (bench_decode(m, &specs[k], bs[j], prompt, n_new, decode_kv16, false, &dec[k][j], &gs, NULL) == 0) {
                ran_dec[k][j] = true;
                if (!gs.on) printf("  %s decode batch %d: graphs off: %s\n", specs[k].name, bs[j], gs.off_why);
                if (bench_decode(m, &specs[k], bs[j], prompt, n_new, decode_kv16, true, &eager_tok_s, &ge, NULL) == 0)
                    printf("  %s decode batch %d: %.0f tok/s with graphs (%d captured, %lld steps replayed, %lld eager), "
                           "%.0f tok/s kernel by kernel (%.2fx)\n",
                           specs[k].name, bs[j], dec[k][j], gs.captures, (long long)gs.replays, (long long)gs.eager_steps,
                           eager_tok_s, eager_tok_s > 0 ? dec[k][j] / eager_tok_s : 0.0);
                else
                    failures++;
                head_decode(specs[k].name, bs[j], dec[k][j]);
            } else {
                failures++;
            }
        }
        ff_model_destroy(&m);
        /* the colocated copy's decode at the batch nearest 32, beside the one above */
        int near = 0;
        for (int j = 1; j < nb; j++)
            if (abs(bs[j] - 32) < abs(bs[near] - 32)) near = j;
        if (nb > 0 && ran_dec[k][near] && !OVER_BUDGET() &&
            bench_colocated(be, &specs[k], bs[near], prompt, n_new, decode_kv16, dec[k][near]))
            failures++;
    }
    /* The training step again with TF32 products (fp32 operands, FF_CUDA_MATH=tf32), where the main
     * run was not already that and time is left. */
    double tr32[NSPEC] = {0}, mfu32[NSPEC] = {0};
    bool ran32[NSPEC] = {0};
    if (tf32_train && strcmp(train_math, "tf32")) {
        setenv("FF_CUDA_MATH", "tf32", 1);
        ff_backend *b32 = ff_backend_new(device);
        if (math) setenv("FF_CUDA_MATH", math, 1);
        else unsetenv("FF_CUDA_MATH");
        for (int k = 0; b32 && k < NSPEC; k++) {
            if (!chosen[k]) continue;
            if (OVER_BUDGET()) {
                printf("  %s train with TF32 products: skipped (budget of %.0f s spent)\n", specs[k].name, budget);
                continue;
            }
            printf("  %s train with TF32 products (FF_CUDA_MATH=tf32):\n", specs[k].name);
            if (bench_train(b32, &specs[k], seq, steps, &tr32[k], &mfu32[k], NULL) == 0) {
                ran32[k] = true;
                head_train("bench_cuda_train_tf32", specs[k].name, tr32[k], mfu32[k], seq, ", FF_CUDA_MATH=tf32");
            } else {
                failures++;
            }
        }
        ff_backend_destroy(&b32);
    }
    /* Where the time of a training step goes: one step (after two warm-up steps, all three
     * counted) of the largest model asked for, bf16 products, every kernel timed to its end
     * (FF_PROFILE_KERNELS: a sync after each, so the sum is above a step's time). */
    int big = -1;
    for (int k = 0; k < NSPEC; k++)
        if (chosen[k]) big = k;
    if (profile && big >= 0 && OVER_BUDGET()) printf("  kernel profile: skipped (budget of %.0f s spent)\n", budget);
    if (profile && big >= 0 && !OVER_BUDGET()) {
        setenv("FF_PROFILE_KERNELS", "1", 1);
        setenv("FF_CUDA_MATH", "bf16", 1);
        ff_backend *bp = ff_backend_new(device);
        unsetenv("FF_PROFILE_KERNELS");
        if (math) setenv("FF_CUDA_MATH", math, 1);
        else unsetenv("FF_CUDA_MATH");
        double tp = 0, mp = 0;
        printf("bench_cuda_profile %s: the kernels of 3 training steps (%d sequences of %d tokens each, FF_CUDA_MATH=bf16), "
               "printed when the backend goes:\n", specs[big].name, accum, seq);
        fflush(stdout);
        if (!bp || bench_train(bp, &specs[big], seq, 1, &tp, &mp, NULL)) failures++;
        fflush(stdout);
        ff_backend_destroy(&bp); /* prints the profile on stderr */
        fflush(stderr);
    }
    /* Decoding at a long context (the long tail of a rollout: few sequences, thousands of keys
     * each), the first model asked for: its attention with the keys split over blocks (the
     * default) beside one block a head group (FF_CUDA_DECODE_SPLIT=0), each on a backend and
     * model of its own. Decode tokens/s: the time of the prefills taken out. */
    int small = -1;
    for (int k = NSPEC - 1; k >= 0; k--)
        if (chosen[k]) small = k;
    double lt[2] = {0, 0};
    bool long_ran = false;
    if (long_b > 0 && small >= 0) {
        const char *keep = getenv("FF_CUDA_DECODE_SPLIT");
        char saved[8] = "";
        if (keep) snprintf(saved, sizeof saved, "%s", keep);
        long_ran = true;
        for (int split = 1; split >= 0 && long_ran; split--) {
            if (OVER_BUDGET()) {
                printf("  %s decode at a long context: skipped (budget of %.0f s spent)\n", specs[small].name, budget);
                long_ran = false;
                break;
            }
            setenv("FF_CUDA_DECODE_SPLIT", split ? "1" : "0", 1);
            ff_backend *bl = ff_backend_new(device);
            if (keep) setenv("FF_CUDA_DECODE_SPLIT", saved, 1);
            else unsetenv("FF_CUDA_DECODE_SPLIT");
            ff_model *ml = bl ? random_model(bl, &specs[small].cfg, true, decode_w16) : NULL;
            double all = 0;
            ff_generator_graph_stats gl;
            if (!ml || bench_decode(ml, &specs[small], long_b, long_prompt, n_new, decode_kv16, false, &all, &gl, &lt[split])) {
                fprintf(stderr, "bench_cuda: %s decode at a long context: %s\n", specs[small].name, ff_error_message());
                failures++;
                long_ran = false;
            }
            ff_model_destroy(&ml);
            ff_backend_destroy(&bl);
        }
        if (long_ran)
            printf("bench_cuda_decode_long %s batch %d, context %d: %.0f decode tok/s with the keys split, %.0f in one block a "
                   "head group (%.2fx)\n",
                   specs[small].name, long_b, long_prompt + n_new, lt[1], lt[0], lt[0] > 0 ? lt[1] / lt[0] : 0.0);
    }
    printf("bench_cuda: headlines\n");
    for (int k = 0; k < NSPEC; k++) {
        if (ran_tr[k]) head_train("bench_cuda_train", specs[k].name, tr[k], mfu[k], seq, train_note);
        if (ran32[k]) head_train("bench_cuda_train_tf32", specs[k].name, tr32[k], mfu32[k], seq, ", FF_CUDA_MATH=tf32");
        for (int j = 0; j < nb; j++)
            if (ran_dec[k][j]) head_decode(specs[k].name, bs[j], dec[k][j]);
    }
    if (long_ran)
        printf("bench_cuda_decode_long %s batch %d, context %d: %.0f decode tok/s with the keys split, %.0f in one block a head "
               "group (%.2fx)\n",
               specs[small].name, long_b, long_prompt + n_new, lt[1], lt[0], lt[0] > 0 ? lt[1] / lt[0] : 0.0);
    ff_backend_destroy(&be);
    return failures ? 1 : 0;
}

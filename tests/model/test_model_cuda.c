/* The model on the CUDA backend against the same model on the CPU backend (the reference):
 * a tiny Llama-shaped model with biases, GQA and an untied head, the same random weights on
 * both. Checks: a packed forward's log-probs and entropy (fp32 gemm: 2e-4; TF32: 3e-2,
 * 10-bit mantissa inputs; bf16 products, the default, in test_bf16_products), a critic's values, one SFT training step (loss,
 * gradient norm, every gradient, the parameters after AdamW), and generation: KV-cache
 * decoding's log-probs against a full forward over prompt + response on the GPU, and greedy
 * tokens equal to the CPU's (fp32 gemm, where near-ties cannot flip); an inference model with
 * bf16 weights against the CPU's (0.1: bf16 activations on the GPU) and its KV-cache decoding;
 * the same bf16 model loaded straight from a folder onto the GPU (ff_model_load_dir) holds
 * the CPU's parameter bytes.
 *
 * Needs a GPU: exits 77 (SKIPPED, saying why) without CUDA in the build or without a
 * device; tests/kernels/test_cuda_skip.sh checks that path here. */
#include "tests/model/model_test_util.h"

#if !defined(FF_HAVE_CUDA) && !defined(FF_TEST_CUDA_EMU)
int main(void) {
    (void)ff_test_failures;
    SKIP("cuda model test: fuseflow was built without CUDA (no CUDA toolkit at configure time, or FF_CUDA=OFF)");
}
#else
#include "tests/cuda_test_util.h"
#include <unistd.h>

#include "fuseflow/error.h"
#include "fuseflow/modelio.h"

/* A packed batch of three sequences (one of length 1), tokens from a fixed pattern. */
enum { NS = 3, NT = 61 };
static const int32_t seq_start[NS + 1] = {0, 27, 28, NT};
static int32_t tokens[NT], targets[NT];

static void forward_both(ff_model *mc, ff_model *mg, bool train, float temp, const char *what, double tol) {
    float lpc[NT], lpg[NT], ec[NT], eg[NT];
    ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
    ff_forward_opts o = {.train = train, .temperature = temp};
    ff_forward_out oc = {.logprobs = lpc, .entropy = ec}, og = {.logprobs = lpg, .entropy = eg};
    REQUIRE(ff_model_forward(mc, &b, &o, &oc) == 0);
    if (ff_model_forward(mg, &b, &o, &og)) {
        fprintf(stderr, "%s: cuda forward failed: %s\n", what, ff_error_message());
        ff_test_failures++;
        return;
    }
    char w[128];
    snprintf(w, sizeof w, "%s log-probs", what);
    check_tensor_close(w, lpg, lpc, NT, tol, 0);
    snprintf(w, sizeof w, "%s entropy", what);
    check_tensor_close(w, eg, ec, NT, tol, 0);
}

/* An SFT step's forward, loss and backward on both models: the losses, and the flat gradients
 * (malloc'd, n floats each; NULL when the GPU's backward failed, counted as a failure). */
static float *sft_grads(ff_model *mc, ff_model *mg, double *lc, double *lg, float **gc_out, int64_t *n) {
    float lpc[NT], lpg[NT], dc[NT], dg[NT], mask[NT];
    for (int t = 0; t < NT; t++) mask[t] = targets[t] >= 0 ? 1.0f : 0.0f;
    ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
    ff_forward_opts o = {.train = true};
    ff_forward_out oc = {.logprobs = lpc}, og = {.logprobs = lpg};
    REQUIRE(ff_model_forward(mc, &b, &o, &oc) == 0 && ff_model_forward(mg, &b, &o, &og) == 0);
    *lc = ff_sft_loss(lpc, mask, NT, 1.0f / NT, dc);
    *lg = ff_sft_loss(lpg, mask, NT, 1.0f / NT, dg);
    REQUIRE(ff_model_zero_grad(mc) == 0 && ff_model_zero_grad(mg) == 0);
    REQUIRE(ff_model_backward(mc, dc, NULL, NULL) == 0);
    if (ff_model_backward(mg, dg, NULL, NULL)) {
        fprintf(stderr, "cuda backward failed: %s\n", ff_error_message());
        ff_test_failures++;
        return NULL;
    }
    *n = ff_model_param_count(mc);
    float *gc = malloc((size_t)*n * 4), *gg = malloc((size_t)*n * 4);
    REQUIRE(ff_model_read_grads(mc, gc) == 0 && ff_model_read_grads(mg, gg) == 0);
    *gc_out = gc;
    return gg;
}

/* One SFT step on both: loss, gradient norm, gradients, updated parameters. */
static void train_step_both(ff_model *mc, ff_model *mg, double tol) {
    double lc, lg;
    float *gc = NULL;
    int64_t n = 0;
    float *gg = sft_grads(mc, mg, &lc, &lg, &gc, &n);
    CHECK_CLOSE(lg, lc, tol, 0);
    if (!gg) return;
    check_tensor_close("gradients (flat buffer)", gg, gc, n, tol * 1e-2, 20 * tol);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-3;
    ac.max_grad_norm = 0.5;
    ff_optimizer *oc_ = ff_optimizer_new(mc, &ac), *og_ = ff_optimizer_new(mg, &ac);
    REQUIRE(oc_ && og_);
    ff_optim_stats sc, sg;
    REQUIRE(ff_optimizer_step(oc_, &sc) == 0);
    CHECK(ff_optimizer_step(og_, &sg) == 0);
    CHECK_CLOSE(sg.grad_norm, sc.grad_norm, 0, 20 * tol);
    CHECK(sg.clipped == sc.clipped);
    ff_model_read_params(mc, gc);
    ff_model_read_params(mg, gg);
    /* Adam's first step moves each element by about lr g / |g|: where |g| is near its eps the
     * two gradients' last bits show (measured 1.4e-5 on an AVX-512 EPYC's BLAS); a wrong update
     * is off by a step's size */
    check_tensor_close("parameters after one AdamW step", gg, gc, n, 1e-5 + 5e-2 * ac.lr, 0);
    ff_optimizer_destroy(&oc_);
    ff_optimizer_destroy(&og_);
    free(gc);
    free(gg);
}

/* One SFT step's loss and gradients on a GPU model whose attention runs on tensor cores
 * (FF_CUDA_ATTENTION=bf16, exact fp32 products otherwise) against the CPU's: the loss within
 * 1e-2, every gradient within 3 % of the largest one (bf16 rounding of Q, K, V, dO and the
 * probabilities, ~0.4 % each, through two layers). */
static void train_step_tc(ff_model *mc, ff_model *mg) {
    double lc, lg;
    float *gc = NULL;
    int64_t n = 0;
    float *gg = sft_grads(mc, mg, &lc, &lg, &gc, &n);
    CHECK_CLOSE(lg, lc, 1e-2, 0);
    if (!gg) return;
    double mx = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(gc[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, isnan(gg[i]) ? INFINITY : fabs((double)gg[i] - gc[i]));
    if (!(worst <= 3e-2 * mx)) {
        fprintf(stderr, "tensor-core attention: gradients differ by %.3g, above 3%% of the largest %.3g\n", worst, mx);
        ff_test_failures++;
    }
    free(gc);
    free(gg);
}

/* bf16 products (FF_CUDA_MATH=bf16: ff_model_bf16_products on by default) against the same model
 * with them off (every operand rounded per product), over two SFT steps with an AdamW step
 * between. The weights' bf16 copy made after each change of them, each output gradient rounded once and the
 * normed rows kept in bf16 give the same roundings as off; what differs is what a training
 * forward keeps in bf16 besides: q|k|v (rounded after RoPE, so attention runs on bf16 inputs)
 * and the attention output, the MLP's gate|up output (rounded before SwiGLU, as autocast does)
 * and SwiGLU's output, and the gradients of the MLP's activations and of the attention output
 * (written in bf16). So: the loss within 5e-4 relative, the gradients within 2e-2 of the
 * largest at step 0 (measured 1.6e-4, 8.3e-3; step 1 after AdamW 5e-3, 0.1, measured 8.4e-4,
 * 0.036); a copy not made again from the updated weights would put step 1's loss at step 0's
 * (5.05 against 3.71). The CPU's definition (ff_gemm_bf16 as a loop and the bf16 attention, set
 * on a CPU model) against them within fp32 summation order and the bf16 steps it can flip
 * (measured 5.5e-5 of loss, 2.2e-3 of the largest gradient, where the CPU's fp32 model is 1.6e-3
 * and 1.1e-2 away), and away from the CPU's fp32 products (so the rounding happens). An
 * inference model refuses them. */
static void test_bf16_products(ff_backend *cpu, const ff_model_config *c) {
    setenv("FF_CUDA_MATH", "bf16", 1);
    setenv("FF_CUDA_ATTENTION", "fp32", 1);
    ff_backend *gbf = gpu_new("cuda");
    unsetenv("FF_CUDA_MATH");
    unsetenv("FF_CUDA_ATTENTION");
    REQUIRE(gbf);
    CHECK(ff_backend_bf16_products(gbf));
    ff_model *mon = tiny_model(gbf, c, 5, 0.1), *moff = tiny_model(gbf, c, 5, 0.1);
    ff_model *cp16 = tiny_model(cpu, c, 5, 0.1), *c32 = tiny_model(cpu, c, 5, 0.1);
    REQUIRE(mon && moff && cp16 && c32);
    CHECK(ff_model_bf16_products(mon) && !ff_model_bf16_products(cp16));
    REQUIRE(ff_model_set_bf16_products(moff, false) == 0 && ff_model_set_bf16_products(cp16, true) == 0);
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ac.lr = 1e-2;
    ff_optimizer *oon = ff_optimizer_new(mon, &ac), *ooff = ff_optimizer_new(moff, &ac), *ocp = ff_optimizer_new(cp16, &ac),
                 *o32 = ff_optimizer_new(c32, &ac);
    REQUIRE(oon && ooff && ocp && o32);
    for (int step = 0; step < 2; step++) {
        double lon, loff, lcp, l32;
        float *goff = NULL, *gcp = NULL, *g32 = NULL;
        int64_t n = 0;
        float *gon = sft_grads(moff, mon, &loff, &lon, &goff, &n);
        float *gcpu = sft_grads(c32, cp16, &l32, &lcp, &g32, &n);
        REQUIRE(gon && gcpu);
        gcp = gcpu;
        char what[96];
        {
            double mx = 0, worst = 0;
            for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(goff[i]));
            for (int64_t i = 0; i < n; i++) worst = fmax(worst, isnan(gon[i]) ? INFINITY : fabs((double)gon[i] - goff[i]));
            printf("bf16 products step %d: loss %.9g, %.9g with them off (%.2g relative); gradients %.2g of the largest "
                   "apart\n", step, lon, loff, fabs(lon - loff) / fabs(loff), worst / mx);
            /* step 1 after an AdamW step from gradients that differ so (Adam moves elements near
             * zero by a whole step either way): measured 8.4e-4 and 0.036 */
            const double lt = step ? 5e-3 : 5e-4, gt = step ? 0.1 : 2e-2;
            if (!(fabs(lon - loff) <= lt * fabs(loff)) || !(worst <= gt * mx)) {
                fprintf(stderr, "bf16 products step %d: loss %.9g against %.9g with them off, gradients %.3g of the largest "
                        "apart (at most %g relative, %g)\n", step, lon, loff, worst / mx, lt, gt);
                ff_test_failures++;
            }
        }
        /* the CPU's definition: the same roundings, another summation order (step 0: the same
         * weights; after a step they differ by that order, and so may their bf16 copies) */
        if (step == 0) {
            CHECK_CLOSE(lcp, lon, 3e-4, 0);
            snprintf(what, sizeof what, "bf16 products step %d: the cpu's against the gpu's gradients", step);
            check_tensor_close(what, gcp, gon, n, 1e-6, 5e-3);
        }
        /* and not the CPU's fp32 products */
        double diff = 0;
        for (int64_t i = 0; i < n; i++) diff = fmax(diff, fabs((double)gcp[i] - g32[i]));
        CHECK(lcp != l32 && diff > 0);
        CHECK_CLOSE(lcp, l32, 2e-2, 0);
        ff_optim_stats st;
        REQUIRE(ff_optimizer_step(oon, &st) == 0 && ff_optimizer_step(ooff, &st) == 0 && ff_optimizer_step(ocp, &st) == 0 &&
                ff_optimizer_step(o32, &st) == 0);
        free(gon), free(goff), free(gcp), free(g32);
    }
    ff_model_memory mon_m, moff_m;
    ff_model_memory_of(mon, &mon_m);
    ff_model_memory_of(moff, &moff_m);
    /* the training forward's kept product inputs (xn1, xn2 [T, H], att [T, Hq D], hm [T, I] a
     * layer), q|k|v ([T, QKV]) and gate|up's output (gu [T, 2I]) are bf16 alone: half their bytes
     * (each region 64-byte aligned), everything else the same */
    {
        const int64_t H = c->hidden_size, I = c->intermediate_size, L = c->num_hidden_layers;
        const int64_t D = H / c->num_attention_heads, HD = c->num_attention_heads * D,
                      QKV = (c->num_attention_heads + 2 * c->num_key_value_heads) * D;
#define HALF(n) ((((n) * 4 + 63) / 64 - ((n) * 2 + 63) / 64) * 64) /* bytes of n fp32 elements less n bf16 */
        const int64_t saved = L * (2 * HALF(NT * H) + HALF(NT * QKV) + HALF(NT * HD) + HALF(NT * I) + HALF(NT * 2 * I));
#undef HALF
        printf("bf16 products: activations %lld bytes against %lld with them off\n", (long long)mon_m.activations,
               (long long)moff_m.activations);
        if (moff_m.activations - mon_m.activations != saved) {
            fprintf(stderr, "bf16 products: activations %lld bytes against %lld with them off, %lld expected fewer\n",
                    (long long)mon_m.activations, (long long)moff_m.activations, (long long)saved);
            ff_test_failures++;
        }
        CHECK(mon_m.activations > 0 && mon_m.workspace > mon_m.activations);
    }
    /* the copy counted: 2 bytes a weight-matrix element, most of the parameters; given back with
     * the gradients (a colocated actor's generation phase), made again by the next forward */
#define REST(mm) ((mm).workspace - (mm).activations)
    CHECK(REST(mon_m) - REST(moff_m) >= ff_model_param_count(mon));
    ff_backend_memory b0, b1;
    ff_backend_memory_of(gbf, &b0);
    REQUIRE(ff_model_release_grads(mon) == 0);
    ff_backend_memory_of(gbf, &b1);
    CHECK(b0.in_use - b1.in_use >= 4 * ff_model_param_count(mon) + ff_model_param_count(mon));
    ff_model_memory_of(mon, &mon_m);
    CHECK(REST(mon_m) - REST(moff_m) < ff_model_param_count(mon));
    {
        float lp[NT];
        ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
        ff_forward_out fo = {.logprobs = lp};
        CHECK(ff_model_forward(mon, &b, NULL, &fo) == 0); /* a scoring forward: the copy is back */
        ff_model_memory_of(mon, &mon_m);
        CHECK(REST(mon_m) - REST(moff_m) >= ff_model_param_count(mon));
    }
#undef REST
    /* a training forward's backward reads its inputs as it kept them: no switching between */
    {
        float lp[NT];
        ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
        ff_forward_opts o = {.train = true};
        ff_forward_out fo = {.logprobs = lp};
        REQUIRE(ff_model_restore_grads(mon) == 0 && ff_model_forward(mon, &b, &o, &fo) == 0);
        /* a scoring forward (on a set of its own: the training one is held) rounds where the
         * training forward does: the same log-probs, bit for bit */
        float lps[NT];
        ff_forward_out fs = {.logprobs = lps};
        CHECK(ff_model_forward(mon, &b, NULL, &fs) == 0 && memcmp(lps, lp, sizeof lp) == 0);
        CHECK(ff_model_set_bf16_products(mon, false) == -1);
        CHECK_STR_CONTAINS(ff_error_message(), "backward");
        CHECK(ff_model_set_bf16_products(mon, true) == 0); /* no change: fine */
        ff_model_stage_drop(mon);
        CHECK(ff_model_set_bf16_products(mon, false) == 0 && ff_model_set_bf16_products(mon, true) == 0);
    }
    ff_optimizer_destroy(&oon), ff_optimizer_destroy(&ooff), ff_optimizer_destroy(&ocp), ff_optimizer_destroy(&o32);
    ff_model_destroy(&mon), ff_model_destroy(&moff), ff_model_destroy(&cp16), ff_model_destroy(&c32);
    /* an inference model's products follow its backend or its bf16 weights */
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, 9, 0.2, w) == 0);
    ff_model_opts inf = {.inference = true};
    ff_model *mi = ff_model_new_opts(gbf, c, w, &inf);
    REQUIRE(mi);
    CHECK(!ff_model_bf16_products(mi));
    CHECK(ff_model_set_bf16_products(mi, true) == -1);
    CHECK_STR_CONTAINS(ff_error_message(), "inference");
    ff_model_destroy(&mi);
    /* A reference: inference models of the same weights on this backend, with bf16 weights (a
     * colocated reference's default on cuda) and with fp32 ones, score as the trainable model
     * does, bit for bit: their forwards hold the same activations in bf16 (ffm_act16), and the
     * trainable model's embedding rows are its bf16 copy's, as the bf16 model's are. From fp32
     * weights first (an fp32 checkpoint) with the bf16 reference; then the weights are bf16
     * values, as a bf16 checkpoint's are, so that the fp32 reference's embedding rows (fp32,
     * read as they are) are the others' too. On the CPU's fp32 products nothing rounds, so this
     * is the CUDA code's (the emulator's in CI). */
    {
        ff_model_opts o16 = {.inference = true, .bf16_weights = true};
        ff_model *t0 = ff_model_new(gbf, c, w), *r0 = ff_model_new_opts(gbf, c, w, &o16);
        REQUIRE(t0 && r0);
        float lt[NT], lr[NT];
        ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
        ff_forward_out ot = {.logprobs = lt}, orf = {.logprobs = lr};
        REQUIRE(ff_model_forward(t0, &b, NULL, &ot) == 0 && ff_model_forward(r0, &b, NULL, &orf) == 0);
        CHECK(memcmp(lt, lr, sizeof lt) == 0); /* KL 0 before the first update, from fp32 weights */
        ff_model_destroy(&t0), ff_model_destroy(&r0);
    }
    for (size_t i = 0; i < w->n; i++)
        for (int64_t e = 0; e < ff_host_tensor_numel(&w->items[i]); e++)
            w->items[i].data[e] = ff_bf16_to_f32(ff_f32_to_bf16(w->items[i].data[e]));
    ff_model_opts inf16 = {.inference = true, .bf16_weights = true};
    ff_model *mt = ff_model_new(gbf, c, w), *mi16 = ff_model_new_opts(gbf, c, w, &inf16);
    mi = ff_model_new_opts(gbf, c, w, &inf);
    REQUIRE(mt && mi16 && mi && ff_model_bf16_products(mt));
    {
        float lt[NT], l16[NT], l32[NT], vt[NT], v16[NT];
        ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
        ff_forward_out ot = {.logprobs = lt, .entropy = vt}, o16 = {.logprobs = l16, .entropy = v16}, o32 = {.logprobs = l32};
        REQUIRE(ff_model_forward(mt, &b, NULL, &ot) == 0 && ff_model_forward(mi16, &b, NULL, &o16) == 0 &&
                ff_model_forward(mi, &b, NULL, &o32) == 0);
        CHECK(memcmp(l16, lt, sizeof lt) == 0 && memcmp(v16, vt, sizeof vt) == 0);
#ifdef FF_TEST_CUDA_EMU
        CHECK(memcmp(l32, lt, sizeof lt) == 0);
#else
        /* fp32 weights are rounded into the stream's scratch for each product: on a GPU cuBLAS
         * may take another kernel for that operand, so the sums may run in another order */
        check_tensor_close("an fp32-weight reference's log-probs against the trainable model's", l32, lt, NT, 1e-4, 0);
#endif
        double kl = 0;
        for (int t = 0; t < NT; t++) kl = fmax(kl, fabs((double)l16[t] - lt[t]));
        printf("bf16 products: a bf16-weight reference's log-probs %.3g from the trainable model's at most\n", kl);
    }
    ff_model_destroy(&mt), ff_model_destroy(&mi16), ff_model_destroy(&mi);
    ff_tensor_set_destroy(&w);
    ff_backend_destroy(&gbf);
}

static ff_gen_request req(uint64_t id, const int32_t *prompt, int32_t n, float temp, int32_t max_new, uint64_t seed) {
    ff_gen_request r;
    memset(&r, 0, sizeof r);
    r.id = id;
    r.prompt = prompt;
    r.prompt_len = n;
    r.n_samples = 2;
    ff_sampling_default(&r.sampling);
    r.sampling.temperature = temp;
    r.sampling.max_new_tokens = max_new;
    r.seed = seed;
    return r;
}

/* The automatic LM-head chunk: 256 MiB of logits in host memory and for inference; a trainable
 * model on the device takes 1/32 of its memory (the emulator's 80 GiB: 2.5 GiB, 5120 tokens
 * here), so that a micro-batch's logits stay for the backward instead of being computed again. */
static void test_logits_chunk(ff_backend *cpu, ff_backend *gpu) {
    ff_backend_memory mem;
    ff_backend_memory_of(cpu, &mem);
    CHECK_EQ_INT(mem.capacity, 0);
    ff_backend_memory_of(gpu, &mem);
    REQUIRE(mem.capacity >= (int64_t)16 << 30); /* cudaMemGetInfo's total: a GPU that trains */
    const int64_t dev = mem.capacity / 32 / (512 << 10), most = dev > 512 ? dev : 512;
    /* a vocabulary of 128 Ki: a token's fp32 logits are 512 KiB */
    ff_model_config c = tiny_config(131072, 16, 32, 1, 2, 1, true, false, false);
    ff_model *mc = tiny_model(cpu, &c, 3, 0.02), *mg = tiny_model(gpu, &c, 3, 0.02);
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&c, 3, 0.02, w) == 0);
    ff_model_opts inf = {.inference = true};
    ff_model *mi = ff_model_new_opts(gpu, &c, w, &inf);
    REQUIRE(mi);
    CHECK_EQ_INT(ff_model_logits_chunk_of(mc, 4096), 512);  /* 256 MiB */
    CHECK_EQ_INT(ff_model_logits_chunk_of(mc, 300), 300);
    CHECK_EQ_INT(ff_model_logits_chunk_of(mg, 1000), 1000); /* kept whole */
    CHECK_EQ_INT(ff_model_logits_chunk_of(mg, 1 << 20), most);
    CHECK_EQ_INT(ff_model_logits_chunk_of(mi, 4096), 512); /* no backward to keep them for */
    ff_model_set_logits_chunk(mg, 100);
    CHECK_EQ_INT(ff_model_logits_chunk_of(mg, 4096), 100);
    ff_model_set_logits_chunk(mg, 0);
    CHECK_EQ_INT(ff_model_logits_chunk_of(mg, 1 << 20), most);
    ff_model_destroy(&mi);
    ff_model_destroy(&mg);
    ff_model_destroy(&mc);
    ff_tensor_set_destroy(&w);
}

/* KV-cache decoding on the GPU against a full GPU forward; greedy tokens against the CPU's. The
 * greedy request runs to 145 positions of a cache of 320, so its attention's keys are split
 * (chunks of 128: k_att_cached) and combined. */
static void test_generation(ff_model *mc, ff_model *mg) {
    int32_t p0[] = {3, 1, 4, 1, 5}, p1[] = {9};
    ff_gen_request r[2] = {req(1, p0, 5, 0.0f, 140, 1), req(2, p1, 1, 1.0f, 24, 2)};
    r[1].sampling.top_k = 20;
    r[1].sampling.top_p = 0.9f;
    ff_generator_config gc = {.max_slots = 4, .max_seq_len = 320, .max_prefill_tokens = 16};
    ff_gen_output *og = NULL, *oc = NULL;
    int32_t ng = 0, nc = 0;
    if (ff_model_generate(mg, &gc, r, 2, &og, &ng)) {
        fprintf(stderr, "cuda generate failed: %s\n", ff_error_message());
        ff_test_failures++;
        return;
    }
    REQUIRE(ff_model_generate(mc, &gc, r, 2, &oc, &nc) == 0);
    CHECK_EQ_INT(ng, 4);
    if (ng > 0) CHECK_EQ_INT(og[0].n_tokens, 140); /* no stop token: past the first split's 128 keys */
    for (int i = 0; i < ng && i < nc; i++) {
        ff_gen_output *g = &og[i];
        const ff_gen_request *rq = &r[i / 2];
        int32_t T = rq->prompt_len + g->n_tokens, ss[2] = {0, T};
        int32_t *tok = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
        float *lp = malloc((size_t)T * 4);
        memcpy(tok, rq->prompt, (size_t)rq->prompt_len * 4);
        memcpy(tok + rq->prompt_len, g->tokens, (size_t)g->n_tokens * 4);
        ff_batch_shift_targets(tok, ss, 1, tg);
        ff_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
        ff_forward_opts fo = {0};
        ff_forward_out out = {.logprobs = lp};
        REQUIRE(ff_model_forward(mg, &b, &fo, &out) == 0);
        char what[96];
        snprintf(what, sizeof what, "request %d sample %d: cached vs full log-probs (cuda)", i / 2, i % 2);
        check_tensor_close(what, g->logprobs, lp + rq->prompt_len - 1, g->n_tokens, 2e-4, 0);
        if (rq->sampling.temperature == 0.0f) {
            CHECK_EQ_INT(g->n_tokens, oc[i].n_tokens);
            CHECK(g->n_tokens == oc[i].n_tokens && !memcmp(g->tokens, oc[i].tokens, (size_t)g->n_tokens * 4));
        }
        free(tok), free(tg), free(lp);
    }
    for (int i = 0; i < ng; i++) ff_gen_output_free(&og[i]);
    for (int i = 0; i < nc; i++) ff_gen_output_free(&oc[i]);
    free(og);
    free(oc);
}

/* A prompt of 100 tokens on the default GPU attention (tensor cores): its prefill against the
 * paged cache is k_att_cached_tc, which gives the first token's log-prob; the later ones come
 * from the CUDA-core decoding kernel. All against the full forward on the same backend, which
 * rounds Q, K, V and the probabilities to bf16 throughout: within 3e-2. */
static void test_prefill_tc(ff_model *m) {
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = (i * 13 + 7) % 97;
    ff_gen_request r = req(7, prompt, 100, 0.0f, 12, 3);
    r.n_samples = 1;
    ff_generator_config gc = {.max_slots = 2, .max_seq_len = 128, .max_prefill_tokens = 128};
    ff_gen_output *og = NULL;
    int32_t ng = 0;
    if (ff_model_generate(m, &gc, &r, 1, &og, &ng) || ng != 1) {
        fprintf(stderr, "generate after a tensor-core prefill: %s\n", ff_error_message());
        ff_test_failures++;
        return;
    }
    const int32_t n = og[0].n_tokens, T = 100 + n, ss[2] = {0, T};
    int32_t *tok = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
    float *lp = malloc((size_t)T * 4);
    REQUIRE(tok && tg && lp && n == 12);
    memcpy(tok, prompt, sizeof prompt);
    memcpy(tok + 100, og[0].tokens, (size_t)n * 4);
    ff_batch_shift_targets(tok, ss, 1, tg);
    ff_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
    ff_forward_opts fo = {0};
    ff_forward_out out = {.logprobs = lp};
    REQUIRE(ff_model_forward(m, &b, &fo, &out) == 0);
    check_tensor_close("tensor-core prefill: cached vs full log-probs", og[0].logprobs, lp + 99, n, 3e-2, 0);
    free(tok), free(tg), free(lp);
    ff_gen_output_free(&og[0]);
    free(og);
}

/* Decode steps as graphs (the default on cuda) against kernel-by-kernel steps (.eager): batches
 * of 6 down to 2 sequences (padded to 8, 4, 2 rows), greedy and sampled, the same tokens and
 * log-probs; the statistics show graphs captured per size and replayed. Then the weights are
 * released and restored at another address, and the same generator gives the same outputs with
 * graphs captured again. */
enum { GR_REQS = 4 };
static int gen_round(ff_generator *g, uint64_t id0, ff_gen_output *out /* [6], by id and sample */) {
    static const int32_t p0[] = {3, 1, 4, 1, 5}, p1[] = {9}, p2[] = {2, 7, 1}, p3[] = {8, 8, 3, 6, 2, 5, 4};
    const int32_t *prompt[GR_REQS] = {p0, p1, p2, p3}, len[GR_REQS] = {5, 1, 3, 7}, samples[GR_REQS] = {2, 1, 2, 1},
                  max_new[GR_REQS] = {20, 9, 14, 5}, first[GR_REQS] = {0, 2, 3, 5};
    const float temp[GR_REQS] = {0.0f, 0.8f, 0.0f, 1.0f};
    for (int i = 0; i < GR_REQS; i++) {
        ff_gen_request r = req(id0 + (uint64_t)i, prompt[i], len[i], temp[i], max_new[i], 40 + (uint64_t)i);
        r.n_samples = samples[i];
        if (ff_generator_submit(g, &r)) return -1;
    }
    int done = 0;
    while (ff_generator_pending(g) > 0) {
        if (ff_generator_step(g)) return -1;
        ff_gen_output o;
        while (ff_generator_pop(g, &o) == 1) {
            const int i = (int)(o.id - id0);
            REQUIRE(i >= 0 && i < GR_REQS && o.sample < samples[i]);
            out[first[i] + o.sample] = o;
            done++;
        }
    }
    return done == 6 ? 0 : -1;
}
static void test_generation_graphs(ff_model *mg, const float *weights) {
    /* a cache of 300 positions a sequence: decoding's attention splits its keys (k_att_cached), in
     * the captured steps too */
    ff_generator_config gc = {.max_slots = 8, .max_seq_len = 300, .max_prefill_tokens = 16};
    ff_generator_config ge = gc;
    ge.eager = true;
    ff_generator *gg = ff_generator_new(mg, &gc), *g0 = ff_generator_new(mg, &ge);
    REQUIRE(gg && g0);
    ff_gen_output og[6], oe[6], o2[6];
    memset(og, 0, sizeof og), memset(oe, 0, sizeof oe), memset(o2, 0, sizeof o2);
    if (gen_round(gg, 100, og) || gen_round(g0, 100, oe)) {
        fprintf(stderr, "generation with and without graphs: %s\n", ff_error_message());
        ff_test_failures++;
    }
    ff_generator_graph_stats sg, se;
    ff_generator_graph_stats_of(gg, &sg);
    ff_generator_graph_stats_of(g0, &se);
    CHECK(sg.on && !strcmp(sg.off_why, ""));
    if (!sg.on) fprintf(stderr, "graphs off: %s\n", sg.off_why);
    /* 19 decode steps: 4 of 6 sequences and 4 of 5 (both padded to 8), 5 of 4, 6 of 2; the first
     * step of each size eager, the rest replays of its graph */
    CHECK_EQ_INT(sg.captures, 3);
    CHECK(sg.eager_steps == 3 && sg.replays == 16);
    CHECK(!se.on && se.replays == 0 && se.captures == 0);
    CHECK_STR_CONTAINS(se.off_why, "eager");
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(og[i].n_tokens, oe[i].n_tokens);
        if (og[i].n_tokens != oe[i].n_tokens) continue;
        CHECK(!memcmp(og[i].tokens, oe[i].tokens, (size_t)og[i].n_tokens * 4));
        check_tensor_close("graph vs eager decode log-probs", og[i].logprobs, oe[i].logprobs, og[i].n_tokens, 1e-4, 0);
    }
    /* the weights at another address: a buffer takes the old one while they are restored */
    const int64_t n = ff_model_param_count(mg);
    REQUIRE(ff_model_release_params(mg) == 0);
    ff_buffer *squat = ff_buffer_new(ff_model_backend(mg), (size_t)n * 4);
    REQUIRE(squat && ff_model_restore_params(mg) == 0);
    ff_model_write_params(mg, weights);
    ff_buffer_destroy(&squat);
    if (gen_round(gg, 200, o2)) {
        fprintf(stderr, "generation after the weights moved: %s\n", ff_error_message());
        ff_test_failures++;
    }
    ff_generator_graph_stats s2;
    ff_generator_graph_stats_of(gg, &s2);
    CHECK(s2.on && s2.captures > sg.captures && s2.replays > sg.replays);
    for (int i = 0; i < 6; i++) {
        CHECK(o2[i].n_tokens == og[i].n_tokens && !memcmp(o2[i].tokens, og[i].tokens, (size_t)og[i].n_tokens * 4));
        ff_gen_output_free(&og[i]);
        ff_gen_output_free(&oe[i]);
        ff_gen_output_free(&o2[i]);
    }
    ff_generator_destroy(&gg);
    ff_generator_destroy(&g0);
}

/* A colocated generating copy: a view of a trainable model, on a backend whose products are bf16
 * (the default), reads the model's bf16 copy (ffm_view_bf16), made by the view's first step
 * after the weights change (made again, the new weights read), found made by the model's next
 * forward, and made again where the model gave it back with its gradients (as roles.actor.
 * offload does for generation). Its tokens and log-probs are those of rounding each fp32 piece
 * per product (the model's bf16 products turned off: no copy), bit for bit on the emulator.
 * Graphs on: the copy made anew or given back captures them again. */
static void test_view_bf16(const ff_model_config *c) {
    ff_backend *gbf = gpu_new("cuda"); /* FF_CUDA_MATH unset */
    REQUIRE(gbf && ff_backend_bf16_products(gbf));
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(c, 9, 0.2, w) == 0);
    ff_model *mt = ff_model_new(gbf, c, w);
    const ff_model_opts ov = {.inference = true, .view_of = mt};
    ff_model *mv = mt ? ff_model_new_opts(gbf, c, w, &ov) : NULL;
    REQUIRE(mt && mv && ff_model_bf16_products(mt));
    ff_generator_config gc = {.max_slots = 8, .max_seq_len = 64, .max_prefill_tokens = 16};
    ff_generator *g = ff_generator_new(mv, &gc);
    REQUIRE(g);
    ff_gen_output o1[6], o16[6], orel[6], o32[6];
    memset(o1, 0, sizeof o1), memset(o16, 0, sizeof o16), memset(orel, 0, sizeof orel), memset(o32, 0, sizeof o32);
    CHECK_EQ_INT(ff_model_bf16_copies(mt), 0);
    if (gen_round(g, 100, o1)) fprintf(stderr, "generation on the copy: %s\n", ff_error_message()), ff_test_failures++;
    CHECK_EQ_INT(ff_model_bf16_copies(mt), 1);
    const int64_t n = ff_model_param_count(mt);
    float *wts = malloc((size_t)n * 4);
    REQUIRE(wts);
    ff_model_read_params(mt, wts);
    for (int64_t i = 0; i < n; i++) wts[i] *= 0.9f; /* as an optimizer step changes them */
    ff_model_write_params(mt, wts);
    free(wts);
    if (gen_round(g, 200, o16)) fprintf(stderr, "generation after a change: %s\n", ff_error_message()), ff_test_failures++;
    CHECK_EQ_INT(ff_model_bf16_copies(mt), 2);
    float lp[NT];
    ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
    ff_forward_out fo = {.logprobs = lp};
    REQUIRE(ff_model_forward(mt, &b, NULL, &fo) == 0);
    CHECK_EQ_INT(ff_model_bf16_copies(mt), 2); /* the view's copy */
    REQUIRE(ff_model_release_grads(mt) == 0);
    if (gen_round(g, 300, orel)) fprintf(stderr, "generation, gradients given back: %s\n", ff_error_message()), ff_test_failures++;
    CHECK_EQ_INT(ff_model_bf16_copies(mt), 3);
    REQUIRE(ff_model_restore_grads(mt) == 0 && ff_model_set_bf16_products(mt, false) == 0);
    if (gen_round(g, 400, o32)) fprintf(stderr, "generation on fp32 pieces: %s\n", ff_error_message()), ff_test_failures++;
    CHECK_EQ_INT(ff_model_bf16_copies(mt), 3);
    ff_generator_graph_stats gs;
    ff_generator_graph_stats_of(g, &gs);
    /* 3 sizes captured; the copy made again in place replays them; the copy made in a new
     * buffer captures them again (whether or not its address is the old one: every rank of a
     * group must capture at the same steps), and so do the products on the fp32 pieces */
    CHECK_EQ_INT(gs.captures, 9);
    CHECK(gs.on && gs.replays > 0);
    int moved = 0;
    for (int i = 0; i < 6; i++) {
        CHECK(o16[i].n_tokens > 0);
#ifdef FF_TEST_CUDA_EMU
        CHECK(o16[i].n_tokens == o32[i].n_tokens && !memcmp(o16[i].tokens, o32[i].tokens, (size_t)o16[i].n_tokens * 4));
        CHECK(o16[i].n_tokens == o32[i].n_tokens && !memcmp(o16[i].logprobs, o32[i].logprobs, (size_t)o16[i].n_tokens * 4));
        CHECK(o16[i].n_tokens == orel[i].n_tokens && !memcmp(o16[i].logprobs, orel[i].logprobs, (size_t)o16[i].n_tokens * 4));
#else
        /* on a GPU cuBLAS may take another kernel for the copy's operand than for the scratch's:
         * the last bits may differ, and a sampled token where two are that close */
        if (o16[i].n_tokens == o32[i].n_tokens && !memcmp(o16[i].tokens, o32[i].tokens, (size_t)o16[i].n_tokens * 4))
            check_tensor_close("a view's log-probs on the bf16 copy against rounding per product", o16[i].logprobs,
                               o32[i].logprobs, o16[i].n_tokens, 1e-3, 0);
#endif
        moved += o1[i].n_tokens != o16[i].n_tokens || memcmp(o1[i].logprobs, o16[i].logprobs, (size_t)o16[i].n_tokens * 4);
    }
    CHECK_EQ_INT(moved, 6); /* the new weights read, not the old copy */
    for (int i = 0; i < 6; i++)
        ff_gen_output_free(&o1[i]), ff_gen_output_free(&o16[i]), ff_gen_output_free(&orel[i]), ff_gen_output_free(&o32[i]);
    ff_generator_destroy(&g);
    ff_model_destroy(&mv), ff_model_destroy(&mt);
    ff_tensor_set_destroy(&w);
    ff_backend_destroy(&gbf);
}

int main(void) {
    ff_backend *probe = gpu_new("cuda");
    if (!probe) {
        const char *msg = ff_error_message();
        if (strstr(msg, "no CUDA device")) SKIP("no CUDA device (%s)", msg);
        fprintf(stderr, "the cuda backend failed for another reason than a missing device: %s\n", msg);
        return 1;
    }
    ff_backend_destroy(&probe);
    for (int t = 0; t < NT; t++) tokens[t] = (int32_t)((t * 37 + 11) % 97);
    ff_batch_shift_targets(tokens, seq_start, NS, targets);

    ff_backend *cpu = ff_backend_cpu_new(2);
    setenv("FF_CUDA_MATH", "fp32", 1);
    ff_backend *g32 = gpu_new("cuda");
    setenv("FF_CUDA_MATH", "tf32", 1);
    ff_backend *gtf = gpu_new("cuda");
    unsetenv("FF_CUDA_MATH");
    REQUIRE(cpu && g32 && gtf);

    ff_model_config c = tiny_config(97, 64, 160, 2, 4, 2, false, true, false);
    ff_model *mc = tiny_model(cpu, &c, 5, 0.1), *m32 = tiny_model(g32, &c, 5, 0.1), *mtf = tiny_model(gtf, &c, 5, 0.1);
    forward_both(mc, m32, false, 1.0f, "forward fp32", 2e-4);
    forward_both(mc, m32, false, 0.7f, "forward fp32 temperature 0.7", 2e-4);
    forward_both(mc, mtf, false, 1.0f, "forward tf32", 3e-2);
    test_prefill_tc(mtf);
    train_step_both(mc, m32, 2e-4);
    {
        setenv("FF_CUDA_MATH", "fp32", 1);
        setenv("FF_CUDA_ATTENTION", "bf16", 1);
        ff_backend *gtc = gpu_new("cuda");
        unsetenv("FF_CUDA_MATH");
        unsetenv("FF_CUDA_ATTENTION");
        REQUIRE(gtc);
        ff_model *mc2 = tiny_model(cpu, &c, 5, 0.1), *mtc = tiny_model(gtc, &c, 5, 0.1);
        forward_both(mc2, mtc, false, 1.0f, "forward, tensor-core attention", 3e-2);
        train_step_tc(mc2, mtc);
        ff_model_destroy(&mc2);
        ff_model_destroy(&mtc);
        ff_backend_destroy(&gtc);
    }
    ff_model_destroy(&mc);
    ff_model_destroy(&m32);
    ff_model_destroy(&mtf);
    test_bf16_products(cpu, &c);
    test_view_bf16(&c);
    test_logits_chunk(cpu, gtf);

    /* generation on an inference model (no gradients, as `fuseflow generate` makes it) */
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w && ff_model_init_weights(&c, 9, 0.2, w) == 0);
    ff_model_opts inf = {.inference = true};
    mc = ff_model_new_opts(cpu, &c, w, &inf);
    ff_model *mg = ff_model_new_opts(g32, &c, w, &inf);
    REQUIRE(mc && mg);
    test_generation(mc, mg);
    {
        const int64_t n = ff_model_param_count(mg);
        float *wts = malloc((size_t)n * 4);
        REQUIRE(wts);
        ff_model_read_params(mg, wts);
        test_generation_graphs(mg, wts);
        free(wts);
        /* kernel profiling waits after every kernel: the first capture fails, naming it, and the
         * generator goes on eagerly (the 19 steps, all of them) */
        setenv("FF_PROFILE_KERNELS", "1", 1);
        ff_backend *gprof = gpu_new("cuda");
        unsetenv("FF_PROFILE_KERNELS");
        REQUIRE(gprof);
        ff_model *mp = ff_model_new_opts(gprof, &c, w, &inf);
        ff_generator_config gcp = {.max_slots = 8, .max_seq_len = 48, .max_prefill_tokens = 16};
        ff_generator *gp = mp ? ff_generator_new(mp, &gcp) : NULL;
        REQUIRE(mp && gp);
        ff_gen_output op[6];
        CHECK(gen_round(gp, 300, op) == 0);
        ff_generator_graph_stats sp;
        ff_generator_graph_stats_of(gp, &sp);
        CHECK(!sp.on && sp.captures == 0 && sp.replays == 0 && sp.eager_steps == 19);
        CHECK_STR_CONTAINS(sp.off_why, "FF_PROFILE_KERNELS");
        for (int i = 0; i < 6; i++) ff_gen_output_free(&op[i]);
        ff_generator_destroy(&gp);
        ff_model_destroy(&mp);
        ff_backend_destroy(&gprof);
    }
    ff_model_destroy(&mc);
    ff_model_destroy(&mg);
    ff_tensor_set_destroy(&w);

    /* bf16 weights (an inference model): on the GPU the activations are rounded to bf16 in the
     * products as well, so against the CPU's bf16-weight model (fp32 activations) within the
     * bf16 gemm mode's tolerance; the KV-cache decoding against the GPU's own full forward */
    {
        ff_tensor_set *w16 = ff_tensor_set_new();
        REQUIRE(w16 && ff_model_init_weights(&c, 10, 0.2, w16) == 0);
        ff_model_opts o16 = {.inference = true, .bf16_weights = true};
        ff_model *c16 = ff_model_new_opts(cpu, &c, w16, &o16), *g16 = ff_model_new_opts(g32, &c, w16, &o16);
        REQUIRE(c16 && g16);
        /* straight from a folder onto the GPU (ff_model_load_dir, rows converted and stored a
         * block at a time): the same parameter bytes as the CPU's bf16 model, read back */
        {
            char dir[256];
            snprintf(dir, sizeof dir, "%s/ff_cuda_load_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
            ff_model_config cq = c; /* q/k/v biases: config.json says so through Qwen2's model_type */
            snprintf(cq.model_type, sizeof cq.model_type, "qwen2");
            REQUIRE(ff_model_dir_save(dir, &cq, w16, NULL, FF_DTYPE_F32) == 0);
            ff_model_config cl;
            ff_model *gl = ff_model_load_dir(g32, dir, &o16, &cl);
            if (!gl) fprintf(stderr, "load_dir onto the GPU: %s\n", ff_error_message());
            REQUIRE(gl);
            const int64_t n = ff_model_param_count(gl);
            float *a = malloc((size_t)n * 4), *b2 = malloc((size_t)n * 4);
            REQUIRE(a && b2 && n == ff_model_param_count(c16));
            ff_model_read_params(gl, a);
            ff_model_read_params(c16, b2);
            CHECK(!memcmp(a, b2, (size_t)n * 4));
            free(a), free(b2);
            ff_model_destroy(&gl);
            char cmd[300];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
            CHECK(system(cmd) == 0);
        }
        ff_model_memory mmc, mmg;
        ff_model_memory_of(c16, &mmc);
        ff_model_memory_of(g16, &mmg);
        CHECK_EQ_INT(mmg.params, mmc.params);
        /* bf16 activations in every GPU product (8-bit mantissas against the CPU's fp32 ones),
         * over 2 layers: about 2% of log-probs of about 5 nats */
        forward_both(c16, g16, false, 1.0f, "forward bf16 weights", 1e-1);
        int32_t p0[] = {3, 1, 4, 1, 5};
        ff_gen_request r = req(3, p0, 5, 1.0f, 24, 4);
        ff_generator_config gc = {.max_slots = 2, .max_seq_len = 64, .max_prefill_tokens = 16};
        ff_gen_output *og = NULL;
        int32_t ng = 0;
        if (ff_model_generate(g16, &gc, &r, 1, &og, &ng) || ng != 2) {
            fprintf(stderr, "cuda generate with bf16 weights failed: %s\n", ff_error_message());
            ff_test_failures++;
        } else {
            for (int i = 0; i < ng; i++) {
                int32_t T = 5 + og[i].n_tokens, ss[2] = {0, T};
                int32_t *tok = malloc((size_t)T * 4), *tg = malloc((size_t)T * 4);
                float *lp = malloc((size_t)T * 4);
                memcpy(tok, p0, 5 * 4);
                memcpy(tok + 5, og[i].tokens, (size_t)og[i].n_tokens * 4);
                ff_batch_shift_targets(tok, ss, 1, tg);
                ff_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
                ff_forward_opts fo = {0};
                ff_forward_out out = {.logprobs = lp};
                REQUIRE(ff_model_forward(g16, &b, &fo, &out) == 0);
                /* the same bf16 products both ways, but cuBLAS may pick other kernels by shape */
                check_tensor_close("bf16 weights: cached vs full log-probs (cuda)", og[i].logprobs, lp + 4, og[i].n_tokens, 2e-2, 0);
                free(tok), free(tg), free(lp);
                ff_gen_output_free(&og[i]);
            }
        }
        free(og);
        ff_model_destroy(&c16);
        ff_model_destroy(&g16);
        ff_tensor_set_destroy(&w16);
    }

    /* a critic: values from the value head */
    ff_model_config cv = tiny_config(97, 64, 160, 2, 4, 4, true, false, true);
    mc = tiny_model(cpu, &cv, 6, 0.1);
    mg = tiny_model(g32, &cv, 6, 0.1);
    float vc[NT], vg[NT];
    ff_batch b = {.n_tokens = NT, .n_seqs = NS, .tokens = tokens, .seq_start = seq_start, .targets = targets};
    ff_forward_opts fo = {0};
    ff_forward_out oc = {.values = vc}, og = {.values = vg};
    REQUIRE(ff_model_forward(mc, &b, &fo, &oc) == 0);
    CHECK(ff_model_forward(mg, &b, &fo, &og) == 0);
    check_tensor_close("critic values", vg, vc, NT, 1e-4, 1e-4);
    ff_model_destroy(&mc);
    ff_model_destroy(&mg);

    ff_backend_destroy(&g32);
    ff_backend_destroy(&gtf);
    ff_backend_destroy(&cpu);
    TEST_MAIN_END();
}
#endif

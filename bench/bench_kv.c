/* bench_kv: the generator's paged KV cache (model/generate.c) against one slot of
 * max_seq_len positions per sequence, on a GRPO-shaped rollout: P prompts of `prompt` tokens,
 * n samples each, `new` tokens per sample (no stop token), a random Llama-shaped model. Both
 * layouts run in this process, alternating, best of a few repetitions, and must return the
 * same tokens (checked). Two comparisons:
 *   same memory  slot: max_slots S (the KV bytes of S sequences at full length);
 *                paged: blocks of 16, the same bytes (kv_blocks = S x max_seq / 16), slots for
 *                every sequence: the samples of a prompt share its full blocks and promise
 *                only what they may fill, so more sequences decode at once
 *   every slot   both with a slot per sequence and the default pool: the block tables' lookups
 *                against the prompt rows that a prompt's samples share (the slot cache reads a
 *                copy per sample), in tokens/s, and the KV rows the paged cache actually held;
 *                then the same with SEQS prompts of one sample each: the lookups alone
 *   bf16 KV      the paged cache of the same memory in bf16 (kv_bf16): twice the blocks, so
 *                twice the sequences at once (its tokens differ: the keys and values are
 *                rounded), against the fp32 paged cache of that memory
 * Each layout has one generator for all repetitions, the first untimed (its KV pages touched).
 * The last line is the headline: paged tokens/s over slot's at the same memory.
 *
 * Usage: bench_kv [--threads N] [--quick] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/model.h"
#include "fuseflow/util.h"
#include "bench_util.h"

enum { PROMPTS = 8, SAMPLES = 8, SEQS = PROMPTS * SAMPLES, PROMPT = 128, NEW = 64, MAX_SEQ = PROMPT + NEW, SAME_MEM_SEQS = 16, BLOCK = 16 };

typedef struct run_result {
    double seconds;     /* best of the repetitions */
    int32_t most_running; /* sequences decoding at once, at most */
    int32_t peak_blocks, total_blocks, block_rows;
    int64_t kv_bytes;
    ff_gen_output *outs; /* [SEQS] of the last repetition */
    int samples;         /* per prompt: SAMPLES, or 1 (SEQS prompts, nothing shared) */
} run_result;

static int die(const char *what) {
    fprintf(stderr, "bench_kv: %s: %s\n", what, ff_error_message());
    return 1;
}

static void free_outs(run_result *r) {
    if (!r->outs) return;
    for (int i = 0; i < SEQS; i++) ff_gen_output_free(&r->outs[i]);
    free(r->outs);
    r->outs = NULL;
}

/* One repetition of the whole rollout on generator g (made once per layout, so that the
 * first touch of its KV pages is not timed after the first repetition). */
static int run_once(ff_generator *g, const ff_generator_config *gc, const int32_t *prompts, run_result *r) {
    free_outs(r);
    r->outs = calloc(SEQS, sizeof *r->outs);
    int rc = r->outs ? 0 : -1;
    double t0 = now_s();
    for (int i = 0; i < SEQS / r->samples && !rc; i++) {
        ff_gen_request q;
        memset(&q, 0, sizeof q);
        q.id = (uint64_t)i;
        q.prompt = prompts + (size_t)i * PROMPT;
        q.prompt_len = PROMPT;
        q.n_samples = r->samples;
        ff_sampling_default(&q.sampling);
        q.sampling.temperature = 1.0f;
        q.sampling.max_new_tokens = NEW;
        q.seed = 100 + (uint64_t)i;
        rc = ff_generator_submit(g, &q);
    }
    while (!rc && ff_generator_pending(g) > 0) {
        rc = ff_generator_step(g);
        int32_t run = ff_generator_running(g);
        if (run > r->most_running) r->most_running = run;
    }
    double dt = now_s() - t0;
    ff_gen_output o;
    while (ff_generator_pop(g, &o)) {
        if (o.n_tokens != NEW) rc = -1;
        r->outs[o.id * (uint64_t)r->samples + (uint64_t)o.sample] = o;
    }
    int32_t used;
    ff_generator_kv_blocks(g, &used, &r->peak_blocks, &r->total_blocks);
    r->kv_bytes = ff_generator_kv_bytes(g);
    r->block_rows = gc->kv_block_rows;
    if (rc) return ff_error_set("bench_kv", NULL, "the rollout failed or a sample stopped early");
    if (r->seconds == 0 || dt < r->seconds) r->seconds = dt;
    return 0;
}

static int same_outputs(const run_result *a, const run_result *b) {
    for (int i = 0; i < SEQS; i++)
        if (memcmp(a->outs[i].tokens, b->outs[i].tokens, NEW * 4) || memcmp(a->outs[i].logprobs, b->outs[i].logprobs, NEW * 4))
            return 0;
    return 1;
}

static void report(const char *name, const run_result *r) {
    const double mib = (double)r->kv_bytes / 1048576.0;
    printf("  %-6s %7.0f tok/s  %5.2f s  decoding at once <= %2d  KV %5.1f MiB allocated, %5.1f MiB held at the peak "
           "(%d blocks of %d positions)\n",
           name, SEQS * NEW / r->seconds, r->seconds, r->most_running, mib, mib * r->peak_blocks / r->total_blocks,
           r->peak_blocks, r->block_rows);
}

int main(int argc, char **argv) {
    int threads = 0, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) reps = 1;
        else {
            fprintf(stderr, "usage: bench_kv [--threads N] [--quick]\n");
            return 2;
        }
    }
    ff_backend *be = ff_backend_cpu_new(threads);
    if (!be) return die("backend");
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = 4096;
    c.hidden_size = 384;
    c.intermediate_size = 1024;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 6;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 1024;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.bos_token_id = c.pad_token_id = -1; /* no eos: every sample runs its NEW tokens */
    ff_tensor_set *w = ff_tensor_set_new();
    if (!w || ff_model_init_weights(&c, 1, 0.02, w)) return die("init");
    ff_model *m = ff_model_new(be, &c, w);
    ff_tensor_set_destroy(&w);
    if (!m) return die("model");
    int32_t *prompts = malloc(SEQS * PROMPT * sizeof *prompts); /* enough for SEQS prompts of one sample */
    ff_rng rng;
    ff_rng_seed(&rng, 1);
    for (int i = 0; i < SEQS * PROMPT; i++) prompts[i] = (int32_t)ff_rng_below(&rng, (uint64_t)c.vocab_size);
    printf("bench_kv: %d threads; %.1fM parameters; %d prompts of %d tokens x %d samples x %d new tokens\n",
           ff_backend_threads(be), (double)ff_model_param_count(m) / 1e6, PROMPTS, PROMPT, SAMPLES, NEW);

    /* same memory: the bytes of SAME_MEM_SEQS sequences at full length */
    const ff_generator_config slot_mem = {.max_slots = SAME_MEM_SEQS, .max_seq_len = MAX_SEQ, .max_prefill_tokens = 4 * PROMPT,
                                          .kv_block_rows = MAX_SEQ};
    const ff_generator_config paged_mem = {.max_slots = PROMPTS * SAMPLES, .max_seq_len = MAX_SEQ, .max_prefill_tokens = 4 * PROMPT,
                                           .kv_block_rows = BLOCK, .kv_blocks = SAME_MEM_SEQS * MAX_SEQ / BLOCK};
    /* every sequence its slot, the default pool */
    const ff_generator_config slot_all = {.max_slots = PROMPTS * SAMPLES, .max_seq_len = MAX_SEQ, .max_prefill_tokens = 4 * PROMPT,
                                          .kv_block_rows = MAX_SEQ};
    const ff_generator_config paged_all = {.max_slots = PROMPTS * SAMPLES, .max_seq_len = MAX_SEQ, .max_prefill_tokens = 4 * PROMPT,
                                           .kv_block_rows = BLOCK};
    /* the same bytes as paged_mem in bf16: twice its blocks */
    const ff_generator_config paged16_mem = {.max_slots = PROMPTS * SAMPLES, .max_seq_len = MAX_SEQ, .max_prefill_tokens = 4 * PROMPT,
                                             .kv_block_rows = BLOCK, .kv_blocks = 2 * SAME_MEM_SEQS * MAX_SEQ / BLOCK, .kv_bf16 = true};
    /* 0, 1: the same memory; 2, 3: every sequence a slot; 4, 5: the same with SEQS prompts of one
     * sample each (nothing shared: the table lookups alone); 6: 1's memory in bf16 */
    enum { N = 7 };
    run_result r[N];
    memset(r, 0, sizeof r);
    const ff_generator_config *cfg[N] = {&slot_mem, &paged_mem, &slot_all, &paged_all, &slot_all, &paged_all, &paged16_mem};
    ff_generator *g[N];
    for (int i = 0; i < N; i++) {
        r[i].samples = i < 4 || i == 6 ? SAMPLES : 1;
        if (!(g[i] = ff_generator_new(m, cfg[i]))) return die("generator");
    }
    for (int k = 0; k <= reps; k++) /* the first repetition warms up, untimed */
        for (int i = 0; i < N; i++) {
            double keep = r[i].seconds;
            if (run_once(g[i], cfg[i], prompts, &r[i])) return die("rollout");
            if (k == 0) r[i].seconds = keep;
        }
    for (int i = 0; i < N; i++) ff_generator_destroy(&g[i]);
    for (int i = 1; i < 6; i++) /* 6 rounds its keys and values: other tokens */
        if (!same_outputs(&r[i < 4 ? 0 : 4], &r[i])) {
            fprintf(stderr, "bench_kv: layout %d returned other tokens than one slot per sequence\n", i);
            return 1;
        }
    printf("same KV memory (%d sequences at %d positions):\n", SAME_MEM_SEQS, MAX_SEQ);
    report("slot", &r[0]);
    report("paged", &r[1]);
    printf("every sequence a slot (%d):\n", SEQS);
    report("slot", &r[2]);
    report("paged", &r[3]);
    printf("every sequence a slot, %d prompts of one sample (nothing shared):\n", SEQS);
    report("slot", &r[4]);
    report("paged", &r[5]);
    printf("the same KV memory in bf16:\n");
    report("bf16", &r[6]);
    const double same = r[0].seconds / r[1].seconds, all = r[2].seconds / r[3].seconds, alone = r[4].seconds / r[5].seconds;
    const double held = (double)r[2].peak_blocks * r[2].block_rows / ((double)r[3].peak_blocks * r[3].block_rows);
    printf("every slot: paged %.2fx the tokens/s of slot with %d samples a prompt (their prompt rows shared: read once a step, "
           "%.2fx fewer KV rows held at the peak); %.2fx with nothing shared (the block tables' cost)\n",
           all, SAMPLES, held, alone);
    printf("bf16 KV cache: %.2fx the tokens/s of the fp32 paged cache in the same memory (%d decoding at once, not %d)\n",
           r[1].seconds / r[6].seconds, r[6].most_running, r[1].most_running);
    printf("bench_kv: paged %.2fx the tokens/s of one slot per sequence at the same KV memory (target: >= 1.2x)\n", same);
    for (int i = 0; i < N; i++) free_outs(&r[i]);
    free(prompts);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    return 0;
}

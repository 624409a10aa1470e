/* bench_zero: one data-parallel training step at ZeRO-0 against ZeRO-1, on d processes of
 * this host (ff_coll's cpu backend over shared memory, one cpu:T backend each), for a model
 * of about 17M parameters (Llama-shaped: 6 layers, hidden 384, vocabulary 8192).
 *
 * Each rank runs a training forward + backward of T tokens (its own random batch), then
 * either ZeRO-0, what the trainer's hook and a whole optimizer do (the gradient buffer
 * all-reduced, AdamW over every parameter on every rank), or ZeRO-1 (the optimizer's
 * reduce-scatter in buckets, AdamW on 1/d, the all-gather of the parameters). Both
 * optimizers live on the same model and alternate step by step, so a noisy machine treats
 * them alike; times are rank 0's medians, each phase bracketed by a one-float all-reduce.
 * Both run their collectives on the model's buffers, as a worker does (ff_model_comm's dev_
 * calls, the hook's all-reduce in place), and, alternating with those, through host memory
 * (what FF_DEVICE_COLL=0 keeps: the gradients copied out and back around each collective).
 * Also printed: the optimizer bytes per rank from the allocations.
 *
 *   bench_zero [--ranks 2] [--tokens 256] [--steps 8] [--threads T] [--bucket FLOATS]
 *
 * The last line is the headline: the ZeRO-1 step time and its ratio to ZeRO-0's, beside the
 * ratio of optimizer bytes per rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/model.h"
#include "fuseflow/util.h"
#include "bench_util.h"

enum { MAXSTEPS = 64 };

typedef struct result {
    double fwdbwd_s, z0_s, z1_s; /* medians, rank 0: the collectives on the model's buffers (as workers run them) */
    double z0h_s, z1h_s;         /* the same through host memory (FF_DEVICE_COLL=0's way) */
    int64_t params, z0_bytes, z1_bytes;
    int ok;
} result;

/* ZeRO-1's collectives on a communicator */
static int c_sum64(void *ctx, double *buf, size_t n) { return ff_coll_all_reduce(buf, buf, n, FF_DTYPE_F64, FF_COLL_SUM, ctx, NULL); }
static int c_rs(void *ctx, const float *in, float *out, const size_t *counts) {
    return ff_coll_reduce_scatter_v(in, out, counts, FF_DTYPE_F32, FF_COLL_SUM, ctx, NULL);
}
static int c_ag(void *ctx, const float *in, float *out, const size_t *counts) {
    return ff_coll_all_gather_v(in, out, counts, FF_DTYPE_F32, ctx, NULL);
}
/* the same on the model's buffers (the cpu backend's are host memory the cpu ff_coll reads) */
static int d_sum(void *ctx, ff_stream *st, ff_dptr buf, size_t n) {
    (void)st;
    return ff_coll_all_reduce(ff_dptr_addr(buf), ff_dptr_addr(buf), n, FF_DTYPE_F32, FF_COLL_SUM, ctx, NULL);
}
static int d_rs(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return ff_coll_reduce_scatter_v(ff_dptr_addr(in), ff_dptr_addr(out), counts, FF_DTYPE_F32, FF_COLL_SUM, ctx, NULL);
}
static int d_ag(void *ctx, ff_stream *st, ff_dptr in, ff_dptr out, const size_t *counts) {
    (void)st;
    return ff_coll_all_gather_v(ff_dptr_addr(in), ff_dptr_addr(out), counts, FF_DTYPE_F32, ctx, NULL);
}

typedef struct opts {
    int ranks, tokens, steps, threads;
    int64_t bucket;
} opts;

static int rank_main(const opts *o, int rank, const ff_coll_id *id, result *out) {
    ff_coll_options co = {.timeout_s = 600};
    ff_coll_comm *c = NULL;
    ff_backend *be = NULL;
    ff_model *m = NULL;
    ff_optimizer *z0 = NULL, *z1 = NULL, *z1h = NULL;
    ff_tensor_set *w = NULL;
    float *g = NULL;
    char spec[32];
    snprintf(spec, sizeof spec, "cpu:%d", o->threads);
    if (ff_coll_comm_init(&c, o->ranks, id, rank, &co) || !(be = ff_backend_new(spec))) goto fail;
    ff_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.model_type, sizeof cfg.model_type, "llama");
    cfg.vocab_size = 8192, cfg.hidden_size = 384, cfg.intermediate_size = 1024, cfg.num_hidden_layers = 6;
    cfg.num_attention_heads = 6, cfg.num_key_value_heads = 2, cfg.max_position_embeddings = 1024;
    cfg.rope_theta = 10000, cfg.rms_norm_eps = 1e-5, cfg.bos_token_id = -1, cfg.pad_token_id = -1;
    if (!(w = ff_tensor_set_new()) || ff_model_init_weights(&cfg, 1, 0.02, w) ||
        !(m = ff_model_new_from(be, &cfg, &w, NULL)) || ff_model_reserve(m, o->tokens))
        goto fail;
    ff_adamw_config ac;
    ff_adamw_config_default(&ac);
    ff_model_comm dph = {.rank = rank, .size = o->ranks, .ctx = c, .all_reduce_sum_f64 = c_sum64, .reduce_scatter_sum_v = c_rs,
                         .all_gather_v = c_ag},
                  dp = dph;
    dp.dev_all_reduce_sum = d_sum, dp.dev_reduce_scatter_sum_v = d_rs, dp.dev_all_gather_v = d_ag;
    if (!(z0 = ff_optimizer_new(m, &ac)) ||
        !(z1 = ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = 1, .dp = &dp, .bucket = o->bucket})) ||
        !(z1h = ff_optimizer_new_opts(m, &ac, &(ff_optimizer_opts){.zero = 1, .dp = &dph, .bucket = o->bucket})))
        goto fail;
    const int64_t n = ff_model_param_count(m);
    if (!(g = malloc((size_t)n * sizeof *g))) goto fail;
    int32_t *tok = malloc((size_t)o->tokens * sizeof *tok), *tgt = malloc((size_t)o->tokens * sizeof *tgt);
    float *dlp = malloc((size_t)o->tokens * sizeof *dlp), *lps = malloc((size_t)o->tokens * sizeof *lps);
    if (!tok || !tgt || !dlp || !lps) goto fail;
    ff_rng r;
    ff_rng_seed(&r, 100 + (uint64_t)rank);
    for (int t = 0; t < o->tokens; t++) tok[t] = (int32_t)ff_rng_below(&r, (uint64_t)cfg.vocab_size), dlp[t] = -1.0f / o->tokens;
    int32_t ss[2] = {0, o->tokens};
    ff_batch_shift_targets(tok, ss, 1, tgt);
    ff_batch b = {.n_tokens = o->tokens, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tgt};
    double fb[4 * MAXSTEPS], tv[4][MAXSTEPS];
    int kv[4] = {0}, kf = 0;
    for (int s = 0; s < 4 * o->steps + 4; s++) { /* a warm-up step each (first touch, scratch) */
        const int kind = s % 4;                   /* ZeRO-0, ZeRO-1, each on the buffers and through host memory */
        const bool zero1 = kind & 1, host = kind & 2;
        if (barrier(c)) goto fail;
        double t0 = now_s();
        ff_forward_out fo = {.logprobs = lps};
        if (ff_model_zero_grad(m) || ff_model_forward(m, &b, &(ff_forward_opts){.train = true}, &fo) ||
            ff_model_backward(m, dlp, NULL, NULL))
            goto fail;
        if (barrier(c)) goto fail;
        double t1 = now_s();
        if (!zero1 && host) { /* the trainer's hook, then a whole optimizer */
            if (ff_model_read_grads(m, g) || ff_coll_all_reduce(g, g, (size_t)n, FF_DTYPE_F32, FF_COLL_SUM, c, NULL) ||
                ff_model_write_grads(m, g) || ff_optimizer_step(z0, NULL))
                goto fail;
        } else if (!zero1) { /* the worker's hook now: in place on the gradient buffer */
            if (d_sum(c, NULL, ff_dptr_of(ff_model_grad_buffer(m), 0), (size_t)n) || ff_optimizer_step(z0, NULL)) goto fail;
        } else if (ff_optimizer_step(host ? z1h : z1, NULL)) {
            goto fail;
        }
        if (barrier(c)) goto fail;
        double t2 = now_s();
        if (s >= 4) {
            fb[kf++] = t1 - t0;
            tv[kind][kv[kind]++] = t2 - t1;
        }
    }
    if (rank == 0)
        *out = (result){.fwdbwd_s = median(fb, kf), .z0_s = median(tv[0], kv[0]), .z1_s = median(tv[1], kv[1]),
                        .z0h_s = median(tv[2], kv[2]), .z1h_s = median(tv[3], kv[3]), .params = n,
                        .z0_bytes = ff_optimizer_state_bytes(z0), .z1_bytes = ff_optimizer_state_bytes(z1), .ok = 1};
    free(tok), free(tgt), free(dlp), free(lps), free(g);
    ff_optimizer_destroy(&z0), ff_optimizer_destroy(&z1), ff_optimizer_destroy(&z1h);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_coll_comm_destroy(&c);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, ff_error_message());
    ff_coll_comm_destroy(&c);
    return 1;
}

static void usage(void) {
    printf("usage: bench_zero [--ranks D] [--tokens T] [--steps K] [--threads N] [--bucket FLOATS]\n"
           "  one DP training step at ZeRO-0 (all-reduce + whole AdamW) and at ZeRO-1 (reduce-scatter +\n"
           "  AdamW on 1/D + all-gather) on D processes of this host, a 17M-parameter model.\n");
}

int main(int argc, char **argv) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    opts o = {.ranks = 2, .tokens = 256, .steps = 8, .threads = 0, .bucket = 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc) o.ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) o.tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) o.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) o.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bucket") && i + 1 < argc) o.bucket = atoll(argv[++i]);
        else {
            usage();
            return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
        }
    }
    if (o.threads <= 0) o.threads = cores / o.ranks > 0 ? (int)(cores / o.ranks) : 1;
    if (o.ranks < 2 || o.ranks > 16 || o.tokens < 2 || o.steps < 1 || o.steps > MAXSTEPS || o.bucket < 0) {
        fprintf(stderr, "bench_zero: need 2 <= --ranks <= 16, --tokens >= 2, 1 <= --steps <= %d, --bucket >= 0\n", MAXSTEPS);
        return 2;
    }
    result *res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) return 1;
    memset(res, 0, sizeof *res);
    fflush(stdout);
    int pfd[2];
    if (pipe(pfd)) return 1;
    pid_t pids[16];
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            ff_coll_id id;
            if (r == 0) { /* rank 0 makes the id: this process makes none, it forks */
                if (ff_coll_get_unique_id(&id, "cpu", NULL)) {
                    fprintf(stderr, "%s\n", ff_error_message());
                    exit(1);
                }
                for (int p = 1; p < o.ranks; p++)
                    if (write(pfd[1], &id, sizeof id) != (ssize_t)sizeof id) exit(1);
            } else if (read(pfd[0], &id, sizeof id) != (ssize_t)sizeof id) {
                exit(1);
            }
            close(pfd[0]);
            close(pfd[1]);
            exit(rank_main(&o, r, &id, res));
        }
    }
    close(pfd[0]);
    close(pfd[1]);
    int bad = 0;
    for (int r = 0; r < o.ranks; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
    }
    if (bad || !res->ok) {
        fprintf(stderr, "bench_zero: a rank failed\n");
        return 1;
    }
    printf("%d ranks x cpu:%d on a %ld-core host, %lld parameters, %d tokens per rank, median of %d steps each\n", o.ranks,
           o.threads, cores, (long long)res->params, o.tokens, o.steps);
    printf("%-52s %8.1f ms\n", "forward + backward", res->fwdbwd_s * 1e3);
    printf("%-52s %8.1f ms   optimizer %6.1f MiB per rank\n", "ZeRO-0: all-reduce + AdamW on everything", res->z0_s * 1e3,
           (double)res->z0_bytes / 1048576.0);
    char what[64];
    snprintf(what, sizeof what, "ZeRO-1: reduce-scatter + AdamW on 1/%d + all-gather", o.ranks);
    printf("%-52s %8.1f ms   optimizer %6.1f MiB per rank\n", what, res->z1_s * 1e3, (double)res->z1_bytes / 1048576.0);
    printf("%-52s %8.1f ms   (%.2fx on the buffers)\n", "ZeRO-0 through host memory (FF_DEVICE_COLL=0)", res->z0h_s * 1e3,
           res->z0_s / res->z0h_s);
    printf("%-52s %8.1f ms   (%.2fx on the buffers)\n", "ZeRO-1 through host memory (FF_DEVICE_COLL=0)", res->z1h_s * 1e3,
           res->z1_s / res->z1h_s);
    printf("step (forward + backward + the above): ZeRO-0 %.1f ms, ZeRO-1 %.1f ms\n", (res->fwdbwd_s + res->z0_s) * 1e3,
           (res->fwdbwd_s + res->z1_s) * 1e3);
    printf("bench_zero: ZeRO-1 gradient sync + optimizer %.1f ms (%.2fx ZeRO-0's), optimizer bytes per rank %.2fx "
           "(target: <= 1.05x time, 1/%d bytes)\n",
           res->z1_s * 1e3, res->z1_s / res->z0_s, (double)res->z1_bytes / (double)res->z0_bytes, o.ranks);
    return 0;
}

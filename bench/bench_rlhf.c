/* Benchmark: the host-side RLHF math of one PPO iteration (kernels/rlhf/) against the same
 * math in PyTorch the way verl writes it (bench/bench_rlhf_torch.py: padded tensors,
 * autograd, GAE as a loop over positions), same shapes, one thread each, in the same run.
 * Ops: PPO clipped surrogate with dual clip and clip-higher (loss + d/dlogp), the k3 KL loss
 * (+ d/dlogp), GAE by the recursion and by the RLHFuse matrix form.
 *
 * usage: bench_rlhf [B L]   (default 256 sequences x 512 tokens, a 128k-token batch)
 * Last line: rlhf_host_math: <ms> ms per batch (target: faster than PyTorch; <ratio>x). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/rlhf.h"
#include "fuseflow/util.h"

#define REPEATS 5

static double best_of(void (*fn)(void *), void *ctx) {
    double best = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        int64_t t0 = ff_now_ns();
        fn(ctx);
        double s = (double)(ff_now_ns() - t0) * 1e-9;
        if (s < best) best = s;
    }
    return best;
}

typedef struct ctx {
    ff_rlhf_seqs s;
    float *logp, *old, *ref, *adv, *rew, *val, *out1, *out2;
} ctx;

static void run_ppo(void *p) {
    ctx *c = p;
    ff_rlhf_ppo_cfg cfg = {0.2, 0.28, 3.0, FF_RLHF_AGG_TOKEN_MEAN, 0};
    ff_rlhf_pg_stats st;
    volatile double l = ff_rlhf_ppo_loss(&cfg, &c->s, c->logp, c->old, c->adv, c->out1, &st);
    (void)l;
}
static void run_k3(void *p) {
    ctx *c = p;
    volatile double l = ff_rlhf_kl_loss(FF_RLHF_KL_K3, FF_RLHF_AGG_TOKEN_MEAN, 0, &c->s, c->logp, c->ref, c->out1);
    (void)l;
}
static void run_gae(void *p) {
    ctx *c = p;
    ff_rlhf_gae(&c->s, c->rew, c->val, 1.0, 0.95, c->out1, c->out2);
}
static void run_gae_matrix(void *p) {
    ctx *c = p;
    if (ff_rlhf_gae_matrix(&c->s, c->rew, c->val, 1.0, 0.95, c->out1, c->out2) != 0) fprintf(stderr, "%s\n", ff_error_message());
}

/* Run the PyTorch side; fills times[3] (ppo, k3, gae). 0, or -1 when torch is not there. */
static int torch_times(int B, int L, double *times) {
    const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    char cmd[1024];
    const char *src = getenv("FF_SOURCE_DIR");
    snprintf(cmd, sizeof cmd, "%s %s/bench/bench_rlhf_torch.py %d %d %d 2>/dev/null", py, src ? src : ".", B, L, REPEATS);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char name[64];
    double t;
    int n = 0;
    while (n < 3 && fscanf(f, "%63s %lf", name, &t) == 2) times[n++] = t;
    int rc = pclose(f);
    return n == 3 && rc == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
    int B = argc > 2 ? atoi(argv[1]) : 256, L = argc > 2 ? atoi(argv[2]) : 512;
    if (B < 1 || L < 1) {
        fprintf(stderr, "usage: bench_rlhf [B L]\n");
        return 2;
    }
    size_t T = (size_t)B * (size_t)L;
    ctx c;
    int32_t *off = malloc(sizeof *off * (size_t)(B + 1));
    float *mask = malloc(sizeof(float) * T);
    float **arrs[8] = {&c.logp, &c.old, &c.ref, &c.adv, &c.rew, &c.val, &c.out1, &c.out2};
    for (int i = 0; i < 8; i++) *arrs[i] = malloc(sizeof(float) * T);
    if (!off || !mask || !c.out2) return 1;
    ff_rng rng;
    ff_rng_seed(&rng, 0);
    for (int b = 0; b <= B; b++) off[b] = b * L;
    for (size_t t = 0; t < T; t++) {
        mask[t] = ff_rng_uniform(&rng) > 0.1 ? 1.0f : 0.0f;
        c.old[t] = (float)ff_rng_normal(&rng);
        c.logp[t] = c.old[t] + (float)(0.3 * ff_rng_normal(&rng));
        c.ref[t] = (float)ff_rng_normal(&rng);
        c.adv[t] = (float)ff_rng_normal(&rng);
        c.rew[t] = (float)ff_rng_normal(&rng);
        c.val[t] = (float)ff_rng_normal(&rng);
    }
    c.s = (ff_rlhf_seqs){B, off, mask};
    double ours[4] = {best_of(run_ppo, &c), best_of(run_k3, &c), best_of(run_gae, &c), best_of(run_gae_matrix, &c)};
    double theirs[3];
    bool have_torch = torch_times(B, L, theirs) == 0;
    const char *names[4] = {"ppo_loss_grad", "kl_k3_loss_grad", "gae (recursion)", "gae (matrix form)"};
    printf("RLHF host math, %d sequences x %d tokens (%zu tokens), best of %d, one thread\n", B, L, T, REPEATS);
    printf("  %-20s %12s %12s %8s\n", "op", "fuseflow ms", "torch ms", "ratio");
    for (int i = 0; i < 4; i++) {
        double tt = have_torch ? theirs[i < 3 ? i : 2] : 0;
        if (have_torch)
            printf("  %-20s %12.3f %12.3f %7.1fx\n", names[i], ours[i] * 1e3, tt * 1e3, tt / ours[i]);
        else
            printf("  %-20s %12.3f %12s %8s\n", names[i], ours[i] * 1e3, "-", "-");
    }
    double total = ours[0] + ours[1] + ours[2];
    if (have_torch) {
        double tt = theirs[0] + theirs[1] + theirs[2];
        printf("rlhf_host_math: %.3f ms per batch (target: faster than PyTorch; %.1fx)\n", total * 1e3, tt / total);
    } else {
        printf("rlhf_host_math: %.3f ms per batch (target: faster than PyTorch; PyTorch not available: "
               "apt-get install python3-torch)\n",
               total * 1e3);
    }
    for (int i = 0; i < 8; i++) free(*arrs[i]);
    free(off), free(mask);
    return 0;
}

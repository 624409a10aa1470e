/* bench_memory: resident memory of a model per role, beside the bytes its weights need.
 *
 * Each mode runs in a child process of its own (resident peaks only grow) and reports its
 * resident memory (VmRSS, and the peak VmHWM) after each phase: start, the checkpoint read
 * into host fp32 tensors (ff_model_dir_load), the model created from them, and after its
 * work. The modes:
 *   generate   an inference model (ff_model_opts.inference) decodes --new tokens after a
 *              prompt of --prompt tokens: `fuseflow generate`, the generating actor
 *   logprobs   an inference model scores one sequence of prompt + new tokens: `fuseflow
 *              logprobs`, the reference and reward models
 *   train      a trainable model, one step (forward, backward, AdamW) on that sequence: the
 *              trained actor and critic (parameters, gradients, two moments: 16 bytes a
 *              parameter, and the activations of the step)
 *   copy       as the model was loaded before ff_model_new_from: the host tensors copied,
 *              a gradient buffer zeroed (the comparison)
 *   generate16 generate with bf16 weights (ff_model_opts.bf16_weights, `fuseflow generate
 *              --weights bf16`)
 *   gen-set, gen16-set  generate and generate16 as they loaded before ff_model_load_dir: the
 *              checkpoint read whole into fp32 host tensors (ff_model_dir_load), then given to
 *              ff_model_new_from, which gives each tensor's memory back as it copies it
 * generate, logprobs and generate16 read the checkpoint straight into the model
 * (ff_model_load_dir, a few rows at a time), as `fuseflow generate`, `logprobs` and the
 * workers do; their "read" phase is then only the config.
 *
 * Without --model it writes a Qwen2-0.5B-shaped folder (hidden 896, 14 heads, 2 KV heads,
 * intermediate 4864, vocab 151936, tied embeddings, attention bias, bf16) of --layers layers
 * (default 24, the real shape: 494M parameters, a 1 GB file, about 20 s to write) into
 * $TMPDIR, and removes it at the end.
 *
 * Usage: bench_memory [--model DIR] [--layers N] [--prompt N] [--new N] [--threads N]
 * Last line: memory: generate peak <r> x weights (target: <= 1.3 x weights + 64 MiB) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuseflow/backend.h"
#include "fuseflow/model.h"
#include "fuseflow/modelio.h"
#include "fuseflow/util.h"

enum { PH_START, PH_SET, PH_MODEL, PH_USED, PH_N };
static const char *const phase_names[PH_N] = {"start", "read", "model", "used"};
enum { M_GENERATE, M_LOGPROBS, M_TRAIN, M_COPY, M_GENERATE16, M_GENERATE_SET, M_GENERATE16_SET, M_N };
static const char *const mode_names[M_N] = {"generate", "logprobs", "train", "copy", "generate16", "gen-set", "gen16-set"};
/* read straight into the model (ff_model_load_dir), as the commands and workers load now */
static bool streamed(int mode) { return mode == M_GENERATE || mode == M_LOGPROBS || mode == M_GENERATE16; }

typedef struct report {
    int ok;
    int64_t params;
    ff_resident at[PH_N];
} report;

static int die(const char *what) {
    fprintf(stderr, "bench_memory: %s: %s\n", what, ff_error_message());
    return 1;
}

/* One mode, in this (child) process; the report goes to fd. */
static int run_mode(int mode, const char *dir, int threads, int32_t prompt, int32_t n_new, int fd) {
    report r = {0};
    r.at[PH_START] = ff_resident_memory();
    ff_model_config cfg;
    ff_tensor_set *w = NULL;
    if (!streamed(mode) && ff_model_dir_load(dir, &cfg, &w) != 0) return die(dir);
    r.at[PH_SET] = ff_resident_memory();
    ff_backend *be = ff_backend_cpu_new(threads);
    if (!be) return die("backend");
    const bool w16 = mode == M_GENERATE16 || mode == M_GENERATE16_SET;
    const ff_model_opts mo = {.inference = mode != M_TRAIN, .bf16_weights = w16};
    ff_model *m = streamed(mode)   ? ff_model_load_dir(be, dir, &mo, &cfg)
                  : mode == M_COPY ? ff_model_new(be, &cfg, w)
                                   : ff_model_new_from(be, &cfg, &w, &mo);
    if (!m) return die("model");
    r.params = ff_model_param_count(m);
    if (mode == M_COPY && ff_model_zero_grad(m) != 0) return die("zero_grad"); /* then, a memset at allocation */
    ff_tensor_set_destroy(&w);
    r.at[PH_MODEL] = ff_resident_memory();

    int32_t T = prompt + n_new, ss[2] = {0, T};
    int32_t *tok = malloc((size_t)T * sizeof *tok), *tg = malloc((size_t)T * sizeof *tg);
    float *lp = malloc((size_t)T * sizeof *lp), *d = malloc((size_t)T * sizeof *d);
    if (!tok || !tg || !lp || !d) return die("memory");
    for (int32_t i = 0; i < T; i++) tok[i] = (int32_t)((i * 7919 + 13) % cfg.vocab_size), d[i] = -1.0f / (float)T;
    ff_batch_shift_targets(tok, ss, 1, tg);
    ff_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tok, .seq_start = ss, .targets = tg};
    int rc = 0;
    ff_optimizer *o = NULL;
    if (mode == M_GENERATE || mode == M_GENERATE16 || mode == M_GENERATE_SET || mode == M_GENERATE16_SET) {
        ff_gen_request q = {.id = 1, .prompt = tok, .prompt_len = prompt, .n_samples = 1, .seed = 1};
        ff_sampling_default(&q.sampling);
        q.sampling.temperature = 0;
        q.sampling.max_new_tokens = n_new;
        ff_gen_output *outs = NULL;
        int32_t n_outs = 0;
        rc = ff_model_generate(m, NULL, &q, 1, &outs, &n_outs);
        for (int32_t i = 0; i < n_outs; i++) ff_gen_output_free(&outs[i]);
        free(outs);
    } else if (mode == M_LOGPROBS) {
        rc = ff_model_forward(m, &b, NULL, &(ff_forward_out){.logprobs = lp});
    } else if (mode == M_TRAIN) {
        ff_adamw_config ac;
        ff_adamw_config_default(&ac);
        o = ff_optimizer_new(m, &ac);
        rc = !o || ff_model_zero_grad(m) || ff_model_forward(m, &b, &(ff_forward_opts){.train = true}, &(ff_forward_out){.logprobs = lp}) ||
             ff_model_backward(m, d, NULL, NULL) || ff_optimizer_step(o, NULL);
    }
    if (rc) return die(mode_names[mode]);
    r.at[PH_USED] = ff_resident_memory();
    r.ok = 1;
    ff_optimizer_destroy(&o);
    free(tok), free(tg), free(lp), free(d);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    return write(fd, &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1;
}

static int measure(int mode, const char *dir, int threads, int32_t prompt, int32_t n_new, report *r) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(p[0]);
        _exit(run_mode(mode, dir, threads, prompt, n_new, p[1]));
    }
    close(p[1]);
    memset(r, 0, sizeof *r);
    ssize_t got = read(p[0], r, sizeof *r);
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    return got == (ssize_t)sizeof *r && r->ok && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* The Qwen2-0.5B shape with `layers` layers, random weights, bf16, into dir. */
static int write_qwen(const char *dir, int layers) {
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "qwen2");
    c.vocab_size = 151936, c.hidden_size = 896, c.intermediate_size = 4864, c.num_hidden_layers = layers;
    c.num_attention_heads = 14, c.num_key_value_heads = 2, c.max_position_embeddings = 32768;
    c.rope_theta = 1000000.0, c.rms_norm_eps = 1e-6, c.tie_word_embeddings = true, c.attention_bias = true;
    c.bos_token_id = -1, c.pad_token_id = -1;
    ff_tensor_set *w = ff_tensor_set_new();
    int rc = w && ff_model_init_weights(&c, 0, 0.02, w) == 0 ? ff_model_dir_save(dir, &c, w, NULL, FF_DTYPE_BF16) : -1;
    ff_tensor_set_destroy(&w);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int layers = 24, threads = 2;
    int32_t prompt = 16, n_new = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc) n_new = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_memory [--model DIR] [--layers N] [--prompt N] [--new N] [--threads N]\n");
            return 2;
        }
    }
    if (layers < 1 || prompt < 1 || n_new < 1 || threads < 1) {
        fprintf(stderr, "bench_memory: --layers, --prompt, --new and --threads must be >= 1\n");
        return 2;
    }
    char tmp[FF_PATH_MAX] = "";
    if (!dir) {
        const char *t = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/bench_memory_%d", t && *t ? t : "/tmp", (int)getpid());
        printf("writing a Qwen2-0.5B-shaped model with %d layers (bf16) into %s\n", layers, tmp);
        fflush(stdout);
        if (write_qwen(tmp, layers) != 0) return die(tmp);
        dir = tmp;
    }
    const double MiB = 1024.0 * 1024.0;
    report r[M_N];
    double ratio = 0, extra = 0;
    int bad = 0;
    for (int k = 0; k < M_N; k++) {
        if (measure(k, dir, threads, prompt, n_new, &r[k]) != 0) {
            fprintf(stderr, "bench_memory: mode %s failed\n", mode_names[k]);
            bad = 1;
            continue;
        }
        uint64_t wb = (uint64_t)r[k].params * 4;
        if (k == 0) printf("%s: %lld parameters, %.0f MiB as fp32 (resident MiB after each phase)\n", dir, (long long)r[k].params, (double)wb / MiB);
        printf("%-10s", mode_names[k]);
        for (int p = 0; p < PH_N; p++) printf(" | %s %6.0f", phase_names[p], (double)r[k].at[p].now / MiB);
        uint64_t peak = r[k].at[PH_USED].peak;
        printf(" | peak %6.0f = %.2f x weights\n", (double)peak / MiB, (double)peak / (double)wb);
        if (k == M_GENERATE) ratio = (double)peak / (double)wb, extra = (double)peak - 1.3 * (double)wb;
    }
    if (!bad)
        printf("read straight into the model against through an fp32 host set, peak: fp32 %.0f against %.0f MiB (%.2fx), bf16 %.0f "
               "against %.0f MiB (%.2fx)\n",
               (double)r[M_GENERATE].at[PH_USED].peak / MiB, (double)r[M_GENERATE_SET].at[PH_USED].peak / MiB,
               (double)r[M_GENERATE].at[PH_USED].peak / (double)r[M_GENERATE_SET].at[PH_USED].peak,
               (double)r[M_GENERATE16].at[PH_USED].peak / MiB, (double)r[M_GENERATE16_SET].at[PH_USED].peak / MiB,
               (double)r[M_GENERATE16].at[PH_USED].peak / (double)r[M_GENERATE16_SET].at[PH_USED].peak);
    if (tmp[0]) {
        char cmd[FF_PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "bench_memory: could not remove %s\n", tmp);
    }
    if (bad) return 1;
    printf("memory: generate peak %.2f x weights, bf16 generate peak %.2f x the fp32 weights (%.2fx through a host set) "
           "(target: <= 1.3 x weights + 64 MiB: %s)\n",
           ratio, (double)r[M_GENERATE16].at[PH_USED].peak / ((double)r[M_GENERATE16].params * 4),
           (double)r[M_GENERATE16_SET].at[PH_USED].peak / ((double)r[M_GENERATE16_SET].params * 4),
           extra <= 64.0 * 1024 * 1024 ? "met" : "missed");
    return 0;
}

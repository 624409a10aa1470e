/* Benchmark: one PPO iteration with the full fuseflow runtime (`fuseflow run`: the
 * controller, a worker process, the messages between them) beside a straightforward PyTorch
 * implementation of the same iteration (bench/ppo_torch.py), same model, same prompts, same
 * settings, same thread count, in the same run.
 *
 * The iteration: B prompts x n responses (continuous batching, one prefill per prompt),
 * exact-match reward, reference log-probs and critic values, token rewards with a KL
 * penalty, GAE (whitened), critic then actor training over shuffled mini-batches and
 * micro-batches, weight sync. fuseflow runs it as a run config (written here, printed with
 * --show-config) on one worker with the given threads; its time per iteration is the
 * metrics' time.iteration (first iteration dropped as warm-up, median of the rest);
 * PyTorch's is ppo_torch.py's median of the same number of iterations after its warm-up.
 *
 * usage: bench_ppo_iter [--model DIR] [--reps R] [--threads N] [--batch B] [--quick]
 *                       [--fuseflow BIN] [--source DIR] [--python PY] [--no-torch] [--show-config]
 *   --model DIR   a model folder (default: a fresh `fuseflow init --preset tiny`)
 *   --source DIR  the repository (for bench/ppo_torch.py; default: FF_SOURCE_DIR or .)
 * Last line: ppo_iteration_runtime: <ms> ms (target: faster than PyTorch; <ratio>x ...) */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/tokenizer.h"
#include "fuseflow/util.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int sh(const char *cmd) {
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "bench_ppo_iter: failed (%d): %s\n", rc, cmd);
    return rc;
}

int main(int argc, char **argv) {
    const char *model = NULL, *ffbin = getenv("FF_BIN"), *srcdir = getenv("FF_SOURCE_DIR"), *py = "/usr/bin/python3";
    int reps = 3, threads = 2, batch = 64;
    bool torch = true, show = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) reps = 2, batch = 32;
        else if (!strcmp(a, "--no-torch")) torch = false;
        else if (!strcmp(a, "--show-config")) show = true;
        else if (v && !strcmp(a, "--model")) model = v, i++;
        else if (v && !strcmp(a, "--reps")) reps = atoi(v), i++;
        else if (v && !strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (v && !strcmp(a, "--batch")) batch = atoi(v), i++;
        else if (v && !strcmp(a, "--fuseflow")) ffbin = v, i++;
        else if (v && !strcmp(a, "--source")) srcdir = v, i++;
        else if (v && !strcmp(a, "--python")) py = v, i++;
        else {
            fprintf(stderr, "usage: bench_ppo_iter [--model DIR] [--reps R] [--threads N] [--batch B] [--quick] [--fuseflow BIN]\n"
                            "                      [--source DIR] [--python PY] [--no-torch] [--show-config]\n");
            return 2;
        }
    }
    if (reps < 1 || threads < 1 || batch < 4 || batch % 4) {
        fprintf(stderr, "bench_ppo_iter: --reps >= 1, --threads >= 1, --batch a multiple of 4\n");
        return 2;
    }
    char self[FF_PATH_MAX], bin[FF_PATH_MAX];
    if (!ffbin) { /* the fuseflow binary next to this one (both live in the build folder) */
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
        snprintf(bin, sizeof bin, "%s/fuseflow", self);
        ffbin = bin;
    }
    if (!srcdir) srcdir = ".";
    char dir[] = "/tmp/ff_bench_ppo_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char cmd[16384], path[8192], mdir[FF_PATH_MAX];
    if (!model) {
        snprintf(mdir, sizeof mdir, "%s/tiny", dir);
        snprintf(cmd, sizeof cmd, "%s init --preset tiny --out %s > /dev/null", ffbin, mdir);
        if (sh(cmd)) return 1;
        model = mdir;
    }
    int n_prompts = batch * (reps + 1);
    snprintf(cmd, sizeof cmd, "%s dataset arith --digits 2 --train %d --test 10 --seed 7 --out %s/data > /dev/null", ffbin, n_prompts, dir);
    if (sh(cmd)) return 1;
    /* the same prompts, tokenized as fuseflow encodes them, for PyTorch */
    ff_tokenizer *tok = ff_tokenizer_load_dir(model);
    if (!tok) {
        fprintf(stderr, "bench_ppo_iter: %s\n", ff_error_message());
        return 1;
    }
    snprintf(path, sizeof path, "%s/data/train.jsonl", dir);
    FILE *in = fopen(path, "r");
    snprintf(path, sizeof path, "%s/prompts.jsonl", dir);
    FILE *out = fopen(path, "w");
    char line[4096];
    while (in && out && fgets(line, sizeof line, in)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) continue;
        const char *p = json_string_value(json_object_get(o, "prompt")), *ans = json_string_value(json_object_get(o, "answer"));
        int32_t *ids = NULL, n = 0;
        ff_encode_opts eo = {true, true};
        if (p && ans && ff_tokenizer_encode(tok, p, strlen(p), &eo, &ids, &n) == 0) {
            fprintf(out, "{\"ids\": [");
            for (int32_t k = 0; k < n; k++) fprintf(out, "%s%d", k ? ", " : "", ids[k]);
            fprintf(out, "], \"answer\": \"%s\"}\n", ans);
        }
        free(ids);
        json_decref(o);
    }
    if (in) fclose(in);
    if (out) fclose(out);
    ff_tokenizer_destroy(&tok);

    /* the run config: PPO as ppo_torch.py does it */
    const int n = 4, max_new = 8, mini = 128, micro = 64;
    const double lr = 1e-4, kl = 0.02;
    snprintf(path, sizeof path, "%s/ppo.yaml", dir);
    out = fopen(path, "w");
    if (!out) return 1;
    fprintf(out,
            "trainer: {steps: %d, seed: 1, test_freq: 0, save_freq: 0, out_dir: %s/out}\n"
            "data: {train_files: %s/data/train.jsonl, train_batch_size: %d, max_prompt_length: 16, max_response_length: %d,"
            " shuffle: false}\n"
            "roles:\n"
            "  actor: {model: %s, workers: 1, optim: {lr: %g, weight_decay: 0.0, grad_clip: 1.0}}\n"
            "  critic: {model: %s, colocate_with: actor, optim: {lr: %g, weight_decay: 0.0, grad_clip: 1.0}}\n"
            "  ref: {model: %s, colocate_with: actor}\n"
            "graph:\n"
            "  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: %d, temperature: 1.0}\n"
            "  ref_logprob: {op: logprob, role: ref, in: [prompt, response], out: [ref_logprob], micro_batch_size: %d}\n"
            "  values: {op: value, role: critic, in: [prompt, response], out: [values], micro_batch_size: %d}\n"
            "  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: arith_exact_match}\n"
            "  advantage: {op: advantage, in: {score: score, values: values, old_logprob: old_logprob, ref_logprob: ref_logprob},\n"
            "              out: [advantages, returns], estimator: gae, gamma: 1.0, lam: 0.95, kl_penalty: {type: kl, coef: %g}}\n"
            "  train_critic: {op: train, role: critic, in: [prompt, response, values, returns], cliprange_value: 0.5,"
            " mini_batch_size: %d, micro_batch_size: %d}\n"
            "  train_actor: {op: train, role: actor, in: [prompt, response, old_logprob, advantages, ref_logprob], clip_ratio: 0.2,"
            " clip_ratio_c: 3.0, mini_batch_size: %d, micro_batch_size: %d}\n"
            "  sync: {op: sync_weights, role: actor, after: [train_actor]}\n",
            reps + 1, dir, dir, batch, max_new, model, lr, model, lr, model, n, micro, micro, kl, mini / n, micro, mini / n, micro);
    fclose(out);
    if (show) {
        snprintf(cmd, sizeof cmd, "cat %s", path);
        sh(cmd);
    }
    printf("PPO iteration: %d prompts x %d responses (up to %d tokens), mini-batch %d samples, micro-batch %d, %d threads; "
           "%d iterations after one warm-up\n",
           batch, n, max_new, mini, micro, threads, reps);
    fflush(stdout);
    snprintf(cmd, sizeof cmd, "%s run %s --threads %d --no-progress > %s/run.log 2>&1", ffbin, path, threads, dir);
    if (sh(cmd)) {
        snprintf(cmd, sizeof cmd, "cat %s/run.log", dir);
        sh(cmd);
        return 1;
    }
    double t[64];
    int nt = 0;
    double stage[8] = {0};
    const char *stages[8] = {"rollout", "ref_logprob", "values", "reward", "advantage", "train_critic", "train_actor", "sync"};
    double reward = 0, length = 0;
    snprintf(path, sizeof path, "%s/out/metrics.jsonl", dir);
    in = fopen(path, "r");
    while (in && fgets(line, sizeof line, in)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) continue;
        json_int_t it = json_integer_value(json_object_get(o, "iteration"));
        json_t *tm = json_object_get(o, "time");
        if (it >= 2 && tm && nt < 64) {
            t[nt++] = json_number_value(json_object_get(tm, "iteration"));
            for (int k = 0; k < 8; k++) stage[k] += json_number_value(json_object_get(tm, stages[k]));
            reward += json_number_value(json_object_get(o, "reward_mean"));
            length += json_number_value(json_object_get(o, "response_length"));
        }
        json_decref(o);
    }
    if (in) fclose(in);
    if (nt == 0) {
        fprintf(stderr, "bench_ppo_iter: no iteration times in %s\n", path);
        return 1;
    }
    qsort(t, (size_t)nt, sizeof *t, cmp_d);
    double ff = t[nt / 2];
    printf("fuseflow (controller + 1 worker): %.3f s per iteration (median of %d; reward %.3f, mean response %.2f tokens)\n", ff,
           nt, reward / nt, length / nt);
    printf("  stages (first dispatch to last result, overlapping):");
    for (int k = 0; k < 8; k++) printf(" %s %.3f", stages[k], stage[k] / nt);
    printf("\n");
    fflush(stdout);
    double th = 0;
    if (torch) {
        snprintf(cmd, sizeof cmd,
                 "%s %s/bench/ppo_torch.py --model %s --prompts %s/prompts.jsonl --threads %d --reps %d --batch %d --n %d "
                 "--max-new %d --mini %d --micro %d --lr %g --critic-lr %g --kl-coef %g > %s/torch.log 2>&1",
                 py, srcdir, model, dir, threads, reps, batch, n, max_new, mini, micro, lr, lr, kl, dir);
        if (sh(cmd)) {
            snprintf(cmd, sizeof cmd, "tail -5 %s/torch.log", dir);
            sh(cmd);
            torch = false;
        } else {
            snprintf(path, sizeof path, "%s/torch.log", dir);
            in = fopen(path, "r");
            char last[8192] = "";
            while (in && fgets(line, sizeof line, in)) {
                if (strstr(line, "torch iteration")) fputs(line, stdout);
                if (line[0] == '{') snprintf(last, sizeof last, "%s", line);
            }
            if (in) fclose(in);
            json_error_t je;
            json_t *o = json_loads(last, 0, &je);
            th = json_number_value(json_object_get(o, "iter_s"));
            json_decref(o);
            if (th <= 0) torch = false;
        }
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
    if (!torch) {
        printf("ppo_iteration_runtime: %.1f ms (target: faster than PyTorch; PyTorch not run)\n", ff * 1e3);
        return 0;
    }
    printf("PyTorch (%s, same settings): %.3f s per iteration (median of %d)\n", py, th, reps);
    printf("ppo_iteration_runtime: %.1f ms (target: faster than PyTorch; %.2fx faster than PyTorch's %.1f ms)\n", ff * 1e3, th / ff,
           th * 1e3);
    return 0;
}

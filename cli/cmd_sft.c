/* `fuseflow sft`: supervised fine-tuning from JSONL prompt/response pairs. The trainer is
 * include/fuseflow/sft.h (model/sft/); this file parses the command line, prints the
 * progress it reports, and turns Ctrl-C into "finish the step, save a checkpoint, stop". */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/sft.h"
#include "fuseflow/util.h"

static const char *CMD = "sft";

static void help(void) {
    printf("usage: fuseflow sft --config FILE.yaml [--resume | --resume-with-changes] [key=value ...]\n\n"
           "Fine-tunes a model folder on JSONL lines {\"prompt\": ..., \"response\": ...}; the loss\n"
           "covers the response (and the eos after it), not the prompt. Prints a progress line\n"
           "per step (a live line on a terminal), evaluates on held-out data, saves checkpoints.\n"
           "Everything it writes under OUT is checked before it loads anything; staging folders of\n"
           "dead runs there are removed (docs/model-files.md).\n\n"
           "options:\n"
           "  --config FILE      the run (keys below; examples/sft_arith.yaml is a full example)\n"
           "  --resume           continue from the newest checkpoint in OUT/checkpoints; refused when the\n"
           "                     config (with its overrides) changes the run, listing the keys; only out,\n"
           "                     device, save_dtype, data.test, train.logger, log_every, eval_every,\n"
           "                     eval_samples, save_every, keep_checkpoints and stop_after may differ\n"
           "  --backend D        the same as device=D: cpu, cpu:N, cuda, cuda:N (cuda: bf16 products\n"
           "                     and activations, fp32 masters; FF_CUDA_MATH=tf32 or fp32 for fp32 ones)\n"
           "  --resume-with-changes  resume anyway (e.g. a longer train.steps); the changes go to\n"
           "                     OUT/config_changes.jsonl, OUT/config.yaml stays the original\n"
           "  key=value          override a key, e.g. train.steps=50 optim.lr=1e-3\n\n"
           "keys (defaults in brackets):\n"
           "  model              model folder to start from (config.json, weights, tokenizer)\n"
           "  out                run folder: checkpoints/, final/, metrics.jsonl, config.yaml, curves.png\n"
           "  device             cpu, cpu:N, cuda, cuda:N [cpu]\n"
           "  save_dtype         dtype of OUT/final: f32, bf16, f16 [f32]\n"
           "  data.train         training JSONL\n"
           "  data.test          held-out JSONL [none]\n"
           "  train.steps        optimizer steps [100]\n"
           "  train.batch_size   sequences per step [32]\n"
           "  train.micro_batch_tokens  tokens per forward/backward, 0 = whole batch [0]\n"
           "  train.seed         data order seed [1]\n"
           "  train.log_every    a permanent progress line every N steps [1]\n"
           "  train.logger       where the metrics go, any of: console (the step and eval lines),\n"
           "                     jsonl (OUT/metrics.jsonl), tensorboard (OUT/events.out.tfevents.*)\n"
           "                     [[console, jsonl]]; OUT/curves.png is drawn from metrics.jsonl\n"
           "  train.eval_every   held-out loss and exact match every N steps, 0 = off [0]\n"
           "  train.eval_samples held-out examples used for eval [200]\n"
           "  train.save_every   checkpoint every N steps, 0 = only at the end [0]\n"
           "  train.keep_checkpoints  newest checkpoints kept [2]\n"
           "  train.stop_after   stop after this step with a checkpoint, 0 = run to the end [0];\n"
           "                     e.g. to split a run across time-limited jobs (then --resume)\n"
           "  optim.lr [1e-3], optim.weight_decay [0.01], optim.beta1 [0.9], optim.beta2 [0.999],\n"
           "  optim.eps [1e-8], optim.max_grad_norm [1.0], optim.warmup_steps [0],\n"
           "  optim.min_lr_ratio [0.1] (cosine decay to lr * min_lr_ratio over train.steps)\n\n"
           "example:\n"
           "  fuseflow sft --config examples/sft_arith.yaml train.steps=200\n");
}

static volatile sig_atomic_t g_interrupted = 0;
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

typedef struct console {
    bool tty;
    double ema_step; /* seconds per step, smoothed: the ETA */
} console;

static const char *clear(const console *c) { return c->tty ? "\r\033[K" : ""; }

static void on_event(void *ud, const ff_sft_event *e) {
    console *c = ud;
    char a[32], b[32];
    switch (e->kind) {
    case FF_SFT_START:
        ffio_human((double)e->params, a, sizeof a);
        fprintf(stderr, "sft: %s (%s parameters) on %lld examples%s%s, %lld steps of %lld sequences, lr %g, %s%s\n", e->model, a,
                (long long)e->n_train, e->test_path ? ", held-out " : "", e->test_path ? e->test_path : "", (long long)e->steps,
                (long long)e->batch, e->lr, e->backend, e->resumed_from ? ", resumed" : "");
        if (e->resumed_from) fprintf(stderr, "sft: resuming from %s (step %lld)\n", e->resumed_from, (long long)e->step);
        break;
    case FF_SFT_STEP: {
        c->ema_step = c->ema_step == 0 ? e->step_s : 0.9 * c->ema_step + 0.1 * e->step_s;
        ffio_duration(c->ema_step * (double)(e->steps - e->step), a, sizeof a);
        ffio_human((double)e->tokens / (e->step_s > 0 ? e->step_s : 1e-9), b, sizeof b);
        char gpu[80] = "", p[32], q[32];
        if (e->device_capacity > 0)
            snprintf(gpu, sizeof gpu, " | gpu %s/%s", ff_fmt_bytes((uint64_t)e->device_peak, p, sizeof p),
                     ff_fmt_bytes((uint64_t)e->device_capacity, q, sizeof q));
        if (e->console && (e->log_line || c->tty))
            fprintf(stderr, "%sstep %6lld/%lld | loss %.4f | lr %.2e | grad %.3f | %s tok/s%s | ETA %s%s", clear(c), (long long)e->step,
                    (long long)e->steps, e->loss, e->lr, e->grad_norm, b, gpu, a, e->log_line ? "\n" : "");
        break;
    }
    case FF_SFT_EVAL:
        if (!e->console) break;
        fprintf(stderr, "%seval @ %lld | held-out loss %.4f | exact match %.1f%% (%lld/%lld) | %.1fs\n", clear(c), (long long)e->step, e->eval_loss,
                100.0 * (double)e->hits / (double)e->n_test, (long long)e->hits, (long long)e->n_test, e->eval_s);
        break;
    case FF_SFT_SAVED: break;
    case FF_SFT_END:
        fprintf(stderr, "%ssft: done in %.1fs (%lld tokens); model in %s\n", clear(c), e->elapsed_s, (long long)e->tokens, e->path);
        break;
    }
}

int ff_cmd_sft(int argc, char **argv) {
    const char *cfg_path = NULL, *backend = NULL;
    bool resume = false, with_changes = false;
    const ffio_opt opts[] = {{"config", FFIO_STR, &cfg_path, 0, 0},
                             {"resume", FFIO_FLAG, &resume, 0, 0},
                             {"resume-with-changes", FFIO_FLAG, &with_changes, 0, 0},
                             {"backend", FFIO_STR, &backend, 0, 0}};
    char *overrides[257]; /* and --backend's device=D after them */
    char device_kv[96];
    int n_over;
    int pr = ffio_parse(CMD, argc, argv, opts, 4, overrides, 256, &n_over);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (!cfg_path) return ffio_usage(CMD, "--config FILE is required");
    for (int i = 0; i < n_over; i++)
        if (!strchr(overrides[i], '=')) return ffio_usage(CMD, "'%s' is neither an option nor a key=value override", overrides[i]);
    if (backend) { /* the last override: it wins over a device=... before it */
        if ((size_t)snprintf(device_kv, sizeof device_kv, "device=%s", backend) >= sizeof device_kv)
            return ffio_usage(CMD, "--backend '%s' is too long (cpu, cpu:N, cuda or cuda:N)", backend);
        overrides[n_over++] = device_kv;
    }
    console con = {isatty(fileno(stderr)), 0};
    ff_sft_opts o = {.config = cfg_path, .n_overrides = n_over, .overrides = overrides, .resume = resume || with_changes,
                     .resume_with_changes = with_changes, .interrupt = &g_interrupted, .on_event = on_event, .event_ud = &con};
    signal(SIGINT, on_sigint);
    ff_sft_result res;
    int rc = ff_sft_run(&o, &res);
    signal(SIGINT, SIG_DFL);
    if (rc < 0) return ffio_fail(CMD);
    ffplot_after_run(CMD, res.out);
    if (rc == FF_SFT_STOPPED)
        fprintf(stderr, "%ssft: stopped after step %lld (train.stop_after); saved %s (continue with --resume)\n", clear(&con), (long long)res.step,
                res.checkpoint);
    if (rc == FF_SFT_INTERRUPTED)
        fprintf(stderr, "%ssft: interrupted; saved %s (continue with --resume)\n", clear(&con), res.checkpoint);
    return rc == FF_SFT_INTERRUPTED ? 130 : 0;
}

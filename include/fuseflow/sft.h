/* fuseflow: supervised fine-tuning in-process (`fuseflow sft` as a library): a model folder
 * trained on JSONL prompt/response pairs, with held-out evaluation, checkpoints and resume.
 *
 * Each example is prompt (encoded with the tokenizer's template) + response + eos; the loss
 * is the token-mean cross-entropy of the response tokens only (the prompt is masked). A step
 * takes train.batch_size examples in the data order of fuseflow/train_dir.h (a seeded
 * permutation per epoch), optionally in micro-batches of at most train.micro_batch_tokens
 * tokens whose gradients add up to the same update.
 *
 * The run folder (train_dir.h) holds config.yaml, metrics.jsonl ({"step", "loss", "lr",
 * "grad_norm", "tokens", "tokens_per_s", "elapsed_s"} and {"step", "eval_loss",
 * "exact_match", "eval_samples"}), checkpoints/step-NNNNNNNN (the model folder in F32,
 * optimizer.safetensors, trainer_state.json: step, epoch, position, tokens seen, seed,
 * examples; config.yaml) and final/ (the model in save_dtype). A resumed run reproduces the
 * losses and weights of an uninterrupted one bit for bit (the data order is a function of
 * (seed, epoch), the optimizer state is exact, weights are F32).
 *
 * The config keys and their defaults are listed by `fuseflow sft --help` (cli/cmd_sft.c) and
 * docs/model-files.md. Progress goes to the caller through events; nothing here prints
 * (except log lines through ff_log).
 *
 * Not here: argument parsing and printing (cli/cmd_sft.c), the model (model.h). */
#ifndef FUSEFLOW_SFT_H
#define FUSEFLOW_SFT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "fuseflow/util.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef enum {
    FF_SFT_START = 0, /* data and model loaded, about to train */
    FF_SFT_STEP,      /* an optimizer step done */
    FF_SFT_EVAL,      /* held-out loss and exact match */
    FF_SFT_SAVED,     /* a checkpoint written */
    FF_SFT_END,       /* the final model written */
} ff_sft_event_kind;

typedef struct ff_sft_event {
    ff_sft_event_kind kind;
    int64_t step, steps;       /* steps done, train.steps */
    bool console;              /* train.logger has console: STEP and EVAL are for the console */
    /* START */
    const char *model, *test_path, *backend;
    const char *resumed_from;  /* the checkpoint, NULL on a fresh start */
    int64_t params, n_train, n_test, batch;
    /* STEP */
    double loss, lr, grad_norm;
    double step_s;             /* this step's seconds */
    int64_t tokens;            /* this step's tokens */
    bool log_line;             /* a line of its own is due (train.log_every, the first, the last) */
    int64_t device_peak, device_capacity; /* on a device: the most the backend held in the step, the
                                             device's memory, in bytes (metrics.jsonl's
                                             device_peak_bytes); 0 on the cpu */
    /* EVAL */
    double eval_loss, eval_s;
    int64_t hits;              /* exact matches among n_test */
    /* SAVED: path; END: path (the final model), tokens = all tokens seen, elapsed_s */
    const char *path;
    double elapsed_s;
} ff_sft_event;

typedef struct ff_sft_opts {
    const char *config;                /* the run (YAML) */
    int n_overrides;
    char *const *overrides;            /* "key.sub=value", applied in order */
    bool resume;                       /* continue from the newest checkpoint in OUT/checkpoints */
    bool resume_with_changes;          /* resume even when the config changes the run (recorded) */
    volatile sig_atomic_t *interrupt;  /* set non-zero: finish the step, save, stop */
    void (*on_event)(void *ud, const ff_sft_event *e);
    void *event_ud;
} ff_sft_opts;

/* How ff_sft_run ended (checkpoint: the one to continue from, "" when none). */
enum {
    FF_SFT_DONE = 0,        /* train.steps reached, final model written */
    FF_SFT_STOPPED = 1,     /* train.stop_after reached, with a checkpoint */
    FF_SFT_INTERRUPTED = 2, /* opts.interrupt, with a checkpoint */
};
typedef struct ff_sft_result {
    int64_t step;
    char checkpoint[FF_PATH_MAX];
    char out[FF_PATH_MAX]; /* the run folder (the config's `out`), "" before the config was read */
} ff_sft_result;

/* Train. FF_SFT_DONE, FF_SFT_STOPPED or FF_SFT_INTERRUPTED, or -1 + error (bad config or
 * data, an output folder that cannot be written, a resume that does not match; after
 * training started, the message names the checkpoint to continue from). res may be NULL. */
int ff_sft_run(const ff_sft_opts *o, ff_sft_result *res);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

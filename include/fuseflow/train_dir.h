/* fuseflow: what the two training commands, `fuseflow sft` (fuseflow/sft.h) and `fuseflow run`
 * (fuseflow/executor.h), share: the run folder and the order in which examples are drawn.
 *
 * The run folder OUT:
 *   OUT/config.yaml                the effective config (YAML with its overrides) the run started
 *                                  with; a resume keeps it
 *   OUT/config_changes.jsonl       one line per resume whose config differed from the
 *                                  checkpoint's (each key, before and after)
 *   OUT/metrics.jsonl              one JSON object per line, keyed by step ("step", "iteration")
 *                                  (logger jsonl, the default)
 *   OUT/events.out.tfevents.*      the same lines as TensorBoard scalars (logger tensorboard,
 *                                  fuseflow/tfevents.h), one file per start of the command
 *   OUT/checkpoints/step-NNNNNNNN/ what the command saves, plus config.yaml: the effective
 *                                  config at that step (what --resume compares with)
 * Checkpoints are staged as step-N.tmp-PID and swapped in whole (ff_atomic_dir, modelio.h).
 *
 * Opening the folder checks, before any work starts, that everything the command will write
 * can be written (the folder, its checkpoints/, each named file), removes what dead runs
 * left (staging folders and temporary files whose PID is gone; each removal is logged), and
 * finds the newest checkpoint. A fresh run refuses a folder with checkpoints; --resume
 * needs one and compares the configs: keys outside the command's list of harmless ones that
 * differ refuse the resume, listing them, unless the caller accepts changes
 * (--resume-with-changes), which are then recorded.
 *
 * The data order: epoch e is a permutation of the examples drawn from (seed, e), so a
 * position is (epoch, cursor) and a checkpoint needs only that.
 *
 * Not here: what a checkpoint holds (each command's), when to save. */
#ifndef FUSEFLOW_TRAIN_DIR_H
#define FUSEFLOW_TRAIN_DIR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/config.h"
#include "fuseflow/util.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- the data order ------------------------------------------------------------------------ */

typedef struct ff_data_order {
    uint64_t seed;
    bool shuffle;          /* false: 0, 1, 2, ... every epoch */
    int64_t n;             /* examples */
    int64_t epoch, cursor; /* the next example is perm[cursor] of epoch's permutation */
    int64_t *perm;         /* [n] */
} ff_data_order;

/* An order over n > 0 examples standing at (epoch, cursor <= n). 0 or -1 + error. */
int ff_data_order_init(ff_data_order *o, int64_t n, uint64_t seed, bool shuffle, int64_t epoch, int64_t cursor);
/* Move to (epoch, cursor), rebuilding the permutation when the epoch differs. */
void ff_data_order_seek(ff_data_order *o, int64_t epoch, int64_t cursor);
/* The next example's index; past the end of an epoch the next epoch begins. */
int64_t ff_data_order_next(ff_data_order *o);
void ff_data_order_free(ff_data_order *o);

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* The steps of the checkpoints OUT_DIR/checkpoints/step-N, ascending; staging folders are
 * skipped. Returns the count and a malloc'd list in *steps (the caller frees it; NULL when
 * the count is 0). */
int ff_checkpoint_steps(const char *out_dir, int64_t **steps);
/* For a file or folder inside OUT/checkpoints/step-N (path names it, or something in it): the
 * hint for an error that shows that checkpoint damaged, naming the checkpoint before it and
 * how to resume from it (move the damaged one aside; --resume takes the newest), or, with
 * none before it, how to start again. 0 and the hint in buf, or -1 (not in a checkpoint). */
int ff_checkpoint_hint(const char *path, char *buf, size_t cap);
/* A failure reading path: when path lies in a checkpoint, the current error gets
 * ff_checkpoint_hint's hint (once). Returns -1, for `return ff_checkpoint_error(path);`. */
int ff_checkpoint_error(const char *path);
/* "OUT_DIR/checkpoints/step-NNNNNNNN" into buf. */
void ff_checkpoint_path(const char *out_dir, int64_t step, char *buf, size_t cap);

/* ---- the run folder ---------------------------------------------------------------------------- */

typedef struct ff_train_dir_spec {
    const char *cmd;                 /* "sft", "run": in messages */
    const char *out;                 /* the run folder */
    const char *out_key;             /* the config key that names it ("out", "trainer.out_dir") */
    const char *step_key;            /* the step key of metrics lines ("step", "iteration") */
    bool resume;
    const char *const *files;        /* more files under OUT the command writes, NULL-terminated
                                        (NULL: none), e.g. "samples.jsonl" */
    const char *const *folders;      /* folders under OUT it replaces whole, e.g. "final" */
    const char *const *harmless;     /* config keys whose change keeps the run's meaning,
                                        NULL-terminated; "*" matches one level
                                        ("roles.*.workers"), a key covers what is below it */
    unsigned loggers;                /* FF_LOGGER_* (config.h) of the `logger` key: which of
                                        metrics.jsonl and the event files ff_train_dir_metrics
                                        writes (console is the caller's); 0: FF_LOGGERS_DEFAULT */
} ff_train_dir_spec;

typedef struct ff_train_dir {
    ff_train_dir_spec spec;          /* the caller's strings, alive as long as this */
    char checkpoint[FF_PATH_MAX];           /* the newest checkpoint: resumed from, then saved ("" none) */
    int64_t checkpoint_step;         /* its step, -1 when none */
    int64_t changes;                 /* differences a resume accepted (check_config) */
    char *pending;                   /* the config_changes.jsonl line start writes (owned) */
    struct ff_tfevents *tb;          /* the event file start opened (logger tensorboard; owned) */
} ff_train_dir;

/* Check and prepare OUT (above): created if missing; every path the command writes checked;
 * stale leftovers removed; the newest checkpoint found. With spec->resume one must exist;
 * without, none may. 0 or -1 + error naming the path and what to do. */
int ff_train_dir_open(ff_train_dir *d, const ff_train_dir_spec *spec);
/* Free what the folder state holds (not the folder); closes the event file. */
void ff_train_dir_close(ff_train_dir *d);

/* --resume: compare `now` (this run's effective config) with the checkpoint's recorded one
 * (OUT/config.yaml for checkpoints older than that record). Differences in keys that are not
 * harmless refuse the resume (-1 + error listing them, at most 12 with the count) unless
 * accept_changes; every difference (harmless or accepted) is logged, and appended to
 * OUT/config_changes.jsonl by ff_train_dir_start (a resume that fails before it records
 * nothing). 0 or -1 + error. */
int ff_train_dir_check_config(ff_train_dir *d, const ff_config *now, bool accept_changes);

/* Begin writing: a fresh run writes OUT/config.yaml and starts OUT/metrics.jsonl empty
 * (whatever the loggers, so no earlier run's lines stay) and removes earlier runs' event
 * files; a resumed one keeps config.yaml (writes it only when missing) and cuts metrics.jsonl
 * to the lines of steps up to the checkpoint's, and records the changes check_config
 * accepted. With the tensorboard logger a new event file is opened (a resumed run's starts
 * with a restart at the step after the checkpoint's, so TensorBoard drops the steps written
 * again). 0 or -1 + error. */
int ff_train_dir_start(ff_train_dir *d, const ff_config *cfg);

/* Append one line (compact JSON) to OUT/metrics.jsonl (logger jsonl) and as one event to
 * the event file (logger tensorboard). Any failure (open, a short write, the close) is
 * -1 + error naming the file. */
int ff_train_dir_metrics(ff_train_dir *d, const json_t *line);

/* Stage the checkpoint of `step`: its staging folder (OUT as an absolute path, so processes
 * with another working folder can write into it) goes to tmp. 0 or -1 + error. */
int ff_train_dir_stage(ff_train_dir *d, int64_t step, char *tmp, size_t cap);
/* Record cfg in the staged folder (config.yaml), swap it in as checkpoint `step`, keep the
 * newest `keep` checkpoints (older ones are removed). On failure the staging folder is
 * removed. 0 or -1 + error. */
int ff_train_dir_commit(ff_train_dir *d, int64_t step, const char *tmp, const ff_config *cfg, int keep);

/* Where a run that stops here continues: "continue from OUT/checkpoints/step-N with
 * --resume" or "no checkpoint was saved: the run starts over". Returns buf. */
const char *ff_train_dir_resume_note(const ff_train_dir *d, char *buf, size_t cap);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

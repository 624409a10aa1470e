/* fuseflow: small shared utilities: clocks, logging, a seeded random generator, checked
 * allocation. Nothing here knows about models, messages or graphs. */
#ifndef FUSEFLOW_UTIL_H
#define FUSEFLOW_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- clocks ---------------------------------------------------------------------------- */
/* Monotonic time in nanoseconds (CLOCK_MONOTONIC); only differences mean anything. */
int64_t ff_now_ns(void);
/* Wall-clock time in nanoseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t ff_wall_ns(void);

/* ---- logging --------------------------------------------------------------------------- */
/* Messages go to stderr, prefixed with the level. FF_LOG=debug|info|warn|error in the
 * environment sets the threshold (default info). Thread-safe (one fprintf per message). */
typedef enum { FF_LOG_DEBUG = 0, FF_LOG_INFO, FF_LOG_WARN, FF_LOG_ERROR, FF_LOG_OFF } ff_log_level;
void ff_log(ff_log_level level, const char *fmt, ...) FF_PRINTF(2, 3);
void ff_log_set_level(ff_log_level level);
ff_log_level ff_log_get_level(void);
#define ff_debug(...) ff_log(FF_LOG_DEBUG, __VA_ARGS__)
#define ff_info(...) ff_log(FF_LOG_INFO, __VA_ARGS__)
#define ff_warn(...) ff_log(FF_LOG_WARN, __VA_ARGS__)

/* ---- random numbers -------------------------------------------------------------------- */
/* xoshiro256** seeded through splitmix64: same seed, same stream, on every machine. */
typedef struct ff_rng {
    uint64_t s[4];
} ff_rng;
void ff_rng_seed(ff_rng *r, uint64_t seed);
uint64_t ff_rng_u64(ff_rng *r);
double ff_rng_uniform(ff_rng *r);           /* [0, 1), 53 random bits */
double ff_rng_normal(ff_rng *r);            /* standard normal (Box-Muller, no cached pair) */
uint64_t ff_rng_below(ff_rng *r, uint64_t n); /* uniform in [0, n), unbiased; n > 0 */
/* A seed of its own for every (a, b) under a run's seed (splitmix64 over a, then b): a
 * request's sampling stream (iteration, prompt), a shuffle (iteration, a stream tag). */
uint64_t ff_seed_stream(uint64_t seed, uint64_t a, uint64_t b);

/* ---- allocation ------------------------------------------------------------------------ */
/* malloc/calloc/realloc that set an error message on failure (return NULL). */
void *ff_malloc(size_t n);
void *ff_calloc(size_t count, size_t size);
void *ff_realloc(void *p, size_t n);
char *ff_strdup(const char *s);

/* ---- text ------------------------------------------------------------------------------ */
/* Copy the text src into dst (cap bytes; dst may be src). A text that does not fit keeps its
 * start and its end, joined by "...": error texts name the file first and the problem and
 * hint last, and both must survive a deep path. */
void ff_text_fit(char *dst, size_t cap, const char *src);

/* ---- files ----------------------------------------------------------------------------- */
/* Read a whole file into a NUL-terminated buffer (*len excludes the NUL). NULL + error. */
char *ff_read_file(const char *path, size_t *len);
/* Write a file atomically: to PATH.tmp.PID, fsync, rename over PATH. Nothing partial is ever
 * visible under PATH. Returns 0 or -1 + error. */
int ff_write_file_atomic(const char *path, const void *data, size_t len);
/* mkdir -p. Returns 0 or -1 + error. */
int ff_mkdirs(const char *path);
/* The steps of the checkpoints OUT_DIR/checkpoints/step-N (what `fuseflow sft` and
 * `fuseflow run` write), ascending; half-written step-N.tmp-PID folders are skipped. Returns
 * the count and a malloc'd list in *steps (the caller frees it; NULL when the count is 0). */
int ff_checkpoint_steps(const char *out_dir, int64_t **steps);
/* For a file or folder inside OUT/checkpoints/step-N (path names it, or something in it): the
 * hint for an error that shows that checkpoint damaged, naming the checkpoint before it and
 * how to resume from it (move the damaged one aside; --resume takes the newest), or, with
 * none before it, how to start again. 0 and the hint in buf, or -1 (not in a checkpoint). */
int ff_checkpoint_hint(const char *path, char *buf, size_t cap);
/* A failure reading path: when path lies in a checkpoint, the current error gets
 * ff_checkpoint_hint's hint (once). Returns -1, for `return ff_checkpoint_error(path);`. */
int ff_checkpoint_error(const char *path);

#ifdef __cplusplus
}
#endif
#endif

/* fuseflow: small shared utilities: path sizes, clocks, logging, a seeded random generator
 * and seed streams, hashing, checked allocation, files, the machine's memory limit. Nothing
 * here knows about models, messages or graphs. */
#ifndef FUSEFLOW_UTIL_H
#define FUSEFLOW_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/error.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

/* ---- sizes ----------------------------------------------------------------------------- */
/* Bytes of a buffer that holds a file path, the NUL included: Linux's PATH_MAX, the longest
 * path the kernel opens. Paths built from a path (DIR/step-N, PATH.tmp-PID, "PATH:LINE" for
 * a message) use the same size: a longer one could not be opened anyway. */
#define FF_PATH_MAX 4096

/* ---- clocks ---------------------------------------------------------------------------- */
/* Monotonic time in nanoseconds (CLOCK_MONOTONIC); only differences mean anything. */
int64_t ff_now_ns(void);
/* Wall-clock time in nanoseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t ff_wall_ns(void);

/* ---- growing text --------------------------------------------------------------------- */
/* Text appended with printf formats into a buffer that grows (zero-initialise it; free p).
 * Out of memory or a bad format sets failed and ignores what follows, so the caller checks
 * once at the end. */
typedef struct ff_strbuf {
    char *p;    /* NUL-terminated once anything was written */
    size_t len, cap;
    bool failed;
} ff_strbuf;
void ff_strbuf_printf(ff_strbuf *b, const char *fmt, ...) FF_PRINTF(2, 3);

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
/* The b of the streams that are no request's (a request's b is its prompt's index, far
 * below these), one tag per stream so no two share a seed. The values are fixed: a run
 * with the same seed shuffles the same way in every version. */
#define FF_SEED_TAG_TRAIN_ORDER 0x7472000000ULL /* "tr": the RL controller's order of a train node's samples; + node * 1024 + epoch (a: iteration) */
#define FF_SEED_TAG_TRAINER_SHUFFLE 0x5348554646ULL /* "SHUFF": ff_trainer_train_batch's order (seed: its opts' seed, a: epoch) */
/* splitmix64's increment, 2^64 over the golden ratio (odd). Also what a shuffle's seed is
 * multiplied by before its epoch is added (`fuseflow sft`, the RL controller's prompt order),
 * so consecutive epochs start far apart. */
#define FF_SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ULL

/* ---- hashing -------------------------------------------------------------------------- */
/* 64-bit FNV-1a of N bytes at P, continuing from H: FF_HASH_FNV1A_INIT to start, or a
 * previous result to hash pieces in turn (the same value as hashing them joined). For hash
 * tables, string interning, weight digests and the collectives' wire checks (processes of one
 * build compare them; no hash is stored in a file). FF_HASH_FNV1A_INIT is the published
 * offset basis. */
#define FF_HASH_FNV1A_INIT 0xcbf29ce484222325ULL
uint64_t ff_hash_fnv1a(const void *p, size_t n, uint64_t h);

/* ---- allocation ------------------------------------------------------------------------ */
/* malloc/calloc/realloc that set an error message on failure (return NULL). */
void *ff_malloc(size_t n);
void *ff_calloc(size_t count, size_t size);
void *ff_realloc(void *p, size_t n);
char *ff_strdup(const char *s);

/* ---- the machine ----------------------------------------------------------------------- */
/* The bytes of memory this process may use: the least of physical memory, the cgroup's
 * memory.max (a container's limit) and RLIMIT_AS / RLIMIT_DATA when set. what (cap bytes)
 * names the bound that binds, e.g. "physical memory" or "RLIMIT_AS (ulimit -v)". */
uint64_t ff_memory_limit(char *what, size_t cap);
/* This process's resident memory now and at its peak, in bytes (VmRSS and VmHWM of
 * /proc/self/status; where that cannot be read, 0 now and getrusage's ru_maxrss as the
 * peak). */
typedef struct ff_resident {
    uint64_t now, peak;
} ff_resident;
ff_resident ff_resident_memory(void);
/* "1.5 GiB", "300 MiB", "12 KiB", "17 B" (buf holds 32 bytes). */
const char *ff_fmt_bytes(uint64_t bytes, char *buf, size_t cap);
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
/* Can PATH be written (created or replaced the way ff_write_file_atomic does)? A file
 * PATH.tmp.PID is created beside it, written, synced and removed, which is what mkdir and
 * stat cannot tell (a read-only filesystem, a full disk, permissions). PATH itself must not
 * be a folder. 0 or -1 + error naming the path and the reason. */
int ff_check_writable(const char *path);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

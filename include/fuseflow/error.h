/* fuseflow: recoverable errors.
 *
 * A library call that can fail for reasons outside the program (a missing file, a bad
 * config key, a malformed message, a dead worker) returns -1 (or NULL) and leaves a
 * message in a thread-local slot that the caller prints with ff_error_message(). The message
 * names where (a file, a key, a peer), what went wrong, and, when we know it, what to do:
 *
 *     models/tiny/model.safetensors: tensor 'lm_head.weight' ends at byte 8192 but the file
 *     has 4096 (hint: the file is truncated; copy it again)
 *
 * Programming errors (misuse of an API, broken invariants) assert instead. Nothing here
 * exits the process.
 */
#ifndef FUSEFLOW_ERROR_H
#define FUSEFLOW_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

#if defined(__GNUC__)
#define FF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FF_PRINTF(a, b)
#endif

/* Set the message: "WHERE: WHAT (hint: HINT)". where and hint may be NULL. Returns -1, so
 * `return ff_error_set(...)` reads naturally in functions that return a status. errno is
 * left as it was (so is it by ff_error_wrap): callers may still test it. */
int ff_error_set(const char *where, const char *hint, const char *fmt, ...) FF_PRINTF(3, 4);

/* Prepend context to the current message: "CONTEXT: <old message>". Returns -1. */
int ff_error_wrap(const char *fmt, ...) FF_PRINTF(1, 2);

/* The current message of this thread ("" when none). Valid until the next ff_error_*.
 * At most 8191 bytes: a longer one keeps its start and end, joined by "..." (ff_text_fit). */
const char *ff_error_message(void);

void ff_error_clear(void);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

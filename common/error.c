/* Thread-local error messages (see include/fuseflow/error.h). Fixed-size buffer: an error
 * path never allocates, so it works when allocation is what failed. */
#include "fuseflow/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FF_ERROR_CAP 2048

static _Thread_local char g_msg[FF_ERROR_CAP];

int ff_error_set(const char *where, const char *hint, const char *fmt, ...) {
    int saved = errno; /* callers may still look at the errno of what failed */
    char what[FF_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int n = 0;
    if (where && *where)
        n = snprintf(g_msg, sizeof g_msg, "%s: %s", where, what);
    else
        n = snprintf(g_msg, sizeof g_msg, "%s", what);
    if (hint && *hint && n >= 0 && (size_t)n < sizeof g_msg)
        snprintf(g_msg + n, sizeof g_msg - (size_t)n, " (hint: %s)", hint);
    errno = saved;
    return -1;
}

int ff_error_wrap(const char *fmt, ...) {
    int saved = errno;
    char ctx[FF_ERROR_CAP];
    char old[FF_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    if (old[0])
        snprintf(g_msg, sizeof g_msg, "%s: %s", ctx, old);
    else
        snprintf(g_msg, sizeof g_msg, "%s", ctx);
    errno = saved;
    return -1;
}

const char *ff_error_message(void) { return g_msg; }

void ff_error_clear(void) { g_msg[0] = '\0'; }

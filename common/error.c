/* Thread-local error messages (see include/fuseflow/error.h). Fixed-size buffers: an error
 * path never allocates, so it works when allocation is what failed. A message longer than
 * FF_ERROR_CAP - 1 bytes keeps its start (where) and its end (the problem and the hint),
 * cut in the middle (ff_text_fit). */
#include "fuseflow/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fuseflow/util.h"

#define FF_ERROR_CAP 8192

static _Thread_local char g_msg[FF_ERROR_CAP];

int ff_error_set(const char *where, const char *hint, const char *fmt, ...) {
    int saved = errno; /* callers may still look at the errno of what failed */
    char what[FF_ERROR_CAP], full[2 * FF_ERROR_CAP + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int n = 0;
    if (where && *where)
        n = snprintf(full, sizeof full, "%s: %s", where, what);
    else
        n = snprintf(full, sizeof full, "%s", what);
    if (hint && *hint && n >= 0 && (size_t)n < sizeof full)
        snprintf(full + n, sizeof full - (size_t)n, " (hint: %s)", hint);
    ff_text_fit(g_msg, sizeof g_msg, full);
    errno = saved;
    return -1;
}

int ff_error_wrap(const char *fmt, ...) {
    int saved = errno;
    char ctx[FF_ERROR_CAP], full[2 * FF_ERROR_CAP + 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    if (g_msg[0])
        snprintf(full, sizeof full, "%s: %s", ctx, g_msg);
    else
        snprintf(full, sizeof full, "%s", ctx);
    ff_text_fit(g_msg, sizeof g_msg, full);
    errno = saved;
    return -1;
}

const char *ff_error_message(void) { return g_msg; }

void ff_error_clear(void) { g_msg[0] = '\0'; }

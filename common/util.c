/* Clocks, logging, random numbers, checked allocation and file helpers shared by every
 * subsystem. No model, message or graph knowledge lives here. */
#include "fuseflow/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t ff_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t ff_wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- logging --------------------------------------------------------------------------- */

static int g_log_level = -1; /* -1: not read from the environment yet */

static ff_log_level level_from_env(void) {
    const char *e = getenv("FF_LOG");
    if (!e) return FF_LOG_INFO;
    if (!strcmp(e, "debug")) return FF_LOG_DEBUG;
    if (!strcmp(e, "warn")) return FF_LOG_WARN;
    if (!strcmp(e, "error")) return FF_LOG_ERROR;
    if (!strcmp(e, "off")) return FF_LOG_OFF;
    return FF_LOG_INFO;
}

ff_log_level ff_log_get_level(void) {
    if (g_log_level < 0) g_log_level = (int)level_from_env();
    return (ff_log_level)g_log_level;
}

void ff_log_set_level(ff_log_level level) { g_log_level = (int)level; }

void ff_log(ff_log_level level, const char *fmt, ...) {
    if (level < ff_log_get_level()) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "[%s] ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", buf);
}

/* ---- random numbers -------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t ff_seed_stream(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t x = seed + a;
    x = splitmix64(&x) + b;
    return splitmix64(&x);
}

void ff_rng_seed(ff_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ff_rng_u64(ff_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ff_rng_uniform(ff_rng *r) { return (double)(ff_rng_u64(r) >> 11) * 0x1.0p-53; }

double ff_rng_normal(ff_rng *r) {
    double u1 = ff_rng_uniform(r);
    double u2 = ff_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

uint64_t ff_rng_below(ff_rng *r, uint64_t n) {
    /* rejection sampling: drop the top partial range so every value is equally likely */
    uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
    uint64_t x;
    do x = ff_rng_u64(r);
    while (x >= limit);
    return x % n;
}

/* ---- allocation ------------------------------------------------------------------------ */

void *ff_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) ff_error_set(NULL, NULL, "out of memory allocating %zu bytes", n);
    return p;
}

void *ff_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) ff_error_set(NULL, NULL, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *ff_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) ff_error_set(NULL, NULL, "out of memory reallocating to %zu bytes", n);
    return q;
}

char *ff_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = ff_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- text ------------------------------------------------------------------------------ */
void ff_text_fit(char *dst, size_t cap, const char *src) {
    if (!cap) return;
    size_t n = strlen(src);
    if (n < cap) {
        memmove(dst, src, n + 1);
        return;
    }
    static const char dots[] = "...";
    if (cap < 2 * sizeof dots) { /* no room for both ends: the start */
        memmove(dst, src, cap - 1);
        dst[cap - 1] = 0;
        return;
    }
    /* head + dots + tail + NUL = cap; in place, the tail is read from beyond what the head
     * and the dots overwrite (n >= cap) */
    size_t keep = cap - sizeof dots, head = keep / 2, tail = keep - head;
    memmove(dst, src, head);
    memcpy(dst + head, dots, sizeof dots - 1);
    memmove(dst + head + sizeof dots - 1, src + n - tail, tail);
    dst[cap - 1] = 0;
}

/* ---- files ----------------------------------------------------------------------------- */

char *ff_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ff_error_set(path, errno == ENOENT ? "check the path" : NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = ff_malloc(cap);
    if (!buf) {
        fclose(f);
        return NULL;
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = ff_realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        ff_error_set(path, NULL, "read error: %s", strerror(errno));
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

int ff_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return ff_error_set(tmp, "check that the folder exists and is writable", "cannot create: %s", strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return ff_error_set(tmp, e == ENOSPC ? "the disk is full" : NULL, "write failed: %s", strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return ff_error_set(tmp, NULL, "fsync/close failed: %s", strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return ff_error_set(path, NULL, "rename from %s failed: %s", tmp, strerror(e));
    }
    return 0;
}

int ff_mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return ff_error_set(path, NULL, "bad directory path");
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return ff_error_set(buf, "check permissions", "cannot create directory: %s", strerror(errno));
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return ff_error_set(path, NULL, "exists and is not a directory");
    return 0;
}

int ff_checkpoint_steps(const char *out_dir, int64_t **steps) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoints", out_dir);
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long v;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &v, &tail) != 1) continue; /* skips step-N.tmp-PID */
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *a = realloc(*steps, (size_t)cap * sizeof *a);
            if (!a) break;
            *steps = a;
        }
        (*steps)[n++] = v;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int k = i; k > 0 && (*steps)[k - 1] > (*steps)[k]; k--) {
            int64_t t = (*steps)[k];
            (*steps)[k] = (*steps)[k - 1];
            (*steps)[k - 1] = t;
        }
    if (n == 0) {
        free(*steps);
        *steps = NULL;
    }
    return n;
}

/* The OUT/checkpoints/step-N prefix of path: its length, the step, and where OUT ends; -1
 * when path is not inside one (the last such component counts). */
static long checkpoint_prefix(const char *path, int64_t *step, size_t *out_len) {
    long found = -1;
    for (const char *p = path; (p = strstr(p, "checkpoints/step-")); p++) {
        if (p != path && p[-1] != '/') continue;
        const char *q = p + strlen("checkpoints/step-"), *d = q;
        while (*d >= '0' && *d <= '9') d++;
        if (d == q || (*d && *d != '/')) continue;
        *step = strtoll(q, NULL, 10);
        *out_len = p == path ? 0 : (size_t)(p - path - 1);
        found = (long)(d - path);
    }
    return found;
}

int ff_checkpoint_hint(const char *path, char *buf, size_t cap) {
    int64_t step = 0;
    size_t out_len = 0;
    long end = checkpoint_prefix(path, &step, &out_len);
    if (end < 0) return -1;
    char out[4096], ck[4096];
    if (out_len) snprintf(out, sizeof out, "%.*s", (int)out_len, path);
    else snprintf(out, sizeof out, ".");
    snprintf(ck, sizeof ck, "%.*s", (int)end, path);
    int64_t *steps, prev = -1;
    int n = ff_checkpoint_steps(out, &steps);
    for (int i = 0; i < n; i++)
        if (steps[i] < step) prev = steps[i];
    free(steps);
    if (prev >= 0)
        snprintf(buf, cap, "the checkpoint %s is damaged; the one before it is %s/checkpoints/step-%08lld: move the damaged "
                 "one away (mv %s %s.damaged) and run the same command with --resume (it takes the newest)",
                 ck, out, (long long)prev, ck, ck);
    else
        snprintf(buf, cap, "the checkpoint %s is damaged and %s/checkpoints holds none before it: move it away (mv %s "
                 "%s.damaged) and start again without --resume", ck, out, ck, ck);
    return 0;
}

int ff_checkpoint_error(const char *path) {
    char hint[16384];
    if (ff_checkpoint_hint(path, hint, sizeof hint) != 0 || strstr(ff_error_message(), hint)) return -1;
    char msg[8192];
    snprintf(msg, sizeof msg, "%s", ff_error_message());
    return ff_error_set(NULL, hint, "%s", msg);
}

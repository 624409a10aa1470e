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
#include <sys/resource.h>
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
    uint64_t z = (*x += FF_SPLITMIX64_GAMMA);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t ff_hash_fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL; /* the 64-bit FNV prime */
    return h;
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
    char tmp[FF_PATH_MAX];
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
    char buf[FF_PATH_MAX];
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

int ff_check_writable(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return ff_error_set(path, "give a file name", "is a folder");
    char tmp[FF_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int e = fd < 0 ? errno : 0;
    if (fd >= 0) {
        if (write(fd, "ok\n", 3) != 3 || fsync(fd) != 0) e = errno ? errno : EIO;
        if (close(fd) != 0 && !e) e = errno;
        unlink(tmp);
    }
    if (!e) return 0;
    return ff_error_set(path, e == ENOSPC ? "the disk is full" : "check that its folder exists and is writable", "cannot be written: %s",
                        strerror(e));
}

/* ---- the machine ----------------------------------------------------------------------- */
uint64_t ff_memory_limit(char *what, size_t cap) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t lim = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
    snprintf(what, cap, "physical memory");
    /* cgroup v2, as a container sees its own group at the root of its namespace */
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        char buf[64];
        if (fgets(buf, sizeof buf, f)) {
            char *end;
            unsigned long long v = strtoull(buf, &end, 10);
            if (end != buf && v > 0 && v < lim) lim = v, snprintf(what, cap, "the cgroup's memory.max");
        }
        fclose(f);
    }
    static const struct {
        int res;
        const char *name;
    } rl[] = {{RLIMIT_AS, "RLIMIT_AS (ulimit -v)"}, {RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)"}};
    for (size_t i = 0; i < sizeof rl / sizeof *rl; i++) {
        struct rlimit r;
        if (getrlimit(rl[i].res, &r) == 0 && r.rlim_cur != RLIM_INFINITY && (uint64_t)r.rlim_cur < lim)
            lim = (uint64_t)r.rlim_cur, snprintf(what, cap, "%s", rl[i].name);
    }
    return lim;
}

ff_resident ff_resident_memory(void) {
    ff_resident r = {0, 0};
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        unsigned long long kib;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "VmRSS: %llu kB", &kib) == 1) r.now = (uint64_t)kib * 1024;
            else if (sscanf(line, "VmHWM: %llu kB", &kib) == 1) r.peak = (uint64_t)kib * 1024;
        }
        fclose(f);
    }
    struct rusage ru;
    if (!r.peak && getrusage(RUSAGE_SELF, &ru) == 0) r.peak = (uint64_t)ru.ru_maxrss * 1024; /* Linux: KiB */
    return r;
}

const char *ff_fmt_bytes(uint64_t b, char *buf, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 6) v /= 1024, u++;
    if (u == 0) snprintf(buf, cap, "%llu B", (unsigned long long)b);
    else snprintf(buf, cap, "%.*f %s", v < 10 ? 1 : 0, v, units[u]);
    return buf;
}


/* ---- growing text --------------------------------------------------------------------- */
void ff_strbuf_printf(ff_strbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *q = ff_realloc(b->p, cap);
        if (!q) {
            b->failed = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
}

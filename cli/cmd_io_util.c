/* Helpers shared by the model commands (see cli/io_util.h). */
#include "cli/io_util.h"

#include "fuseflow/config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ffio_fail(const char *cmd) {
    const char *m = ff_error_message();
    fprintf(stderr, "fuseflow %s: %s\n", cmd, *m ? m : "failed");
    return 1;
}

int ffio_usage(const char *cmd, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fuseflow %s: %s (run 'fuseflow %s --help')\n", cmd, buf, cmd);
    return 2;
}

int ffio_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        ffio_usage(cmd, "%s wants an integer in [%lld, %lld], got '%s'", opt, (long long)lo, (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int ffio_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        ffio_usage(cmd, "%s wants a number in [%g, %g], got '%s'", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int ffio_weights(const char *cmd, const char *s, bool *bf16) {
    if (strcmp(s, "fp32") && strcmp(s, "bf16")) {
        ffio_usage(cmd, "--weights wants fp32 or bf16, got '%s'", s);
        return -1;
    }
    *bf16 = !strcmp(s, "bf16");
    return 0;
}

int ffio_parse(const char *cmd, int argc, char **argv, const ffio_opt *opts, int n_opts, char **pos, int max_pos, int *n_pos) {
    *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (*n_pos >= max_pos) return ffio_usage(cmd, "unexpected argument '%s'", a);
            pos[(*n_pos)++] = argv[i];
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        const ffio_opt *o = NULL;
        for (int k = 0; k < n_opts && !o; k++)
            if (strlen(opts[k].name) == nl && !strncmp(opts[k].name, name, nl)) o = &opts[k];
        if (!o) return ffio_usage(cmd, "unknown option '--%.*s'", (int)nl, name);
        if (o->kind == FFIO_FLAG) {
            if (eq) return ffio_usage(cmd, "--%s takes no value", o->name);
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) return ffio_usage(cmd, "--%s needs a value", o->name);
            v = argv[++i];
        }
        char optname[96];
        snprintf(optname, sizeof optname, "--%s", o->name);
        if (o->kind == FFIO_STR) {
            *(const char **)o->dst = v;
        } else if (o->kind == FFIO_INT) {
            if (ffio_int(cmd, optname, v, (int64_t)o->lo, (int64_t)o->hi, (int64_t *)o->dst) != 0) return 2;
        } else if (ffio_double(cmd, optname, v, o->lo, o->hi, (double *)o->dst) != 0) {
            return 2;
        }
    }
    return 0;
}

void ffio_human(double v, char *buf, size_t cap) {
    if (v >= 1e9)
        snprintf(buf, cap, "%.2fG", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, cap, "%.1fk", v / 1e3);
    else
        snprintf(buf, cap, "%.0f", v);
}

void ffio_duration(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

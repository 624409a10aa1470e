/* Helpers shared by the model commands (dataset, init, logprobs, generate, sft): messages in
 * one format ("fuseflow CMD: what (hint: ...)"), checked numeric options, and loading a
 * model folder onto a backend. */
#ifndef FF_CLI_IO_UTIL_H
#define FF_CLI_IO_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/error.h"

/* Print the current error as "fuseflow CMD: MESSAGE" and return 1 (the exit status). */
int ffio_fail(const char *cmd);
/* Print "fuseflow CMD: MESSAGE (run 'fuseflow CMD --help')" and return 2. */
int ffio_usage(const char *cmd, const char *fmt, ...) FF_PRINTF(2, 3);
/* Parse an option value; on a bad value print a usage error and return -1. */
int ffio_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int ffio_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* --weights fp32|bf16 of the inference commands: *bf16 set, or a usage error printed and -1. */
int ffio_weights(const char *cmd, const char *s, bool *bf16);
/* Table-driven options: "--name VALUE", "--name=VALUE", or "--name" alone for flags. */
typedef enum { FFIO_STR, FFIO_INT, FFIO_DOUBLE, FFIO_FLAG } ffio_kind;
typedef struct ffio_opt {
    const char *name; /* without the dashes */
    ffio_kind kind;
    void *dst;        /* const char **, int64_t *, double *, bool * */
    double lo, hi;    /* bounds of INT and DOUBLE */
} ffio_opt;
/* Parse argv[1..argc) against the table. Arguments that are not options go to pos[] (at most
 * max_pos; *n_pos their count). Returns 0, 1 when --help/-h was given (the caller prints
 * its help), or 2 after printing a usage error. */
int ffio_parse(const char *cmd, int argc, char **argv, const ffio_opt *opts, int n_opts, char **pos, int max_pos, int *n_pos);

/* "1.02M", "25.3M", "512k" */
void ffio_human(double v, char *buf, size_t cap);
/* "1h02m", "3m05s", "12s" */
void ffio_duration(double seconds, char *buf, size_t cap);

#endif

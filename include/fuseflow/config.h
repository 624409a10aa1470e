/* fuseflow: configuration trees read from YAML, with dotted command-line overrides.
 *
 * Every node remembers its file and line, so errors point at the line. Readers ask for keys
 * through the typed getters, which mark what they read; ff_config_check_unused() then turns
 * every key that no reader asked for into an error with a suggestion ("did you mean"), so a
 * misspelled key never passes silently. Overrides use the dotted style verl users know:
 * `optim.lr=1e-5`, `model.path=/models/x`, `nodes.0.role=actor`; the value is read as YAML,
 * so `a.b=[1,2]` sets a list.
 *
 * Not here: schemas. Each subsystem reads its own section and decides what it means.
 */
#ifndef FUSEFLOW_CONFIG_H
#define FUSEFLOW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef struct ff_config ff_config;
typedef struct ff_cnode ff_cnode;

typedef enum { FF_CNODE_SCALAR, FF_CNODE_SEQ, FF_CNODE_MAP } ff_cnode_kind;

/* Load a YAML file (one document; an empty file is an empty map). NULL + error. */
ff_config *ff_config_load(const char *path);
/* Parse YAML text; name is used in messages ("<string>" when NULL). NULL + error. */
ff_config *ff_config_parse(const char *text, size_t len, const char *name);
/* An empty configuration (a map with no keys). */
ff_config *ff_config_new(void);
void ff_config_destroy(ff_config **c);

/* Apply one override "a.b.c=value". Missing maps on the path are created; an index into a
 * list must exist. Returns 0 or -1 + error. */
int ff_config_set(ff_config *c, const char *assignment);
/* Apply each argv[i] as an override. Returns 0 or -1 + error naming the bad one. */
int ff_config_apply_overrides(ff_config *c, int argc, char *const *argv);

/* Write the tree as YAML (for saving the effective configuration of a run). 0 or -1. */
int ff_config_write(const ff_config *c, FILE *out);

ff_cnode *ff_config_root(ff_config *c);

/* Node at a dotted path below base ("a.b", "nodes.2.name"; "" is base itself), or NULL.
 * Marks the node and the nodes on the way as read. */
ff_cnode *ff_cnode_find(ff_cnode *base, const char *path);
ff_cnode_kind ff_cnode_kind_of(const ff_cnode *n);
size_t ff_cnode_len(const ff_cnode *n);              /* entries of a map or list, 0 for a scalar */
ff_cnode *ff_cnode_at(ff_cnode *n, size_t i);        /* i-th value of a map or list; marks it read */
const char *ff_cnode_key(const ff_cnode *n);         /* key of a map entry, NULL otherwise */
const char *ff_cnode_scalar(const ff_cnode *n);      /* text of a scalar, NULL otherwise */
/* "file.yaml:12" (or "override 'a.b=1'") for messages; buf must hold 256 bytes. */
const char *ff_cnode_where(const ff_cnode *n, char *buf, size_t cap);
void ff_cnode_mark_used(ff_cnode *n);                /* this node and everything below it */

/* Typed getters. Return 0 when the key is present and valid (*out set), 1 when it is absent
 * or null (*out = dflt), -1 when present with a bad value (error names file:line and the
 * expected form). Strings point into the tree and live as long as it.
 *
 * Sections are typed: a key on the path that holds a plain value or a list where the path
 * asks it for a key ("trainer.steps" with `trainer: fast`, or an override `trainer=5`) is an
 * error naming its line, not an absent key; a null section (`trainer:` alone) is empty.
 * ff_cnode_find returns NULL there and leaves the error to ff_config_check_unused. */
int ff_cnode_get_int(ff_cnode *base, const char *path, int64_t dflt, int64_t *out);
/* With bounds: a value outside [lo, hi] is -1 + error naming file:line, the key, the value
 * and the range ("'optim.lr' must be in [0, 10], got -1"); an absent key is 1 with dflt,
 * unchecked, as above. */
int ff_cnode_get_int_in(ff_cnode *base, const char *path, int64_t dflt, int64_t lo, int64_t hi, int64_t *out);
int ff_cnode_get_double_in(ff_cnode *base, const char *path, double dflt, double lo, double hi, double *out);
int ff_cnode_get_double(ff_cnode *base, const char *path, double dflt, double *out);
int ff_cnode_get_bool(ff_cnode *base, const char *path, bool dflt, bool *out);
int ff_cnode_get_str(ff_cnode *base, const char *path, const char *dflt, const char **out);
/* One of names[0..n-1]; *out is its index. */
int ff_cnode_get_enum(ff_cnode *base, const char *path, const char *const *names, int n, int dflt, int *out);
/* A set of names[0..count-1] (count <= 32) as a bit mask (bit i: names[i]): a list of names
 * (`[a, c]`), or one name alone (`a`, so an override `key=a` works); `[]` is the empty set.
 * A name outside the list is -1 + error naming file:line and the choices. */
int ff_cnode_get_flags(ff_cnode *base, const char *path, const char *const *names, int count, unsigned dflt, unsigned *out);

/* Where the training commands send their metrics (`trainer.logger` of `fuseflow run`,
 * `train.logger` of `fuseflow sft`): `[console, jsonl, tensorboard]` in any subset. */
enum {
    FF_LOGGER_CONSOLE = 1u << 0,     /* one line per step on the console */
    FF_LOGGER_JSONL = 1u << 1,       /* OUT/metrics.jsonl (train_dir.h) */
    FF_LOGGER_TENSORBOARD = 1u << 2, /* OUT/events.out.tfevents.* (tfevents.h) */
};
#define FF_LOGGERS_DEFAULT (FF_LOGGER_CONSOLE | FF_LOGGER_JSONL)
int ff_cnode_get_loggers(ff_cnode *base, const char *path, unsigned *out);

/* The same, from the root. */
int ff_config_get_int(ff_config *c, const char *path, int64_t dflt, int64_t *out);
int ff_config_get_int_in(ff_config *c, const char *path, int64_t dflt, int64_t lo, int64_t hi, int64_t *out);
int ff_config_get_double(ff_config *c, const char *path, double dflt, double *out);
int ff_config_get_double_in(ff_config *c, const char *path, double dflt, double lo, double hi, double *out);
int ff_config_get_bool(ff_config *c, const char *path, bool dflt, bool *out);
int ff_config_get_str(ff_config *c, const char *path, const char *dflt, const char **out);
int ff_config_get_enum(ff_config *c, const char *path, const char *const *names, int n, int dflt, int *out);
int ff_config_get_loggers(ff_config *c, const char *path, unsigned *out);

/* ---- comparing two configurations ------------------------------------------------------- */
/* One leaf where two trees differ: its dotted path ("optim.lr", "nodes.2.name") and the
 * scalar text on each side, NULL where the key is absent (or null). */
typedef struct ff_config_change {
    char *key;
    char *was, *now;
} ff_config_change;
/* The leaves in which a and b differ, sorted by key. Scalars that both read as numbers are
 * compared by value (1e-3 equals 0.001), others as text; a null value, an empty map or list
 * and an absent key are the same. Marks nothing as read. Returns the count with the list in
 * *out (free it with ff_config_changes_free; NULL when the count is 0), or -1 + error. */
int ff_config_diff(const ff_config *a, const ff_config *b, ff_config_change **out);
void ff_config_changes_free(ff_config_change **changes, int n);

/* -1 + error for the first section that a reader asked for a key of but holds a plain value
 * or a list (see above), else for the first key that no getter read: "run.yaml:7: unknown key
 * 'optim.lr_sheduler' (hint: did you mean 'optim.lr_scheduler'?)". 0 when all is well. */
int ff_config_check_unused(ff_config *c);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

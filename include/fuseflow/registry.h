/* fuseflow: registries of advantage estimators, policy losses, KL estimators and reward
 * functions, by name.
 *
 * A graph node names what it uses (`estimator: grpo`, `loss: vanilla`, `kl_loss: {type:
 * low_var_kl}`, `function: arith_exact_match`); the registry turns the name into a definition:
 * a few C callbacks on small host arrays. ff_registry_new() registers the built-ins; a C
 * plugin (include/fuseflow/plugin.h) adds more. Names are unique within a kind.
 *
 * Every definition follows one pattern: create(params, &state) reads its own keys from the
 * node's config map (so a misspelled key is an error with its line, see config.h), compute
 * runs as often as needed, destroy frees the state. create and destroy may be NULL (no
 * parameters, no state). Callbacks return 0, or -1 after ff_error_set (a plugin calls
 * api->error_set). States are used from one thread at a time.
 *
 * Lifetime: definitions are copied (names too); a registry must outlive everything created
 * from it (graphs, instances), because plugins are unloaded when it is destroyed.
 */
#ifndef FUSEFLOW_REGISTRY_H
#define FUSEFLOW_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fuseflow/config.h"
#include "fuseflow/rlhf.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

typedef struct ff_registry ff_registry;

/* The unit a node runs on, from the smallest: one sample (a response), one group (the n
 * responses to one prompt), a micro-batch of ready samples, the whole batch (a barrier). */
typedef enum {
    FF_GRAN_SAMPLE = 0,
    FF_GRAN_GROUP,
    FF_GRAN_MICRO_BATCH,
    FF_GRAN_BATCH,
    FF_GRAN_COUNT
} ff_granularity;

const char *ff_granularity_name(ff_granularity g); /* "sample", "group", "micro_batch", "batch" */

/* ---- advantage estimators ---------------------------------------------------------------- */

/* What an estimator reads. Token rewards already hold the score on each sequence's last
 * counted token, minus the KL penalty when the graph asks for one. */
typedef struct ff_adv_batch {
    ff_rlhf_seqs seqs;          /* response tokens */
    const float *token_rewards; /* [T] */
    const float *values;        /* [T] critic values, or NULL */
    const int32_t *group;       /* [n_seq] group (prompt) id of each sequence, in [0, n_seq) */
    const float *baseline;      /* [n_seq] per-sequence baseline (ReMax: greedy reward), or NULL */
} ff_adv_batch;

enum {
    FF_ADV_NEEDS_VALUES = 1u << 0,   /* reads values: the graph needs a critic */
    FF_ADV_NEEDS_BASELINE = 1u << 1, /* reads baseline */
};

typedef struct ff_advantage_def {
    const char *name;
    const char *summary; /* one line, for --help and errors */
    unsigned needs;      /* FF_ADV_NEEDS_* */
    /* The smallest unit it can run on: sample (per-sequence math), group (needs the whole
     * group, e.g. GRPO), batch (needs the whole batch, e.g. global whitening). */
    ff_granularity granularity;
    int (*create)(ff_cnode *params, void **state);
    /* With a state that changes the unit (GAE without whitening runs per sample): the unit
     * for this state. NULL: `granularity` above. */
    ff_granularity (*granularity_of)(const void *state);
    /* adv [T] and ret [T] (returns; estimators without returns write the advantages). */
    int (*compute)(void *state, const ff_adv_batch *in, float *adv, float *ret);
    void (*destroy)(void *state);
} ff_advantage_def;

/* ---- policy losses ----------------------------------------------------------------------- */

typedef struct ff_pg_batch {
    ff_rlhf_seqs seqs;
    const float *logp;     /* [T] current log-probs (what the derivative is taken against) */
    const float *old_logp; /* [T] log-probs at sampling time */
    const float *adv;      /* [T] advantages */
    const float *ref_logp; /* [T] or NULL */
    double denom;          /* normaliser of the mini-batch (see ff_rlhf_agg); 0: this batch's */
} ff_pg_batch;

typedef struct ff_policy_loss_def {
    const char *name;
    const char *summary;
    int (*create)(ff_cnode *params, void **state);
    /* *loss, dlogp [T] = d loss / d logp, stats (zeroed by the caller; fill what applies). */
    int (*compute)(void *state, const ff_pg_batch *in, double *loss, float *dlogp, ff_rlhf_pg_stats *stats);
    void (*destroy)(void *state);
    /* The aggregation this state uses, so the caller can compute the mini-batch normaliser.
     * NULL: token-mean. */
    ff_rlhf_agg_mode (*agg_of)(const void *state);
} ff_policy_loss_def;

/* ---- KL estimators ----------------------------------------------------------------------- */

typedef struct ff_kl_def {
    const char *name;
    const char *summary;
    /* kl [T] and dkl [T] = d kl / d logp; either may be NULL. */
    void (*compute)(int64_t T, const float *logp, const float *ref, float *kl, float *dkl);
} ff_kl_def;

/* ---- reward functions -------------------------------------------------------------------- */

typedef struct ff_reward_item {
    const char *prompt;   /* decoded text */
    const char *response; /* decoded text */
    const char *answer;   /* the dataset's reference answer, or NULL */
    const char *metadata; /* a JSON object as text (other dataset keys), or NULL */
} ff_reward_item;

typedef struct ff_reward_def {
    const char *name;
    const char *summary;
    int (*create)(ff_cnode *params, void **state);
    /* scores [n]. A batch call, so a remote or vectorised reward sees many items at once. */
    int (*score)(void *state, const ff_reward_item *items, size_t n, float *scores);
    void (*destroy)(void *state);
} ff_reward_def;

/* ---- the registry ------------------------------------------------------------------------ */

typedef enum { FF_REG_ADVANTAGE = 0, FF_REG_POLICY_LOSS, FF_REG_KL, FF_REG_REWARD, FF_REG_KIND_COUNT } ff_registry_kind;

const char *ff_registry_kind_name(ff_registry_kind k); /* "advantage estimator", ... */

/* A registry with the built-ins. NULL + error (out of memory). */
ff_registry *ff_registry_new(void);
/* Also unloads the plugins it loaded. */
void ff_registry_destroy(ff_registry **r);
/* Graphs built with this registry check their reward nodes' function names but do not
 * instantiate them (ff_node.reward stays NULL): for processes that train with a graph's
 * losses and never score rewards (the RL workers), so a `remote` reward opens no socket
 * there and a function only the controller registers is no error. */
void ff_registry_skip_rewards(ff_registry *r);
bool ff_registry_skips_rewards(const ff_registry *r);

/* Register a definition (copied). -1 + error for a duplicate name, an empty name or a
 * missing compute callback. */
int ff_registry_add_advantage(ff_registry *r, const ff_advantage_def *def);
int ff_registry_add_policy_loss(ff_registry *r, const ff_policy_loss_def *def);
int ff_registry_add_kl(ff_registry *r, const ff_kl_def *def);
int ff_registry_add_reward(ff_registry *r, const ff_reward_def *def);

/* Look up by name. NULL + error naming the known ones ("unknown advantage estimator 'x'
 * (hint: known: gae, grpo, ...)"). */
const ff_advantage_def *ff_registry_advantage(const ff_registry *r, const char *name);
const ff_policy_loss_def *ff_registry_policy_loss(const ff_registry *r, const char *name);
const ff_kl_def *ff_registry_kl(const ff_registry *r, const char *name);
const ff_reward_def *ff_registry_reward(const ff_registry *r, const char *name);

/* Names of one kind, in registration order: up to cap into names; returns the count. */
size_t ff_registry_names(const ff_registry *r, ff_registry_kind kind, const char **names, size_t cap);
/* The summary of a registered name, or NULL. And the plugin that registered it (its path),
 * or NULL for a built-in. */
const char *ff_registry_summary(const ff_registry *r, ff_registry_kind kind, const char *name);
const char *ff_registry_origin(const ff_registry *r, ff_registry_kind kind, const char *name);

/* Load a plugin (include/fuseflow/plugin.h): dlopen the shared library at path and call its
 * ff_plugin_init. -1 + error for a missing or unloadable file, a missing init symbol, or an
 * init that fails (its own message is kept). Loading the same path twice is an error. */
int ff_registry_load_plugin(ff_registry *r, const char *path);

/* ---- instances: a definition plus the state its create() made from a node's params ------- */

typedef struct ff_advantage ff_advantage;
typedef struct ff_policy_loss ff_policy_loss;
typedef struct ff_reward ff_reward;

/* params may be NULL (all defaults). NULL + error. */
ff_advantage *ff_advantage_new(const ff_registry *r, const char *name, ff_cnode *params);
void ff_advantage_destroy(ff_advantage **a);
const ff_advantage_def *ff_advantage_def_of(const ff_advantage *a);
ff_granularity ff_advantage_granularity(const ff_advantage *a);
int ff_advantage_compute(ff_advantage *a, const ff_adv_batch *in, float *adv, float *ret);

ff_policy_loss *ff_policy_loss_new(const ff_registry *r, const char *name, ff_cnode *params);
void ff_policy_loss_destroy(ff_policy_loss **l);
ff_rlhf_agg_mode ff_policy_loss_agg(const ff_policy_loss *l);
/* stats may be NULL. */
int ff_policy_loss_compute(ff_policy_loss *l, const ff_pg_batch *in, double *loss, float *dlogp, ff_rlhf_pg_stats *stats);

ff_reward *ff_reward_new(const ff_registry *r, const char *name, ff_cnode *params);
void ff_reward_destroy(ff_reward **w);
int ff_reward_score(ff_reward *w, const ff_reward_item *items, size_t n, float *scores);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

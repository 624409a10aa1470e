/* fuseflow: C plugins that add advantage estimators, policy losses, KL estimators and reward
 * functions.
 *
 * A plugin is a shared library named in the run config (`trainer.plugins: [path.so]`) that
 * defines, with C linkage and default visibility:
 *
 *     int ff_plugin_init(const ff_plugin_api *api);
 *
 * fuseflow calls it once after dlopen. It registers definitions (registry.h) through the
 * function pointers in `api` and returns 0, or returns -1 after api->error_set(...) to stop
 * the run with its message. Everything a plugin calls comes through `api`, so a plugin links
 * against nothing of fuseflow and works with the static `fuseflow` binary, libfuseflow.so
 * and the tests alike; it only includes the headers. `api` and the registry stay valid
 * until the registry is destroyed, so a plugin may keep the pointer for its callbacks (to
 * read parameters with api->get_double, say).
 *
 * Check api->abi_version == FF_PLUGIN_ABI_VERSION first: the layout of ff_plugin_api and
 * of the definitions changes only with that number.
 *
 * Build one (see examples/plugins/):
 *     cc -shared -fPIC -I include -o my_plugin.so my_plugin.c
 */
#ifndef FUSEFLOW_PLUGIN_H
#define FUSEFLOW_PLUGIN_H

#include "fuseflow/config.h"
#include "fuseflow/error.h" /* FF_PRINTF only: a plugin calls api->error_set */
#include "fuseflow/registry.h"
#include "fuseflow/rlhf.h"

#ifdef __cplusplus
extern "C" {
#endif
#pragma GCC visibility push(default) /* what libfuseflow.so exports (everything else is hidden) */

#define FF_PLUGIN_ABI_VERSION 1
#define FF_PLUGIN_INIT_SYMBOL "ff_plugin_init"

typedef struct ff_plugin_api {
    int abi_version; /* FF_PLUGIN_ABI_VERSION of the host */
    ff_registry *registry;
    const char *path; /* the plugin's own path, as named in the config */

    int (*add_advantage)(ff_registry *r, const ff_advantage_def *def);
    int (*add_policy_loss)(ff_registry *r, const ff_policy_loss_def *def);
    int (*add_kl)(ff_registry *r, const ff_kl_def *def);
    int (*add_reward)(ff_registry *r, const ff_reward_def *def);

    /* ff_error_set: report an error from any callback, then return -1. */
    int (*error_set)(const char *where, const char *hint, const char *fmt, ...) FF_PRINTF(3, 4);

    /* The typed getters of config.h, to read a node's parameters in create(). */
    int (*get_int)(ff_cnode *base, const char *path, int64_t dflt, int64_t *out);
    int (*get_double)(ff_cnode *base, const char *path, double dflt, double *out);
    int (*get_bool)(ff_cnode *base, const char *path, bool dflt, bool *out);
    int (*get_str)(ff_cnode *base, const char *path, const char *dflt, const char **out);

    /* Some of rlhf.h, so a loss or estimator can reuse the built-in math. */
    int (*agg_parse)(const char *name, ff_rlhf_agg_mode *out);
    double (*agg)(ff_rlhf_agg_mode mode, const ff_rlhf_seqs *s, const float *x, double denom, float *w);
    void (*whiten)(const ff_rlhf_seqs *s, const float *x, bool shift_mean, float *out);
} ff_plugin_api;

typedef int (*ff_plugin_init_fn)(const ff_plugin_api *api);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif

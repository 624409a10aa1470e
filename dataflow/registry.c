/* The registries of include/fuseflow/registry.h, instances made from them, and C plugins
 * (include/fuseflow/plugin.h) loaded with dlopen.
 *
 * Entries and plugins are heap objects held by pointer, so the addresses handed out (a
 * definition, a plugin's api table) stay put while more are registered.
 *
 * Not here: the built-in definitions (builtins.c, reward.c). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dataflow/internal.h"
#include "fuseflow/error.h"
#include "fuseflow/plugin.h"
#include "fuseflow/registry.h"
#include "fuseflow/util.h"

typedef struct entry {
    ff_registry_kind kind;
    char *name;
    char *summary;
    const char *origin; /* plugin path, NULL for a built-in */
    union {
        ff_advantage_def adv;
        ff_policy_loss_def loss;
        ff_kl_def kl;
        ff_reward_def reward;
    } def;
} entry;

typedef struct plugin {
    char *path;
    void *handle;
    ff_plugin_api api;
} plugin;

struct ff_registry {
    entry **e;
    size_t n, cap;
    plugin **plugins;
    size_t n_plugins;
    const char *loading; /* path of the plugin whose init is running, for origin */
    bool skip_rewards;   /* graphs leave reward functions uninstantiated */
};

static const char *const kind_names[FF_REG_KIND_COUNT] = {"advantage estimator", "policy loss", "KL estimator",
                                                          "reward function"};

const char *ff_registry_kind_name(ff_registry_kind k) { return (unsigned)k < FF_REG_KIND_COUNT ? kind_names[k] : "?"; }

static const char *const gran_names[FF_GRAN_COUNT] = {"sample", "group", "micro_batch", "batch"};

const char *ff_granularity_name(ff_granularity g) { return (unsigned)g < FF_GRAN_COUNT ? gran_names[g] : "?"; }

ff_registry *ff_registry_new(void) {
    ff_registry *r = ff_calloc(1, sizeof *r);
    if (!r) return NULL;
    if (ff_builtins_register(r) != 0) {
        ff_error_wrap("registering the built-ins");
        ff_registry_destroy(&r);
        return NULL;
    }
    return r;
}

void ff_registry_skip_rewards(ff_registry *r) { r->skip_rewards = true; }
bool ff_registry_skips_rewards(const ff_registry *r) { return r->skip_rewards; }

void ff_registry_destroy(ff_registry **pr) {
    if (!pr || !*pr) return;
    ff_registry *r = *pr;
    for (size_t i = 0; i < r->n; i++) {
        free(r->e[i]->name);
        free(r->e[i]->summary);
        free(r->e[i]);
    }
    free(r->e);
    for (size_t i = 0; i < r->n_plugins; i++) {
        if (r->plugins[i]->handle) dlclose(r->plugins[i]->handle);
        free(r->plugins[i]->path);
        free(r->plugins[i]);
    }
    free(r->plugins);
    free(r);
    *pr = NULL;
}

static entry *find(const ff_registry *r, ff_registry_kind kind, const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i]->kind == kind && !strcmp(r->e[i]->name, name)) return r->e[i];
    return NULL;
}

static int add(ff_registry *r, ff_registry_kind kind, const char *name, const char *summary, bool has_compute, entry **out) {
    const char *where = r->loading ? r->loading : "registry";
    if (!name || !name[0]) return ff_error_set(where, "give every definition a name", "a %s without a name", kind_names[kind]);
    if (!has_compute)
        return ff_error_set(where, "set the definition's compute (or score) callback", "%s '%s' has no compute callback",
                            kind_names[kind], name);
    const entry *old = find(r, kind, name);
    if (old)
        return ff_error_set(where, "choose another name", "%s '%s' is already registered (by %s)", kind_names[kind], name,
                            old->origin ? old->origin : "fuseflow");
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 32;
        entry **e = ff_realloc(r->e, cap * sizeof *e);
        if (!e) return -1;
        r->e = e, r->cap = cap;
    }
    entry *e = ff_calloc(1, sizeof *e);
    if (!e) return -1;
    e->kind = kind;
    e->name = ff_strdup(name);
    e->summary = ff_strdup(summary ? summary : "");
    e->origin = r->loading;
    if (!e->name || !e->summary) {
        free(e->name), free(e->summary), free(e);
        return -1;
    }
    r->e[r->n++] = e;
    *out = e;
    return 0;
}

int ff_registry_add_advantage(ff_registry *r, const ff_advantage_def *def) {
    entry *e;
    if (add(r, FF_REG_ADVANTAGE, def->name, def->summary, def->compute != NULL, &e) != 0) return -1;
    e->def.adv = *def;
    e->def.adv.name = e->name, e->def.adv.summary = e->summary;
    return 0;
}

int ff_registry_add_policy_loss(ff_registry *r, const ff_policy_loss_def *def) {
    entry *e;
    if (add(r, FF_REG_POLICY_LOSS, def->name, def->summary, def->compute != NULL, &e) != 0) return -1;
    e->def.loss = *def;
    e->def.loss.name = e->name, e->def.loss.summary = e->summary;
    return 0;
}

int ff_registry_add_kl(ff_registry *r, const ff_kl_def *def) {
    entry *e;
    if (add(r, FF_REG_KL, def->name, def->summary, def->compute != NULL, &e) != 0) return -1;
    e->def.kl = *def;
    e->def.kl.name = e->name, e->def.kl.summary = e->summary;
    return 0;
}

int ff_registry_add_reward(ff_registry *r, const ff_reward_def *def) {
    entry *e;
    if (add(r, FF_REG_REWARD, def->name, def->summary, def->score != NULL, &e) != 0) return -1;
    e->def.reward = *def;
    e->def.reward.name = e->name, e->def.reward.summary = e->summary;
    return 0;
}

size_t ff_registry_names(const ff_registry *r, ff_registry_kind kind, const char **names, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i]->kind == kind) {
            if (k < cap) names[k] = r->e[i]->name;
            k++;
        }
    return k;
}

const char *ff_registry_summary(const ff_registry *r, ff_registry_kind kind, const char *name) {
    const entry *e = find(r, kind, name);
    return e ? e->summary : NULL;
}

const char *ff_registry_origin(const ff_registry *r, ff_registry_kind kind, const char *name) {
    const entry *e = find(r, kind, name);
    return e ? e->origin : NULL;
}

static const entry *lookup(const ff_registry *r, ff_registry_kind kind, const char *name) {
    const entry *e = find(r, kind, name);
    if (e) return e;
    char known[512];
    size_t off = 0;
    known[0] = '\0';
    for (size_t i = 0; i < r->n && off < sizeof known; i++) {
        if (r->e[i]->kind != kind) continue;
        int w = snprintf(known + off, sizeof known - off, "%s%s", off ? ", " : "", r->e[i]->name);
        if (w < 0) break;
        off += (size_t)w;
    }
    char hint[700];
    snprintf(hint, sizeof hint, "known: %s; a plugin (trainer.plugins) can register more", known);
    ff_error_set(NULL, hint, "unknown %s '%s'", kind_names[kind], name ? name : "(none)");
    return NULL;
}

const ff_advantage_def *ff_registry_advantage(const ff_registry *r, const char *name) {
    const entry *e = lookup(r, FF_REG_ADVANTAGE, name);
    return e ? &e->def.adv : NULL;
}
const ff_policy_loss_def *ff_registry_policy_loss(const ff_registry *r, const char *name) {
    const entry *e = lookup(r, FF_REG_POLICY_LOSS, name);
    return e ? &e->def.loss : NULL;
}
const ff_kl_def *ff_registry_kl(const ff_registry *r, const char *name) {
    const entry *e = lookup(r, FF_REG_KL, name);
    return e ? &e->def.kl : NULL;
}
const ff_reward_def *ff_registry_reward(const ff_registry *r, const char *name) {
    const entry *e = lookup(r, FF_REG_REWARD, name);
    return e ? &e->def.reward : NULL;
}

/* ---- plugins ----------------------------------------------------------------------------- */

int ff_registry_load_plugin(ff_registry *r, const char *path) {
    for (size_t i = 0; i < r->n_plugins; i++)
        if (!strcmp(r->plugins[i]->path, path))
            return ff_error_set(path, "name each plugin once in trainer.plugins", "plugin is already loaded");
    struct stat st;
    if (stat(path, &st) != 0)
        return ff_error_set(path, "build it (the example: cmake --build BUILD --target ff_example_plugin) or fix the path",
                            "plugin file not found");
    plugin **ps = ff_realloc(r->plugins, (r->n_plugins + 1) * sizeof *ps);
    if (!ps) return -1;
    r->plugins = ps;
    plugin *p = ff_calloc(1, sizeof *p);
    if (!p) return -1;
    p->path = ff_strdup(path);
    if (!p->path) {
        free(p);
        return -1;
    }
    /* RTLD_LOCAL: two plugins may use the same static helper names */
    p->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!p->handle) {
        const char *why = dlerror();
        ff_error_set(path, "is it a shared library built for this machine (cc -shared -fPIC)?", "cannot load plugin: %s",
                     why ? why : "?");
        free(p->path), free(p);
        return -1;
    }
    dlerror();
    void *sym = dlsym(p->handle, FF_PLUGIN_INIT_SYMBOL);
    if (!sym) {
        ff_error_set(path, "define `int ff_plugin_init(const ff_plugin_api *api)` with C linkage and default visibility",
                     "plugin has no symbol '%s'", FF_PLUGIN_INIT_SYMBOL);
        dlclose(p->handle);
        free(p->path), free(p);
        return -1;
    }
    /* keep the plugin (and unload it with the registry) from here on: its init may have
     * registered some definitions before failing */
    r->plugins[r->n_plugins++] = p;
    p->api = (ff_plugin_api){
        .abi_version = FF_PLUGIN_ABI_VERSION,
        .registry = r,
        .path = p->path,
        .add_advantage = ff_registry_add_advantage,
        .add_policy_loss = ff_registry_add_policy_loss,
        .add_kl = ff_registry_add_kl,
        .add_reward = ff_registry_add_reward,
        .error_set = ff_error_set,
        .get_int = ff_cnode_get_int,
        .get_double = ff_cnode_get_double,
        .get_bool = ff_cnode_get_bool,
        .get_str = ff_cnode_get_str,
        .agg_parse = ff_rlhf_agg_parse,
        .agg = ff_rlhf_agg,
        .whiten = ff_rlhf_whiten,
    };
    ff_plugin_init_fn init;
    *(void **)&init = sym; /* POSIX: function pointers round-trip through void * */
    r->loading = p->path;
    ff_error_clear();
    int rc = init(&p->api);
    r->loading = NULL;
    if (rc != 0) {
        if (!ff_error_message()[0]) ff_error_set(NULL, NULL, "ff_plugin_init returned %d", rc);
        return ff_error_wrap("plugin %s", path);
    }
    return 0;
}

/* ---- instances --------------------------------------------------------------------------- */

struct ff_advantage {
    ff_advantage_def def;
    void *state;
};

struct ff_policy_loss {
    ff_policy_loss_def def;
    void *state;
};

struct ff_reward {
    ff_reward_def def;
    void *state;
};

#define INSTANCE_NEW(T, getter, what)                                                        \
    const T##_def *d = getter(r, name);                                                      \
    if (!d) return NULL;                                                                     \
    struct T *x = ff_calloc(1, sizeof *x);                                                   \
    if (!x) return NULL;                                                                     \
    x->def = *d;                                                                             \
    if (d->create && d->create(params, &x->state) != 0) {                                    \
        ff_error_wrap("%s '%s'", what, name);                                                \
        free(x);                                                                             \
        return NULL;                                                                         \
    }                                                                                        \
    return x;

#define INSTANCE_DESTROY(p)                                  \
    if (!p || !*p) return;                                   \
    if ((*p)->def.destroy) (*p)->def.destroy((*p)->state);   \
    free(*p);                                                \
    *p = NULL;

ff_advantage *ff_advantage_new(const ff_registry *r, const char *name, ff_cnode *params) {
    INSTANCE_NEW(ff_advantage, ff_registry_advantage, "advantage estimator")
}
void ff_advantage_destroy(ff_advantage **a) { INSTANCE_DESTROY(a) }
const ff_advantage_def *ff_advantage_def_of(const ff_advantage *a) { return &a->def; }
ff_granularity ff_advantage_granularity(const ff_advantage *a) {
    return a->def.granularity_of ? a->def.granularity_of(a->state) : a->def.granularity;
}
int ff_advantage_compute(ff_advantage *a, const ff_adv_batch *in, float *adv, float *ret) {
    if ((a->def.needs & FF_ADV_NEEDS_VALUES) && !in->values)
        return ff_error_set(a->def.name, "add a critic's values column to the advantage node's inputs",
                            "the estimator needs values");
    if ((a->def.needs & FF_ADV_NEEDS_BASELINE) && !in->baseline)
        return ff_error_set(a->def.name, "add a baseline column to the advantage node's inputs", "the estimator needs a baseline");
    return a->def.compute(a->state, in, adv, ret);
}

ff_policy_loss *ff_policy_loss_new(const ff_registry *r, const char *name, ff_cnode *params) {
    INSTANCE_NEW(ff_policy_loss, ff_registry_policy_loss, "policy loss")
}
void ff_policy_loss_destroy(ff_policy_loss **l) { INSTANCE_DESTROY(l) }
ff_rlhf_agg_mode ff_policy_loss_agg(const ff_policy_loss *l) {
    return l->def.agg_of ? l->def.agg_of(l->state) : FF_RLHF_AGG_TOKEN_MEAN;
}
int ff_policy_loss_compute(ff_policy_loss *l, const ff_pg_batch *in, double *loss, float *dlogp, ff_rlhf_pg_stats *stats) {
    ff_rlhf_pg_stats scratch;
    if (!stats) stats = &scratch;
    memset(stats, 0, sizeof *stats);
    return l->def.compute(l->state, in, loss, dlogp, stats);
}

ff_reward *ff_reward_new(const ff_registry *r, const char *name, ff_cnode *params) {
    INSTANCE_NEW(ff_reward, ff_registry_reward, "reward function")
}
void ff_reward_destroy(ff_reward **w) { INSTANCE_DESTROY(w) }
int ff_reward_score(ff_reward *w, const ff_reward_item *items, size_t n, float *scores) {
    return w->def.score(w->state, items, n, scores);
}

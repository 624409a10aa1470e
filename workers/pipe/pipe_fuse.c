/* The fused actor+critic problem (fuseflow/fuse.h) from a measured pipeline run
 * (ff_pipe_fuse_instance): the layout from the executor's schedule, the times from its stage
 * timings, the activation bytes from the model configs. Not here: solving (ff_dataflow),
 * running the fused streams (the executor runs them as any schedule). */
#include <ctype.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/pipe_exec.h"

int ff_pipe_fuse_instance(const ff_pipe_exec *e, const ff_pipe_fuse_model *models, ff_fuse_instance *out) {
    const char *w = "fused instance";
    const ff_pipe_schedule *s = ff_pipe_exec_schedule(e);
    memset(out, 0, sizeof *out);
    if (s->n_ranks > FF_FUSE_MAX_NODES)
        return ff_error_set(w, NULL, "%d ranks: the fused problem takes up to %d", (int)s->n_ranks, FF_FUSE_MAX_NODES);
    out->nodes = s->n_ranks;
    out->n_models = s->n_models;
    for (int i = 0; i < s->n_models; i++) {
        const ff_pipe_model *pm = &s->models[i];
        const ff_pipe_fuse_model *g = &models[i];
        ff_fuse_model *m = &out->models[i];
        if (pm->forward_only)
            return ff_error_set(w, "give a training schedule", "model %d (%s) is forward-only", i, g->name ? g->name : "?");
        if (!g->cfg || !(g->tokens > 0))
            return ff_error_set(w, "give each model's config and tokens per micro-batch", "model %d (%s): %s", i,
                                g->name ? g->name : "?", !g->cfg ? "no config" : "no tokens");
        snprintf(m->name, sizeof m->name, "%s", g->name ? g->name : "");
        size_t fl = strlen(m->name); /* the JSON's default: critic0, critic1 -> critic */
        while (!g->family && fl > 1 && isdigit((unsigned char)m->name[fl - 1])) fl--;
        snprintf(m->family, sizeof m->family, "%.*s", (int)(g->family ? strlen(g->family) : fl), g->family ? g->family : m->name);
        m->n_stages = pm->n_stages;
        m->micro = pm->micro;
        double fwd[FF_FUSE_MAX_NODES], bwd[FF_FUSE_MAX_NODES], act = 0;
        ff_pipe_exec_stage_times(e, i, fwd, bwd);
        for (int32_t k = 0; k < pm->n_stages; k++) {
            m->stages[k] = pm->stage_rank[k];
            for (int32_t q = 0; q < k; q++)
                if (pm->stage_rank[q] == pm->stage_rank[k])
                    return ff_error_set(w, "the fused problem has one stage of a model per node",
                                        "model %d (%s): virtual stages %d and %d on rank %d", i, m->name, (int)q, (int)k,
                                        (int)pm->stage_rank[k]);
            m->fwd += fwd[k] / pm->n_stages;
            m->bwd += bwd[k] / pm->n_stages;
            const double layers = pm->stage_layers ? (double)pm->stage_layers[k]
                                                   : (double)g->cfg->num_hidden_layers / pm->n_stages;
            act += ff_fuse_stage_activation(layers, g->tokens, g->cfg->hidden_size);
        }
        m->act = act / pm->n_stages;
        if (!(m->fwd > 0) || !(m->bwd > 0))
            return ff_error_set(w, "run a training step first (ff_pipe_exec_run)", "model %d (%s): no measured times", i, m->name);
    }
    return 0;
}

/* Engine settings from a run config's nodes (include/fuseflow/graph.h), so that the executor
 * and in-process drivers read a YAML run config the same way.
 *
 * Not here: reading or validating the config (dataflow/run_config.c). */
#include <string.h>

#include "fuseflow/error.h"
#include "workers/roles/roles_internal.h"

void ff_roles_sampling_from_node(const ff_run_config *run, const ff_node *gen, ff_sampling *out) {
    ff_node_sampling ns;
    ff_node_sampling_of(run, gen, &ns);
    ff_sampling_default(out);
    out->temperature = ns.temperature;
    out->top_k = ns.top_k;
    out->top_p = ns.top_p;
    out->max_new_tokens = ns.max_new;
    out->len_median = ns.len_median;
    out->len_p99_ratio = ns.len_p99_ratio;
    out->len_max = ns.len_max;
    out->logprob_mode = FF_LOGPROB_TEMPERATURE;
}

/* The temperature the rollout samples at: the sample-level generate node's. */
static float rollout_temperature(const ff_graph *g) {
    int resp = ff_graph_response_column(g);
    for (size_t i = 0; i < ff_graph_n_nodes(g); i++) {
        const ff_node *n = ff_graph_node(g, i);
        if (n->op == FF_OP_GENERATE && (resp < 0 || n->out[FF_SLOT_RESPONSE] == resp))
            return n->gen.greedy ? 1.0f : (float)n->gen.temperature;
    }
    return 1.0f;
}

int ff_roles_trainer_config_from_node(const ff_run_config *run, const ff_node *n, int64_t total_updates, ff_trainer_config *out) {
    memset(out, 0, sizeof *out);
    if (n->op != FF_OP_TRAIN || (n->role != FF_ROLE_ACTOR && n->role != FF_ROLE_CRITIC))
        return ff_error_set(n->where, NULL, "node '%s' is not a train node of the actor or the critic", n->name);
    const ff_role_cfg *rc = &run->roles[n->role];
    const ff_optim_cfg *o = &rc->optim;
    ff_adamw_config_default(&out->optim);
    out->optim.lr = o->lr;
    out->optim.beta1 = o->beta1;
    out->optim.beta2 = o->beta2;
    out->optim.eps = o->eps;
    out->optim.weight_decay = o->weight_decay;
    out->optim.max_grad_norm = o->grad_clip;
    out->optim.warmup_steps = o->warmup_steps;
    out->optim.min_lr_ratio = o->min_lr_ratio;
    out->optim.total_steps = o->lr_schedule && !strcmp(o->lr_schedule, "cosine") ? total_updates : 0;
    if (n->role == FF_ROLE_ACTOR) {
        if (!n->train.loss) return ff_error_set(n->where, "validate the graph first", "node '%s' has no policy loss", n->name);
        out->kind = FF_TRAIN_ACTOR;
        out->loss = n->train.loss;
        out->kl = n->train.kl_loss;
        out->kl_coef = n->train.kl_loss_coef;
        out->entropy_coeff = n->train.entropy_coeff;
        out->temperature = rollout_temperature(run->graph);
    } else {
        out->kind = FF_TRAIN_CRITIC;
        out->value = n->train.value;
    }
    return 0;
}

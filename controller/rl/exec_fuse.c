/* RLHFuse's intra-stage fusion in `fuseflow run` (graph.<actor train>.fuse, docs/run.md "Fused
 * actor and critic training"): whether the run fuses, the fused problem of a step and the
 * schedule the workers follow.
 *
 * The instance of a step: nodes = the actor's pipeline ranks, the actor's stages on 0..pp-1,
 * the critic's reversed: r = actor pp / critic pp replicas, replica b on the block of ranks
 * b x critic pp .. with its stage k on the block's rank critic pp-1-k (the workers lay it out
 * so: ff_run_config_critic_place), each model's micro-batches those of its share (the non-empty
 * ones; 1 for an empty share). Times: `on`
 * fuses from the first step, with one micro-batch's forward 1 and backward 2 on every stage
 * and activation 1; `auto` trains its first iteration serially, the workers report each
 * stage's measured forward and backward seconds (rl.train's stage_times), and from then on the
 * instance has their means over the stages, steps and replicas, and each model's activation
 * bytes per stage from its config and the measured tokens of a micro-batch
 * (ff_fuse_stage_activation). The solver runs once per pair of micro-batch counts, on one
 * thread with a fixed seed and a round budget, so the schedule is the same for the same instance
 * whatever the machine's load; `auto` fuses when the executor streams of the solver's schedule
 * (ff_fuse_streams_makespan: the executor's transfers, sends posted) run at least 5% shorter
 * than the serial baseline's streams (the actor's 1F1B, then the critic's).
 *
 * Not here: planning the mini-batches and submitting the fused subtasks (exec_train.c), the
 * fused step itself (the workers: ff_trainer_step_fused). */
#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/error.h"
#include "fuseflow/fuse.h"
#include "fuseflow/modelio.h"
#include "fuseflow/util.h"

#define FUSE_MIN_GAIN 0.05   /* auto: the least simulated gain that fuses */
#define FUSE_SEED 20240501u  /* the solver's seed: fixed, so every run solves alike */
#define FUSE_ROUNDS 400      /* the solver's round budget (48 schedules per round) */
#define FUSE_SECONDS 60.0    /* a bound far above what the rounds take */

static const char *const mode_names[] = {"off", "on", "auto"};

int ex_fuse_init(ex_run *x) {
    ex_fuse *f = &x->fuse;
    memset(f, 0, sizeof *f);
    f->actor = f->critic = -1;
    for (int m = 0; m < x->n_nodes; m++) {
        const ff_node *n = ff_graph_node(x->run->graph, (size_t)m);
        if (n->op != FF_OP_TRAIN || n->role != FF_ROLE_ACTOR) continue;
        if (n->train.fuse_note[0]) snprintf(f->note, sizeof f->note, "%s", n->train.fuse_note);
        if (n->train.fuse == FF_FUSE_OFF) continue;
        f->mode = n->train.fuse;
        f->actor = m;
        f->critic = n->train.fuse_partner;
        f->peak_cap = n->train.fuse_peak;
    }
    if (f->mode != FF_FUSE_AUTO) return 0;
    const ff_role roles[2] = {FF_ROLE_ACTOR, FF_ROLE_CRITIC};
    for (int i = 0; i < 2; i++) {
        char path[FF_PATH_MAX];
        ff_model_config cfg;
        snprintf(path, sizeof path, "%s/config.json", x->run->roles[roles[i]].model);
        if (ff_hf_config_load(path, &cfg) != 0) return ff_error_wrap("fuse auto: the %s's config", i ? "critic" : "actor");
        f->hidden[i] = cfg.hidden_size, f->layers[i] = cfg.num_hidden_layers;
    }
    return 0;
}

bool ex_fuse_measuring(const ex_run *x) {
    const ex_fuse *f = &x->fuse;
    return f->mode == FF_FUSE_AUTO && !(f->n_times[0] > 0 && f->n_times[1] > 0 && f->n_tok[0] > 0 && f->n_tok[1] > 0);
}

void ex_fuse_measured(ex_run *x, int node, const ff_tensor *times) {
    ex_fuse *f = &x->fuse;
    const int which = node == f->actor ? 0 : node == f->critic ? 1 : -1;
    if (which < 0 || !times || times->dtype != FF_DTYPE_F64 || times->ndim != 2 || times->shape[0] != 2 || times->shape[1] < 1)
        return;
    const int64_t S = times->shape[1];
    const double *v = times->data;
    double fw = 0, bw = 0;
    for (int64_t k = 0; k < S; k++) fw += v[k] / (double)S, bw += v[S + k] / (double)S;
    if (!(fw > 0) || !(bw > 0)) return; /* an empty share's filler step measures nothing useful */
    f->sum_fwd[which] += fw, f->sum_bwd[which] += bw, f->n_times[which] += 1;
}

void ex_fuse_tokens(ex_run *x, int which, double tokens_per_micro) {
    x->fuse.sum_tok[which] += tokens_per_micro;
    x->fuse.n_tok[which] += 1;
}

void ex_fuse_describe(ex_run *x) {
    const ex_fuse *f = &x->fuse;
    if (f->note[0])
        fprintf(x->out, "run: fuse auto: the actor and the critic train one after the other (%s)\n", f->note);
    if (f->mode == FF_FUSE_OFF) return;
    const int R = ex_fuse_reps(x), Pc = x->lay[POOL_CRITIC].pp;
    char when[256], cap[128] = "";
    if (f->peak_cap > 0)
        snprintf(cap, sizeof cap, ", where a schedule holds at most %g x the serial 1F1B's activation memory per rank (fuse_peak)", f->peak_cap);
    snprintf(when, sizeof when, "%s%s",
             f->mode == FF_FUSE_ON ? "each mini-batch of both trains in one fused step" : "fused steps where the simulator gains at least 5%", cap);
    if (R > 1)
        fprintf(x->out, "run: fuse %s: %d critic replicas in each actor pipeline, replica b's stage k on pipeline rank b x %d + %d-k; %s\n",
                mode_names[f->mode], R, Pc, Pc - 1, when);
    else
        fprintf(x->out, "run: fuse %s: the critic's stage k on pipeline rank %d-k of the actor's pipeline; %s\n", mode_names[f->mode],
                Pc - 1, when);
}

void ex_fuse_free(ex_run *x) {
    ex_fuse *f = &x->fuse;
    for (int i = 0; i < f->n_plans; i++) {
        free(f->plans[i].json);
        free(f->plans[i].sched);
    }
    f->n_plans = 0;
}

/* The instance's JSON (ff_fuse_instance_parse reads it back to the same numbers: %.17g). */
static char *instance_json(const ff_fuse_instance *in) {
    size_t cap = 4096, off = 0;
    char *s = ff_malloc(cap);
    if (!s) return NULL;
    off += (size_t)snprintf(s + off, cap - off, "{\"nodes\": %d, \"models\": [", (int)in->nodes);
    for (int i = 0; i < in->n_models && off < cap; i++) {
        const ff_fuse_model *m = &in->models[i];
        off += (size_t)snprintf(s + off, cap - off, "%s{\"name\": \"%s\", \"stages\": [", i ? ", " : "", m->name);
        for (int32_t k = 0; k < m->n_stages && off < cap; k++)
            off += (size_t)snprintf(s + off, cap - off, "%s%d", k ? ", " : "", (int)m->stages[k]);
        if (off < cap)
            off += (size_t)snprintf(s + off, cap - off,
                                    "], \"micro_batches\": %d, \"forward\": %.17g, \"backward\": %.17g, \"activation\": %.17g}",
                                    (int)m->micro, m->fwd, m->bwd, m->act);
    }
    if (off < cap) off += (size_t)snprintf(s + off, cap - off, "]}");
    if (off >= cap) {
        free(s);
        return ff_error_set("fuse", NULL, "the instance's JSON is longer than %zu bytes", cap), NULL;
    }
    return s;
}

/* The schedule as rl.train_fused's tensor: per node, its count then (model, F 0 | B 1). */
static int32_t *schedule_tensor(const ff_fuse_schedule *s, int64_t *n) {
    int64_t len = s->nodes;
    for (int32_t k = 0; k < s->nodes; k++) len += 2 * s->n_tasks[k];
    int32_t *v = ff_malloc((size_t)len * sizeof *v);
    if (!v) return NULL;
    int64_t at = 0;
    for (int32_t k = 0; k < s->nodes; k++) {
        v[at++] = (int32_t)s->n_tasks[k];
        for (int64_t i = 0; i < s->n_tasks[k]; i++) v[at++] = s->tasks[k][i].model, v[at++] = s->tasks[k][i].backward;
    }
    *n = len;
    return v;
}

int ex_fuse_reps(const ex_run *x) {
    const int pc = x->lay[POOL_CRITIC].pp;
    return pc > 0 ? x->lay[POOL_ACTOR].pp / pc : 1;
}

const ex_fuse_plan *ex_fuse_plan_for(ex_run *x, int32_t ma, const int32_t *mc) {
    ex_fuse *f = &x->fuse;
    const int R = ex_fuse_reps(x);
    assert(R >= 1 && R < FF_FUSE_MAX_MODELS); /* validated with the config (graph.c check_fuse) */
    for (int i = 0; i < f->n_plans; i++)
        if (f->plans[i].ma == ma && !memcmp(f->plans[i].mc, mc, (size_t)R * sizeof *mc)) return &f->plans[i];
    if (f->n_plans == EX_FUSE_PLANS)
        return ff_error_set("fuse", "use micro_batch_size values that divide each rank's share evenly",
                            "more than %d different micro-batch counts in one run", EX_FUSE_PLANS),
               NULL;
    const int32_t P = x->lay[POOL_ACTOR].pp, Pc = P / R;
    /* the actor on 0..P-1; critic replica b on its block b x Pc .., reversed (its stage k on
     * the block's rank Pc-1-k), as ff_run_config_critic_place lays it out */
    ff_fuse_instance in = {.nodes = P, .n_models = 1 + R};
    const bool measured = f->mode == FF_FUSE_AUTO && !ex_fuse_measuring(x);
    for (int i = 0; i < 1 + R; i++) {
        ff_fuse_model *m = &in.models[i];
        const int w = i > 0, b = i - 1;
        if (!w) snprintf(m->name, sizeof m->name, "actor");
        else if (R == 1) snprintf(m->name, sizeof m->name, "critic");
        else snprintf(m->name, sizeof m->name, "critic%d", b);
        snprintf(m->family, sizeof m->family, "%s", w ? "critic" : "actor");
        m->n_stages = w ? Pc : P;
        for (int32_t k = 0; k < m->n_stages; k++) m->stages[k] = w ? b * Pc + Pc - 1 - k : k;
        m->micro = w ? mc[b] : ma;
        m->fwd = 1, m->bwd = 2, m->act = 1;
        if (measured) {
            m->fwd = f->sum_fwd[w] / f->n_times[w], m->bwd = f->sum_bwd[w] / f->n_times[w];
            m->act = ff_fuse_stage_activation((double)f->layers[w] / m->n_stages, f->sum_tok[w] / f->n_tok[w], f->hidden[w]);
        }
    }
    ff_fuse_schedule serial = {0}, fused = {0};
    ff_fuse_solve_opts so = {.seconds = FUSE_SECONDS, .seed = FUSE_SEED, .threads = 1, .max_rounds = FUSE_ROUNDS};
    ff_fuse_solve_stats st;
    ex_fuse_plan p = {.ma = ma, .reps = R, .in = in};
    memcpy(p.mc, mc, (size_t)R * sizeof *mc);
    int rc = -1;
    /* what fusing costs in memory: more micro-batches in flight where the pipelines overlap */
    ff_fuse_sim sim_serial, sim_fused;
    if (ff_fuse_serial(&in, &serial) || ff_fuse_simulate(&in, &serial, &sim_serial)) goto out;
    p.peak_serial = sim_serial.peak_activation;
    /* the fastest schedule; under fuse_peak, where it holds more than the cap, the least peak
     * the solver finds within ever larger makespan slacks, the first that fits */
    p.slack = 0;
    if (f->peak_cap > 0 ? ff_fuse_solve_capped(&in, &so, f->peak_cap * p.peak_serial, &fused, &st, &p.slack)
                        : ff_fuse_solve(&in, &so, &fused, &st))
        goto out;
    if (ff_fuse_simulate(&in, &fused, &sim_fused)) goto out;
    p.peak_fused = sim_fused.peak_activation;
    /* compare what runs: the streams' makespans (the executor's transfers), not the fused simulator's */
    p.serial = ff_fuse_streams_makespan(&in, &serial), p.fused = ff_fuse_streams_makespan(&in, &fused);
    if (p.serial < 0 || p.fused < 0) goto out;
    p.gain = p.serial > 0 ? 1 - p.fused / p.serial : 0;
    /* on: fused whatever the gain, but never over the memory cap; auto: also at least 5% faster */
    p.use = p.slack >= 0 && (f->mode == FF_FUSE_ON || p.gain >= FUSE_MIN_GAIN);
    if (!(p.json = instance_json(&in)) || !(p.sched = schedule_tensor(&fused, &p.n_sched))) goto out;
    /* measured: seconds and bytes per stage; else the unit instance */
    const double tu = measured ? 1e3 : 1, au = measured ? 1e-3 : 1;
    const char *tn = measured ? " ms" : "", *an = measured ? " KB" : "";
    char crit[160] = "";
    size_t co = 0;
    for (int b = 0; b < R && co < sizeof crit; b++)
        co += (size_t)snprintf(crit + co, sizeof crit - co, "%s%d on %d..%d", b ? ", " : "", (int)mc[b], (int)in.models[1 + b].stages[0],
                               (int)in.models[1 + b].stages[Pc - 1]);
    char cap[160] = "";
    if (f->peak_cap > 0 && p.slack > 0)
        snprintf(cap, sizeof cap, "; fuse_peak %g: the least peak within %g%% of the fastest schedule", f->peak_cap, 100 * p.slack);
    else if (f->peak_cap > 0 && p.slack < 0)
        snprintf(cap, sizeof cap, "; fuse_peak %g: no fused schedule found under it, the least within 100%% of the fastest", f->peak_cap);
    const char *choice = p.use                                 ? "fused steps"
                         : p.slack < 0                         ? "serial steps (over fuse_peak)"
                                                               : "serial steps (under 5%)";
    fprintf(x->out,
            "run: fuse %s: pp %d, actor %d micro-batches on stages 0..%d (forward %.4g%s, backward %.4g%s, activation %.4g%s per "
            "stage%s), critic %s%s (%.4g%s, %.4g%s, %.4g%s): simulated streams' makespan serial %.4g%s, fused %.4g%s (fused lower bound %s, "
            "%.2f s to solve), peak activation per rank serial %.4g%s, fused %.4g%s (%.2fx%s): gain %.1f%%, %s\n",
            mode_names[f->mode], (int)P, (int)ma, (int)P - 1, in.models[0].fwd * tu, tn, in.models[0].bwd * tu, tn,
            in.models[0].act * au, an, measured ? ", measured" : "", R > 1 ? "replicas " : "", crit, in.models[1].fwd * tu, tn,
            in.models[1].bwd * tu, tn, in.models[1].act * au, an, p.serial * tu, tn, p.fused * tu, tn,
            st.optimal ? "reached" : "not reached", st.seconds, p.peak_serial * au, an, p.peak_fused * au, an,
            p.peak_serial > 0 ? p.peak_fused / p.peak_serial : 0, cap, 100 * p.gain, choice);
    fflush(x->out);
    f->plans[f->n_plans++] = p;
    rc = 0;
out:
    ff_fuse_schedule_free(&serial);
    ff_fuse_schedule_free(&fused);
    if (rc) {
        free(p.json);
        free(p.sched);
        return ff_error_wrap("fuse: the fused schedule of %d actor micro-batches, %d of the first critic replica", (int)ma,
                             (int)mc[0]),
               NULL;
    }
    return &f->plans[f->n_plans - 1];
}

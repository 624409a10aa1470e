/* ff_trainer_step_fused: the actor's and the critic's trainers (the registry's vanilla PPO loss
 * with a KL term and an entropy bonus; the clipped value loss) on 4 ranks (threads, the mailbox
 * transport of tests/pipe/pipe_mailbox.h in its rendezvous mode, so a placement that could
 * deadlock hangs here), each rank holding the actor's stage r and the critic's stage 3-r (the
 * critic's pipeline group in reverse order, as `fuseflow run` lays it out under fuse), over 8
 * layers and 4 micro-batches of 16 varied samples. And with the critic as PP 2 x 2 replicas in the
 * actor's pipeline (replica b's stage k on rank 2b + 1 - k, as `fuseflow run` lays out a critic
 * at pp / 2 and dp x 2 under fuse), each replica on its half of the micro-batches with the
 * mini-batch's normaliser, the gradient hook summing each critic stage over its 2 replicas.
 *
 * Proved, after 3 steps: the fused step on the solver's schedule (ff_fuse_solve) and on the
 * serial baseline's (ff_fuse_serial) gives every rank the same weights and metrics, bit for bit,
 * as the actor's ff_trainer_step followed by the critic's (1F1B each; with replicas, each
 * replica's on its half, the same hook): each stage runs the same micro-batches in the same
 * order whatever the interleaving; and the replicas' critic stages end equal bit for bit (the
 * hook summed them, at the point where the fused streams put both replicas' steps). Refused before any transfer (every
 * rank alike): an instance whose micro-batches are not the shares', an instance whose critic
 * stages are not where the critic's pipeline holds them, the trainers given in the wrong order,
 * a one-critic instance given to critic replicas. */
#include <pthread.h>

#include "fuseflow/fuse.h"
#include "fuseflow/registry.h"
#include "fuseflow/roles.h"
#include "tests/pipe/pipe_mailbox.h"
#include "tests/pipe/pipe_test_util.h"

enum { P = 4, NS = 16, RMAX = 6, STEPS = 3, NMB = 4, VOCAB = 48, LAYERS = 8 };
enum { SERIAL = 0, FUSED_SOLVED, FUSED_BASELINE, BAD_MICRO, BAD_STAGES, BAD_ORDER, BAD_REPS, NMODES };
enum { PC = 2, REPS = P / PC }; /* the critic replicas' layout: PP 2 x 2 */
/* the world's groups: the actor's pipeline; the critic's (replica 0's with replicas), replica
 * 1's; each critic stage's replicas (the hook's sum) */
enum { G_ACTOR = 0, G_CRITIC, G_CRITIC1, G_DP0, G_DP1, NG };

typedef struct toy {
    int32_t prompt[NS][4], resp[NS][RMAX];
    float mask[NS][RMAX], old[NS][RMAX], adv[NS][RMAX], ref[NS][RMAX], oldv[NS][RMAX], ret[NS][RMAX];
    ff_rl_sample s[NS];
} toy;

static void toy_make(toy *t, uint64_t seed) {
    ff_rng r;
    ff_rng_seed(&r, seed);
    for (int i = 0; i < NS; i++) {
        int32_t pl = 1 + (int32_t)ff_rng_below(&r, 4), rl = 1 + (int32_t)ff_rng_below(&r, RMAX);
        for (int j = 0; j < pl; j++) t->prompt[i][j] = 2 + (int32_t)ff_rng_below(&r, VOCAB - 2);
        for (int j = 0; j < rl; j++) {
            t->resp[i][j] = 2 + (int32_t)ff_rng_below(&r, VOCAB - 2);
            t->mask[i][j] = (i == 3 && j == 0) ? 0.0f : 1.0f;
            t->adv[i][j] = (float)(ff_rng_uniform(&r) * 2 - 1);
            t->old[i][j] = (float)(-4 + ff_rng_uniform(&r));
            t->ref[i][j] = t->old[i][j] + (float)(ff_rng_uniform(&r) * 0.2 - 0.1);
            t->ret[i][j] = (float)ff_rng_uniform(&r);
            t->oldv[i][j] = t->ret[i][j] + (float)(ff_rng_uniform(&r) * 0.8 - 0.4);
        }
        t->s[i] = (ff_rl_sample){.prompt = t->prompt[i], .prompt_len = pl, .response = t->resp[i], .response_len = rl,
                                 .mask = t->mask[i], .old_logprob = t->old[i], .advantages = t->adv[i],
                                 .ref_logprob = t->ref[i], .old_values = t->oldv[i], .returns = t->ret[i]};
    }
}

typedef struct world {
    int mode;
    bool reps;              /* the critic as PP 2 x 2 replicas */
    ff_model_config cfg[2]; /* the actor's, the critic's */
    const ff_tensor_set *w[2];
    const toy *t;
    const ff_registry *reg;
    group *g[NG];           /* the actor's pipeline (rank r), the critic's (rank P-1-r; or replica r / 2's, rank 1 - r % 2) */
    rank_ctx ctx[NG][P];
    ff_fuse_instance in;
    const ff_fuse_schedule *sched;
    ff_train_metrics m[P][2][STEPS];
    ff_tensor_set *after[P][2];
    int rc[P];
    char err[P][512];
} world;

typedef struct rank_arg {
    world *w;
    int r;
} rank_arg;

/* The critic replicas' gradient hook: each stage's gradients summed over its replicas (in
 * double, rank order: the same bits on both). */
typedef struct dp_hook {
    rank_ctx *c;
    double *d;
    float *f;
    size_t cap;
} dp_hook;

static int dp_sum(void *user, ff_model *m, ff_buffer *grads, int64_t n) {
    (void)grads;
    dp_hook *h = user;
    if ((size_t)n > h->cap) {
        REQUIRE((h->d = realloc(h->d, sizeof *h->d * (size_t)n)) && (h->f = realloc(h->f, sizeof *h->f * (size_t)n)));
        h->cap = (size_t)n;
    }
    REQUIRE(ff_model_read_grads(m, h->f) == 0);
    for (int64_t i = 0; i < n; i++) h->d[i] = h->f[i];
    t_sum64(h->c, h->d, (size_t)n);
    for (int64_t i = 0; i < n; i++) h->f[i] = (float)h->d[i];
    return ff_model_write_grads(m, h->f);
}

static ff_trainer_config cfg_of(ff_train_kind kind, ff_policy_loss *pl, const ff_kl_def *kl) {
    ff_trainer_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    pt_adamw(&c.optim);
    c.optim.total_steps = 2 * STEPS;
    c.loss = pl;
    c.kl = kl;
    c.kl_coef = 0.3;
    c.entropy_coeff = 0.05;
    c.temperature = 0.8f;
    c.value = (ff_rlhf_value_cfg){0.2, FF_RLHF_AGG_TOKEN_MEAN, 0};
    return c;
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    world *w = a->w;
    const int r = a->r;
    ff_backend *be = ff_backend_new("cpu:1");
    REQUIRE(be);
    ff_pipe_transport tr[2];
    ff_roles_pipe rp[2];
    ff_model_comm norm[2];
    int32_t first[2][FF_MODEL_MAX_CHUNKS], count[2][FF_MODEL_MAX_CHUNKS];
    ff_model *m[2];
    ff_trainer *tn[2];
    ff_policy_loss *pl = ff_policy_loss_new(w->reg, "vanilla", NULL);
    REQUIRE(pl);
    const int b = w->reps ? r / PC : 0, cr = w->reps ? PC - 1 - r % PC : P - 1 - r; /* the critic's replica and stage here */
    dp_hook hook = {.c = w->reps ? &w->ctx[G_DP0 + cr][b] : NULL};
    for (int i = 0; i < 2; i++) {
        tr[i] = transport_of(i ? &w->ctx[G_CRITIC + b][cr] : &w->ctx[G_ACTOR][r]);
        rp[i] = (ff_roles_pipe){.transport = &tr[i], .kind = FF_PIPE_1F1B, .vpp = 1};
        ff_model_stage st;
        REQUIRE(ff_roles_pipe_stage(&w->cfg[i], &rp[i], tr[i].rank, first[i], count[i], &norm[i], &st) == 0);
        REQUIRE((m[i] = ff_model_new_opts(be, &w->cfg[i], w->w[i], &(ff_model_opts){.stage = &st})));
        ff_trainer_config c = cfg_of(i ? FF_TRAIN_CRITIC : FF_TRAIN_ACTOR, pl, ff_registry_kl(w->reg, "low_var_kl"));
        c.pipe = rp[i];
        if (i && w->reps) c.grad_hook = dp_sum, c.grad_hook_user = &hook;
        if (!(tn[i] = ff_trainer_new(m[i], &c))) fprintf(stderr, "%s\n", ff_error_message());
        REQUIRE(tn[i]);
    }
    int32_t mb[NMB + 1];
    for (int b = 0; b <= NMB; b++) mb[b] = b * NS / NMB;
    const ff_trainer_share sh = {w->t->s, NS, mb, NMB, 0};
    /* the critic's share: the whole mini-batch, or replica b's half of its micro-batches, with
     * the mini-batch's normaliser either way */
    const int32_t q0 = w->reps ? b * NMB / REPS : 0, nq = w->reps ? NMB / REPS : NMB;
    int32_t cmb[NMB + 1];
    for (int32_t q = 0; q <= nq; q++) cmb[q] = mb[q0 + q] - mb[q0];
    const ff_trainer_share cs = {w->t->s + mb[q0], cmb[nq], cmb, nq, ff_trainer_denom(tn[1], w->t->s, NS)};
    for (int k = 0; k < STEPS && w->rc[r] == 0; k++) {
        int rc;
        switch (w->mode) {
        case SERIAL:
            rc = ff_trainer_step(tn[0], w->t->s, NS, mb, NMB, 0, &w->m[r][0][k]) ||
                 ff_trainer_step(tn[1], cs.samples, cs.n, cs.mb_start, cs.n_micro, cs.denom, &w->m[r][1][k]);
            break;
        case BAD_ORDER:
            rc = ff_trainer_step_fused(tn[1], tn[0], &w->in, w->sched, &sh, &cs, &w->m[r][0][k], &w->m[r][1][k]);
            break;
        default:
            rc = ff_trainer_step_fused(tn[0], tn[1], &w->in, w->sched, &sh, &cs, &w->m[r][0][k], &w->m[r][1][k]);
        }
        if (rc) {
            snprintf(w->err[r], sizeof w->err[r], "%s", ff_error_message());
            w->rc[r] = -1;
        }
    }
    for (int i = 0; i < 2; i++) {
        REQUIRE((w->after[r][i] = ff_tensor_set_new()) && ff_model_export_weights(m[i], w->after[r][i]) == 0);
        ff_trainer_destroy(&tn[i]);
        ff_model_destroy(&m[i]);
    }
    ff_policy_loss_destroy(&pl);
    ff_backend_destroy(&be);
    free(hook.d), free(hook.f);
    return NULL;
}

static world *run(int mode, bool reps, const ff_model_config *cfg, ff_tensor_set *const *wt, const toy *t, const ff_registry *reg,
                  const ff_fuse_instance *in, const ff_fuse_schedule *sched) {
    world *w = calloc(1, sizeof *w);
    REQUIRE(w);
    *w = (world){.mode = mode, .reps = reps, .cfg = {cfg[0], cfg[1]}, .w = {wt[0], wt[1]}, .t = t, .reg = reg, .sched = sched};
    if (in) w->in = *in;
    for (int i = 0; i < NG; i++) {
        const int n = i == G_ACTOR || !reps ? P : i == G_CRITIC || i == G_CRITIC1 ? PC : REPS;
        if (!reps && i > G_CRITIC) continue;
        w->g[i] = group_new(n);
        w->g[i]->rendezvous = true;
        for (int r = 0; r < n; r++) w->ctx[i][r] = (rank_ctx){.g = w->g[i], .rank = r};
    }
    pthread_t th[P];
    rank_arg a[P];
    for (int r = 0; r < P; r++) {
        a[r] = (rank_arg){w, r};
        REQUIRE(pthread_create(&th[r], NULL, rank_main, &a[r]) == 0);
    }
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    for (int i = 0; i < NG; i++) {
        for (int r = 0; r < P; r++) rank_ctx_clear(&w->ctx[i][r]);
        if (w->g[i]) group_free(&w->g[i]);
    }
    return w;
}

static void world_free(world *w) {
    for (int r = 0; r < P; r++)
        for (int i = 0; i < 2; i++) ff_tensor_set_destroy(&w->after[r][i]);
    free(w);
}

/* Bit for bit: every rank's stages and metrics of both models. */
static void same_as(const world *got, const world *want, const char *name) {
    const char *models[2] = {"actor", "critic"};
    for (int r = 0; r < P; r++) {
        CHECK(got->rc[r] == 0 && want->rc[r] == 0);
        if (got->rc[r]) fprintf(stderr, "%s rank %d: %s\n", name, r, got->err[r]);
        for (int i = 0; i < 2; i++) {
            char what[128];
            snprintf(what, sizeof what, "%s: rank %d's %s stage after %d steps", name, r, models[i], STEPS);
            pt_err e = {0};
            pt_compare_sets(&e, what, got->after[r][i], want->after[r][i], 0, 0);
            CHECK(!e.differs);
            for (int k = 0; k < STEPS; k++) {
                const ff_train_metrics *a = &got->m[r][i][k], *b = &want->m[r][i][k];
                CHECK(a->loss == b->loss && a->pg_loss == b->pg_loss && a->kl_loss == b->kl_loss && a->entropy == b->entropy);
                CHECK(a->value_loss == b->value_loss && a->value_mean == b->value_mean && a->grad_norm == b->grad_norm);
                CHECK(a->steps == 1 && a->tokens == b->tokens && a->samples == b->samples && a->micro_batches == b->micro_batches);
                CHECK(a->samples == (i && got->reps ? NS / REPS : NS) && a->micro_batches == (i && got->reps ? NMB / REPS : NMB));
            }
        }
    }
    if (got->reps) /* the hook made the replicas' stages one: rank r's and rank r + 2's */
        for (int r = 0; r < PC; r++) {
            pt_err e = {0};
            pt_compare_sets(&e, "the critic replicas' stage", got->after[r][1], got->after[r + PC][1], 0, 0);
            CHECK(!e.differs);
        }
    printf("%s: every rank's weights and metrics after %d steps equal the serial steps' bit for bit\n", name, STEPS);
}

static void refused(const world *w, const char *name, const char *want) {
    for (int r = 0; r < P; r++) {
        CHECK(w->rc[r] == -1);
        if (!strstr(w->err[r], want)) {
            fprintf(stderr, "%s rank %d: '%s' lacks '%s'\n", name, r, w->err[r], want);
            ff_test_failures++;
        }
    }
    printf("%s: refused on every rank (%s)\n", name, w->err[0]);
}

int main(void) {
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    const ff_model_config cfg[2] = {tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, false, false, false),
                                    tiny_config(VOCAB, 32, 64, LAYERS, 4, 2, false, false, true)};
    ff_tensor_set *wt[2];
    for (int i = 0; i < 2; i++) REQUIRE((wt[i] = ff_tensor_set_new()) && ff_model_init_weights(&cfg[i], 21 + (uint64_t)i, 0.3, wt[i]) == 0);
    toy *t = calloc(1, sizeof *t);
    REQUIRE(t);
    toy_make(t, 5);
    /* the instance `fuseflow run` makes: the actor on ranks 0..3, the critic on 3..0 */
    ff_fuse_instance in = {.nodes = P, .n_models = 2};
    for (int i = 0; i < 2; i++) {
        ff_fuse_model *m = &in.models[i];
        snprintf(m->name, sizeof m->name, "%s", i ? "critic" : "actor");
        snprintf(m->family, sizeof m->family, "%s", i ? "critic" : "actor");
        m->n_stages = P;
        for (int k = 0; k < P; k++) m->stages[k] = i ? P - 1 - k : k;
        m->micro = NMB, m->fwd = 1, m->bwd = 2, m->act = 1;
    }
    ff_fuse_schedule solved, base;
    ff_fuse_solve_opts so = {.seconds = 30, .seed = 1, .threads = 1, .max_rounds = 200};
    ff_fuse_solve_stats st;
    REQUIRE(ff_fuse_solve(&in, &so, &solved, &st) == 0 && ff_fuse_serial(&in, &base) == 0);
    ff_fuse_sim s1, s2;
    REQUIRE(ff_fuse_simulate(&in, &solved, &s1) == 0 && ff_fuse_simulate(&in, &base, &s2) == 0);
    CHECK(s1.makespan < s2.makespan); /* the fused schedule interleaves the two models */
    printf("schedules: solved makespan %.0f, serial baseline %.0f\n", s1.makespan, s2.makespan);

    world *serial = run(SERIAL, false, cfg, wt, t, reg, NULL, NULL);
    for (int r = 0; r < P; r++)
        if (serial->rc[r]) fprintf(stderr, "serial rank %d: %s\n", r, serial->err[r]), ff_test_failures++;
    world *w = run(FUSED_SOLVED, false, cfg, wt, t, reg, &in, &solved);
    same_as(w, serial, "fused (the solver's schedule)");
    world_free(w);
    w = run(FUSED_BASELINE, false, cfg, wt, t, reg, &in, &base);
    same_as(w, serial, "fused (the serial baseline's schedule)");
    world_free(w);

    ff_fuse_instance bad = in;
    bad.models[1].micro = NMB - 1;
    ff_fuse_schedule bs;
    REQUIRE(ff_fuse_serial(&bad, &bs) == 0);
    w = run(BAD_MICRO, false, cfg, wt, t, reg, &bad, &bs);
    refused(w, "an instance of other micro-batch counts", "micro-batches");
    world_free(w);
    ff_fuse_schedule_free(&bs);
    bad = in;
    for (int k = 0; k < P; k++) bad.models[1].stages[k] = k;
    REQUIRE(ff_fuse_serial(&bad, &bs) == 0);
    w = run(BAD_STAGES, false, cfg, wt, t, reg, &bad, &bs);
    refused(w, "an instance with the critic's stages forward", "places other stages there");
    world_free(w);
    ff_fuse_schedule_free(&bs);
    w = run(BAD_ORDER, false, cfg, wt, t, reg, &in, &solved);
    refused(w, "the critic's trainer first", "the actor's trainer first");
    world_free(w);

    /* the critic as PP 2 x 2 replicas: critic0 on ranks [1, 0], critic1 on [3, 2], 2 micro-batches each */
    ff_fuse_instance in3 = {.nodes = P, .n_models = 1 + REPS};
    in3.models[0] = in.models[0];
    for (int q = 0; q < REPS; q++) {
        ff_fuse_model *m = &in3.models[1 + q];
        snprintf(m->name, sizeof m->name, "critic%d", q);
        snprintf(m->family, sizeof m->family, "critic");
        m->n_stages = PC;
        for (int k = 0; k < PC; k++) m->stages[k] = q * PC + PC - 1 - k;
        m->micro = NMB / REPS, m->fwd = 1, m->bwd = 2, m->act = 1;
    }
    ff_fuse_schedule solved3, base3;
    REQUIRE(ff_fuse_solve(&in3, &so, &solved3, &st) == 0 && ff_fuse_serial(&in3, &base3) == 0);
    REQUIRE(ff_fuse_simulate(&in3, &solved3, &s1) == 0 && ff_fuse_simulate(&in3, &base3, &s2) == 0);
    CHECK(s1.makespan < s2.makespan);
    printf("critic PP 2 x 2 schedules: solved makespan %.0f, serial baseline %.0f\n", s1.makespan, s2.makespan);
    world *serial3 = run(SERIAL, true, cfg, wt, t, reg, NULL, NULL);
    for (int r = 0; r < P; r++)
        if (serial3->rc[r]) fprintf(stderr, "serial (replicas) rank %d: %s\n", r, serial3->err[r]), ff_test_failures++;
    w = run(FUSED_SOLVED, true, cfg, wt, t, reg, &in3, &solved3);
    same_as(w, serial3, "critic PP 2 x 2, fused (the solver's schedule)");
    world_free(w);
    w = run(FUSED_BASELINE, true, cfg, wt, t, reg, &in3, &base3);
    same_as(w, serial3, "critic PP 2 x 2, fused (the serial baseline's schedule)");
    world_free(w);
    w = run(BAD_REPS, true, cfg, wt, t, reg, &in, &solved);
    refused(w, "critic replicas given a one-critic instance", "one critic model per critic replica");
    world_free(w);
    world_free(serial3);
    ff_fuse_schedule_free(&solved3);
    ff_fuse_schedule_free(&base3);

    world_free(serial);
    ff_fuse_schedule_free(&solved);
    ff_fuse_schedule_free(&base);
    free(t);
    for (int i = 0; i < 2; i++) ff_tensor_set_destroy(&wt[i]);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}

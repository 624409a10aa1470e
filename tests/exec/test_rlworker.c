/* The RL worker kinds (workers/rl/, what `fuseflow worker` serves to `fuseflow run`), driven
 * directly from a controller with two local workers (the fuseflow binary, FF_BIN):
 *   - rl.init loads the roles of a run config and reports the worker's resident memory and
 *     the bytes each role needs (the reference and the generating copy no gradients and no
 *     optimizer state); a missing model folder is an error naming it;
 *   - rl.generate: n samples per prompt, tokens and log-probs; the same seed gives the same
 *     samples on either worker and alone or batched with other requests (continuous batching
 *     across subtasks, while other kinds run between steps); a cancelled one comes back
 *     cancelled;
 *   - rl.logprob of the rollout's own samples equals the rollout's log-probs;
 *   - rl.train on two DP ranks with different shares and the global normaliser leaves both
 *     ranks with the same weights (gradients summed in the group), and they moved;
 *   - rl.sync copies the trained actor into the generating one (digests equal);
 *   - rl.save + rl.init with resume: another worker continues bit for bit (a further identical
 *     step gives equal digests: weights and optimizer state were restored exactly);
 *   - long-tail migration between the two workers over a group's communicator: rank 0's open
 *     job moves to rank 1 (rl.migrate_out / rl.migrate_in) with its KV rows and with a
 *     recompute; rank 0's rl.generate comes back with every sample marked moved, rank 1's
 *     rl.migrate_in returns each one tagged with the job and response it stands for, and they
 *     are the samples rank 1 makes without a move (bit for bit with the rows; the same tokens
 *     and log-probs within 1e-4 with a recompute); a send that cannot finish (a survivor that
 *     never receives, the group's timeout) leaves the sequences on rank 0, which finishes them
 *     bit for bit; a peer that is not another member is refused;
 *   - bad requests (a role not hosted, missing columns, mismatched lengths, max_new or top_k
 *     outside what the engine's int32 holds) are clear errors.
 */
#include <sys/stat.h>

#include "fuseflow/rl_protocol.h"
#include "tests/runtime/rt_test.h"

static const char *bin;
static char dir[256];

typedef struct out {
    int calls, status;
    char error[256];
    int32_t rlen[64], resp[4096], finish[64];
    float lp[4096], score[4096];
    int64_t nresp;
    uint64_t hash;
    double sum;
    double metrics[32];
    int64_t tag[128], state_len[64], moved[4], ntag; /* migration */
    double xfer[3];
    int64_t params[FF_RL_NROLES], memory[FF_RL_MEM_N], role_bytes[FF_RL_NROLES][FF_RL_RB_N]; /* rl.init */
} out;

static void on_done(ff_controller *c, uint64_t job, const ff_result *r, int n, void *ud) {
    (void)c, (void)job, (void)n;
    out *o = ud;
    o->calls++;
    o->status = r[0].status;
    snprintf(o->error, sizeof o->error, "%s", r[0].error);
    for (int i = 0; i < r[0].noutputs; i++) {
        const ff_tensor *t = &r[0].outputs[i];
        size_t nb = t->nbytes;
        if (!nb) { /* an empty tensor (a job whose samples all moved) may have no data */
            if (!strcmp(t->name, "resp")) o->nresp = 0;
            continue;
        }
        if (!strcmp(t->name, "rlen") && nb <= sizeof o->rlen) memcpy(o->rlen, t->data, nb);
        if (!strcmp(t->name, "finish") && nb <= sizeof o->finish) memcpy(o->finish, t->data, nb);
        if (!strcmp(t->name, "resp") && nb <= sizeof o->resp) memcpy(o->resp, t->data, nb), o->nresp = (int64_t)(nb / 4);
        if (!strcmp(t->name, "logprob") && nb <= sizeof o->lp) memcpy(o->lp, t->data, nb);
        if (!strcmp(t->name, "hash")) memcpy(&o->hash, t->data, 8);
        if (!strcmp(t->name, FF_RL_T_TAG) && nb <= sizeof o->tag) memcpy(o->tag, t->data, nb), o->ntag = (int64_t)(nb / 16);
        if (!strcmp(t->name, FF_RL_T_STATE_LEN) && nb <= sizeof o->state_len) memcpy(o->state_len, t->data, nb);
        if (!strcmp(t->name, FF_RL_T_MOVED) && nb == sizeof o->moved) memcpy(o->moved, t->data, nb);
        if (!strcmp(t->name, FF_RL_T_XFER) && nb == sizeof o->xfer) memcpy(o->xfer, t->data, nb);
        if (!strcmp(t->name, "sum")) memcpy(&o->sum, t->data, 8);
        if (!strcmp(t->name, "metrics") && nb <= sizeof o->metrics) memcpy(o->metrics, t->data, nb);
        if (!strcmp(t->name, FF_RL_T_PARAMS) && nb == sizeof o->params) memcpy(o->params, t->data, nb);
        if (!strcmp(t->name, FF_RL_T_MEMORY) && nb == sizeof o->memory) memcpy(o->memory, t->data, nb);
        if (!strcmp(t->name, FF_RL_T_ROLE_BYTES) && nb == sizeof o->role_bytes) memcpy(o->role_bytes, t->data, nb);
    }
}

static ff_controller *C;

static uint64_t submit(const char *kind, int rank, const char *group, ff_arg *args, int nargs, ff_input *in, int nin, out *o) {
    memset(o, 0, sizeof *o);
    ff_subtask_spec s = {.kind = kind, .target = FF_TARGET_RANK, .rank = rank, .group = group, .args = args, .nargs = nargs,
                         .inputs = in, .ninputs = nin};
    uint64_t id = ff_controller_submit(C, &s, on_done, o);
    REQUIRE(id > 0);
    return id;
}

static ff_input i32(const char *name, const int32_t *v, int64_t n, int64_t *shape) {
    int32_t *d = malloc((size_t)(n ? n : 1) * 4);
    if (n) memcpy(d, v, (size_t)n * 4);
    *shape = n;
    return (ff_input){.name = name, .dtype = FF_DTYPE_I32, .ndim = 1, .shape = shape, .data = d, .free_fn = rt_free};
}

static ff_input f32(const char *name, const float *v, int64_t n, int64_t *shape) {
    float *d = malloc((size_t)(n ? n : 1) * 4);
    if (n) memcpy(d, v, (size_t)n * 4);
    *shape = n;
    return (ff_input){.name = name, .dtype = FF_DTYPE_F32, .ndim = 1, .shape = shape, .data = d, .free_fn = rt_free};
}

static const int32_t prompt[] = {49, 43, 50, 61}; /* "1+2=" in the byte tokenizer */

static uint64_t generate_max(int rank, int64_t seed, int n, int max_new, out *o);
static void generate(int rank, int64_t seed, int n, out *o) { generate_max(rank, seed, n, 6, o); }

static uint64_t generate_sampling(int rank, int64_t seed, int n, int64_t max_new, int64_t top_k, out *o);
static uint64_t generate_max(int rank, int64_t seed, int n, int max_new, out *o) { return generate_sampling(rank, seed, n, max_new, 0, o); }

static uint64_t generate_sampling(int rank, int64_t seed, int n, int64_t max_new, int64_t top_k, out *o) {
    static int64_t shp[3];
    int32_t pl = 4;
    ff_input in[3] = {i32("prompt", prompt, 4, &shp[0]), i32("plen", &pl, 1, &shp[1])};
    int64_t *sd = malloc(8);
    *sd = seed;
    shp[2] = 1;
    in[2] = (ff_input){.name = "seed", .dtype = FF_DTYPE_I64, .ndim = 1, .shape = &shp[2], .data = sd, .free_fn = rt_free};
    ff_arg a[4] = {ff_arg_int("n", n), ff_arg_float("temperature", 1.0), ff_arg_int("max_new", max_new), ff_arg_int("top_k", top_k)};
    return submit("rl.generate", rank, NULL, a, 4, in, 3, o);
}

static void run_all(void) { REQUIRE(ff_controller_run(C, 120) == 0); }

static void digest(int rank, const char *role, out *o) {
    ff_arg a = ff_arg_str("role", role);
    submit("rl.digest", rank, NULL, &a, 1, NULL, 0, o);
}

static void init(int rank, const char *config, const char *resume, out *o) {
    static int64_t shp;
    int64_t len = (int64_t)strlen(config);
    char *c = malloc((size_t)len);
    memcpy(c, config, (size_t)len);
    shp = len;
    ff_input in = {.name = "config", .dtype = FF_DTYPE_U8, .ndim = 1, .shape = &shp, .data = c, .free_fn = rt_free};
    ff_arg a[5] = {ff_arg_int("roles", 1 | 2 | 8), ff_arg_str("backend", "cpu:1"), ff_arg_int("slots", 16), ff_arg_int("max_seq", 64),
                   ff_arg_str("resume", resume ? resume : "")};
    submit("rl.init", rank, NULL, a, 5, &in, 1, o);
}

/* A train step of rank `rank` on samples [a, b) of the generated batch g. */
static void train(int rank, const out *g, int a, int b, double denom, const float *adv_all, out *o) {
    static int64_t shp[2][8];
    int64_t *sh = shp[rank];
    int n = b - a;
    int32_t pr[64 * 4], pl[64], rl[64], mb[2] = {0, n};
    int32_t off = 0;
    for (int i = 0; i < a; i++) off += g->rlen[i];
    int32_t R = 0;
    for (int i = a; i < b; i++) {
        memcpy(pr + 4 * (i - a), prompt, sizeof prompt);
        pl[i - a] = 4;
        rl[i - a] = g->rlen[i];
        R += g->rlen[i];
    }
    float adv[4096];
    for (int32_t t = 0; t < R; t++) adv[t] = adv_all[off + t];
    ff_input in[7] = {i32("prompt", pr, 4 * n, &sh[0]), i32("plen", pl, n, &sh[1]),          i32("resp", g->resp + off, R, &sh[2]),
                      i32("rlen", rl, n, &sh[3]),       f32("old_logprob", g->lp + off, R, &sh[4]), f32("advantages", adv, R, &sh[5]),
                      i32("mb", mb, 2, &sh[6])};
    ff_arg args[2] = {ff_arg_str("role", "actor"), ff_arg_float("denom", denom)};
    submit("rl.train", rank, "actor", args, 2, in, 7, o);
}

/* the least free on a device since a result's previous one: what is free less what was held
 * above what is held now, 0 at least, -1 where the free figure is unknown */
static void test_least_free(void) {
    CHECK(ff_rl_device_least_free((int64_t[FF_RL_DP_N]){100, 100, 50}) == 50);
    CHECK(ff_rl_device_least_free((int64_t[FF_RL_DP_N]){130, 100, 50}) == 20);
    CHECK(ff_rl_device_least_free((int64_t[FF_RL_DP_N]){200, 100, 50}) == 0);
    CHECK(ff_rl_device_least_free((int64_t[FF_RL_DP_N]){100, 100, -1}) == -1);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    test_least_free();
    bin = getenv("FF_BIN");
    if (!bin) SKIP("FF_BIN (the fuseflow binary) is not set; run through ctest");
    snprintf(dir, sizeof dir, "/tmp/ff_rlworker_%d", (int)getpid());
    rt_sh("rm -rf %s && mkdir -p %s", dir, dir);
    char model[512], cfg[4096];
    snprintf(model, sizeof model, "%s/m", dir);
    rt_sh("%s init --preset tiny --out %s num_hidden_layers=2 hidden_size=64 intermediate_size=128 > /dev/null", bin, model);
    snprintf(cfg, sizeof cfg,
             "trainer: {steps: 2, seed: 3}\n"
             "data: {train_files: none.jsonl, train_batch_size: 2, max_prompt_length: 8, max_response_length: 6}\n"
             "roles:\n  actor: {model: %s, workers: 2, optim: {lr: 1.0e-2, grad_clip: 0}}\n"
             "  ref: {model: %s, colocate_with: actor}\n"
             "graph:\n"
             "  rollout: {op: generate, role: actor, in: [prompt], out: [response, old_logprob], n: 4}\n"
             "  reward: {op: reward_fn, in: [prompt, response, answer], out: [score], function: arith_exact_match}\n"
             "  adv: {op: advantage, in: [score], out: [advantages], estimator: grpo}\n"
             "  train: {op: train, role: actor, in: [prompt, response, old_logprob, advantages], mini_batch_size: 2, micro_batch_size: 4}\n",
             model, model);
    setenv("FF_COLL_SHM_BYTES", "4096", 1); /* the workers' FIFOs: a move that is never received cannot finish */
    ff_controller_opts o = rt_opts();
    o.worker_bin = bin;
    o.worker_log = "error";
    C = ff_controller_new(&o);
    REQUIRE(C);
    REQUIRE(ff_controller_spawn(C, 2) == 0);
    REQUIRE(ff_controller_wait_workers(C, 2, 60) == 0);
    REQUIRE(ff_controller_group_create(C, "actor", (int[]){0, 1}, 2, &(ff_group_opts){.backend = "cpu"}) == 0);
    static out r0, r1, g0, g1, ga, gb[6], lp, t0, t1, d0, d1, e0, e1, bad;

    /* a missing model folder: the error names it */
    char badcfg[4096];
    snprintf(badcfg, sizeof badcfg, "%s", cfg);
    char *p = strstr(badcfg, "/m,");
    REQUIRE(p);
    memcpy(p, "/x,", 3);
    init(0, badcfg, NULL, &bad);
    run_all();
    CHECK_EQ_INT(bad.status, FF_STATUS_FAILED);
    CHECK_STR_CONTAINS(bad.error, "/x");

    init(0, cfg, NULL, &r0);
    init(1, cfg, NULL, &r1);
    run_all();
    CHECK_EQ_INT(r0.status, FF_STATUS_OK);
    CHECK_EQ_INT(r1.status, FF_STATUS_OK);
    if (r0.status) fprintf(stderr, "rl.init: %s\n", r0.error);
    /* what each hosted role needs: the trained actor its parameters, gradients and two
     * moments; the generating copy and the reference their parameters alone */
    int64_t np = r0.params[0];
    CHECK(np > 0);
    CHECK(r0.params[1] == np && r0.params[2] == 0 && r0.params[3] == np && r0.params[4] == 0);
    const int64_t want[FF_RL_NROLES][FF_RL_RB_N] = {{4 * np, 4 * np, 8 * np}, {4 * np, 0, 0}, {0, 0, 0}, {4 * np, 0, 0}, {0, 0, 0}};
    CHECK(memcmp(r0.role_bytes, want, sizeof want) == 0);
    CHECK(memcmp(r1.role_bytes, want, sizeof want) == 0);
    /* resident memory: at least the three copies of the weights, the peak at least that */
    CHECK(r0.memory[FF_RL_MEM_RSS] >= 12 * np && r0.memory[FF_RL_MEM_PEAK] >= r0.memory[FF_RL_MEM_RSS]);
    CHECK(r1.memory[FF_RL_MEM_RSS] >= 12 * np && r1.memory[FF_RL_MEM_PEAK] >= r1.memory[FF_RL_MEM_RSS]);
    /* the backend's: on the cpu its buffers (the three copies of the weights at least: the
     * actor's, its generating copy's, the reference's), and no device capacity */
    CHECK(r0.memory[FF_RL_MEM_DEV] >= 12 * np && r0.memory[FF_RL_MEM_DEV_CAP] == 0 && r0.memory[FF_RL_MEM_DEV_FREE] == -1);

    /* the same request on both workers, and batched with others on worker 0 */
    generate(0, 11, 4, &g0);
    generate(1, 11, 4, &g1);
    run_all();
    for (int k = 0; k < 6; k++) generate(0, 100 + k, 3, &gb[k]);
    generate(0, 11, 4, &ga);
    digest(0, "ref", &d0); /* another kind between the steps */
    run_all();
    REQUIRE(g0.status == FF_STATUS_OK && g1.status == FF_STATUS_OK && ga.status == FF_STATUS_OK);
    int64_t total = 0;
    for (int i = 0; i < 4; i++) total += g0.rlen[i];
    CHECK_EQ_INT(total, g0.nresp);
    CHECK(g0.nresp > 0);
    CHECK(!memcmp(g0.resp, g1.resp, (size_t)g0.nresp * 4) && !memcmp(g0.rlen, g1.rlen, sizeof g0.rlen));
    CHECK(!memcmp(g0.resp, ga.resp, (size_t)g0.nresp * 4));
    for (int64_t t = 0; t < g0.nresp; t++) CHECK_CLOSE(ga.lp[t], g0.lp[t], 1e-5, 1e-4);
    for (int k = 0; k < 6; k++) CHECK_EQ_INT(gb[k].status, FF_STATUS_OK);
    CHECK_EQ_INT(d0.status, FF_STATUS_OK);

    /* the rollout's log-probs are what a forward gives */
    {
        static int64_t shp[4];
        int32_t pr[16], pl[4] = {4, 4, 4, 4};
        for (int i = 0; i < 4; i++) memcpy(pr + 4 * i, prompt, sizeof prompt);
        ff_input in[4] = {i32("prompt", pr, 16, &shp[0]), i32("plen", pl, 4, &shp[1]), i32("resp", g0.resp, g0.nresp, &shp[2]),
                          i32("rlen", g0.rlen, 4, &shp[3])};
        ff_arg a = ff_arg_str("role", "gen");
        submit("rl.logprob", 0, NULL, &a, 1, in, 4, &lp);
        run_all();
        CHECK_EQ_INT(lp.status, FF_STATUS_OK);
        for (int64_t t = 0; t < g0.nresp; t++) CHECK_CLOSE(lp.lp[t], g0.lp[t], 1e-4, 1e-4);
        double m1 = 0, m2 = 0;
        for (int64_t t = 0; t < g0.nresp; t++) { double d = fabs(lp.lp[t] - g0.lp[t]); if (d > m1) m1 = d; d = fabs(ga.lp[t] - g0.lp[t]); if (d > m2) m2 = d; }
        if (getenv("FF_PROBE")) fprintf(stderr, "forward vs rollout %g, batched vs alone %g\n", m1, m2);
    }

    /* long-tail migration: rank 0's job to rank 1 over "mig", the rows, then a recompute */
    {
        static out ref, gm, mo, mi;
        REQUIRE(ff_controller_group_create(C, "mig", (int[]){0, 1}, 2, &(ff_group_opts){.backend = "cpu"}) == 0);
        generate_max(1, 300, 4, 40, &ref); /* where the moved samples end up, never moved */
        run_all();
        REQUIRE(ref.status == FF_STATUS_OK);
        static out slept;
        ff_arg nap = ff_arg_float("ms", 200);
        for (int how = 0; how < 2; how++) {
            /* rank 0 sleeps first, so that the job and the move wait there together: the move
             * takes the job at its first step boundary, not after a loaded machine let it finish */
            submit("sleep", 0, NULL, &nap, 1, NULL, 0, &slept);
            uint64_t job = generate_max(0, 300, 4, 40, &gm);
            ff_arg ia = ff_arg_int("peer", 0), oa[2] = {ff_arg_int("peer", 1), ff_arg_int("how", how)};
            submit(FF_RL_MIGRATE_IN, 1, "mig", &ia, 1, NULL, 0, &mi);
            submit(FF_RL_MIGRATE_OUT, 0, "mig", oa, 2, NULL, 0, &mo);
            run_all();
            REQUIRE(gm.status == FF_STATUS_OK && mo.status == FF_STATUS_OK && mi.status == FF_STATUS_OK);
            if (mi.status) fprintf(stderr, "migration: %s / %s\n", mo.error, mi.error);
            /* the job left at its first step boundary: every sample moved, none came back here */
            CHECK_EQ_INT(mo.moved[0], 4);
            CHECK_EQ_INT(mo.moved[3], how);
            CHECK_EQ_INT(gm.nresp, 0);
            int64_t bytes = 0;
            for (int i = 0; i < 4; i++) {
                CHECK(gm.state_len[i] > 0);
                bytes += gm.state_len[i];
            }
            CHECK_EQ_INT(mo.moved[1], bytes);
            CHECK(mi.xfer[0] == (double)bytes && mi.xfer[1] > 0);
            REQUIRE(mi.ntag == 4);
            /* rank 1 continued them: each, by its tag, is what rank 1 makes without a move */
            int64_t at = 0;
            for (int i = 0; i < 4; i++) {
                CHECK(mi.tag[2 * i] == (int64_t)job);
                int64_t k = mi.tag[2 * i + 1], ro = 0;
                REQUIRE(k >= 0 && k < 4);
                for (int q = 0; q < k; q++) ro += ref.rlen[q];
                CHECK_EQ_INT(mi.rlen[i], ref.rlen[k]);
                CHECK(!memcmp(mi.resp + at, ref.resp + ro, (size_t)ref.rlen[k] * 4));
                for (int32_t t = 0; t < ref.rlen[k]; t++) {
                    if (how == 0) CHECK(mi.lp[at + t] == ref.lp[ro + t]);
                    else CHECK_CLOSE(mi.lp[at + t], ref.lp[ro + t], 1e-4, 1e-4);
                }
                at += mi.rlen[i];
            }
            CHECK_EQ_INT(at, mi.nresp);
        }
        /* a survivor that never receives: the send cannot finish (a FIFO of a page, the
         * group's 2 s), the sequences stay on rank 0 and finish there bit for bit */
        REQUIRE(ff_controller_group_create(C, "migslow", (int[]){0, 1}, 2, &(ff_group_opts){.backend = "cpu", .timeout_s = 2}) == 0);
        submit("sleep", 0, NULL, &nap, 1, NULL, 0, &slept);
        generate_max(0, 300, 4, 40, &gm);
        ff_arg oa[2] = {ff_arg_int("peer", 1), ff_arg_int("how", 0)};
        submit(FF_RL_MIGRATE_OUT, 0, "migslow", oa, 2, NULL, 0, &mo);
        run_all();
        CHECK_EQ_INT(mo.status, FF_STATUS_FAILED);
        CHECK_STR_CONTAINS(mo.error, "rl.migrate_out: sending 4 sequences to member 1");
        REQUIRE(gm.status == FF_STATUS_OK);
        CHECK(!memcmp(gm.rlen, ref.rlen, 4 * sizeof *ref.rlen) && gm.nresp == ref.nresp);
        CHECK(!memcmp(gm.resp, ref.resp, (size_t)ref.nresp * 4) && !memcmp(gm.lp, ref.lp, (size_t)ref.nresp * 4));
        for (int i = 0; i < 4; i++) CHECK_EQ_INT(gm.state_len[i], 0);
        /* a peer that is not another member */
        ff_arg self = ff_arg_int("peer", 1);
        submit(FF_RL_MIGRATE_IN, 1, "mig", &self, 1, NULL, 0, &mi);
        run_all();
        CHECK_EQ_INT(mi.status, FF_STATUS_BAD_REQUEST);
        CHECK_STR_CONTAINS(mi.error, "peer 1 is not another member of the 2 in group 'mig'");
    }

    /* cancel a deferred generation that waits in the engine behind 60 long sequences */
    {
        static out many[16];
        uint64_t last = 0;
        for (int k = 0; k < 16; k++) last = generate_max(1, 200 + k, 4, 56, &many[k]);
        REQUIRE(ff_controller_cancel(C, last) == 0);
        run_all();
        CHECK_EQ_INT(many[15].status, FF_STATUS_CANCELLED);
        CHECK_EQ_INT(many[15].calls, 1);
        for (int k = 0; k < 15; k++) CHECK_EQ_INT(many[k].status, FF_STATUS_OK);
    }

    /* DP training: rank 0 takes samples [0, 1), rank 1 [1, 4); the normaliser is the
     * mini-batch's token count; both end with the same weights, which moved */
    digest(0, "actor", &e0);
    run_all();
    float adv[4096];
    for (int smp = 0, t = 0; smp < 4; smp++)
        for (int q = 0; q < g0.rlen[smp]; q++) adv[t++] = smp % 2 ? 1.0f : -1.0f;
    train(0, &g0, 0, 1, (double)g0.nresp, adv, &t0);
    train(1, &g0, 1, 4, (double)g0.nresp, adv, &t1);
    run_all();
    CHECK_EQ_INT(t0.status, FF_STATUS_OK);
    CHECK_EQ_INT(t1.status, FF_STATUS_OK);
    if (t0.status) fprintf(stderr, "rl.train: %s / %s\n", t0.error, t1.error);
    digest(0, "actor", &d0);
    digest(1, "actor", &d1);
    run_all();
    CHECK(d0.hash == d1.hash);
    CHECK(d0.hash != e0.hash);
    CHECK_CLOSE(t0.metrics[16], t1.metrics[16], 1e-6, 1e-6); /* the same global gradient norm */

    /* sync: the generating copy gets the trained weights */
    ff_arg local = ff_arg_str("mode", "local");
    submit("rl.sync", 0, NULL, &local, 1, NULL, 0, &e0);
    run_all();
    CHECK_EQ_INT(e0.status, FF_STATUS_OK);
    digest(0, "gen", &e1);
    run_all();
    CHECK(e1.hash == d0.hash);

    /* checkpoint from rank 0, rank 1 resumes from it; one more identical step on both */
    char ck[512];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    mkdir(ck, 0755);
    ff_arg sv[2] = {ff_arg_str("role", "actor"), ff_arg_str("dir", ck)};
    submit("rl.save", 0, NULL, sv, 2, NULL, 0, &e0);
    run_all();
    CHECK_EQ_INT(e0.status, FF_STATUS_OK);
    init(1, cfg, ck, &r1);
    run_all();
    CHECK_EQ_INT(r1.status, FF_STATUS_OK);
    digest(1, "actor", &d1);
    run_all();
    CHECK(d1.hash == d0.hash);
    train(0, &g0, 0, 1, (double)g0.nresp, adv, &t0);
    train(1, &g0, 1, 4, (double)g0.nresp, adv, &t1);
    run_all();
    digest(0, "actor", &d0);
    digest(1, "actor", &d1);
    run_all();
    CHECK(d0.hash == d1.hash); /* Adam moments and step count came back exactly */

    /* bad requests */
    ff_arg crit = ff_arg_str("role", "critic");
    submit("rl.train", 0, "actor", &crit, 1, NULL, 0, &bad);
    run_all();
    CHECK(bad.status == FF_STATUS_BAD_REQUEST);
    {
        static int64_t shp[4];
        int32_t pl = 4, rl = 9;
        ff_input in[4] = {i32("prompt", prompt, 4, &shp[0]), i32("plen", &pl, 1, &shp[1]), i32("resp", g0.resp, 2, &shp[2]),
                          i32("rlen", &rl, 1, &shp[3])};
        ff_arg a = ff_arg_str("role", "ref");
        submit("rl.logprob", 0, NULL, &a, 1, in, 4, &bad);
        run_all();
        CHECK_EQ_INT(bad.status, FF_STATUS_BAD_REQUEST);
        CHECK_STR_CONTAINS(bad.error, "lengths");
    }
    {
        /* max_new and top_k past int32 once wrapped to 6 and 0 and ran; 0 and -1 are refused by
         * name too, not as mismatched lengths */
        const struct {
            int64_t max_new, top_k;
            const char *msg;
        } cases[] = {{((int64_t)1 << 32) + 6, 0, "max_new = 4294967302 is outside [1, 2147483647]"},
                     {0, 0, "max_new = 0 is outside [1, 2147483647]"},
                     {6, (int64_t)1 << 32, "top_k = 4294967296 is outside [0, 2147483647]"},
                     {6, -1, "top_k = -1 is outside [0, 2147483647]"}};
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            generate_sampling(0, 1, 1, cases[i].max_new, cases[i].top_k, &bad);
            run_all();
            CHECK_EQ_INT(bad.status, FF_STATUS_BAD_REQUEST);
            CHECK_STR_CONTAINS(bad.error, cases[i].msg);
        }
    }
    {
        ff_arg a = ff_arg_str("role", "reward");
        submit("rl.digest", 1, NULL, &a, 1, NULL, 0, &bad);
        run_all();
        CHECK_EQ_INT(bad.status, FF_STATUS_FAILED);
        CHECK_STR_CONTAINS(bad.error, "does not host");
    }
    rt_shutdown_clean(C);
    ff_controller_destroy(&C);
    rt_sh("rm -rf %s%s", dir, "");
    TEST_MAIN_END();
}

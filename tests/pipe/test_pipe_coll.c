/* The pipeline executor across processes over ff_coll (the transport of
 * ff_pipe_transport_coll: send and receive inside ff_coll_group_start / end, the sums through
 * ff_coll_all_reduce): each rank a forked process with its communicator, its stage model and its
 * executor; the results go through files to the parent, which compares them with the
 * single-rank model as tests/pipe/test_pipe_exec.c does with threads (the same checks, the same
 * tolerances). Layouts: 1F1B at PP 2 and interleaved (v = 2) at PP 4 with tied embeddings over
 * 8 layers, GPipe at PP 2 over 5 layers with a value head (the sends posted: ff_coll_send_post).
 * Also: rank 1 killed in the middle of a 1F1B step; rank 0's run fails promptly naming it. */
#include "fuseflow/safetensors.h"
#include "tests/coll/coll_test.h"
#include "tests/pipe/pipe_test_util.h"

enum { NMICRO = 8, MAXR = 8 };

typedef struct layout {
    const char *name;
    ff_model_config cfg;
    ff_pipe_config pc;
    char dir[FF_PATH_MAX];
} layout;

static void path_of(char *out, const layout *l, int rank, const char *what) {
    snprintf(out, FF_PATH_MAX, "%s/rank%d_%s", l->dir, rank, what);
}

/* What a rank's result holds beyond its tensor sets, as one file of raw numbers. */
static int save_raw(const char *path, const pt_result *r, int64_t N) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const float *arr[6] = {r->lp, r->ent, r->val, r->ilp, r->ient, r->ival};
    bool ok = true;
    for (int i = 0; i < 6; i++) ok = ok && fwrite(arr[i], sizeof(float), (size_t)N, f) == (size_t)N;
    ok = ok && fwrite(r->loss, sizeof r->loss, 1, f) == 1 && fwrite(r->norm, sizeof r->norm, 1, f) == 1;
    ok = ok && fwrite(r->stats, sizeof r->stats, 1, f) == 1 && fwrite(&r->sim_bubble, sizeof(double), 1, f) == 1;
    ok = ok && fwrite(&r->formula, sizeof(double), 1, f) == 1 && fwrite(&r->n_instr, sizeof(int64_t), 1, f) == 1;
    ok = ok && fwrite(r->t_start, sizeof(double), (size_t)r->n_instr, f) == (size_t)r->n_instr;
    ok = ok && fwrite(r->t_end, sizeof(double), (size_t)r->n_instr, f) == (size_t)r->n_instr;
    ok = ok && fwrite(r->in_flight, sizeof r->in_flight, 1, f) == 1 && fwrite(&r->n_chunks, sizeof r->n_chunks, 1, f) == 1;
    ok = ok && fwrite(r->workspace, sizeof r->workspace, 1, f) == 1;
    ok = ok && fwrite(&r->tied_n, sizeof(int64_t), 1, f) == 1;
    if (r->tied_n > 0) ok = ok && fwrite(r->tied, sizeof(float), (size_t)r->tied_n, f) == (size_t)r->tied_n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static void load_raw(const char *path, pt_result *r, int64_t N) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    float *arr[6] = {r->lp, r->ent, r->val, r->ilp, r->ient, r->ival};
    bool ok = true;
    for (int i = 0; i < 6; i++) ok = ok && fread(arr[i], sizeof(float), (size_t)N, f) == (size_t)N;
    ok = ok && fread(r->loss, sizeof r->loss, 1, f) == 1 && fread(r->norm, sizeof r->norm, 1, f) == 1;
    ok = ok && fread(r->stats, sizeof r->stats, 1, f) == 1 && fread(&r->sim_bubble, sizeof(double), 1, f) == 1;
    ok = ok && fread(&r->formula, sizeof(double), 1, f) == 1 && fread(&r->n_instr, sizeof(int64_t), 1, f) == 1;
    REQUIRE(ok && r->n_instr > 0 && r->n_instr < (1 << 24));
    REQUIRE((r->t_start = malloc(sizeof(double) * (size_t)r->n_instr)) && (r->t_end = malloc(sizeof(double) * (size_t)r->n_instr)));
    ok = fread(r->t_start, sizeof(double), (size_t)r->n_instr, f) == (size_t)r->n_instr;
    ok = ok && fread(r->t_end, sizeof(double), (size_t)r->n_instr, f) == (size_t)r->n_instr;
    ok = ok && fread(r->in_flight, sizeof r->in_flight, 1, f) == 1 && fread(&r->n_chunks, sizeof r->n_chunks, 1, f) == 1;
    ok = ok && fread(r->workspace, sizeof r->workspace, 1, f) == 1;
    ok = ok && fread(&r->tied_n, sizeof(int64_t), 1, f) == 1;
    REQUIRE(ok && r->tied_n >= 0);
    if (r->tied_n > 0) {
        REQUIRE((r->tied = malloc(sizeof(float) * (size_t)r->tied_n)));
        REQUIRE(fread(r->tied, sizeof(float), (size_t)r->tied_n, f) == (size_t)r->tied_n);
    }
    fclose(f);
}

static void inputs(const layout *l, ff_tensor_set **w, pt_batch *g) {
    *w = ff_tensor_set_new();
    REQUIRE(*w && ff_model_init_weights(&l->cfg, 5, 0.2, *w) == 0);
    pt_batch_make(g, NMICRO, l->cfg.vocab_size, 12, 0, 17);
}

static int pipe_rank(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg) {
    (void)nranks, (void)id;
    const layout *l = arg;
    ff_tensor_set *w;
    pt_batch g;
    inputs(l, &w, &g);
    ff_pipe_transport t;
    ff_pipe_transport_coll(comm, &t);
    pt_result r;
    pt_rank(&l->pc, &l->cfg, w, &g, &t, "cpu:1", NULL, NULL, &r);
    char p[FF_PATH_MAX];
    int rc = 0;
    path_of(p, l, rank, "grads.safetensors");
    rc |= ff_safetensors_save(p, r.grads, FF_DTYPE_F32, NULL);
    path_of(p, l, rank, "after.safetensors");
    rc |= ff_safetensors_save(p, r.after, FF_DTYPE_F32, NULL);
    path_of(p, l, rank, "optim.safetensors");
    rc |= ff_safetensors_save(p, r.optim, FF_DTYPE_F32, NULL);
    path_of(p, l, rank, "raw");
    rc |= save_raw(p, &r, g.off[g.n]);
    if (rc) fprintf(stderr, "rank %d: saving results: %s\n", rank, ff_error_message());
    pt_result_free(&r);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
    return rc;
}

static void run_layout(layout *l) {
    snprintf(l->dir, sizeof l->dir, "/tmp/ff_pipe_coll.XXXXXX");
    REQUIRE(mkdtemp(l->dir));
    const int p = l->pc.pp;
    run_opts ro = default_run();
    ro.watchdog_s = 120;
    int failed = run_ranks(p, &ro, pipe_rank, l);
    CHECK_EQ_INT(failed, 0);
    ff_tensor_set *w;
    pt_batch g;
    inputs(l, &w, &g); /* the reference after the fork: no threads of this process meet fork */
    pt_result ref, res[MAXR];
    pt_reference(&l->cfg, w, &g, &ref);
    char path[FF_PATH_MAX];
    for (int r = 0; r < p && !failed; r++) {
        pt_result_alloc(&res[r], g.off[g.n]);
        path_of(path, l, r, "grads.safetensors");
        res[r].grads = load_set(path);
        path_of(path, l, r, "after.safetensors");
        res[r].after = load_set(path);
        path_of(path, l, r, "optim.safetensors");
        res[r].optim = load_set(path);
        path_of(path, l, r, "raw");
        load_raw(path, &res[r], g.off[g.n]);
    }
    if (!failed) pt_compare(l->name, &l->cfg, &l->pc, &g, res, &ref, 1);
    for (int r = 0; r < p && !failed; r++) {
        const char *what[] = {"grads.safetensors", "after.safetensors", "optim.safetensors", "raw"};
        for (int k = 0; k < 4; k++) {
            path_of(path, l, r, what[k]);
            unlink(path);
        }
        pt_result_free(&res[r]);
    }
    rmdir(l->dir);
    pt_result_free(&ref);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
}

/* ---- a peer killed in the middle of a step ------------------------------------------------ */

/* Rank 1's transport: ff_coll's, but the process dies at its third call (the steady state:
 * rank 0 has posted sends to it and waits for its gradients). */
static ff_pipe_transport g_inner;
static int g_calls;

static int dying_call(void *ctx, const ff_pipe_xfer *x, int n) {
    if (++g_calls == 3) kill(getpid(), SIGKILL);
    return g_inner.call(ctx, x, n);
}

static int killed_rank(ff_coll_comm *comm, int rank, int nranks, const ff_coll_id *id, void *arg) {
    (void)nranks, (void)id, (void)arg;
    int fails = 0;
    const ff_model_config cfg = tiny_config(64, 32, 48, 4, 4, 2, false, true, true);
    layout l = {.cfg = cfg, .pc = {.pp = 2, .micro = NMICRO, .kind = FF_PIPE_1F1B, .layers = 4}};
    ff_tensor_set *w;
    pt_batch g;
    inputs(&l, &w, &g);
    ff_pipe_schedule s;
    REQUIRE(ff_pipe_generate(&l.pc, &s) == 0);
    ff_pipe_transport_coll(comm, &g_inner);
    ff_pipe_transport t = g_inner;
    if (rank == 1) t.call = dying_call;
    ff_model_comm nc;
    ff_pipe_model_comm(&t, &nc);
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_stage st;
    REQUIRE(ff_pipe_stage_layers(&s, 0, rank, first, count, &st) == 0);
    st.comm = &nc;
    ff_backend *be = ff_backend_new("cpu:1");
    ff_model *m = ff_model_new_opts(be, &cfg, w, &(ff_model_opts){.stage = &st});
    ff_adamw_config ac;
    pt_adamw(&ac);
    ff_optimizer *opt = m ? ff_optimizer_new(m, &ac) : NULL;
    REQUIRE(opt);
    ff_pipe_exec_model em = {.model = m, .opt = opt, .temperature = PT_TEMP, .logprobs = true, .entropy = true, .values = cfg.value_head,
                             .loss = pt_loss, .loss_ctx = &g};
    ff_pipe_exec *e = ff_pipe_exec_new(&s, rank, &t, &em);
    REQUIRE(e);
    ff_pipe_exec_stats x;
    const int64_t t0 = ff_now_ns();
    RCHECK(ff_pipe_exec_run(e, &(ff_pipe_run){.micro = {g.b}}, &x) == -1, "the run succeeded without rank 1");
    const double ms = (double)(ff_now_ns() - t0) / 1e6;
    printf("rank 1 killed in its third call: rank 0 failed after %.1f ms: %s\n", ms, ff_error_message());
    CHECK_STR_CONTAINS(ff_error_message(), "pipeline executor, rank 0");
    CHECK_STR_CONTAINS(ff_error_message(), "rank 1 died");
    RCHECK(ms < 10000, "it took %.0f ms (the timeout is 20 s)", ms);
    ff_coll_comm_abort(comm, "rank 1 died"); /* as the host does */
    ff_pipe_exec_destroy(&e);
    ff_optimizer_destroy(&opt);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    ff_pipe_schedule_clear(&s);
    pt_batch_free(&g);
    ff_tensor_set_destroy(&w);
    return fails;
}

int main(void) {
    layout ls[] = {
        {.name = "coll 8 layers tied pp2 1f1b", .cfg = tiny_config(64, 32, 48, 8, 4, 2, true, false, false),
         .pc = {.pp = 2, .kind = FF_PIPE_1F1B}},
        {.name = "coll 8 layers tied pp4 interleaved v2", .cfg = tiny_config(64, 32, 48, 8, 4, 2, true, false, false),
         .pc = {.pp = 4, .vpp = 2, .kind = FF_PIPE_INTERLEAVED}},
        {.name = "coll 5 layers pp2 gpipe", .cfg = tiny_config(64, 32, 48, 5, 4, 2, false, true, true),
         .pc = {.pp = 2, .kind = FF_PIPE_GPIPE}},
    };
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        ls[i].pc.micro = NMICRO;
        ls[i].pc.layers = ls[i].cfg.num_hidden_layers;
        run_layout(&ls[i]);
    }
    pt_print_errors("over ff_coll");
    run_opts rk = default_run();
    rk.comm_opt.timeout_s = 20;
    rk.expect_killed_rank = 1;
    CHECK_EQ_INT(run_ranks(2, &rk, killed_rank, NULL), 0);
    if (ff_test_failures) fprintf(stderr, "%d check(s) failed\n", ff_test_failures);
    return ff_test_failures ? 1 : 0;
}

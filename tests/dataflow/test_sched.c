/* The scheduling view, driven by a fake executor (no workers): tasks are dispatched as the
 * scheduler offers them and completed in a random order. The executor keeps its own record
 * of which columns exist, and checks at each dispatch that the task's inputs exist for every
 * sample it covers, that a group task sees its whole group, that a barrier sees the whole
 * batch, that every node covers every live sample exactly once, that the fused schedule
 * overlaps stages and the serial one does not, and that dynamic sampling fills the batch with
 * informative groups only. */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/graph.h"
#include "fuseflow/registry.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

typedef struct fake {
    const ff_graph *g;
    ff_sched *s;
    ff_rng rng;
    int64_t n, gsize;
    uint64_t cols[4096];      /* the executor's view: columns present per sample */
    int covered[64][4096];    /* times node m ran on sample i */
    int64_t done_tasks[64];   /* tasks of node m completed */
    int64_t total_tasks[64];
    const ff_sched_task *flight[4096];
    int n_flight;
    int overlap;              /* tasks dispatched while a generate task was still running */
    int serial_violations;    /* tasks dispatched before an earlier node finished */
    int max_micro;            /* largest micro-batch seen */
    float score[4096];        /* fake rewards, for filters */
    int64_t groups_added;
} fake;

static uint64_t need_mask(const ff_node *n) {
    uint64_t m = 0;
    for (int s = 0; s < FF_SLOT_COUNT; s++)
        if (n->in[s] >= 0) m |= 1ull << n->in[s];
    return m;
}

static uint64_t out_mask(const ff_node *n) {
    uint64_t m = 0;
    for (int s = 0; s < FF_SLOT_COUNT; s++)
        if (n->out[s] >= 0) m |= 1ull << n->out[s];
    return m;
}

static void init_samples(fake *f, int64_t from, int64_t to) {
    uint64_t data = 0;
    for (size_t c = 0; c < ff_graph_n_columns(f->g); c++)
        if (ff_graph_column(f->g, c)->from_data) data |= 1ull << c;
    for (int64_t i = from; i < to; i++) {
        f->cols[i] = data;
        /* a third of the groups answer all alike (no signal for GRPO) */
        int64_t g = i / f->gsize;
        f->score[i] = g % 3 == 0 ? 1.0f : (float)ff_rng_below(&f->rng, 2);
    }
}

static bool node_finished_for_all(fake *f, int m) {
    for (int64_t i = 0; i < ff_sched_n_samples(f->s); i++)
        if (ff_sched_sample_alive(f->s, i) && !f->covered[m][i]) return false;
    return true;
}

static void on_dispatch(fake *f, const ff_sched_task *t, ff_schedule mode) {
    const ff_node *n = ff_graph_node(f->g, (size_t)t->node);
    uint64_t need = need_mask(n);
    REQUIRE(t->n_samples > 0 || n->gran == FF_GRAN_BATCH);
    for (int64_t k = 0; k < t->n_samples; k++) {
        int64_t i = t->samples[k];
        CHECK(ff_sched_sample_alive(f->s, i));
        if ((f->cols[i] & need) != need) {
            fprintf(stderr, "node %s dispatched for sample %lld without its inputs\n", n->name, (long long)i);
            CHECK(0);
        }
        for (int a = 0; a < n->n_after; a++) CHECK(f->covered[n->after[a]][i]);
        if (k) CHECK(t->samples[k] > t->samples[k - 1]);
    }
    if (n->gran == FF_GRAN_GROUP) {
        int64_t live = 0;
        for (int64_t i = t->group * f->gsize; i < (t->group + 1) * f->gsize; i++) live += ff_sched_sample_alive(f->s, i);
        CHECK_EQ_INT(t->n_samples, live);
        for (int64_t k = 0; k < t->n_samples; k++) CHECK_EQ_INT(t->samples[k] / f->gsize, t->group);
    }
    if (t->gran == FF_GRAN_BATCH) {
        CHECK(n->gran == FF_GRAN_BATCH || n->op == FF_OP_TRAIN);
        int64_t live = 0;
        for (int64_t i = 0; i < ff_sched_n_samples(f->s); i++) live += ff_sched_sample_alive(f->s, i);
        CHECK_EQ_INT(t->n_samples, live);
    }
    if (t->gran == FF_GRAN_MICRO_BATCH) {
        CHECK(t->n_samples <= n->micro_batch_size);
        if (t->n_samples > f->max_micro) f->max_micro = (int)t->n_samples;
    }
    /* is generation still running? */
    for (int k = 0; k < f->n_flight; k++)
        if (ff_graph_node(f->g, (size_t)f->flight[k]->node)->op == FF_OP_GENERATE && n->op != FF_OP_GENERATE) f->overlap++;
    if (mode == FF_SCHED_SERIAL) {
        const int *order = ff_graph_order(f->g);
        for (int k = 0; order[k] != t->node; k++)
            if (!node_finished_for_all(f, order[k])) f->serial_violations++;
    }
    f->total_tasks[t->node]++;
}

static void on_complete(fake *f, const ff_sched_task *t) {
    const ff_node *n = ff_graph_node(f->g, (size_t)t->node);
    for (int64_t k = 0; k < t->n_samples; k++) {
        int64_t i = t->samples[k];
        if (!ff_sched_sample_alive(f->s, i)) continue;
        f->cols[i] |= out_mask(n);
        f->covered[t->node][i]++;
    }
    f->done_tasks[t->node]++;
}

/* Run one iteration; complete tasks in a random order. Returns 0 or -1 (scheduler error). */
static int run(fake *f, ff_schedule mode, int64_t max_groups) {
    for (;;) {
        const ff_sched_task *t;
        int rc;
        /* dynamic sampling: draw more prompts as soon as the scheduler wants them */
        int64_t want = ff_sched_groups_wanted(f->s);
        if (want > 0) {
            if (f->groups_added + want > max_groups) {
                ff_sched_source_exhausted(f->s);
            } else {
                int64_t first = ff_sched_add_groups(f->s, want);
                REQUIRE(first >= 0);
                init_samples(f, first * f->gsize, (first + want) * f->gsize);
                f->groups_added += want;
            }
        }
        while ((rc = ff_sched_next(f->s, &t)) == 1) {
            on_dispatch(f, t, mode);
            REQUIRE(f->n_flight < 4096);
            f->flight[f->n_flight++] = t;
        }
        if (rc < 0) return -1;
        if (ff_sched_finished(f->s)) {
            CHECK_EQ_INT(f->n_flight, 0);
            return 0;
        }
        REQUIRE(f->n_flight > 0);
        int k = (int)ff_rng_below(&f->rng, (uint64_t)f->n_flight);
        const ff_sched_task *done = f->flight[k];
        f->flight[k] = f->flight[--f->n_flight];
        on_complete(f, done);
        const ff_node *n = ff_graph_node(f->g, (size_t)done->node);
        if (n->op == FF_OP_FILTER) {
            float sc[64];
            for (int64_t j = 0; j < done->n_samples; j++) sc[j] = f->score[done->samples[j]];
            REQUIRE(ff_sched_complete_filter(f->s, done->id, ff_node_filter_keep(n, sc, (size_t)done->n_samples)) == 0);
        } else {
            REQUIRE(ff_sched_complete(f->s, done->id) == 0);
        }
    }
}

static bool run_ok_limit(fake *f, ff_schedule mode, int64_t max_groups) {
    if (run(f, mode, max_groups) == 0) return true;
    fprintf(stderr, "%s\n", ff_error_message());
    return false;
}

static bool run_ok(fake *f, ff_schedule mode) { return run_ok_limit(f, mode, 0); }

static ff_run_config *load_example(ff_registry *reg, const char *name, int n_over, char **over) {
    const char *src = getenv("FF_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/%s.yaml", src ? src : ".", name);
    ff_run_config *run = ff_run_config_load(path, n_over, over, reg);
    if (!run) fprintf(stderr, "%s\n", ff_error_message());
    REQUIRE(run);
    return run;
}

static fake *fake_new(ff_run_config *run, int64_t n_groups, ff_schedule mode, uint64_t seed) {
    fake *f = calloc(1, sizeof *f);
    REQUIRE(f);
    f->g = run->graph;
    f->gsize = ff_graph_group_size(run->graph);
    ff_rng_seed(&f->rng, seed);
    f->s = ff_sched_new(run->graph, n_groups, f->gsize, mode);
    REQUIRE(f->s);
    init_samples(f, 0, n_groups * f->gsize);
    return f;
}

static void fake_destroy(fake *f) {
    ff_sched_destroy(&f->s);
    free(f);
}

/* Every node ran exactly once on every live sample. */
static void check_coverage(fake *f) {
    for (size_t m = 0; m < ff_graph_n_nodes(f->g); m++)
        for (int64_t i = 0; i < ff_sched_n_samples(f->s); i++)
            if (ff_sched_sample_alive(f->s, i) && f->covered[m][i] != 1) {
                fprintf(stderr, "node %s ran %d times on sample %lld\n", ff_graph_node(f->g, m)->name, f->covered[m][i], (long long)i);
                CHECK(0);
                return;
            }
}

static void test_fused_and_serial(ff_registry *reg) {
    static const char *examples[] = {"grpo", "ppo", "rloo", "reinforce_pp", "remax"};
    for (size_t e = 0; e < sizeof examples / sizeof *examples; e++) {
        ff_run_config *run = load_example(reg, examples[e], 0, NULL);
        int overlap[2] = {0, 0};
        for (int mode = 0; mode < 2; mode++) {
            fake *f = fake_new(run, 6, (ff_schedule)mode, 100 + e);
            REQUIRE(run_ok(f, mode));
            check_coverage(f);
            overlap[mode] = f->overlap;
            if (mode == FF_SCHED_SERIAL) CHECK_EQ_INT(f->serial_violations, 0);
            /* batch nodes ran once; sample nodes once per sample */
            for (size_t m = 0; m < ff_graph_n_nodes(run->graph); m++) {
                const ff_node *n = ff_graph_node(run->graph, m);
                if (n->gran == FF_GRAN_BATCH || n->op == FF_OP_TRAIN) CHECK_EQ_INT(f->total_tasks[m], 1);
                if (n->gran == FF_GRAN_SAMPLE) CHECK_EQ_INT(f->total_tasks[m], 6 * f->gsize);
                if (n->gran == FF_GRAN_GROUP) CHECK_EQ_INT(f->total_tasks[m], 6);
            }
            fake_destroy(f);
        }
        /* fused: later stages start while generation still runs; serial: never */
        if (overlap[0] == 0) fprintf(stderr, "%s: no overlap in the fused schedule\n", examples[e]);
        CHECK(overlap[0] > 0);
        CHECK_EQ_INT(overlap[1], 0);
        ff_run_config_destroy(&run);
    }
}

static void test_micro_batches(ff_registry *reg) {
    char *over[] = {"graph.ref_logprob.micro_batch_size=5"};
    ff_run_config *run = load_example(reg, "grpo", 1, over);
    fake *f = fake_new(run, 4, FF_SCHED_FUSED, 9); /* 32 samples: 6 x 5 + a partial 2 */
    REQUIRE(run_ok(f, FF_SCHED_FUSED));
    check_coverage(f);
    int ref = ff_graph_find_node(run->graph, "ref_logprob");
    CHECK_EQ_INT(f->max_micro, 5);
    CHECK(f->total_tasks[ref] >= 7);
    fake_destroy(f);
    ff_run_config_destroy(&run);
}

/* DAPO: groups whose scores are all equal are dropped; more are drawn until the batch holds
 * train_batch_size informative groups. */
static void test_dynamic_sampling(ff_registry *reg) {
    ff_run_config *run = load_example(reg, "dapo", 0, NULL);
    int64_t target = run->data.train_batch_size;
    fake *f = fake_new(run, target, FF_SCHED_FUSED, 5);
    REQUIRE(run_ok_limit(f, FF_SCHED_FUSED, 10 * target));
    check_coverage(f);
    CHECK(f->groups_added > 0);
    int tr = ff_graph_find_node(run->graph, "train_actor");
    int64_t live = 0;
    for (int64_t i = 0; i < ff_sched_n_samples(f->s); i++) {
        if (!ff_sched_sample_alive(f->s, i)) {
            CHECK_EQ_INT(f->covered[tr][i], 0); /* dropped samples never train */
            continue;
        }
        live++;
        CHECK(i / f->gsize % 3 != 0); /* the uninformative groups are gone */
    }
    CHECK_EQ_INT(live, target * f->gsize);
    fake_destroy(f);

    /* the same under the serial schedule: generate, filter, generate more, ... */
    f = fake_new(run, target, FF_SCHED_SERIAL, 8);
    REQUIRE(run_ok_limit(f, FF_SCHED_SERIAL, 10 * target));
    check_coverage(f);
    live = 0;
    for (int64_t i = 0; i < ff_sched_n_samples(f->s); i++) live += ff_sched_sample_alive(f->s, i);
    CHECK_EQ_INT(live, target * f->gsize);
    CHECK_EQ_INT(f->total_tasks[tr], 1);
    fake_destroy(f);

    /* prompts run out: the barrier runs with the groups kept so far */
    f = fake_new(run, target, FF_SCHED_FUSED, 6);
    REQUIRE(run_ok_limit(f, FF_SCHED_FUSED, 0));
    int64_t kept = 0;
    for (int64_t i = 0; i < ff_sched_n_samples(f->s); i++) kept += ff_sched_sample_alive(f->s, i);
    CHECK(kept < target * f->gsize && kept > 0);
    CHECK_EQ_INT(f->total_tasks[tr], 1);
    fake_destroy(f);

    /* an executor that neither adds groups nor says the source is exhausted gets an error */
    f = fake_new(run, target, FF_SCHED_FUSED, 7);
    const ff_sched_task *t;
    int rc;
    for (;;) {
        while ((rc = ff_sched_next(f->s, &t)) == 1) f->flight[f->n_flight++] = t;
        if (rc < 0 || !f->n_flight) break;
        const ff_sched_task *d = f->flight[--f->n_flight];
        const ff_node *n = ff_graph_node(f->g, (size_t)d->node);
        if (n->op == FF_OP_FILTER) {
            float sc[64];
            for (int64_t j = 0; j < d->n_samples; j++) sc[j] = f->score[d->samples[j]];
            ff_sched_complete_filter(f->s, d->id, ff_node_filter_keep(n, sc, (size_t)d->n_samples));
        } else {
            ff_sched_complete(f->s, d->id);
        }
    }
    CHECK_EQ_INT(rc, -1);
    CHECK_STR_CONTAINS(ff_error_message(), "more groups");
    CHECK_EQ_INT(ff_sched_complete(f->s, 123456), -1);
    CHECK_STR_CONTAINS(ff_error_message(), "unknown or finished task");
    fake_destroy(f);
    ff_run_config_destroy(&run);
}

int main(void) {
    ff_registry *reg = ff_registry_new();
    REQUIRE(reg);
    test_fused_and_serial(reg);
    test_micro_batches(reg);
    test_dynamic_sampling(reg);
    ff_registry_destroy(&reg);
    TEST_MAIN_END();
}

/* Layout search: the fast search (values hoisted out of the inner loops, groups from the rank
 * factors) finds exactly what evaluating every candidate from scratch finds, ranks by iteration
 * time, keeps only layouts that fit, and says why when nothing can run. */
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "tests/test_util.h"

static void same_as_naive(const char *model, int64_t gpus, int64_t seq, int64_t batch, bool ckpt, double hbm) {
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset(model, &in.model) == 0);
    in.cluster.gpus = gpus;
    if (hbm > 0) in.cluster.hbm_bytes = hbm;
    in.workload.seq = seq;
    ff_plan_search_opts o;
    memset(&o, 0, sizeof o);
    o.global_batch = batch;
    o.try_checkpoint = ckpt;
    o.top = 25;
    ff_plan_search_result fast, naive;
    REQUIRE(ff_plan_search(&in, &o, &fast) == 0);
    o.naive = true;
    REQUIRE(ff_plan_search(&in, &o, &naive) == 0);
    CHECK(fast.evaluated > 50);
    CHECK_EQ_INT(fast.evaluated, naive.evaluated);
    CHECK_EQ_INT(fast.fitting, naive.fitting);
    CHECK_EQ_INT(fast.n_best, naive.n_best);
    CHECK(fast.n_best > 0);
    for (size_t i = 0; i < fast.n_best && i < naive.n_best; i++) {
        const ff_plan_candidate *a = &fast.best[i], *b = &naive.best[i];
        CHECK_CLOSE(a->iteration_s, b->iteration_s, 0, 1e-12);
        CHECK_CLOSE(a->total_bytes, b->total_bytes, 0, 1e-12);
        CHECK(a->layout.tp == b->layout.tp && a->layout.cp == b->layout.cp && a->layout.pp == b->layout.pp && a->layout.ep == b->layout.ep);
        CHECK(a->layout.vpp == b->layout.vpp && a->layout.zero == b->layout.zero && a->layout.checkpoint == b->layout.checkpoint);
        if (i) CHECK(fast.best[i - 1].iteration_s <= a->iteration_s);
        /* each one, evaluated on its own, fits and takes that long */
        ff_plan_input c = in;
        c.layout = a->layout;
        c.workload.micro_batch = a->micro_batch;
        c.workload.micro_batches = a->micro_batches;
        ff_plan_result r;
        REQUIRE(ff_plan_evaluate(&c, &r) == 0);
        CHECK(r.memory.fits);
        CHECK_CLOSE(r.time.iteration_s, a->iteration_s, 0, 1e-12);
        CHECK_EQ_INT(r.global_batch, batch);
        ff_plan_result_clear(&r);
    }
    ff_plan_search_result_clear(&fast);
    ff_plan_search_result_clear(&naive);
}

int main(void) {
    same_as_naive("llama3-8b", 64, 8192, 256, false, 0);
    same_as_naive("llama3-70b", 256, 8192, 512, true, 0);
    same_as_naive("mixtral-8x7b", 128, 4096, 512, true, 0);

    /* the best 70B layout on 256 H100s keeps TP inside the server */
    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("llama3-70b", &in.model) == 0);
    in.cluster.gpus = 256, in.workload.seq = 8192;
    ff_plan_search_opts o;
    memset(&o, 0, sizeof o);
    o.global_batch = 512;
    ff_plan_search_result r;
    REQUIRE(ff_plan_search(&in, &o, &r) == 0);
    REQUIRE(r.n_best > 0);
    CHECK(r.best[0].layout.tp <= 8);
    CHECK(r.n_best <= 10);
    char *json = ff_plan_search_json(&in, &r);
    REQUIRE(json);
    CHECK_STR_CONTAINS(json, "\"candidates\"");
    free(json);
    ff_plan_search_result_clear(&r);

    /* nothing fits in 1 GB: an empty ranking, not an error */
    in.cluster.hbm_bytes = 1e9;
    REQUIRE(ff_plan_search(&in, &o, &r) == 0);
    CHECK_EQ_INT(r.n_best, 0);
    CHECK_EQ_INT(r.fitting, 0);
    CHECK(r.evaluated > 0);
    ff_plan_search_result_clear(&r);

    /* bad input */
    o.global_batch = 0;
    CHECK(ff_plan_search(&in, &o, &r) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "--global-batch");
    o.global_batch = 512;
    in.model.layers = 0;
    CHECK(ff_plan_search(&in, &o, &r) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "search");
    TEST_MAIN_END();
}

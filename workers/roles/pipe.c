/* Pipeline groups of the roles: which layers a rank's stage holds (the planner's placement,
 * as ff_pipe_generate places them), the check that a trainer's or a scoring call's model
 * matches the pipeline it is given, and the schedule of a step.
 *
 * Not here: running a schedule (fuseflow/pipe_exec.h), the trainer's and the scoring's use of
 * it (trainer.c, score.c), making the transport (the host: the RL worker over ff_coll). */
#include <stdlib.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/roles/roles_internal.h"

bool rl_pipe_on(const ff_roles_pipe *p) { return p && p->transport && p->transport->size > 1; }

int32_t rl_pipe_vpp(const ff_roles_pipe *p) { return p->vpp > 0 ? p->vpp : 1; }

const ff_rl_sample *rl_pipe_pad(void) {
    static const int32_t token = 0;
    static const ff_rl_sample pad = {.prompt = &token, .prompt_len = 1};
    return &pad;
}

int ff_roles_pipe_stage(const ff_model_config *cfg, const ff_roles_pipe *p, int32_t rank, int32_t *first, int32_t *count,
                        ff_model_comm *norm, ff_model_stage *out) {
    const char *w = "pipeline stage";
    if (!rl_pipe_on(p))
        return ff_error_set(w, "give ff_roles_pipe.transport of a pipeline group of 2 or more ranks, or build a whole model",
                            "no pipeline (no transport, or a group of one rank)");
    const int32_t pp = p->transport->size, v = rl_pipe_vpp(p);
    if ((unsigned)p->kind >= FF_PIPE_CUSTOM)
        return ff_error_set(w, "use FF_PIPE_GPIPE, FF_PIPE_1F1B or FF_PIPE_INTERLEAVED", "unknown schedule kind %d", (int)p->kind);
    if (p->kind == FF_PIPE_INTERLEAVED && v < 2)
        return ff_error_set(w, "give vpp >= 2 with the interleaved schedule (with one chunk it is 1f1b)", "interleaved with vpp %d", v);
    if (p->kind != FF_PIPE_INTERLEAVED && v != 1)
        return ff_error_set(w, "chunks per stage need FF_PIPE_INTERLEAVED; or set vpp 1", "vpp %d with the %s schedule", v,
                            ff_pipe_kind_name(p->kind));
    if (v > FF_MODEL_MAX_CHUNKS)
        return ff_error_set(w, NULL, "vpp %d: a stage holds at most %d chunks", v, FF_MODEL_MAX_CHUNKS);
    if (rank < 0 || rank >= pp) return ff_error_set(w, NULL, "rank %d of a pipeline of %d ranks", rank, pp);
    const int64_t L = cfg->num_hidden_layers, S = (int64_t)pp * v;
    if (L < S)
        return ff_error_set(w, "use fewer stages or chunks per stage (every virtual stage needs a layer)",
                            "%lld layers over %lld virtual stages (pp %d x vpp %d)", (long long)L, (long long)S, pp, v);
    int64_t *per = ff_malloc(sizeof(int64_t) * (size_t)S);
    if (!per) return -1;
    if (ff_pipe_place_layers(L, pp, v, 0, 0, per)) {
        free(per);
        return ff_error_wrap("%s, rank %d", w, rank);
    }
    int32_t n = 0;
    int64_t layer = 0;
    for (int64_t k = 0; k < S; k++) { /* virtual stage k on rank k mod pp, its chunk k / pp */
        if (k % pp == rank) {
            first[n] = (int32_t)layer;
            count[n] = (int32_t)per[k];
            n++;
        }
        layer += per[k];
    }
    free(per);
    ff_pipe_model_comm(p->transport, norm);
    *out = (ff_model_stage){.n_chunks = n, .first_layer = first, .n_layers = count, .comm = norm};
    return 0;
}

int rl_pipe_check(const ff_model *m, const ff_roles_pipe *p, const char *where) {
    const bool whole = ff_model_is_whole(m);
    ff_model_chunk_info ci;
    ff_model_chunk_of(m, 0, &ci);
    if (!rl_pipe_on(p)) {
        if (!whole)
            return ff_error_set(where, "give the stage's pipeline (ff_roles_pipe: transport, kind, vpp), or a whole model",
                                "the model is a pipeline stage (%d chunk(s), the first from layer %d) and no pipeline is given",
                                ff_model_n_chunks(m), ci.first_layer);
        return 0;
    }
    if (whole)
        return ff_error_set(where, "leave the pipeline zero for a whole model, or build the stage with ff_roles_pipe_stage",
                            "a pipeline of %d ranks is given for a whole model", p->transport->size);
    if (!p->transport->call || !p->transport->all_reduce_sum_f64)
        return ff_error_set(where, "give a transport with call and all_reduce_sum_f64", "the pipeline's transport is incomplete");
    int32_t first[FF_MODEL_MAX_CHUNKS], count[FF_MODEL_MAX_CHUNKS];
    ff_model_comm norm;
    ff_model_stage st;
    const int32_t rank = p->transport->rank;
    if (ff_roles_pipe_stage(ff_model_config_of(m), p, rank, first, count, &norm, &st)) return ff_error_wrap("%s", where);
    const char *hint = "build the stage with ff_roles_pipe_stage of the same pipeline and rank";
    if (ff_model_n_chunks(m) != st.n_chunks)
        return ff_error_set(where, hint, "the stage has %d chunk(s); rank %d of the pipeline (pp %d, vpp %d) holds %d",
                            ff_model_n_chunks(m), rank, p->transport->size, rl_pipe_vpp(p), st.n_chunks);
    for (int32_t c = 0; c < st.n_chunks; c++) {
        ff_model_chunk_of(m, c, &ci);
        if (ci.first_layer != first[c] || ci.n_layers != count[c])
            return ff_error_set(where, hint, "chunk %d holds layers [%d, %d); rank %d of the pipeline places [%d, %d) there", c,
                                ci.first_layer, ci.first_layer + ci.n_layers, rank, first[c], first[c] + count[c]);
    }
    return 0;
}

int rl_pipe_schedule(const ff_model *m, const ff_roles_pipe *p, int32_t n_micro, bool forward_only, ff_pipe_schedule *out) {
    ff_pipe_config c = {.pp = p->transport->size, .vpp = rl_pipe_vpp(p), .micro = n_micro, .kind = p->kind,
                        .forward_only = forward_only, .layers = ff_model_config_of(m)->num_hidden_layers};
    return ff_pipe_generate(&c, out);
}

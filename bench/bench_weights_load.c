/* bench_weights_load: what loading a frozen role's weights on demand costs here
 * (roles.<ref|reward>.weights: on_demand, docs/run.md "Weights on demand"): an inference model
 * of about --mb MB of fp32 weights (Llama-shaped: hidden 1024, intermediate 2816, vocabulary
 * 8192, as many layers as the size needs) keeps them in host memory (ff_model_params_to_host),
 * then --reps times loads them onto the backend (ff_model_params_load on a stream of its own,
 * as a worker's prefetch does) and gives them back (ff_model_release_params), which is the
 * round trip of one iteration. Each load allocates the backend buffer anew (on the CPU backend
 * fresh pages from the kernel, so their first-touch faults are in the figure, as in a run).
 *
 *   bench_weights_load [--mb 256] [--reps 5] [--backend cpu:1|cuda]
 *
 * The last line is the headline: seconds per GB of weights loaded (median over the reps) and
 * the rate, beside the one-time copy to host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/backend.h"
#include "fuseflow/error.h"
#include "fuseflow/model.h"
#include "fuseflow/util.h"
#include "bench_util.h"

enum { MAXREPS = 64 };

int main(int argc, char **argv) {
    int64_t mb = 256;
    int reps = 5;
    const char *backend = "cpu:1";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else {
            fprintf(stderr, "usage: bench_weights_load [--mb 256] [--reps 5] [--backend cpu:1|cuda]\n");
            return 2;
        }
    }
    if (mb < 1 || reps < 1 || reps > MAXREPS) {
        fprintf(stderr, "bench_weights_load: --mb >= 1, --reps in [1, %d]\n", MAXREPS);
        return 2;
    }
    ff_backend *be = ff_backend_new(backend);
    if (!be) {
        fprintf(stderr, "bench_weights_load: %s\n", ff_error_message());
        return 1;
    }
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = 8192, c.hidden_size = 1024, c.intermediate_size = 2816, c.num_attention_heads = 16, c.num_key_value_heads = 16;
    c.max_position_embeddings = 512, c.rope_theta = 10000.0, c.rms_norm_eps = 1e-5, c.bos_token_id = -1, c.pad_token_id = -1;
    const int64_t H = c.hidden_size, per_layer = 4 * H * H + 3 * H * c.intermediate_size + 2 * H, ends = 2 * H * c.vocab_size + H;
    const int64_t want = mb * 1000000 / 4;
    c.num_hidden_layers = (int)(want > ends + per_layer ? (want - ends + per_layer / 2) / per_layer : 1);
    ff_tensor_set *w = ff_tensor_set_new();
    ff_model *m = w && ff_model_init_weights(&c, 1, 0.02, w) == 0 ? ff_model_new_from(be, &c, &w, &(ff_model_opts){.inference = true}) : NULL;
    ff_stream *st = m ? ff_stream_new(be) : NULL;
    ff_offload_stats to;
    if (!st || ff_model_params_to_host(m, &to) != 0) {
        fprintf(stderr, "bench_weights_load: %s\n", ff_error_message());
        return 1;
    }
    const double gb = (double)ff_model_params_host_bytes(m) * 1e-9;
    double t[MAXREPS], rel[MAXREPS];
    for (int r = 0; r < reps; r++) {
        ff_offload_stats ls;
        if (ff_model_params_load(m, st, &ls) != 0) {
            fprintf(stderr, "bench_weights_load: %s\n", ff_error_message());
            return 1;
        }
        const double t0 = now_s();
        ff_model_release_params(m);
        rel[r] = now_s() - t0;
        t[r] = ls.seconds;
    }
    const double first = t[0], rmed = median(rel, reps), med = median(t, reps), best = t[0]; /* median sorts t */
    printf("bench_weights_load: backend %s, %d layers, %.3f GB of fp32 weights, %d loads\n", ff_backend_name(be), c.num_hidden_layers, gb,
           reps);
    printf("  to host once: %.4f s (%.3f s/GB)\n", to.seconds, to.seconds / gb);
    printf("  load: first %.4f s, median %.4f s, best %.4f s; release %.6f s\n", first, med, best, rmed);
    printf("weights_load: %.3f s/GB (%.2f GB/s) loading on demand, %.3f s/GB to host once\n", med / gb, gb / med, to.seconds / gb);
    ff_stream_destroy(&st);
    ff_model_destroy(&m);
    ff_backend_destroy(&be);
    return 0;
}

/* Helpers shared by the roles tests: a small random Llama model (fast enough for ASan), a
 * backend, and samples built from arrays. */
#ifndef FF_TEST_ROLES_UTIL_H
#define FF_TEST_ROLES_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/model.h"
#include "fuseflow/roles.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

/* vocab 40, hidden 32, 2 layers, GQA 4/2: a few thousand parameters. */
static inline ff_model_config small_config(bool value_head, bool tied) {
    ff_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    c.vocab_size = 40;
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 64;
    c.rope_theta = 10000;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = tied;
    c.value_head = value_head;
    c.bos_token_id = -1;
    c.pad_token_id = -1;
    c.eos_token_ids[0] = 1;
    c.n_eos = 1;
    return c;
}

/* A model with seeded random weights; std 0.3 so that distributions are far from uniform. */
static inline ff_model *small_model(ff_backend *be, const ff_model_config *c, uint64_t seed) {
    ff_tensor_set *w = ff_tensor_set_new();
    REQUIRE(w);
    DIE_IF(ff_model_init_weights(c, seed, 0.3, w));
    ff_model *m = ff_model_new(be, c, w);
    DIE_IF(!m);
    ff_tensor_set_destroy(&w);
    return m;
}

static inline ff_backend *test_backend(void) {
    ff_backend *be = ff_backend_new("cpu:1");
    DIE_IF(!be);
    return be;
}

#endif

/* Critics and reward models from a policy checkpoint: the same network with a scalar value
 * head (score.weight [1, hidden]) and no LM head, as verl and OpenRLHF build a critic from
 * the SFT model.
 *
 * Not here: loading the folder (model/io) or training (trainer.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "workers/roles/roles_internal.h"

int ff_roles_add_value_head(ff_model_config *cfg, ff_tensor_set *w, double std, uint64_t seed) {
    if (!(std >= 0 && isfinite(std))) return ff_error_set("value head", NULL, "std %g must be >= 0", std);
    if (cfg->hidden_size < 1) return ff_error_set("value head", NULL, "hidden_size %d", cfg->hidden_size);
    cfg->value_head = true;
    ff_host_tensor *score = ff_tensor_set_find(w, "score.weight");
    if (!score) {
        int64_t shape[2] = {1, cfg->hidden_size};
        score = ff_tensor_set_add(w, "score.weight", 2, shape);
        if (!score) return ff_error_wrap("value head");
    } else if (ff_host_tensor_expect(score, 2, (int64_t[]){1, cfg->hidden_size}, "score.weight")) {
        return -1;
    }
    ff_rng r;
    ff_rng_seed(&r, seed);
    for (int32_t i = 0; i < cfg->hidden_size; i++) score->data[i] = (float)(std * ff_rng_normal(&r));
    /* an untied LM head is not part of a critic */
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->items[i].name, "lm_head.weight")) {
            free(w->items[i].name);
            free(w->items[i].data);
            memmove(&w->items[i], &w->items[i + 1], (w->n - i - 1) * sizeof w->items[0]);
            w->n--;
            break;
        }
    return 0;
}

/* AdamW for a model's flat parameter buffer: global grad-norm clipping, warmup + cosine
 * learning rate, decoupled weight decay on the 2-D weights only, state export/import for
 * checkpoints. The arithmetic follows torch.optim.AdamW and
 * torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6)). Under tensor
 * parallelism the update is elementwise on the rank's shard; the norm is the whole model's
 * (model/tp.c) and the state goes in and out as whole tensors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "model/model_internal.h"

struct ff_optimizer {
    ff_model *m;
    ff_adamw_config c;
    ff_buffer *mbuf, *vbuf; /* [n_params] each: exp_avg, exp_avg_sq */
    int64_t step;           /* updates done */
};

void ff_adamw_config_default(ff_adamw_config *c) {
    memset(c, 0, sizeof *c);
    c->lr = 1e-5;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->weight_decay = 0.01;
    c->max_grad_norm = 1.0;
}

double ff_adamw_lr_at(const ff_adamw_config *c, int64_t k) {
    if (k < 1) k = 1;
    if (c->warmup_steps > 0 && k <= c->warmup_steps) return c->lr * (double)k / (double)c->warmup_steps;
    if (c->total_steps <= c->warmup_steps) return c->lr;
    double progress = (double)(k - c->warmup_steps) / (double)(c->total_steps - c->warmup_steps);
    if (progress > 1.0) progress = 1.0;
    return c->lr * (c->min_lr_ratio + (1.0 - c->min_lr_ratio) * 0.5 * (1.0 + cos(M_PI * progress)));
}

static int check_config(const ff_adamw_config *c) {
    const char *w = "adamw";
    if (!(c->lr >= 0 && isfinite(c->lr))) return ff_error_set(w, NULL, "lr %g must be >= 0", c->lr);
    if (!(c->beta1 >= 0 && c->beta1 < 1)) return ff_error_set(w, NULL, "beta1 %g must be in [0, 1)", c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) return ff_error_set(w, NULL, "beta2 %g must be in [0, 1)", c->beta2);
    if (!(c->eps > 0)) return ff_error_set(w, NULL, "eps %g must be > 0", c->eps);
    if (!(c->weight_decay >= 0)) return ff_error_set(w, NULL, "weight_decay %g must be >= 0", c->weight_decay);
    if (c->warmup_steps < 0 || c->total_steps < 0)
        return ff_error_set(w, NULL, "warmup_steps and total_steps must be >= 0");
    if (!(c->min_lr_ratio >= 0 && c->min_lr_ratio <= 1))
        return ff_error_set(w, NULL, "min_lr_ratio %g must be in [0, 1]", c->min_lr_ratio);
    return 0;
}

ff_optimizer *ff_optimizer_new(ff_model *m, const ff_adamw_config *c) {
    if (m->inference) {
        ffm_inference_only("optimizer");
        return NULL;
    }
    if (check_config(c)) return NULL;
    ff_optimizer *o = ff_calloc(1, sizeof *o);
    if (!o) return NULL;
    o->m = m;
    o->c = *c;
    size_t bytes = (size_t)m->n_params * sizeof(float);
    o->mbuf = ff_buffer_new(m->be, bytes);
    o->vbuf = ff_buffer_new(m->be, bytes);
    if (!o->mbuf || !o->vbuf) {
        ff_optimizer_destroy(&o);
        return NULL;
    }
    return o;
}

void ff_optimizer_destroy(ff_optimizer **po) {
    if (!po || !*po) return;
    ff_buffer_destroy(&(*po)->mbuf);
    ff_buffer_destroy(&(*po)->vbuf);
    free(*po);
    *po = NULL;
}

int64_t ff_optimizer_steps_done(const ff_optimizer *o) { return o->step; }
int64_t ff_optimizer_state_bytes(const ff_optimizer *o) {
    return (int64_t)(ff_buffer_size(o->mbuf) + ff_buffer_size(o->vbuf));
}

int ff_optimizer_step(ff_optimizer *o, ff_optim_stats *stats) {
    ff_model *m = o->m;
    ff_stream *st = m->st;
    int64_t n = m->n_params;
    double ss;
    if (ffm_grad_sumsq(m, &ss)) return -1; /* over the TP and pipeline groups */
    double norm = sqrt(ss);
    if (ff_stream_sync(st)) return -1; /* a failed kernel, not a NaN gradient */
    int64_t k = o->step + 1;
    double lr = ff_adamw_lr_at(&o->c, k);
    double coef = 1.0;
    if (o->c.max_grad_norm > 0) {
        double c = o->c.max_grad_norm / (norm + 1e-6);
        if (c < 1.0) coef = c;
    }
    ff_optim_stats s = {.step = k, .lr = lr, .grad_norm = norm, .clipped = coef < 1.0};
    if (stats) *stats = s;
    if (!isfinite(norm))
        return ff_error_set("optimizer", "lower the learning rate or check the loss for NaN/inf",
                            "gradient norm is %g at update %lld; update skipped", norm, (long long)k);
    double bc1 = 1.0 - pow(o->c.beta1, (double)k), bc2 = 1.0 - pow(o->c.beta2, (double)k);
    float b1 = (float)o->c.beta1, b2 = (float)o->c.beta2, eps = (float)o->c.eps;
    ff_dptr p = ff_dptr_of(m->params, 0), g = ff_dptr_of(m->grads, 0), mo = ff_dptr_of(o->mbuf, 0),
            vo = ff_dptr_of(o->vbuf, 0);
    int64_t nd = m->n_decay;
    ff_adamw(st, p, g, mo, vo, nd, (float)lr, b1, b2, eps, (float)o->c.weight_decay, (float)bc1, (float)bc2, (float)coef);
    ff_adamw(st, ff_dptr_add(p, (size_t)nd, 4), ff_dptr_add(g, (size_t)nd, 4), ff_dptr_add(mo, (size_t)nd, 4),
             ff_dptr_add(vo, (size_t)nd, 4), n - nd, (float)lr, b1, b2, eps, 0.0f, (float)bc1, (float)bc2, (float)coef);
    if (ff_stream_sync(st)) return -1;
    o->step = k;
    return 0;
}

int ff_optimizer_export_state(ff_optimizer *o, ff_tensor_set *out) {
    ff_model *m = o->m;
    if (ffm_tp_export(m, o->mbuf, "exp_avg.", out) || ffm_tp_export(m, o->vbuf, "exp_avg_sq.", out)) return -1;
    int64_t one = 1;
    ff_host_tensor *t = ff_tensor_set_add(out, "step", 1, &one);
    if (!t) return -1;
    t->data[0] = (float)o->step; /* exact up to 2^24 updates */
    return 0;
}

int ff_optimizer_import_state(ff_optimizer *o, const ff_tensor_set *in) {
    ff_model *m = o->m;
    char name[128];
    const ff_host_tensor *st = ff_tensor_set_find(in, "step");
    int64_t one = 1;
    if (!st) return ff_error_set("optimizer state", "the checkpoint has no optimizer state", "tensor 'step' is missing");
    if (ff_host_tensor_expect(st, 1, &one, "optimizer state 'step'")) return -1;
    if (!(st->data[0] >= 0 && st->data[0] <= 16777216.0f && st->data[0] == floorf(st->data[0])))
        return ff_error_set("optimizer state", NULL, "step %g is not a count", (double)st->data[0]);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < m->n_tensors; i++) {
            const ff_param_tensor *p = &m->tensors[i];
            snprintf(name, sizeof name, "%s.%s", pass ? "exp_avg_sq" : "exp_avg", p->name);
            const ff_host_tensor *t = ff_tensor_set_find(in, name);
            if (!t)
                return ff_error_set(name, "the optimizer state belongs to another model", "tensor is missing");
            if (!ffm_tp_is_shard(p, t) && ff_host_tensor_expect(t, p->ndim, p->full, name)) return -1;
        }
    for (int pass = 0; pass < 2; pass++) {
        ff_buffer *b = pass ? o->vbuf : o->mbuf;
        for (int i = 0; i < m->n_tensors; i++) {
            const ff_param_tensor *p = &m->tensors[i];
            snprintf(name, sizeof name, "%s.%s", pass ? "exp_avg_sq" : "exp_avg", p->name);
            if (ffm_tp_load_slice(m, p, ff_tensor_set_find(in, name), ff_dptr_f32(b, p->off))) return -1;
        }
    }
    o->step = (int64_t)st->data[0];
    return 0;
}

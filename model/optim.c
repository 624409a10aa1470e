/* AdamW for a model's flat parameter buffer: global grad-norm clipping, warmup + cosine
 * learning rate, decoupled weight decay on the 2-D weights only, state export/import for
 * checkpoints, and ZeRO-1 (docs/model.md "ZeRO"): the state of one range of the buffer per
 * data-parallel rank, with the bucketed reduce-scatter of the gradients before the update
 * and the all-gather of the parameters after it. The arithmetic follows torch.optim.AdamW
 * and torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6)). Under tensor
 * parallelism the update is elementwise on the rank's shard; the norm is the whole model's
 * (model/tp.c) and the state goes in and out as whole tensors, at every ZeRO stage.
 *
 * Not here: ZeRO-2 (freeing the gradient buckets of other ranks as they are reduced) and
 * ZeRO-3 (parameters sharded too, gathered layer by layer): they need the model's backward
 * to hand out gradient buckets as they complete, which it does not yet. */
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
    int zero;
    ff_model_comm dp;       /* size 1 unless zero 1 over several ranks */
    int64_t lo, hi;         /* the range of the flat buffer whose state this rank holds */
    int64_t *start;         /* [d + 1]: rank r holds [start[r], start[r + 1]) */
    size_t *counts;         /* [d] scratch of the _v collectives */
    int64_t bucket;         /* floats per collective */
    float *host;            /* [2 bucket] staging of the collectives (d > 1) */
    ff_buffer *mbuf, *vbuf; /* [hi - lo] each: exp_avg, exp_avg_sq (NULL while offloaded) */
    float *off;             /* [2 (hi - lo)] while offloaded: exp_avg then exp_avg_sq in host memory */
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

ff_optimizer *ff_optimizer_new(ff_model *m, const ff_adamw_config *c) { return ff_optimizer_new_opts(m, c, NULL); }

static int check_opts(const ff_optimizer_opts *o) {
    const char *w = "optimizer";
    if (o->zero < 0 || o->zero > 3) return ff_error_set(w, "give zero 0 or 1", "ZeRO stage %d does not exist", o->zero);
    if (o->zero > 1)
        return ff_error_set(w, "use zero 1 (optimizer state sharded) or 0", "ZeRO-2/3 are not built (stage %d asked for)", o->zero);
    if (o->bucket < 0) return ff_error_set(w, NULL, "bucket %lld must be >= 0 floats (0: the default)", (long long)o->bucket);
    const ff_model_comm *d = o->zero ? o->dp : NULL;
    if (!d || d->size == 1) return 0;
    if (d->size < 1 || d->rank < 0 || d->rank >= d->size)
        return ff_error_set(w, "give 0 <= rank < size", "data-parallel rank %d of a group of %d", d->rank, d->size);
    if (!d->all_reduce_sum_f64 || !d->reduce_scatter_sum_v || !d->all_gather_v)
        return ff_error_set(w, "the host must supply all_reduce_sum_f64, reduce_scatter_sum_v and all_gather_v",
                            "ZeRO-1: a data-parallel communicator function is NULL");
    const int n_dev = !!d->dev_all_reduce_sum + !!d->dev_all_gather_v + !!d->dev_reduce_scatter_sum_v;
    if (n_dev != 0 && n_dev != 3)
        return ff_error_set(w, "supply all three dev_ collectives of ff_model_comm, or none",
                            "ZeRO-1: %d of the three device-buffer collectives are set", n_dev);
    return 0;
}

/* rank r of d: [r S, (r + 1) S) clipped to n, with S = ceil(n / d) rounded up to FF_ZERO_ALIGN
 * (the norm's block partials then are ZeRO-0's, and every range but the last starts on a
 * 16 KiB boundary) */
static int split_ranges(ff_optimizer *o, int64_t n) {
    const int d = o->dp.size;
    o->start = ff_malloc((size_t)(d + 1) * sizeof *o->start);
    o->counts = ff_malloc((size_t)d * sizeof *o->counts);
    if (!o->start || !o->counts) return -1;
    int64_t S = (n + d - 1) / d;
    S = (S + FF_ZERO_ALIGN - 1) / FF_ZERO_ALIGN * FF_ZERO_ALIGN;
    for (int r = 0; r <= d; r++) o->start[r] = (int64_t)r * S < n ? (int64_t)r * S : n;
    o->lo = o->start[o->dp.rank];
    o->hi = o->start[o->dp.rank + 1];
    return 0;
}

ff_optimizer *ff_optimizer_new_opts(ff_model *m, const ff_adamw_config *c, const ff_optimizer_opts *opts) {
    if (m->inference) {
        ffm_inference_only("optimizer");
        return NULL;
    }
    const ff_optimizer_opts none = {0};
    if (!opts) opts = &none;
    if (check_config(c) || check_opts(opts)) return NULL;
    ff_optimizer *o = ff_calloc(1, sizeof *o);
    if (!o) return NULL;
    o->m = m;
    o->c = *c;
    o->zero = opts->zero;
    o->dp = (ff_model_comm){.rank = 0, .size = 1};
    if (opts->zero && opts->dp && opts->dp->size > 1) o->dp = *opts->dp;
    const int64_t n = m->n_params;
    o->lo = 0;
    o->hi = n;
    o->bucket = opts->bucket > 0 ? opts->bucket : FF_ZERO_BUCKET_DEFAULT;
    if (o->bucket > n) o->bucket = n > 0 ? n : 1;
    if (o->dp.size > 1 &&
        (split_ranges(o, n) || (!ff_model_comm_on_device(&o->dp) && !(o->host = ff_malloc(2 * (size_t)o->bucket * sizeof *o->host))))) {
        ff_optimizer_destroy(&o);
        return NULL;
    }
    size_t bytes = (size_t)(o->hi - o->lo) * sizeof(float);
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
    ff_optimizer *o = *po;
    ff_buffer_destroy(&o->mbuf);
    ff_buffer_destroy(&o->vbuf);
    free(o->start);
    free(o->counts);
    free(o->host);
    free(o->off);
    free(o);
    *po = NULL;
}

void ff_optimizer_shard(const ff_optimizer *o, int64_t *lo, int64_t *hi) {
    *lo = o->lo;
    *hi = o->hi;
}

int64_t ff_optimizer_steps_done(const ff_optimizer *o) { return o->step; }
int64_t ff_optimizer_state_bytes(const ff_optimizer *o) {
    return o->off ? 0 : (int64_t)(ff_buffer_size(o->mbuf) + ff_buffer_size(o->vbuf));
}
int64_t ff_optimizer_host_bytes(const ff_optimizer *o) { return o->off ? 2 * (o->hi - o->lo) * (int64_t)sizeof(float) : 0; }
bool ff_optimizer_offloaded(const ff_optimizer *o) { return o->off != NULL; }

static int offloaded(const ff_optimizer *o, const char *what) {
    if (!o->off) return 0;
    return ff_error_set(what, "call ff_optimizer_reload first (the generation phase is over)",
                        "the optimizer state is offloaded to host memory (ff_optimizer_offload)");
}

/* Both directions copy through the backend's own d2h / h2d (a device backend's PCIe copy; on
 * the CPU backend a memcpy between two allocations), so the backend's buffers are freed and its
 * allocation counters drop by the state's bytes while it is away. */
int ff_optimizer_offload(ff_optimizer *o, ff_offload_stats *stats) {
    const int64_t t0 = ff_now_ns();
    if (stats) *stats = (ff_offload_stats){0};
    if (o->off) return 0;
    const size_t n = (size_t)(o->hi - o->lo), bytes = n * sizeof(float);
    float *h = ff_malloc(2 * (n ? bytes : 1));
    if (!h) return ff_error_wrap("offloading the optimizer state (%zu bytes)", 2 * bytes);
    ff_stream *st = o->m->st;
    ff_memcpy_d2h(st, h, ff_dptr_of(o->mbuf, 0), bytes);
    ff_memcpy_d2h(st, h + n, ff_dptr_of(o->vbuf, 0), bytes);
    if (ff_stream_sync(st)) {
        free(h);
        return ff_error_wrap("offloading the optimizer state");
    }
    ff_buffer_destroy(&o->mbuf);
    ff_buffer_destroy(&o->vbuf);
    o->off = h;
    if (stats) *stats = (ff_offload_stats){.bytes = 2 * (int64_t)bytes, .seconds = (double)(ff_now_ns() - t0) * 1e-9};
    return 0;
}

int ff_optimizer_reload(ff_optimizer *o, ff_offload_stats *stats) {
    const int64_t t0 = ff_now_ns();
    if (stats) *stats = (ff_offload_stats){0};
    if (!o->off) return 0;
    const size_t n = (size_t)(o->hi - o->lo), bytes = n * sizeof(float);
    o->mbuf = ff_buffer_new(o->m->be, bytes);
    o->vbuf = o->mbuf ? ff_buffer_new(o->m->be, bytes) : NULL;
    if (!o->vbuf) {
        ff_buffer_destroy(&o->mbuf); /* still offloaded: a later reload may succeed */
        return ff_error_wrap("reloading the optimizer state (%zu bytes)", 2 * bytes);
    }
    ff_stream *st = o->m->st;
    ff_memcpy_h2d(st, ff_dptr_of(o->mbuf, 0), o->off, bytes);
    ff_memcpy_h2d(st, ff_dptr_of(o->vbuf, 0), o->off + n, bytes);
    if (ff_stream_sync(st)) { /* the host copy stays until the device holds it */
        ff_buffer_destroy(&o->mbuf), ff_buffer_destroy(&o->vbuf);
        return ff_error_wrap("reloading the optimizer state");
    }
    free(o->off);
    o->off = NULL;
    if (stats) *stats = (ff_offload_stats){.bytes = 2 * (int64_t)bytes, .seconds = (double)(ff_now_ns() - t0) * 1e-9};
    return 0;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* counts[r]: the floats of [a, b) in rank r's range */
static void window_counts(ff_optimizer *o, int64_t a, int64_t b) {
    for (int r = 0; r < o->dp.size; r++) o->counts[r] = (size_t)max64(0, min64(b, o->start[r + 1]) - max64(a, o->start[r]));
}

/* Each bucket of the gradient buffer summed over dp into its owners' ranges (on device
 * buffers: in place, this rank's range of the bucket at its displacement). */
static int reduce_scatter_grads(ff_optimizer *o) {
    ff_model *m = o->m;
    const int64_t n = m->n_params, B = o->bucket;
    const bool dev = ff_model_comm_on_device(&o->dp);
    float *send = o->host, *recv = dev ? NULL : o->host + B;
    for (int64_t a = 0; a < n; a += B) {
        const int64_t b = min64(a + B, n), x = max64(a, o->lo), y = min64(b, o->hi);
        window_counts(o, a, b);
        if (dev) {
            if (o->dp.dev_reduce_scatter_sum_v(o->dp.ctx, m->st, ffm_grad(m, (size_t)a), ffm_grad(m, (size_t)(y > x ? x : a)), o->counts))
                return ff_error_wrap("ZeRO-1: reduce-scatter of the gradients [%lld, %lld)", (long long)a, (long long)b);
            continue;
        }
        ff_memcpy_d2h(m->st, send, ffm_grad(m, (size_t)a), (size_t)(b - a) * sizeof(float));
        if (o->dp.reduce_scatter_sum_v(o->dp.ctx, send, recv, o->counts))
            return ff_error_wrap("ZeRO-1: reduce-scatter of the gradients [%lld, %lld)", (long long)a, (long long)b);
        if (y > x) ff_memcpy_h2d(m->st, ffm_grad(m, (size_t)x), recv, (size_t)(y - x) * sizeof(float));
    }
    return 0;
}

/* Every rank's updated range into every rank's parameter buffer, bucket by bucket. */
static int all_gather_params(ff_optimizer *o) {
    ff_model *m = o->m;
    const int64_t n = m->n_params, B = o->bucket;
    const bool dev = ff_model_comm_on_device(&o->dp);
    float *mine = o->host, *all = dev ? NULL : o->host + B;
    for (int64_t a = 0; a < n; a += B) {
        const int64_t b = min64(a + B, n), x = max64(a, o->lo), y = min64(b, o->hi);
        window_counts(o, a, b);
        if (dev) {
            if (o->dp.dev_all_gather_v(o->dp.ctx, m->st, ffm_param(m, (size_t)(y > x ? x : a)), ffm_param(m, (size_t)a), o->counts))
                return ff_error_wrap("ZeRO-1: all-gather of the parameters [%lld, %lld)", (long long)a, (long long)b);
            continue;
        }
        if (y > x) ff_memcpy_d2h(m->st, mine, ffm_param(m, (size_t)x), (size_t)(y - x) * sizeof(float));
        if (o->dp.all_gather_v(o->dp.ctx, mine, all, o->counts))
            return ff_error_wrap("ZeRO-1: all-gather of the parameters [%lld, %lld)", (long long)a, (long long)b);
        ff_memcpy_h2d(m->st, ffm_param(m, (size_t)a), all, (size_t)(b - a) * sizeof(float));
    }
    return 0;
}

int ff_optimizer_step(ff_optimizer *o, ff_optim_stats *stats) {
    ff_model *m = o->m;
    ff_stream *st = m->st;
    const bool dp = o->dp.size > 1;
    if (offloaded(o, "optimizer step") || ffm_grads_released(m, "optimizer step")) return -1;
    if (dp && reduce_scatter_grads(o)) return -1;
    double ss = ffm_grad_sumsq_range(m, o->lo, o->hi);
    if (ff_stream_sync(st)) return -1; /* a failed kernel, not a NaN gradient */
    if (dp && o->dp.all_reduce_sum_f64(o->dp.ctx, &ss, 1))
        return ff_error_wrap("ZeRO-1: all-reduce (sum) of the gradient norm over the data-parallel ranks");
    if (ffm_tp_sum_f64(m, &ss)) return -1;
    if (m->pp.size > 1 && m->pp.all_reduce_sum_f64(m->pp.ctx, &ss, 1))
        return ff_error_wrap("pipeline: all-reduce (sum) of the gradient norm over the stages");
    double norm = sqrt(ss);
    int64_t k = o->step + 1;
    double lr = ff_adamw_lr_at(&o->c, k);
    double coef = 1.0;
    if (o->c.max_grad_norm > 0) {
        double c = o->c.max_grad_norm / (norm + 1e-6);
        if (c < 1.0) coef = c;
    }
    ff_optim_stats s = {.step = k, .lr = lr, .grad_norm = norm, .clipped = coef < 1.0};
    if (stats) *stats = s;
    if (!isfinite(norm)) /* the same norm on every rank: every rank skips */
        return ff_error_set("optimizer", "lower the learning rate or check the loss for NaN/inf",
                            "gradient norm is %g at update %lld; update skipped", norm, (long long)k);
    double bc1 = 1.0 - pow(o->c.beta1, (double)k), bc2 = 1.0 - pow(o->c.beta2, (double)k);
    float b1 = (float)o->c.beta1, b2 = (float)o->c.beta2, eps = (float)o->c.eps;
    /* [lo, hi) split at n_decay: the 2-D weights decay, the norms and biases after them not */
    const int64_t lo = o->lo, hi = o->hi, nd = min64(max64(m->n_decay, lo), hi);
    ff_dptr p = ffm_param(m, (size_t)lo), g = ffm_grad(m, (size_t)lo), mo = ff_dptr_of(o->mbuf, 0), vo = ff_dptr_of(o->vbuf, 0);
    const size_t k0 = (size_t)(nd - lo);
    ffm_params_written(m);
    if (nd > lo)
        ff_adamw(st, p, g, mo, vo, nd - lo, (float)lr, b1, b2, eps, (float)o->c.weight_decay, (float)bc1, (float)bc2, (float)coef);
    if (hi > nd)
        ff_adamw(st, ff_dptr_add(p, k0, 4), ff_dptr_add(g, k0, 4), ff_dptr_add(mo, k0, 4), ff_dptr_add(vo, k0, 4), hi - nd,
                 (float)lr, b1, b2, eps, 0.0f, (float)bc1, (float)bc2, (float)coef);
    if (ff_stream_sync(st)) return -1;
    if (dp && all_gather_params(o)) return -1;
    o->step = k;
    return 0;
}

/* The part of tensor p in this rank's range: [*a, *b) of the flat buffer (empty: a >= b). */
static void owned_part(const ff_optimizer *o, const ff_param_tensor *p, int64_t *a, int64_t *b) {
    *a = max64((int64_t)p->off, o->lo);
    *b = min64((int64_t)p->off + p->numel, o->hi);
}

/* Tensor p of state buffer b (exp_avg or exp_avg_sq) as this rank's TP-local values
 * local [numel]: its own part, and the other dp ranks' parts gathered (mine: scratch of
 * numel floats). */
static int state_local(ff_optimizer *o, ff_buffer *buf, const ff_param_tensor *p, float *local, float *mine) {
    ff_model *m = o->m;
    int64_t a, b;
    owned_part(o, p, &a, &b);
    if (o->dp.size == 1) {
        ff_memcpy_d2h(m->st, local, ff_dptr_f32(buf, (size_t)(a - o->lo)), (size_t)p->numel * sizeof(float));
        return 0;
    }
    if (b > a) ff_memcpy_d2h(m->st, mine, ff_dptr_f32(buf, (size_t)(a - o->lo)), (size_t)(b - a) * sizeof(float));
    window_counts(o, (int64_t)p->off, (int64_t)p->off + p->numel);
    if (o->dp.all_gather_v(o->dp.ctx, mine, local, o->counts))
        return ff_error_wrap("ZeRO-1: all-gather of the optimizer state of %s", p->name);
    return 0;
}

int ff_optimizer_export_state(ff_optimizer *o, ff_tensor_set *out) {
    ff_model *m = o->m;
    if (offloaded(o, "export the optimizer state")) return -1;
    size_t most = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if ((size_t)m->tensors[i].numel > most) most = (size_t)m->tensors[i].numel;
    float *local = ff_malloc(2 * (most ? most : 1) * sizeof *local), *mine = local + most;
    if (!local) return -1;
    char name[128];
    int rc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++)
        for (int i = 0; i < m->n_tensors && rc == 0; i++) {
            const ff_param_tensor *p = &m->tensors[i];
            if (p->copy) continue; /* a pipeline stage's copy of a tensor another stage owns and exports */
            snprintf(name, sizeof name, "%s.%s", pass ? "exp_avg_sq" : "exp_avg", p->name);
            ff_host_tensor *t = ff_tensor_set_add(out, name, p->ndim, p->full);
            /* a tensor TP does not split is its own whole */
            float *dst = t && p->split < 0 ? t->data : local;
            if (!t || state_local(o, pass ? o->vbuf : o->mbuf, p, dst, mine) ||
                (p->split >= 0 && ffm_tp_store_whole_host(m, p, local, t->data)))
                rc = -1;
        }
    free(local);
    if (rc) return -1;
    int64_t one = 1;
    ff_host_tensor *t = ff_tensor_set_add(out, "step", 1, &one);
    if (!t) return -1;
    t->data[0] = (float)o->step; /* exact up to 2^24 updates */
    return 0;
}

int ff_optimizer_import_state(ff_optimizer *o, const ff_tensor_set *in) {
    ff_model *m = o->m;
    if (offloaded(o, "import the optimizer state")) return -1;
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
            int64_t x, y;
            owned_part(o, p, &x, &y);
            if (y <= x) continue;
            snprintf(name, sizeof name, "%s.%s", pass ? "exp_avg_sq" : "exp_avg", p->name);
            const float *v = ffm_tp_local_view(m, p, ff_tensor_set_find(in, name));
            if (!v) return -1;
            ff_memcpy_h2d(m->st, ff_dptr_f32(b, (size_t)(x - o->lo)), v + (x - (int64_t)p->off), (size_t)(y - x) * sizeof(float));
        }
    }
    o->step = (int64_t)st->data[0];
    return 0;
}

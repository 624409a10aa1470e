/* Pipeline schedules on paper (fuseflow/pipeline.h): the compact text of `fuseflow schedule
 * show`, its JSON, and the SVG timeline. Not here: building or simulating (pipe_schedule.c,
 * pipe_sim.c). */
#include "fuseflow/pipeline.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/util.h"

static bool show_chunk(const ff_pipe_schedule *s, const ff_pipe_instr *in) {
    return in->chunk > 0 || (in->model < s->n_models && s->models[in->model].n_stages > s->n_ranks);
}

void ff_pipe_instr_format(const ff_pipe_schedule *s, const ff_pipe_instr *in, char *buf, size_t cap) {
    static const char *tag[FF_PIPE_NOPS] = {"F", "B", "sa", "ra", "sg", "rg", "step"};
    static const char dir[FF_PIPE_NOPS] = {0, 0, '>', '<', '>', '<', 0};
    char model[16] = "", chunk[16] = "", peer[16] = "";
    if (s->n_models > 1) snprintf(model, sizeof model, "%d:", in->model);
    if (in->op >= FF_PIPE_NOPS) {
        snprintf(buf, cap, "%s?op%d", model, in->op);
        return;
    }
    if (in->op == FF_PIPE_OPTIMIZER_STEP) {
        snprintf(buf, cap, "%sstep", model);
        return;
    }
    if (show_chunk(s, in)) snprintf(chunk, sizeof chunk, ".%d", in->chunk);
    if (dir[in->op]) snprintf(peer, sizeof peer, "%c%d", dir[in->op], (int)in->peer);
    snprintf(buf, cap, "%s%s%d%s%s", model, tag[in->op], (int)in->micro, chunk, peer);
}

static const char *formula_text(const ff_pipe_schedule *s) {
    switch (s->config.kind) {
    case FF_PIPE_GPIPE:
    case FF_PIPE_1F1B: return "(p-1)/(m+p-1)";
    case FF_PIPE_INTERLEAVED: return "(p-1)/(v m+p-1)";
    default: return NULL;
    }
}

void ff_pipe_write_text(const ff_pipe_schedule *s, const ff_pipe_sim *sim, FILE *out) {
    const ff_pipe_config *c = &s->config;
    const ff_pipe_model *m0 = &s->models[0];
    if (c->kind != FF_PIPE_CUSTOM)
        fprintf(out, "schedule: %s, pp %d, vpp %d, micro %d, %s\n", ff_pipe_kind_name(c->kind), (int)c->pp, (int)c->vpp, (int)c->micro,
                c->forward_only ? "forward-only" : "training");
    else
        fprintf(out, "schedule: custom, %d ranks, %d model%s\n", (int)s->n_ranks, (int)s->n_models, s->n_models > 1 ? "s" : "");
    for (int i = 0; i < s->n_models; i++) {
        const ff_pipe_model *m = &s->models[i];
        if (!m->stage_layers) continue;
        if (s->n_models > 1) fprintf(out, "model %d ", i);
        fprintf(out, "layers per virtual stage:");
        for (int32_t k = 0; k < m->n_stages; k++) fprintf(out, " %lld", (long long)m->stage_layers[k]);
        fprintf(out, "%s\n", m->n_stages > s->n_ranks ? " (virtual stage k on rank k mod p)" : "");
    }
    fprintf(out, "legend: F3 forward of micro-batch 3%s, B3 backward, sa/ra send/receive an activation, sg/rg a gradient\n"
                 "        (>r to rank r, <r from rank r), [...] one grouped call, step the optimizer step\n",
            m0->n_stages > s->n_ranks ? " (F3.1: through chunk 1)" : "");
    for (int32_t r = 0; r < s->n_ranks; r++) {
        const ff_pipe_stream *st = &s->streams[r];
        fprintf(out, "rank %d:", (int)r);
        for (int64_t i = 0; i < st->n; i++) {
            const ff_pipe_instr *in = &st->instr[i];
            bool comm = in->op >= FF_PIPE_SEND_ACT && in->op <= FF_PIPE_RECV_GRAD;
            bool opens = comm && (i == 0 || st->instr[i - 1].call != in->call);
            bool closes = comm && (i + 1 == st->n || st->instr[i + 1].call != in->call);
            char f[64];
            ff_pipe_instr_format(s, in, f, sizeof f);
            fprintf(out, " %s%s", opens ? "[" : "", f);
            if (closes) fputc(']', out);
        }
        fputc('\n', out);
    }
    if (!sim) return;
    double formula = ff_pipe_bubble_formula(c);
    fprintf(out, "makespan %.6g, bubble %.2f%%", sim->makespan_s, 100 * sim->bubble_fraction);
    if (formula >= 0) fprintf(out, " (formula %s = %.2f%%)", formula_text(s), 100 * formula);
    fprintf(out, "\n%-6s %12s %12s %10s %14s%s\n", "rank", "busy", "idle", "in-flight", "F before 1st B", m0->stage_layers ? "  peak layers x mb" : "");
    for (int32_t r = 0; r < sim->n_ranks; r++) {
        const ff_pipe_rank_stats *st = &sim->ranks[r];
        fprintf(out, "%-6d %12.6g %12.6g %10d %14d", (int)r, st->busy_s, st->idle_s, (int)st->peak_in_flight, (int)st->forwards_before_backward);
        if (m0->stage_layers) fprintf(out, "  %lld", (long long)st->peak_layers);
        fputc('\n', out);
    }
}

/* ---- JSON -------------------------------------------------------------------------------- */

char *ff_pipe_json(const ff_pipe_schedule *s, const ff_pipe_sim *sim) {
    const ff_pipe_config *c = &s->config;
    json_t *root = json_object();
    json_object_set_new(root, "kind", json_string(ff_pipe_kind_name(c->kind)));
    if (c->kind != FF_PIPE_CUSTOM) {
        json_object_set_new(root, "pp", json_integer(c->pp));
        json_object_set_new(root, "vpp", json_integer(c->vpp));
        json_object_set_new(root, "micro", json_integer(c->micro));
        json_object_set_new(root, "forward_only", json_boolean(c->forward_only));
    }
    json_object_set_new(root, "n_ranks", json_integer(s->n_ranks));
    json_t *models = json_array();
    for (int i = 0; i < s->n_models; i++) {
        const ff_pipe_model *m = &s->models[i];
        json_t *jm = json_object(), *stages = json_array();
        json_object_set_new(jm, "micro", json_integer(m->micro));
        json_object_set_new(jm, "forward_only", json_boolean(m->forward_only));
        for (int32_t k = 0; k < m->n_stages; k++) {
            json_t *st = json_pack("{s:i, s:i}", "rank", (int)m->stage_rank[k], "chunk", (int)m->stage_chunk[k]);
            if (m->stage_layers) json_object_set_new(st, "layers", json_integer(m->stage_layers[k]));
            json_array_append_new(stages, st);
        }
        json_object_set_new(jm, "stages", stages);
        json_array_append_new(models, jm);
    }
    json_object_set_new(root, "models", models);
    json_t *ranks = json_array();
    for (int32_t r = 0; r < s->n_ranks; r++) {
        const ff_pipe_stream *st = &s->streams[r];
        json_t *list = json_array();
        for (int64_t i = 0; i < st->n; i++) {
            const ff_pipe_instr *in = &st->instr[i];
            json_t *ji = json_pack("{s:s, s:i}", "op", ff_pipe_op_name((ff_pipe_op)in->op), "model", (int)in->model);
            if (in->op != FF_PIPE_OPTIMIZER_STEP) {
                json_object_set_new(ji, "micro", json_integer(in->micro));
                json_object_set_new(ji, "chunk", json_integer(in->chunk));
            }
            if (in->call >= 0) {
                json_object_set_new(ji, "peer", json_integer(in->peer));
                json_object_set_new(ji, "call", json_integer(in->call));
            }
            if (sim && sim->start_s && sim->start_s[r]) {
                json_object_set_new(ji, "start", json_real(sim->start_s[r][i]));
                json_object_set_new(ji, "end", json_real(sim->end_s[r][i]));
            }
            json_array_append_new(list, ji);
        }
        json_array_append_new(ranks, json_pack("{s:i, s:o}", "rank", (int)r, "instructions", list));
    }
    json_object_set_new(root, "ranks", ranks);
    if (sim) {
        json_t *js = json_object(), *per = json_array();
        json_object_set_new(js, "makespan", json_real(sim->makespan_s));
        json_object_set_new(js, "bubble_fraction", json_real(sim->bubble_fraction));
        double formula = ff_pipe_bubble_formula(c);
        if (formula >= 0) {
            json_object_set_new(js, "formula", json_string(formula_text(s)));
            json_object_set_new(js, "formula_bubble_fraction", json_real(formula));
        }
        for (int32_t r = 0; r < sim->n_ranks; r++) {
            const ff_pipe_rank_stats *st = &sim->ranks[r];
            json_t *jr = json_pack("{s:i, s:f, s:f, s:f, s:i, s:i}", "rank", (int)r, "busy", st->busy_s, "idle", st->idle_s, "end", st->end_s,
                                   "peak_in_flight", (int)st->peak_in_flight, "forwards_before_backward", (int)st->forwards_before_backward);
            if (s->models[0].stage_layers) json_object_set_new(jr, "peak_layers", json_integer(st->peak_layers));
            json_array_append_new(per, jr);
        }
        json_object_set_new(js, "ranks", per);
        json_object_set_new(root, "simulation", js);
    }
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_COMPACT);
    json_decref(root);
    if (!text) ff_error_set("pipeline", NULL, "cannot write the JSON (out of memory)");
    return text;
}

/* ---- SVG --------------------------------------------------------------------------------- */


/* Forward, backward and step per model (Tableau's palette); later chunks lighter. */
static void colour(const ff_pipe_instr *in, int32_t chunks, char *buf, size_t cap) {
    static const unsigned base[FF_PIPE_MAX_MODELS][3] = {
        {0x4e79a7, 0x59a14f, 0x9c755f}, {0xf28e2b, 0xb07aa1, 0x9c755f}, {0xe15759, 0x76b7b2, 0x9c755f}, {0xedc948, 0xff9da7, 0x9c755f}};
    unsigned rgb = base[in->model % FF_PIPE_MAX_MODELS][in->op == FF_PIPE_FORWARD ? 0 : in->op == FF_PIPE_BACKWARD ? 1 : 2];
    double t = chunks > 1 ? 0.55 * in->chunk / (chunks - 1) : 0.0;
    unsigned ch[3] = {rgb >> 16 & 255, rgb >> 8 & 255, rgb & 255};
    for (int i = 0; i < 3; i++) ch[i] = (unsigned)(ch[i] + (255 - ch[i]) * t + 0.5);
    snprintf(buf, cap, "#%02x%02x%02x", ch[0], ch[1], ch[2]);
}

int ff_pipe_write_svg(const ff_pipe_schedule *s, const ff_pipe_sim *sim, const char *path) {
    if (!sim || !sim->start_s) return ff_error_set(path, "simulate the schedule first", "no timeline to draw");
    const double left = 70, width = 1100, top = 46, row = 28, bar = 22;
    double span = sim->makespan_s > 0 ? sim->makespan_s : 1, sx = width / span;
    double height = top + row * s->n_ranks + 44;
    int32_t chunks = 1;
    for (int i = 0; i < s->n_models; i++)
        for (int32_t k = 0; k < s->models[i].n_stages; k++)
            if (s->models[i].stage_chunk[k] + 1 > chunks) chunks = s->models[i].stage_chunk[k] + 1;
    ff_strbuf b = {0};
    ff_strbuf_printf(&b,
              "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
              "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
              left + width + 20, height);
    const ff_pipe_config *c = &s->config;
    double formula = ff_pipe_bubble_formula(c);
    if (c->kind != FF_PIPE_CUSTOM)
        ff_strbuf_printf(&b, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%s, pp %d, vpp %d, micro %d%s: makespan %.6g, bubble %.2f%% (formula %.2f%%)</text>\n", left,
                  ff_pipe_kind_name(c->kind), (int)c->pp, (int)c->vpp, (int)c->micro, c->forward_only ? ", forward-only" : "", sim->makespan_s,
                  100 * sim->bubble_fraction, 100 * formula);
    else
        ff_strbuf_printf(&b, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%d ranks, %d models: makespan %.6g, bubble %.2f%%</text>\n", left,
                  (int)s->n_ranks, (int)s->n_models, sim->makespan_s, 100 * sim->bubble_fraction);
    for (int32_t r = 0; r < s->n_ranks; r++) {
        double y = top + row * r;
        ff_strbuf_printf(&b, "<text x=\"8\" y=\"%.1f\">rank %d</text>\n<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.0f\" fill=\"#f2f2f2\"/>\n", y + bar * 0.7,
                  (int)r, left, y, width, bar);
        const ff_pipe_stream *st = &s->streams[r];
        for (int64_t i = 0; i < st->n; i++) {
            const ff_pipe_instr *in = &st->instr[i];
            if (in->op != FF_PIPE_FORWARD && in->op != FF_PIPE_BACKWARD && in->op != FF_PIPE_OPTIMIZER_STEP) continue;
            double x0 = left + sim->start_s[r][i] * sx, w = (sim->end_s[r][i] - sim->start_s[r][i]) * sx;
            char fill[16], f[64];
            colour(in, chunks, fill, sizeof fill);
            ff_pipe_instr_format(s, in, f, sizeof f);
            ff_strbuf_printf(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\"><title>rank %d %s: %.6g - %.6g</title></rect>\n",
                      x0, y, w, bar, fill, (int)r, f, sim->start_s[r][i], sim->end_s[r][i]);
            if (w >= 16 && in->op != FF_PIPE_OPTIMIZER_STEP)
                ff_strbuf_printf(&b, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"white\">%d</text>\n", x0 + w / 2, y + bar * 0.7, (int)in->micro);
        }
    }
    double ya = top + row * s->n_ranks + 14;
    for (int t = 0; t <= 10; t++)
        ff_strbuf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#555\">%.4g</text>\n", left + width * t / 10, ya, span * t / 10);
    ff_pipe_instr fw = {.op = FF_PIPE_FORWARD}, bw = {.op = FF_PIPE_BACKWARD}, step = {.op = FF_PIPE_OPTIMIZER_STEP};
    char cf[16], cb[16], cs[16];
    colour(&fw, 1, cf, sizeof cf);
    colour(&bw, 1, cb, sizeof cb);
    colour(&step, 1, cs, sizeof cs);
    ff_strbuf_printf(&b,
              "<g transform=\"translate(%.0f,%.1f)\"><rect width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"16\" y=\"10\">forward</text>"
              "<rect x=\"80\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"96\" y=\"10\">backward</text>"
              "<rect x=\"170\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"186\" y=\"10\">optimizer step</text>"
              "<text x=\"290\" y=\"10\">%s(the number is the micro-batch; grey: waiting)</text></g>\n</svg>\n",
              left, ya + 12, cf, cb, cs, chunks > 1 ? "later chunks lighter " : "");
    if (b.failed) {
        free(b.p);
        return ff_error_set(path, NULL, "cannot build the picture (out of memory)");
    }
    int rc = ff_write_file_atomic(path, b.p, b.len);
    free(b.p);
    return rc;
}

/* `fuseflow plot OUT_DIR`: the learning curves of a run folder (OUT_DIR/metrics.jsonl of
 * `fuseflow run` or `fuseflow sft`) as a PNG drawn with cairo, OUT_DIR/curves.png by default;
 * `fuseflow run` and `fuseflow sft` draw it at their end (ffplot_curves). A grid of panels,
 * one per metric the file has (reward, accuracy, loss, KL, entropy, response length, time
 * per stage, throughput, learning rate, grad norm), 3 to a row, each with ticked and labelled
 * axes, a title, and a legend where it shows several series.
 *
 * Not here: reading TensorBoard files; interactive plots. Without cairo at build time the
 * command says so (and the training commands skip the picture). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/commands.h"
#include "cli/io_util.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"

#ifdef FF_HAVE_CAIRO
#include <cairo.h>
#endif

#define CMD "plot"

/* ---- the panels ------------------------------------------------------------------------------ */

/* A panel: the keys of its series, "key" or "key:label" ("time/KEY": KEY inside "time"; the
 * key "time/" alone: every number inside "time" but the throughputs). Each key with data is a
 * series; a panel without any is left out. */
typedef struct panel_spec {
    const char *title;
    const char *keys[4];
} panel_spec;

static const panel_spec specs[] = {
    {"Reward (mean score)", {"reward_mean"}},
    {"Accuracy", {"acc:train (perfect answers)", "eval_acc:held-out greedy", "exact_match:held-out exact match"}},
    {"Loss", {"loss:train", "eval_loss:held-out", "value_loss:critic (value)"}},
    {"KL (old - ref, per token)", {"kl"}},
    {"Entropy (per token)", {"entropy"}},
    {"Response length (tokens)", {"response_length"}},
    {"Time per stage (s)", {"time/"}},
    {"Throughput (tokens/s)", {"tokens_per_s:train", "time/tokens_per_s:all stages", "time/gen_tokens_per_s:generation"}},
    {"Learning rate", {"lr", "critic_lr"}},
    {"Grad norm", {"grad_norm", "critic_grad_norm"}},
};
#define N_SPECS (sizeof specs / sizeof *specs)
#define MAX_SERIES 8

typedef struct series {
    char key[128], label[128];
    int order; /* its key's place in the panel's list: the legend's order */
    double *x, *y;
    size_t n, cap;
} series;

typedef struct panel {
    const panel_spec *spec;
    series s[MAX_SERIES];
    int n;
} panel;

static void series_add(series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        double *nx = ff_realloc(s->x, cap * sizeof *nx), *ny = nx ? ff_realloc(s->y, cap * sizeof *ny) : NULL;
        if (nx) s->x = nx;
        if (!ny) return; /* out of memory: the point is dropped */
        s->y = ny, s->cap = cap;
    }
    s->x[s->n] = x, s->y[s->n] = y;
    s->n++;
}

static series *series_of(panel *p, const char *key, const char *label, int order) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->s[i].key, key)) return &p->s[i];
    if (p->n == MAX_SERIES) return NULL;
    int at = p->n++; /* after the series of keys listed before it (and those found before it) */
    while (at > 0 && p->s[at - 1].order > order) {
        p->s[at] = p->s[at - 1];
        at--;
    }
    series *s = &p->s[at];
    memset(s, 0, sizeof *s);
    snprintf(s->key, sizeof s->key, "%s", key);
    snprintf(s->label, sizeof s->label, "%s", label);
    s->order = order;
    return s;
}

/* The points of one metrics line for each panel. */
static void take_line(panel *panels, const json_t *m, double x) {
    for (size_t k = 0; k < N_SPECS; k++) {
        panel *p = &panels[k];
        for (int j = 0; j < 4 && p->spec->keys[j]; j++) {
            char key[128];
            snprintf(key, sizeof key, "%s", p->spec->keys[j]);
            char *colon = strchr(key, ':');
            const char *label = colon ? colon + 1 : key;
            if (colon) *colon = '\0';
            if (!strcmp(key, "time/")) {
                const char *name;
                const json_t *v;
                json_object_foreach((json_t *)json_object_get(m, "time"), name, v) {
                    if (!json_is_number(v) || strstr(name, "per_s")) continue;
                    series *s = series_of(p, name, strcmp(name, "iteration") ? name : "whole iteration", j);
                    if (s) series_add(s, x, json_number_value(v));
                }
                continue;
            }
            const json_t *v = m;
            if (!strncmp(key, "time/", 5)) v = json_object_get(json_object_get(m, "time"), key + 5);
            else v = json_object_get(m, key);
            if (!json_is_number(v) || !isfinite(json_number_value(v))) continue;
            series *s = series_of(p, key, label, j);
            if (s) series_add(s, x, json_number_value(v));
        }
    }
}

static void panels_free(panel *panels) {
    for (size_t k = 0; k < N_SPECS; k++)
        for (int i = 0; i < panels[k].n; i++) {
            free(panels[k].s[i].x);
            free(panels[k].s[i].y);
        }
}

/* metrics.jsonl into the panels; the step key ("iteration" for run, "step" for sft) into
 * step_key. Lines that are not JSON objects with a step are skipped. The lines read, or -1. */
static int read_metrics(const char *path, panel *panels, char *step_key, size_t cap) {
    size_t len;
    char *text = ff_read_file(path, &len);
    if (!text) return -1;
    int lines = 0;
    snprintf(step_key, cap, "step");
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        json_t *m = json_loadb(line, n, 0, NULL);
        const json_t *it = json_object_get(m, "iteration"), *st = json_object_get(m, "step");
        if (json_is_integer(it) || json_is_integer(st)) {
            if (json_is_integer(it)) snprintf(step_key, cap, "iteration");
            take_line(panels, m, (double)json_integer_value(json_is_integer(it) ? it : st));
            lines++;
        }
        json_decref(m);
        line += n + (end ? 1 : 0);
    }
    free(text);
    return lines;
}

/* ---- drawing ---------------------------------------------------------------------------------- */

#ifdef FF_HAVE_CAIRO

static const double palette[MAX_SERIES][3] = {{0.12, 0.47, 0.71}, {0.85, 0.37, 0.01}, {0.17, 0.63, 0.17}, {0.84, 0.15, 0.16},
                                              {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29}, {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}};

/* Ticks at 1, 2 or 5 times a power of ten, about 5 over [lo, hi]. */
static double tick_step(double lo, double hi) {
    double span = hi - lo, raw = span / 5, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* One format for all the ticks of an axis: exponents when its largest tick is >= 1e5 or
 * < 1e-2, else as many decimals as the step needs. */
static void fmt_tick(double v, double step, double largest, char *buf, size_t cap) {
    if (fabs(v) < step * 1e-6) v = 0;
    if (v == 0) snprintf(buf, cap, "0");
    else if (largest >= 1e5 || largest < 1e-2) snprintf(buf, cap, "%.1e", v);
    else {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(buf, cap, "%.*f", dec > 6 ? 6 : dec, v);
    }
}

/* s with its advance scaled by ax (0 left, 0.5 centre, 1 right) at x, and the font's
 * cap height scaled by ay below y (0: y is the baseline, 0.5: centred on y, 1: hangs
 * from y), the same for every string of a size. */
static void text_at(cairo_t *cr, double x, double y, const char *s, double ax, double ay) {
    cairo_text_extents_t e, cap;
    cairo_text_extents(cr, s, &e);
    cairo_text_extents(cr, "H", &cap);
    cairo_move_to(cr, x - e.x_advance * ax, y + cap.height * ay);
    cairo_show_text(cr, s);
}

static void draw_panel(cairo_t *cr, const panel *p, double px, double py, const char *step_key) {
    const double L = px + FFPLOT_MARGIN_L, R = px + FFPLOT_PANEL_W - FFPLOT_MARGIN_R, T = py + FFPLOT_MARGIN_T,
                 B = py + FFPLOT_PANEL_H - FFPLOT_MARGIN_B;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < p->n; i++)
        for (size_t k = 0; k < p->s[i].n; k++) {
            x0 = fmin(x0, p->s[i].x[k]), x1 = fmax(x1, p->s[i].x[k]);
            y0 = fmin(y0, p->s[i].y[k]), y1 = fmax(y1, p->s[i].y[k]);
        }
    if (x1 <= x0) x0 -= 1, x1 += 1;
    double xpad = (x1 - x0) * 0.02; /* the end points whole inside the frame */
    x0 -= xpad, x1 += xpad;
    if (y1 <= y0) {
        double d = fabs(y0) > 0 ? fabs(y0) * 0.1 : 1;
        y0 -= d, y1 += d;
    }
    double pad = (y1 - y0) * 0.06;
    y0 -= pad, y1 += pad;
    /* a legend gets a band of its own above the curves; more than 3 series, in 2 columns */
    const int lcols = p->n > 3 ? 2 : 1, lrows = (p->n + lcols - 1) / lcols;
    const double rh = 14, bh = rh * lrows + 6;
    if (p->n > 1) y1 += (y1 - y0) * (bh + 10) / (B - T - bh - 10);
    double xs = tick_step(x0, x1), ys = tick_step(y0, y1);
    if (xs < 1) xs = 1; /* steps are integers */
#define MAPX(v) (L + ((v)-x0) / (x1 - x0) * (R - L))
#define MAPY(v) (B - ((v)-y0) / (y1 - y0) * (B - T))
    /* frame, grid, ticks */
    cairo_set_font_size(cr, 11);
    char buf[64];
    cairo_set_line_width(cr, 1);
    double ylarge = fmax(fabs(floor(y0 / ys) * ys), fabs(ceil(y1 / ys) * ys)), xlarge = fmax(fabs(x0), fabs(x1));
    for (double v = ceil(y0 / ys) * ys; v <= y1 + ys * 1e-9; v += ys) {
        double y = round(MAPY(v)) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, L, y), cairo_line_to(cr, R, y), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        cairo_move_to(cr, L - 4, y), cairo_line_to(cr, L, y), cairo_stroke(cr);
        fmt_tick(v, ys, ylarge, buf, sizeof buf);
        text_at(cr, L - 7, y, buf, 1, 0.5);
    }
    for (double v = ceil(x0 / xs) * xs; v <= x1 + xs * 1e-9; v += xs) {
        double x = round(MAPX(v)) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, x, T), cairo_line_to(cr, x, B), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        cairo_move_to(cr, x, B), cairo_line_to(cr, x, B + 4), cairo_stroke(cr);
        fmt_tick(v, xs, xlarge < 1e5 ? 1 : xlarge, buf, sizeof buf);
        text_at(cr, x, B + 8, buf, 0.5, 1);
    }
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, round(L) + 0.5, round(T) + 0.5, round(R - L), round(B - T));
    cairo_stroke(cr);
    text_at(cr, (L + R) / 2, B + 26, step_key, 0.5, 1);
    cairo_set_font_size(cr, 13);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    char title[300]; /* one series: its label in the title, where a legend would say it */
    if (p->n == 1 && strcmp(p->s[0].label, p->s[0].key)) snprintf(title, sizeof title, "%s: %s", p->spec->title, p->s[0].label);
    else snprintf(title, sizeof title, "%s", p->spec->title);
    text_at(cr, (L + R) / 2, py + 10, title, 0.5, 1);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    /* the series, clipped to the frame */
    cairo_save(cr);
    cairo_rectangle(cr, L, T, R - L, B - T);
    cairo_clip(cr);
    cairo_set_line_width(cr, 1.6);
    for (int i = 0; i < p->n; i++) {
        const series *s = &p->s[i];
        cairo_set_source_rgb(cr, palette[i][0], palette[i][1], palette[i][2]);
        for (size_t k = 0; k < s->n; k++) {
            if (k == 0) cairo_move_to(cr, MAPX(s->x[k]), MAPY(s->y[k]));
            else cairo_line_to(cr, MAPX(s->x[k]), MAPY(s->y[k]));
        }
        cairo_stroke(cr);
        if (s->n <= 40) /* sparse series (evaluations): their points too */
            for (size_t k = 0; k < s->n; k++) {
                cairo_arc(cr, MAPX(s->x[k]), MAPY(s->y[k]), 2.6, 0, 2 * M_PI);
                cairo_fill(cr);
            }
    }
    cairo_restore(cr);
    /* the legend, top left in its band */
    if (p->n > 1) {
        cairo_set_font_size(cr, 10.5);
        double w = 0;
        for (int i = 0; i < p->n; i++) {
            cairo_text_extents_t e;
            cairo_text_extents(cr, p->s[i].label, &e);
            w = fmax(w, e.x_advance);
        }
        double cw = w + 30, bw = cw * lcols, lx = L + 8, ly = T + 5;
        cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
        cairo_rectangle(cr, lx, ly, bw, bh);
        cairo_fill(cr);
        for (int i = 0; i < p->n; i++) {
            double x = lx + cw * (i / lrows), y = ly + 3 + rh * (i % lrows) + rh / 2;
            cairo_set_source_rgb(cr, palette[i][0], palette[i][1], palette[i][2]);
            cairo_set_line_width(cr, 2);
            cairo_move_to(cr, x + 4, y), cairo_line_to(cr, x + 20, y), cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
            text_at(cr, x + 24, y, p->s[i].label, 0, 0.5);
        }
    }
#undef MAPX
#undef MAPY
}

static int draw(const char *png, const char *title, const panel *const *used, int n, const char *step_key, int *w_out, int *h_out) {
    int cols = n < FFPLOT_COLS ? n : FFPLOT_COLS, rows = (n + cols - 1) / cols;
    int W = cols * FFPLOT_PANEL_W, H = FFPLOT_HEADER_H + rows * FFPLOT_PANEL_H;
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, W, H);
    cairo_t *cr = cairo_create(sf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 15);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text_at(cr, W / 2.0, 12, title, 0.5, 1);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    for (int i = 0; i < n; i++)
        draw_panel(cr, used[i], (i % cols) * FFPLOT_PANEL_W, FFPLOT_HEADER_H + (i / cols) * FFPLOT_PANEL_H, step_key);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_write_to_png(sf, png);
    cairo_surface_destroy(sf);
    if (st != CAIRO_STATUS_SUCCESS) return ff_error_set(png, "check that the folder can be written", "cannot write the picture: %s", cairo_status_to_string(st));
    *w_out = W, *h_out = H;
    return 0;
}
#else
static int draw(const char *png, const char *title, const panel *const *used, int n, const char *step_key, int *w_out, int *h_out) {
    (void)title, (void)used, (void)n, (void)step_key, (void)w_out, (void)h_out;
    return ff_error_set(png, "install libcairo2-dev (bash scripts/deps.sh) and build again",
                        "this fuseflow was built without cairo, so it draws no pictures");
}
#endif

int ffplot_curves(const char *out_dir, const char *png, char *info, size_t cap) {
    char path[FF_PATH_MAX], step_key[32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    panel panels[N_SPECS];
    memset(panels, 0, sizeof panels);
    for (size_t k = 0; k < N_SPECS; k++) panels[k].spec = &specs[k];
    int lines = read_metrics(path, panels, step_key, sizeof step_key), rc = -1;
    if (lines < 0) {
        ff_error_wrap("%s: a run folder of `fuseflow run` or `fuseflow sft` holds metrics.jsonl", out_dir);
        goto out;
    }
    const panel *used[N_SPECS];
    int n = 0;
    for (size_t k = 0; k < N_SPECS; k++)
        if (panels[k].n) used[n++] = &panels[k];
    if (n == 0) {
        rc = ff_error_set(path, "plot after a run has written some steps (trainer.logger with jsonl)",
                          "no metrics to draw (%d lines with a step)", lines);
        goto out;
    }
    char title[FF_PATH_MAX + 64];
    snprintf(title, sizeof title, "%s  (%d lines of metrics.jsonl)", out_dir, lines);
    int W = 0, H = 0;
    if (draw(png, title, used, n, step_key, &W, &H) != 0) goto out;
    size_t off = (size_t)snprintf(info, cap, "%dx%d, %d panels:", W, H, n);
    for (int i = 0; i < n && off < cap; i++) off += (size_t)snprintf(info + off, cap - off, "%s %s", i ? "," : "", used[i]->spec->title);
    rc = 0;
out:
    panels_free(panels);
    return rc;
}

void ffplot_after_run(const char *cmd, const char *out_dir) {
    char png[FF_PATH_MAX], info[1024];
    snprintf(png, sizeof png, "%s/curves.png", out_dir);
    if (ffplot_curves(out_dir, png, info, sizeof info) == 0) fprintf(stderr, "%s: learning curves in %s\n", cmd, png);
    else fprintf(stderr, "%s: no learning curves: %s\n", cmd, ff_error_message());
}

static void help(void) {
    printf("usage: fuseflow plot OUT_DIR [--out FILE.png]\n\n"
           "Draws the learning curves of a run folder of `fuseflow run` or `fuseflow sft` (its\n"
           "metrics.jsonl) as a PNG, OUT_DIR/curves.png unless --out says otherwise. One panel for each\n"
           "metric the file has, of: reward, accuracy (train, held-out), loss, KL, entropy, response\n"
           "length, time per stage, throughput, learning rate, grad norm; %d panels to a row, each\n"
           "%dx%d pixels, under a %d-pixel title. `fuseflow run` and `fuseflow sft` draw it at their end.\n",
           FFPLOT_COLS, FFPLOT_PANEL_W, FFPLOT_PANEL_H, FFPLOT_HEADER_H);
#ifndef FF_HAVE_CAIRO
    printf("\nThis fuseflow was built without cairo: install libcairo2-dev (bash scripts/deps.sh) and build again.\n");
#endif
}

int ff_cmd_plot(int argc, char **argv) {
    const char *out = NULL;
    const ffio_opt opts[] = {{"out", FFIO_STR, &out, 0, 0}};
    char *pos[2];
    int n_pos;
    int pr = ffio_parse(CMD, argc, argv, opts, 1, pos, 2, &n_pos);
    if (pr == 1) help();
    if (pr) return pr == 1 ? 0 : pr;
    if (n_pos != 1) return ffio_usage(CMD, "give one run folder (OUT_DIR)");
    char png[FF_PATH_MAX], info[1024];
    if (out) snprintf(png, sizeof png, "%s", out);
    else snprintf(png, sizeof png, "%s/curves.png", pos[0]);
    if (ffplot_curves(pos[0], png, info, sizeof info) != 0) return ffio_fail(CMD);
    printf("plot: wrote %s (%s)\n", png, info);
    return 0;
}

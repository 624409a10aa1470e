/* Traffic matrices on disk: GPU-by-GPU and server-by-server bytes per step as CSV, each GPU's
 * server, local rank and rail as CSV, and both matrices as heatmaps (an SVG page with axes and a
 * colour legend around a PNG drawn with libpng, log colour scale, white = no traffic). Not here:
 * where the bytes come from (ff_plan_traffic_edges). */
#include <math.h>
#include <png.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"

/* ---- a growing text buffer ---------------------------------------------------------------- */


static int sb_write(ff_strbuf *b, const char *path, FILE *logf, const char *what) {
    int rc = b->failed ? ff_error_set(path, NULL, "out of memory while writing") : ff_write_file_atomic(path, b->p, b->len);
    if (!rc && logf) fprintf(logf, "wrote %s (%s)\n", path, what);
    free(b->p);
    memset(b, 0, sizeof *b);
    return rc;
}

/* ---- accumulating the flows ----------------------------------------------------------------- */

typedef struct acc {
    double *gpu, *srv;
    int64_t wg, ws, domain;
} acc;

static void add_edge(int64_t src, int64_t dst, ff_plan_dim dim, double bytes, void *ctx) {
    (void)dim;
    acc *a = ctx;
    if (src < a->wg && dst < a->wg) a->gpu[src * a->wg + dst] += bytes;
    int64_t s = src / a->domain, d = dst / a->domain;
    if (s < a->ws && d < a->ws) a->srv[s * a->ws + d] += bytes;
}

static void csv_matrix(ff_strbuf *b, const double *m, int64_t n, const char *corner) {
    ff_strbuf_printf(b, "%s", corner);
    for (int64_t j = 0; j < n; j++) ff_strbuf_printf(b, ",%lld", (long long)j);
    ff_strbuf_printf(b, "\n");
    for (int64_t i = 0; i < n; i++) {
        ff_strbuf_printf(b, "%lld", (long long)i);
        for (int64_t j = 0; j < n; j++) ff_strbuf_printf(b, ",%.0f", m[i * n + j]);
        ff_strbuf_printf(b, "\n");
    }
}

/* ---- heatmaps ------------------------------------------------------------------------------- */

/* light (little traffic) to dark (most): yellow, orange, red, purple; white stays for none */
static void colour(double t, unsigned char rgb[3]) {
    static const double stops[5][3] = {{250, 215, 90}, {250, 160, 60}, {235, 95, 45}, {170, 35, 70}, {50, 10, 70}};
    if (t < 0) t = 0;
    if (t > 1) t = 1;
    double x = t * 4.0;
    int i = (int)x;
    if (i >= 4) i = 3;
    double f = x - i;
    for (int k = 0; k < 3; k++) rgb[k] = (unsigned char)lround(stops[i][k] + f * (stops[i + 1][k] - stops[i][k]));
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void sb_base64(ff_strbuf *b, const unsigned char *p, size_t n) {
    char out[5] = {0};
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[0] = b64[v >> 18 & 63], out[1] = b64[v >> 12 & 63];
        out[2] = i + 1 < n ? b64[v >> 6 & 63] : '=';
        out[3] = i + 2 < n ? b64[v & 63] : '=';
        ff_strbuf_printf(b, "%s", out);
    }
}

static void human_bytes(double v, char *buf, size_t cap) {
    static const char *const u[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    int i = 0;
    while (v >= 1000.0 && i < 5) v /= 1000.0, i++;
    snprintf(buf, cap, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, u[i]);
}

/* n x n matrix as an SVG page; group = cells per server block for the grid lines (1: none). */
static int write_heatmap(const char *path, const double *m, int64_t n, int64_t group, const char *title, const char *axis,
                         FILE *logf) {
    double lo = INFINITY, hi = 0;
    for (int64_t i = 0; i < n * n; i++)
        if (m[i] > 0) {
            if (m[i] < lo) lo = m[i];
            if (m[i] > hi) hi = m[i];
        }
    int64_t cell = 640 / n;
    if (cell < 1) cell = 1;
    if (cell > 32) cell = 32;
    int64_t side = n * cell;
    unsigned char *px = ff_malloc((size_t)(side * side * 3));
    if (!px) return -1;
    double span = hi > lo ? log(hi / lo) : 1.0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            unsigned char rgb[3] = {255, 255, 255};
            double v = m[i * n + j];
            if (v > 0) colour(hi > lo ? log(v / lo) / span : 1.0, rgb);
            for (int64_t y = 0; y < cell; y++)
                for (int64_t x = 0; x < cell; x++) {
                    unsigned char *q = px + ((i * cell + y) * side + j * cell + x) * 3;
                    q[0] = rgb[0], q[1] = rgb[1], q[2] = rgb[2];
                    bool edge = group > 1 && cell * group >= 4 &&
                                ((x == 0 && j % group == 0 && j) || (y == 0 && i % group == 0 && i));
                    if (edge && v <= 0) q[0] = q[1] = q[2] = 200; /* server boundaries, on empty cells */
                }
        }
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)side;
    img.height = (png_uint_32)side;
    img.format = PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    if (!png_image_write_to_memory(&img, NULL, &size, 0, px, 0, NULL)) {
        free(px);
        return ff_error_set(path, NULL, "libpng: %s", img.message);
    }
    unsigned char *png = ff_malloc(size);
    if (!png) {
        free(px);
        return -1;
    }
    if (!png_image_write_to_memory(&img, png, &size, 0, px, 0, NULL)) {
        free(px), free(png);
        return ff_error_set(path, NULL, "libpng: %s", img.message);
    }
    free(px);

    int64_t left = 80, top = 60, legend = 170, w = left + side + legend, h = top + side + 60;
    ff_strbuf b = {0};
    ff_strbuf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%lld\" height=\"%lld\" font-family=\"sans-serif\" font-size=\"12\">\n",
              (long long)w, (long long)h);
    ff_strbuf_printf(&b, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    ff_strbuf_printf(&b, "<text x=\"%lld\" y=\"24\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", (long long)left, title);
    ff_strbuf_printf(&b, "<text x=\"%lld\" y=\"44\">row sends to column; bytes per optimizer step, log colour scale; white: none</text>\n",
              (long long)left);
    ff_strbuf_printf(&b, "<image x=\"%lld\" y=\"%lld\" width=\"%lld\" height=\"%lld\" style=\"image-rendering:pixelated\" href=\"data:image/png;base64,",
              (long long)left, (long long)top, (long long)side, (long long)side);
    sb_base64(&b, png, size);
    ff_strbuf_printf(&b, "\"/>\n<rect x=\"%lld\" y=\"%lld\" width=\"%lld\" height=\"%lld\" fill=\"none\" stroke=\"#444\"/>\n", (long long)left,
              (long long)top, (long long)side, (long long)side);
    free(png);
    /* ticks: at most ~16 along each axis, on server boundaries when there are servers */
    int64_t step = group > 1 ? group : 1;
    while (n / step > 16) step *= 2;
    for (int64_t k = 0; k < n; k += step) {
        double pos = (double)(k * cell) + 0.5 * (double)cell;
        ff_strbuf_printf(&b, "<text x=\"%.1f\" y=\"%lld\" text-anchor=\"middle\" font-size=\"10\">%lld</text>\n", (double)left + pos,
                  (long long)(top + side + 14), (long long)k);
        ff_strbuf_printf(&b, "<text x=\"%lld\" y=\"%.1f\" text-anchor=\"end\" font-size=\"10\">%lld</text>\n", (long long)(left - 4),
                  (double)top + pos + 3.0, (long long)k);
    }
    ff_strbuf_printf(&b, "<text x=\"%.1f\" y=\"%lld\" text-anchor=\"middle\">receiving %s</text>\n", (double)left + 0.5 * (double)side,
              (long long)(top + side + 34), axis);
    ff_strbuf_printf(&b, "<text transform=\"translate(%lld,%.1f) rotate(-90)\" text-anchor=\"middle\">sending %s</text>\n", (long long)(left - 44),
              (double)top + 0.5 * (double)side, axis);
    /* legend */
    int64_t lx = left + side + 30, lh = side < 200 ? side : 200;
    if (hi > 0) {
        for (int k = 0; k < 64; k++) {
            unsigned char rgb[3];
            colour(1.0 - (k + 0.5) / 64.0, rgb);
            ff_strbuf_printf(&b, "<rect x=\"%lld\" y=\"%.2f\" width=\"18\" height=\"%.2f\" fill=\"rgb(%d,%d,%d)\"/>\n", (long long)lx,
                      (double)top + (double)lh * k / 64.0, (double)lh / 64.0 + 0.3, rgb[0], rgb[1], rgb[2]);
        }
        for (int k = 0; k <= 4; k++) {
            double frac = k / 4.0, v = hi > lo ? lo * exp(span * (1.0 - frac)) : hi;
            char lab[32];
            human_bytes(v, lab, sizeof lab);
            ff_strbuf_printf(&b, "<text x=\"%lld\" y=\"%.1f\" font-size=\"10\">%s</text>\n", (long long)(lx + 24), (double)top + lh * frac + 4.0,
                      lab);
            if (!(hi > lo)) break;
        }
    } else {
        ff_strbuf_printf(&b, "<text x=\"%lld\" y=\"%lld\">no traffic</text>\n", (long long)lx, (long long)(top + 12));
    }
    ff_strbuf_printf(&b, "<rect x=\"%lld\" y=\"%lld\" width=\"18\" height=\"12\" fill=\"white\" stroke=\"#888\"/>\n", (long long)lx,
              (long long)(top + lh + 14));
    ff_strbuf_printf(&b, "<text x=\"%lld\" y=\"%lld\" font-size=\"10\">0 B</text>\n</svg>\n", (long long)(lx + 24), (long long)(top + lh + 24));
    return sb_write(&b, path, logf, "heatmap");
}

/* ---- public ----------------------------------------------------------------------------------- */

int ff_plan_write_matrices(const ff_plan_input *in_const, const ff_plan_result *r, const char *prefix_arg, int64_t limit, FILE *logf) {
    /* "--matrix out.csv" means the prefix "out" */
    char prefix[3800];
    snprintf(prefix, sizeof prefix, "%s", prefix_arg);
    size_t pl = strlen(prefix);
    if (pl > 4 && (!strcmp(prefix + pl - 4, ".csv") || !strcmp(prefix + pl - 4, ".svg"))) prefix[pl - 4] = '\0';
    ff_plan_input in = *in_const;
    if (ff_plan_resolve(&in)) return -1;
    if (limit < 1) return ff_error_set("--matrix-limit", NULL, "must be at least 1");
    int64_t n = in.cluster.gpus, x = in.cluster.domain, servers = (n + x - 1) / x;
    acc a = {0};
    a.wg = n < limit ? n : limit;
    a.ws = servers < limit ? servers : limit;
    a.domain = x;
    a.gpu = ff_calloc((size_t)(a.wg * a.wg), sizeof(double));
    a.srv = ff_calloc((size_t)(a.ws * a.ws), sizeof(double));
    if (!a.gpu || !a.srv) {
        free(a.gpu), free(a.srv);
        return -1;
    }
    int rc = ff_plan_traffic_edges(&in, r, add_edge, &a);
    char path[FF_PATH_MAX];
    ff_strbuf b = {0};
    if (!rc) {
        csv_matrix(&b, a.gpu, a.wg, "src\\dst");
        snprintf(path, sizeof path, "%s.gpu.csv", prefix);
        rc = sb_write(&b, path, logf, a.wg < n ? "GPU matrix, the first GPUs only (--matrix-limit)" : "GPU matrix");
    }
    if (!rc) {
        csv_matrix(&b, a.srv, a.ws, "src\\dst");
        snprintf(path, sizeof path, "%s.server.csv", prefix);
        rc = sb_write(&b, path, logf, a.ws < servers ? "server matrix, the first servers only" : "server matrix; the diagonal is NVLink traffic");
    }
    if (!rc) {
        ff_strbuf_printf(&b, "rank,server,local_rank,rail,stage,tp,cp,pp,dp,ep\n");
        for (int64_t i = 0; i < n; i++) {
            ff_plan_rank k;
            ff_plan_rank_coords(&in, i, &k);
            ff_strbuf_printf(&b, "%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld\n", (long long)k.rank, (long long)k.server,
                      (long long)k.local_rank, (long long)k.rail, (long long)k.stage, (long long)k.idx[FF_PLAN_TP],
                      (long long)k.idx[FF_PLAN_CP], (long long)k.idx[FF_PLAN_PP], (long long)k.idx[FF_PLAN_DP], (long long)k.idx[FF_PLAN_EP]);
        }
        snprintf(path, sizeof path, "%s.ranks.csv", prefix);
        rc = sb_write(&b, path, logf, "each GPU's server, local rank, rail and coordinates");
    }
    if (!rc) {
        char title[256];
        snprintf(title, sizeof title, "%s: GPU to GPU (%s%lld GPUs, %lld per server)", in.model.name, a.wg < n ? "first " : "",
                 (long long)a.wg, (long long)x);
        snprintf(path, sizeof path, "%s.gpu.svg", prefix);
        rc = write_heatmap(path, a.gpu, a.wg, x, title, "GPU", logf);
    }
    if (!rc) {
        char title[256];
        snprintf(title, sizeof title, "%s: server to server (%s%lld servers)", in.model.name, a.ws < servers ? "first " : "", (long long)a.ws);
        snprintf(path, sizeof path, "%s.server.svg", prefix);
        rc = write_heatmap(path, a.srv, a.ws, 1, title, "server", logf);
    }
    free(a.gpu), free(a.srv);
    return rc;
}

/* `fuseflow plot`: a run's and an sft's metrics.jsonl drawn as a PNG, decoded here with
 * libpng: the picture has the size its layout gives for the panels the file has data for
 * (cli/commands.h FFPLOT_*), each panel's plot area holds coloured pixels (its curves) and
 * dark ones (its title), a panel slot without a metric stays white; a folder without
 * metrics and a file without steps are refused by name. Skipped when fuseflow was built
 * without cairo (it says so). */
#include <png.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli/commands.h"
#include "fuseflow/modelio.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

static const char *ff_bin(void) {
    const char *b = getenv("FF_BIN");
    return b ? b : "build/fuseflow";
}

/* Runs `fuseflow plot args`; its exit status, its output (stdout + stderr) in out. */
static int plot(const char *args, char *out, size_t cap) {
    char cmd[FF_PATH_MAX * 2];
    snprintf(cmd, sizeof cmd, "'%s' plot %s 2>&1", ff_bin(), args);
    FILE *p = popen(cmd, "r");
    REQUIRE(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_text(const char *path, const char *text) {
    DIE_IF(ff_write_file_atomic(path, text, strlen(text)) != 0);
}

typedef struct image {
    int w, h;
    uint8_t *rgb; /* [h][w][3] */
} image;

static image load_png(const char *path) {
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    REQUIRE(png_image_begin_read_from_file(&im, path));
    im.format = PNG_FORMAT_RGB;
    image r = {(int)im.width, (int)im.height, malloc(PNG_IMAGE_SIZE(im))};
    REQUIRE(r.rgb && png_image_finish_read(&im, NULL, r.rgb, 0, NULL));
    return r;
}

/* Pixels in [x0, x1) x [y0, y1) that are coloured (a curve: channels far apart) and dark
 * (text, frame). */
static void count(const image *im, int x0, int y0, int x1, int y1, int *colour, int *dark) {
    *colour = *dark = 0;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) {
            const uint8_t *p = im->rgb + ((size_t)y * (size_t)im->w + (size_t)x) * 3;
            int mx = p[0] > p[1] ? (p[0] > p[2] ? p[0] : p[2]) : (p[1] > p[2] ? p[1] : p[2]);
            int mn = p[0] < p[1] ? (p[0] < p[2] ? p[0] : p[2]) : (p[1] < p[2] ? p[1] : p[2]);
            *colour += mx - mn > 60;
            *dark += mx < 110;
        }
}

/* A picture of n panels: its size, and panel by panel curves and a title. */
static void check_picture(const char *png, int n) {
    image im = load_png(png);
    int cols = n < FFPLOT_COLS ? n : FFPLOT_COLS, rows = (n + cols - 1) / cols;
    CHECK_EQ_INT(im.w, cols * FFPLOT_PANEL_W);
    CHECK_EQ_INT(im.h, FFPLOT_HEADER_H + rows * FFPLOT_PANEL_H);
    REQUIRE(im.w == cols * FFPLOT_PANEL_W && im.h == FFPLOT_HEADER_H + rows * FFPLOT_PANEL_H);
    int colour, dark;
    count(&im, 0, 0, im.w, FFPLOT_HEADER_H, &colour, &dark);
    CHECK(dark > 100); /* the picture's title */
    for (int i = 0; i < rows * cols; i++) {
        int px = (i % cols) * FFPLOT_PANEL_W, py = FFPLOT_HEADER_H + (i / cols) * FFPLOT_PANEL_H;
        count(&im, px + FFPLOT_MARGIN_L + 2, py + FFPLOT_MARGIN_T + 2, px + FFPLOT_PANEL_W - FFPLOT_MARGIN_R - 2,
              py + FFPLOT_PANEL_H - FFPLOT_MARGIN_B - 2, &colour, &dark);
        int tc, td;
        count(&im, px, py, px + FFPLOT_PANEL_W, py + FFPLOT_MARGIN_T - 4, &tc, &td);
        if (i < n) {
            if (colour < 100 || td < 50) fprintf(stderr, "panel %d: %d coloured pixels, %d dark in its title\n", i, colour, td);
            CHECK(colour >= 100); /* a curve */
            CHECK(td >= 50);      /* a title */
        } else {
            CHECK_EQ_INT(colour + dark + tc + td, 0); /* an empty slot of the last row */
        }
    }
    free(im.rgb);
}

int main(void) {
    char root[] = "/tmp/ff_plot_XXXXXX", out[8192], path[FF_PATH_MAX], args[FF_PATH_MAX * 2];
    REQUIRE(mkdtemp(root));
    snprintf(args, sizeof args, "%s", root);
    CHECK_EQ_INT(plot(args, out, sizeof out), 1); /* no metrics.jsonl: said before anything needs cairo */
    CHECK_STR_CONTAINS(out, "metrics.jsonl");

    /* a run: every panel but loss */
    ff_strbuf m = {0};
    for (int it = 0; it <= 30; it++) {
        if (it == 0 || it % 10 == 0) ff_strbuf_printf(&m, "{\"iteration\": %d, \"eval_acc\": %.3f}\n", it, 0.3 + 0.02 * it);
        if (it == 0) continue;
        ff_strbuf_printf(&m,
                         "{\"iteration\": %d, \"samples\": 64, \"reward_mean\": %.3f, \"acc\": %.3f, \"response_length\": %.1f, \"kl\": %.5f,"
                         " \"entropy\": %.3f, \"lr\": 1e-5, \"grad_norm\": %.2f, \"time\": {\"iteration\": %.2f, \"rollout\": %.2f,"
                         " \"actor_train\": %.2f, \"gen_tokens_per_s\": %.0f, \"tokens_per_s\": %.0f}, \"memory\": [1, 2]}\n",
                         it, 0.2 + 0.02 * it, 0.2 + 0.02 * it, 4.0 - 0.03 * it, 0.001 * it, 0.9 - 0.01 * it, 1.0 + 0.1 * (it % 3), 1.5 + 0.01 * it,
                         0.8, 0.5, 4000.0 + it, 2500.0 + it);
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", root);
    write_text(path, m.p);
    int rc = plot(args, out, sizeof out);
    if (rc == 1 && strstr(out, "built without cairo")) {
        ff_remove_tree(root);
        SKIP("fuseflow was built without cairo (install libcairo2-dev and rebuild); it says so: %s", out);
    }
    CHECK_EQ_INT(rc, 0);
    CHECK_STR_CONTAINS(out, "9 panels: Reward (mean score), Accuracy, KL");
    snprintf(path, sizeof path, "%s/curves.png", root);
    check_picture(path, 9);

    /* sft: loss and exact match, to another file (--out) */
    m.len = 0;
    m.p[0] = '\0';
    for (int s = 1; s <= 50; s++) {
        ff_strbuf_printf(&m, "{\"step\": %d, \"loss\": %.4f, \"tokens\": 900}\n", s, 3.0 / s);
        if (s % 10 == 0) ff_strbuf_printf(&m, "{\"step\": %d, \"eval_loss\": %.4f, \"exact_match\": %.2f}\n", s, 3.5 / s, 0.01 * s);
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", root);
    write_text(path, m.p);
    snprintf(args, sizeof args, "%s --out %s/sft.png", root, root);
    CHECK_EQ_INT(plot(args, out, sizeof out), 0);
    CHECK_STR_CONTAINS(out, "2 panels: Accuracy, Loss");
    snprintf(path, sizeof path, "%s/sft.png", root);
    check_picture(path, 2);

    /* lines without a step: nothing to draw */
    snprintf(path, sizeof path, "%s/metrics.jsonl", root);
    write_text(path, "{\"loss\": 1}\nnot json\n");
    snprintf(args, sizeof args, "%s", root);
    CHECK_EQ_INT(plot(args, out, sizeof out), 1);
    CHECK_STR_CONTAINS(out, "no metrics to draw");
    CHECK_EQ_INT(plot("", out, sizeof out), 2);
    CHECK_STR_CONTAINS(out, "give one run folder");

    free(m.p);
    ff_remove_tree(root);
    TEST_MAIN_END();
}

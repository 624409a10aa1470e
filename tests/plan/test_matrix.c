/* Traffic matrices on disk: the GPU and server CSVs add up to the bytes the plan reports, the
 * ranks file gives each GPU's server, local rank and rail, the heatmaps are SVG pages around a
 * PNG, a limit draws the first GPUs only, and an unwritable place is a clear error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuseflow/error.h"
#include "fuseflow/plan.h"
#include "fuseflow/util.h"
#include "tests/test_util.h"

/* n x n matrix from a CSV with a header row and a label column */
static double *read_csv_matrix(const char *path, int64_t *n_out) {
    size_t len;
    char *text = ff_read_file(path, &len);
    REQUIRE(text);
    int64_t n = 0;
    char *line = strchr(text, '\n');
    REQUIRE(line);
    for (char *p = text; p < line; p++) n += *p == ',';
    double *m = calloc((size_t)(n * n), sizeof(double));
    REQUIRE(m);
    char *p = line + 1;
    for (int64_t i = 0; i < n; i++) {
        char *end;
        long long row = strtoll(p, &end, 10);
        REQUIRE(row == i);
        p = end;
        for (int64_t j = 0; j < n; j++) {
            REQUIRE(*p == ',');
            m[i * n + j] = strtod(p + 1, &end);
            p = end;
        }
        REQUIRE(*p == '\n');
        p++;
    }
    free(text);
    *n_out = n;
    return m;
}

int main(void) {
    char dir[] = "/tmp/ff_plan_matrix_XXXXXX";
    REQUIRE(mkdtemp(dir));
    char prefix[256], path[320];
    snprintf(prefix, sizeof prefix, "%s/gpt3", dir);

    ff_plan_input in;
    ff_plan_input_defaults(&in);
    REQUIRE(ff_plan_model_preset("gpt3-175b", &in.model) == 0);
    in.cluster.gpus = 128;
    in.layout.tp = 8, in.layout.pp = 4;
    in.workload.seq = 2048, in.workload.micro_batches = 16;
    ff_plan_result r;
    REQUIRE(ff_plan_evaluate(&in, &r) == 0);
    FILE *devnull = fopen("/dev/null", "w");
    REQUIRE(ff_plan_write_matrices(&in, &r, prefix, 1024, devnull) == 0);

    /* GPU matrix: each row sends what its stage sends */
    int64_t n;
    snprintf(path, sizeof path, "%s.gpu.csv", prefix);
    double *g = read_csv_matrix(path, &n);
    CHECK_EQ_INT(n, 128);
    for (int64_t i = 0; i < n; i++) {
        ff_plan_rank k;
        ff_plan_rank_coords(&in, i, &k);
        double row = 0, want = 0;
        for (int64_t j = 0; j < n; j++) row += g[i * n + j];
        for (int d = 0; d < FF_PLAN_NDIMS; d++) want += r.stages[k.stage].traffic[d];
        CHECK_CLOSE(row, want, 128.0, 1e-9); /* the CSV rounds each cell to a byte */
        CHECK(g[i * n + i] == 0);
    }
    /* server matrix: the diagonal is NVLink, the rest what the servers' NICs send */
    double *s = NULL;
    int64_t ns;
    snprintf(path, sizeof path, "%s.server.csv", prefix);
    s = read_csv_matrix(path, &ns);
    CHECK_EQ_INT(ns, 16);
    for (int64_t i = 0; i < ns; i++) {
        double off = 0, nic = 0, nv = 0;
        for (int64_t j = 0; j < ns; j++)
            if (j != i) off += s[i * ns + j];
        for (int64_t q = i * 8; q < i * 8 + 8; q++) {
            ff_plan_rank k;
            ff_plan_rank_coords(&in, q, &k);
            nic += r.stages[k.stage].nic_bytes;
            nv += r.stages[k.stage].nvlink_bytes;
        }
        CHECK_CLOSE(off, nic, 16.0 * 8, 1e-9);
        CHECK_CLOSE(s[i * ns + i], nv, 8.0, 1e-9);
    }
    free(g);
    free(s);

    /* ranks: server, local rank, rail */
    snprintf(path, sizeof path, "%s.ranks.csv", prefix);
    size_t len;
    char *text = ff_read_file(path, &len);
    REQUIRE(text);
    const char *header = "rank,server,local_rank,rail,stage,tp,cp,pp,dp,ep\n";
    CHECK(!strncmp(text, header, strlen(header)));
    int lines = 0;
    for (char *p = text; *p; p++) lines += *p == '\n';
    CHECK_EQ_INT(lines, 129);
    CHECK_STR_CONTAINS(text, "\n13,1,5,5,1,5,0,1,0,0\n"); /* rank 13 = tp 5 + 8 pp 1: server 1, local rank and rail 5 */
    free(text);

    /* heatmaps: an SVG page with a PNG inside (its signature in base64) */
    const char *svgs[2] = {"gpu", "server"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s.%s.svg", prefix, svgs[i]);
        text = ff_read_file(path, &len);
        REQUIRE(text);
        CHECK(!strncmp(text, "<svg", 4));
        CHECK_STR_CONTAINS(text, "data:image/png;base64,iVBORw0KGgo");
        CHECK_STR_CONTAINS(text, "</svg>");
        free(text);
    }

    /* the first 16 GPUs only */
    REQUIRE(ff_plan_write_matrices(&in, &r, prefix, 16, devnull) == 0);
    snprintf(path, sizeof path, "%s.gpu.csv", prefix);
    g = read_csv_matrix(path, &n);
    CHECK_EQ_INT(n, 16);
    free(g);

    /* an unwritable place */
    CHECK(ff_plan_write_matrices(&in, &r, "/nonexistent-dir/x", 16, devnull) != 0);
    CHECK_STR_CONTAINS(ff_error_message(), "/nonexistent-dir/x.gpu.csv");
    CHECK(ff_plan_write_matrices(&in, &r, prefix, 0, devnull) != 0);
    fclose(devnull);
    ff_plan_result_clear(&r);

    const char *files[] = {"gpu.csv", "server.csv", "ranks.csv", "gpu.svg", "server.svg"};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s.%s", prefix, files[i]);
        unlink(path);
    }
    rmdir(dir);
    TEST_MAIN_END();
}

/* `fuseflow devices`: what this machine offers a worker started here, before a run: its cores,
 * the GPUs the CUDA driver lists (CUDA_VISIBLE_DEVICES applied, the order `fuseflow run` places
 * workers in), what the cuda backend makes of each (its memory, what is free there now, the
 * precision of its products), and whether NCCL's collectives can run. It opens every GPU it
 * lists (a CUDA context each, for a moment). It chooses nothing: `fuseflow run` places. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/commands.h"
#include "fuseflow/backend.h"
#include "fuseflow/coll.h"
#include "fuseflow/error.h"
#include "fuseflow/util.h"
#include "fuseflow/worker.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: fuseflow devices [--json]\n\n"
            "What a worker started on this machine would see: its cores (those its affinity allows),\n"
            "the GPUs the CUDA driver lists (CUDA_VISIBLE_DEVICES applied; `fuseflow run` gives rank r\n"
            "cuda:r in this order), and for each what the cuda backend makes of it: its memory, what is\n"
            "free there now (other processes and CUDA contexts hold the rest; nvidia-smi lists them)\n"
            "and whether its matrix products are bf16 (FF_CUDA_MATH). Last, whether NCCL's\n"
            "collectives can run here. Opens each GPU for a moment. Exit 0 once it could say, GPUs or not.\n\n"
            "  --json   the same as one JSON object: cores, cpus, gpus [{index, name, backend,\n"
            "           capacity_bytes, free_bytes, bf16_products} or {index, name, error}], no_gpu (why,\n"
            "           where there is none), cuda_backend (its words where it cannot open a GPU), nccl\n"
            "           {available, why}\n");
}

/* One GPU as the cuda backend opens it: the JSON row, and its line on out (NULL: none). */
static json_t *gpu_row(int i, const char *name, FILE *out) {
    char be_name[32], a[32], b[32];
    snprintf(be_name, sizeof be_name, "cuda:%d", i);
    json_t *row = json_pack("{s:i, s:s}", "index", i, "name", name);
    ff_backend *be = ff_backend_new(be_name);
    if (!be) {
        json_object_set_new(row, "error", json_string(ff_error_message()));
        if (out) fprintf(out, "%-8s %s: the cuda backend cannot open it: %s\n", be_name, name, ff_error_message());
        return row;
    }
    ff_backend_memory m;
    ff_backend_memory_of(be, &m);
    const int64_t free_now = ff_backend_device_free(be);
    const bool b16 = ff_backend_bf16_products(be);
    json_object_set_new(row, "backend", json_string(ff_backend_name(be)));
    json_object_set_new(row, "capacity_bytes", json_integer((json_int_t)m.capacity));
    json_object_set_new(row, "free_bytes", json_integer((json_int_t)free_now));
    json_object_set_new(row, "bf16_products", json_boolean(b16));
    if (out)
        fprintf(out, "%-8s %s: %s, %s free; %s products\n", ff_backend_name(be), name, ff_fmt_bytes((uint64_t)m.capacity, a, sizeof a),
                free_now >= 0 ? ff_fmt_bytes((uint64_t)free_now, b, sizeof b) : "unknown", b16 ? "bf16" : "fp32 (FF_CUDA_MATH)");
    ff_backend_destroy(&be);
    return row;
}

int ff_cmd_devices(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = true;
            continue;
        }
        fprintf(stderr, "fuseflow devices: unknown option %s (see fuseflow devices --help)\n", argv[i]);
        return 2;
    }
    ff_devices d;
    char why[256], seen[256];
    ff_devices_probe(&d, why, sizeof why);
    ff_devices_describe(&d, seen, sizeof seen);
    FILE *out = json ? NULL : stdout;
    json_t *o = json_pack("{s:i, s:i, s:[]}", "cores", (int)d.cores, "cpus", (int)d.cpus, "gpus");
    if (!o) {
        fprintf(stderr, "fuseflow devices: out of memory\n");
        return 1;
    }
    if (out) fprintf(out, "machine: %s%s%s%s\n", seen, why[0] ? " (" : "", why, why[0] ? ")" : "");
    if (why[0]) json_object_set_new(o, "no_gpu", json_string(why));
    json_t *gpus = json_object_get(o, "gpus");
    for (int i = 0; i < d.ngpus; i++) json_array_append_new(gpus, gpu_row(i, d.gpus[i], out));
    if (d.ngpus == 0) { /* the backend's own words: not built in, or no device */
        ff_backend *be = ff_backend_new("cuda");
        const char *msg = be ? "opens a device the driver does not list" : ff_error_message();
        json_object_set_new(o, "cuda_backend", json_string(msg));
        if (out) fprintf(out, "%s%s\n", strncmp(msg, "cuda backend", 12) ? "cuda backend: " : "", msg);
        ff_backend_destroy(&be);
    }
    const char *nwhy = NULL;
    const bool nccl = ff_coll_backend_available("nccl", &nwhy);
    json_object_set_new(o, "nccl", json_pack("{s:b, s:s}", "available", nccl, "why", nccl || !nwhy ? "" : nwhy));
    if (out) fprintf(out, "nccl: %s%s\n", nccl ? "available" : "unavailable: ", nccl || !nwhy ? "" : nwhy);
    if (json) {
        char *text = json_dumps(o, JSON_COMPACT);
        if (text) puts(text);
        free(text);
    }
    json_decref(o);
    return 0;
}

/* libFuzzer target for the wire decoder (ff_msg_decode).
 *
 * Input layout: byte 0 picks the number of frames (1 to 4); then each frame but the last is
 * a 2-byte little-endian length and its bytes; the last frame takes what is left. Whatever
 * decodes must pack again and decode to the same type: the packer and the decoder agree on
 * every message the decoder accepts. The decoder's frame limit is small (4 KiB) so the
 * oversized path is reachable. */
#include <stdint.h>
#include <string.h>

#include "fuseflow/msgs.h"

static char repack[FF_MSG_MAX_HEADER];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ff_msg_decoder *d;
    if (!d) d = ff_msg_decoder_new(4096);
    if (size < 1) return 0;
    int nframes = data[0] % 4 + 1;
    data++;
    size--;
    ff_frame fr[4];
    for (int i = 0; i < nframes; i++) {
        size_t len = size;
        if (i + 1 < nframes) {
            if (size < 2) return 0;
            len = (size_t)data[0] | (size_t)data[1] << 8;
            data += 2;
            size -= 2;
            if (len > size) len = size;
        }
        fr[i].data = data;
        fr[i].len = len;
        data += len;
        size -= len;
    }
    ff_msg m, again;
    ff_msg_init(&m);
    ff_msg_init(&again);
    if (ff_msg_decode(d, &m, fr, nframes, NULL) == 0) {
        if (m.type == FF_MSG_SUBTASK) {
            int64_t i;
            double f;
            const char *p;
            size_t n;
            (void)ff_msg_arg_int(&m.u.subtask, "n", &i);
            (void)ff_msg_arg_float(&m.u.subtask, "alpha", &f);
            (void)ff_msg_arg_str(&m.u.subtask, "mode", &p, &n);
        }
        for (int i = 0; i < m.ntensors; i++) {
            /* touch every byte the decoder vouched for */
            volatile uint8_t sink = 0;
            for (size_t b = 0; b < m.tensors[i].nbytes; b++) sink ^= ((const uint8_t *)m.tensors[i].data)[b];
            (void)sink;
        }
        long n = ff_msg_pack(&m, repack, sizeof repack);
        if (n < 0) __builtin_trap(); /* accepted but cannot be re-sent: packer and decoder disagree */
        ff_frame fr2[4];
        fr2[0].data = repack;
        fr2[0].len = (size_t)n;
        for (int i = 0; i < m.ntensors; i++) {
            fr2[i + 1].data = m.tensors[i].data;
            fr2[i + 1].len = m.tensors[i].nbytes;
        }
        if (ff_msg_decode(d, &again, fr2, m.ntensors + 1, NULL) != 0 || again.type != m.type) __builtin_trap();
    }
    ff_msg_free(&m);
    ff_msg_free(&again);
    return 0;
}

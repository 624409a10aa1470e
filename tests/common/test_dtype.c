/* dtype conversions: exact round trips of representable values, rounding to nearest even,
 * subnormals, infinities and NaN, against values worked out by hand (and numpy's float16). */
#include "fuseflow/dtype.h"
#include "tests/test_util.h"

int main(void) {
    ff_dtype t;
    CHECK_EQ_INT(ff_dtype_parse("BF16", &t), 0);
    CHECK_EQ_INT(t, FF_DTYPE_BF16);
    CHECK_EQ_INT(ff_dtype_parse("Q4", &t), -1);
    CHECK_EQ_INT(ff_dtype_size(FF_DTYPE_I64), 8);

    /* bf16: 1.0 = 0x3f80; 1 + 2^-8 lies halfway between 0x3f80 and 0x3f81 -> even 0x3f80 */
    CHECK_EQ_INT(ff_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(ff_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    CHECK_EQ_INT(ff_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CHECK_EQ_INT(ff_f32_to_bf16(-2.0f), 0xc000);
    CHECK(ff_bf16_to_f32(0x3f81) == 1.0f + 0x1p-7f);
    CHECK(isnan(ff_bf16_to_f32(ff_f32_to_bf16(NAN))));

    /* f16: 1.0 = 0x3c00, 65504 = 0x7bff, smallest subnormal 2^-24 = 0x0001 */
    CHECK_EQ_INT(ff_f16_from_f32(1.0f), 0x3c00);
    CHECK_EQ_INT(ff_f16_from_f32(65504.0f), 0x7bff);
    CHECK_EQ_INT(ff_f16_from_f32(65520.0f), 0x7c00); /* rounds to inf */
    CHECK_EQ_INT(ff_f16_from_f32(0x1p-24f), 0x0001);
    CHECK_EQ_INT(ff_f16_from_f32(-0.0f), 0x8000);
    CHECK_EQ_INT(ff_f16_from_f32(1.0f + 0x1p-11f), 0x3c00); /* halfway, to even */
    CHECK_EQ_INT(ff_f16_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);
    CHECK(ff_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(ff_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(ff_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(ff_f16_to_f32(ff_f16_from_f32(NAN))));
    /* every finite f16 survives f16 -> f32 -> f16 */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        if (ff_f16_from_f32(ff_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7f80) == 0x7f80) continue;
        if (ff_f32_to_bf16(ff_bf16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);

    float src[3] = {0.5f, -3.25f, 1e-3f}, back[3];
    uint16_t half[3];
    CHECK_EQ_INT(ff_dtype_from_f32(FF_DTYPE_BF16, src, half, 3), 0);
    CHECK_EQ_INT(ff_dtype_to_f32(FF_DTYPE_BF16, half, back, 3), 0);
    CHECK(back[0] == 0.5f && back[1] == -3.25f);
    CHECK_CLOSE(back[2], 1e-3, 0, 4e-3);
    int64_t ints[2] = {7, -9};
    CHECK_EQ_INT(ff_dtype_to_f32(FF_DTYPE_I64, ints, back, 2), 0);
    CHECK(back[0] == 7.0f && back[1] == -9.0f);
    CHECK_EQ_INT(ff_dtype_from_f32(FF_DTYPE_I32, src, ints, 1), -1);
    TEST_MAIN_END();
}

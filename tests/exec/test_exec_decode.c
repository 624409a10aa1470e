/* The run's decoding of responses (controller/rl/exec_data.c, ex_decode): a model whose
 * vocabulary is padded past its tokenizer's (vocab_size 260 beside the byte tokenizer's 259
 * ids, so that TP 2 divides it) may sample an id no token has; it decodes to nothing, as
 * Hugging Face's tokenizers decode it, instead of stopping the run (the tokenizer's own
 * decode refuses such an id). */
#include <stdlib.h>
#include <string.h>

#include "controller/rl/exec_internal.h"
#include "fuseflow/tokenizer.h"
#include "tests/test_util.h"

int main(void) {
    ff_tokenizer *t = ff_tokenizer_new_bytes();
    REQUIRE(t);
    const int32_t ids[] = {'1', 259, '2', FF_BYTES_EOS, 1000, -1};
    char *text = NULL;
    size_t len = 0;
    REQUIRE(ex_decode(t, ids, 6, &text, &len) == 0);
    CHECK_EQ_INT(len, 2);
    CHECK(text && !strcmp(text, "12"));
    free(text);
    CHECK(ff_tokenizer_decode(t, ids, 6, true, &text, &len) == -1); /* the strict decode it wraps */
    REQUIRE(ex_decode(t, ids + 1, 0, &text, &len) == 0);
    CHECK_EQ_INT(len, 0);
    free(text);
    ff_tokenizer_destroy(&t);
    TEST_MAIN_END();
}

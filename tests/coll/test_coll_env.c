/* ff_coll_nccl_env: NCCL across hosts takes its interface from FF_COLL_IFNAME, as the cpu
 * backend does, unless NCCL_SOCKET_IFNAME is given; nothing set without FF_COLL_IFNAME. (The
 * NCCL communicators themselves need GPUs: tests/coll/test_coll_nccl.c.) */
#include <stdlib.h>
#include <string.h>

#include "fuseflow/coll.h"
#include "tests/test_util.h"

int main(void) {
    unsetenv("NCCL_SOCKET_IFNAME");
    unsetenv("FF_COLL_IFNAME");
    CHECK(ff_coll_nccl_env() == NULL);
    CHECK(getenv("NCCL_SOCKET_IFNAME") == NULL);
    setenv("FF_COLL_IFNAME", "", 1); /* empty: as unset */
    CHECK(ff_coll_nccl_env() == NULL);
    CHECK(getenv("NCCL_SOCKET_IFNAME") == NULL);

    setenv("FF_COLL_IFNAME", "ens5f0", 1);
    const char *set = ff_coll_nccl_env();
    CHECK(set && !strcmp(set, "ens5f0"));
    CHECK(getenv("NCCL_SOCKET_IFNAME") && !strcmp(getenv("NCCL_SOCKET_IFNAME"), "ens5f0"));

    setenv("NCCL_SOCKET_IFNAME", "ib0", 1); /* the site's own choice stays */
    CHECK(ff_coll_nccl_env() == NULL);
    CHECK(!strcmp(getenv("NCCL_SOCKET_IFNAME"), "ib0"));
    TEST_MAIN_END();
}

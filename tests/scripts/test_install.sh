#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then, against the installed tree only (copies
# of the sources in a folder outside the checkout; include and link flags from the installed
# pkg-config file, or from find_package(fuseflow) in a CMake project): the example plugin
# and examples/embed.c build, and the program runs, checking a GRPO graph with the plugin's
# estimator. The installed tree must hold the headers, libfuseflow.so (with its soname), the
# `fuseflow` command, fuseflow.pc and the CMake package, and nothing in the flags or the
# programs may point into the checkout or the build folder.
set -uo pipefail
SRC=${FF_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=${FF_BUILD_DIR:-$SRC/build}
SRC=$(realpath "$SRC") BUILD=$(realpath "$BUILD")
TMP=$(mktemp -d /tmp/ff_install_test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
FAILS=0
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }
P=$TMP/prefix

cmake --install "$BUILD" --prefix "$P" > "$TMP/install.log" 2>&1 || { fail "cmake --install: $(tail -5 "$TMP/install.log")"; exit 1; }
missing=
for f in include/fuseflow/fuseflow.h include/fuseflow/plugin.h include/fuseflow/tfevents.h lib/libfuseflow.so lib/libfuseflow.so.0 \
         bin/fuseflow lib/pkgconfig/fuseflow.pc lib/cmake/fuseflow/fuseflowConfig.cmake lib/cmake/fuseflow/fuseflowConfigVersion.cmake; do
  [[ -e "$P/$f" ]] || missing+=" $f"
done
[[ -z "$missing" ]] && ok "installed: headers, libfuseflow.so, fuseflow, fuseflow.pc, the CMake package" || fail "not installed:$missing"
n_src=$(ls "$SRC"/include/fuseflow/*.h | wc -l)
n_inst=$(ls "$P"/include/fuseflow/*.h | wc -l)
[[ $n_src == "$n_inst" ]] && ok "all $n_src public headers" || fail "$n_inst of $n_src headers installed"
"$P/bin/fuseflow" --version | grep -q "^fuseflow " && ok "the installed command runs" || fail "installed fuseflow --version"

# sources copied away from the checkout: only the installed tree can supply fuseflow's headers
mkdir -p "$TMP/work"
cp "$SRC/examples/embed.c" "$SRC/examples/plugins/example_plugin.c" "$TMP/work/"
cd "$TMP/work"
san=()
[[ -n "${FF_SANITIZED:-}" ]] && san=(-fsanitize=address,undefined) # libfuseflow.so of a sanitized build needs its runtime

# 1. pkg-config
export PKG_CONFIG_PATH=$P/lib/pkgconfig
flags=$(pkg-config --cflags --libs fuseflow 2>&1) || fail "pkg-config fuseflow: $flags"
case "$flags" in *"$SRC"* | *"$BUILD"*) fail "pkg-config flags point into the checkout: $flags" ;; *) ok "pkg-config: $flags" ;; esac
[[ $(pkg-config --modversion fuseflow) == $("$P/bin/fuseflow" --version | awk '{print $2}') ]] && ok "pkg-config version" || fail "pkg-config version"
if cc -std=c11 -Wall -Wextra -Werror -O1 "${san[@]}" -shared -fPIC $(pkg-config --cflags fuseflow) -o plugin.so example_plugin.c 2> cc1.err; then
  ok "the example plugin builds against the install"
else fail "the plugin: $(head -c 600 cc1.err)"; fi
if cc -std=c11 -Wall -Wextra -Werror -O1 "${san[@]}" embed.c $flags -Wl,-rpath,"$P/lib" -o embed 2> cc2.err; then
  ok "examples/embed.c builds against the install (pkg-config)"
else fail "embed (pkg-config): $(head -c 600 cc2.err)"; fi
./embed "$PWD/plugin.so" > run1.out 2>&1 && grep -q "advantage estimator group_median: .*($PWD/plugin.so)" run1.out &&
  grep -q "graph ok: 6 nodes" run1.out && ok "embed runs with the plugin" || fail "embed with the plugin: $(head -c 600 run1.out)"
lib=$(ldd ./embed | awk '/libfuseflow/ {print $3}')
[[ "$lib" == "$P/lib/libfuseflow.so.0" ]] && ok "embed loads the installed libfuseflow.so.0" || fail "embed loads '$lib'"

# 2. CMake: find_package(fuseflow) and fuseflow::fuseflow
mkdir -p cm
cat > cm/CMakeLists.txt <<'CM'
cmake_minimum_required(VERSION 3.22)
project(embed_fuseflow LANGUAGES C)
find_package(fuseflow 0.1 REQUIRED)
add_executable(embed ../embed.c)
target_link_libraries(embed PRIVATE fuseflow::fuseflow)
target_compile_options(embed PRIVATE -Wall -Wextra -Werror ${SAN})
target_link_options(embed PRIVATE ${SAN})
CM
if cmake -S cm -B cm/build -DCMAKE_PREFIX_PATH="$P" -DSAN="${san[*]}" > cm.log 2>&1 && cmake --build cm/build >> cm.log 2>&1; then
  ok "examples/embed.c builds with find_package(fuseflow)"
else fail "the CMake project: $(tail -n 15 cm.log)"; fi
grep -rqs -- "$SRC/include\|$BUILD" cm/build/CMakeFiles/embed.dir/flags.make cm/build/CMakeFiles/embed.dir/link.txt &&
  fail "the CMake build points into the checkout: $(cat cm/build/CMakeFiles/embed.dir/flags.make)" || ok "the CMake flags name only the install"
./cm/build/embed "$PWD/plugin.so" > run2.out 2>&1 && grep -q "group_median" run2.out && ok "the CMake-built embed runs" ||
  fail "the CMake-built embed: $(head -c 600 run2.out)"

if ((FAILS)); then echo "$FAILS check(s) failed"; exit 1; fi
echo "all checks passed"

#!/usr/bin/env bash
# scripts/gpu-deps.sh [DIR]: pack what fuseflow builds on (ZeroMQ, msgpack-c, libev, OpenBLAS,
# jansson, libyaml, PCRE2, utf8proc, libpng: headers, pkg-config files, shared libraries and
# the libraries those load; pkg-config itself) from this machine into DIR (default .gpu-deps, which .gitignore
# keeps out of git), for a GPU machine that has CUDA, CMake and PyTorch but none of these and
# no package registry. scripts/gpu-check.sh finds DIR there and builds against it
# (pkg-config with DIR as its sysroot, the binaries with DIR's libraries on their rpath).
# Run it here on a Debian/Ubuntu x86-64 machine with the -dev packages installed, then carry
# DIR with the device run (carry: [".gpu-deps"]). glibc, libstdc++, libgcc_s, libgomp and
# zlib stay out: the GPU machine has its own, and older copies would shadow them.
set -euo pipefail
cd "$(dirname "$0")/.."
D=$(realpath -m "${1:-.gpu-deps}")
ARCH=x86_64-linux-gnu
rm -rf "$D"
mkdir -p "$D/pkgconfig" "$D/usr/include" "$D/usr/lib/$ARCH"

# headers: everything under /usr/include that the -dev packages own (symlinks resolved)
for p in libzmq3-dev libmsgpack-dev libjansson-dev libyaml-dev libpcre2-dev libev-dev libutf8proc-dev libpng-dev \
  libopenblas-dev libopenblas-pthread-dev libsodium-dev; do
  dpkg -L "$p" >/dev/null 2>&1 || { echo "gpu-deps: package $p is not installed here (apt-get install -y $p)" >&2; exit 1; }
  for f in $(dpkg -L "$p" | grep '^/usr/include/' || true); do
    if [[ -f "$f" ]]; then
      mkdir -p "$D$(dirname "$f")"
      cp -L "$f" "$D$f"
    fi
  done
done
cp -L /usr/include/$ARCH/cblas.h "$D/usr/include/$ARCH/cblas.h" 2>/dev/null || true

# pkg-config files: our modules and everything they require, privately too (pkg-config
# checks that those exist), symlinks resolved
declare -A seen=()
queue=(libzmq msgpack jansson yaml-0.1 libpcre2-8 openblas)
while ((${#queue[@]})); do
  m=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n "${seen[$m]:-}" ]] && continue
  seen[$m]=1
  pc="$(pkg-config --variable=pcfiledir "$m")/$m.pc"
  [[ -f "$pc" ]] || { echo "gpu-deps: no $m.pc here" >&2; exit 1; }
  cp -L "$pc" "$D/pkgconfig/$m.pc"
  # CMake checks that an imported target's include folders exist; the private requirements'
  # headers themselves are not needed (zmq.h includes none of them)
  for inc in $(pkg-config --cflags-only-I "$m" | tr ' ' '\n' | sed -n 's/^-I//p; s/^-isystem//p'); do mkdir -p "$D$inc"; done
  for inc in $(pkg-config --cflags "$m" | tr ' ' '\n' | grep '^/' || true); do mkdir -p "$D$inc"; done
  for r in $(pkg-config --print-requires --print-requires-private "$m" | awk '{print $1}'); do queue+=("$r"); done
done

# libraries: the link-time names (libX.so) and their sonames, then every library they load
# that is not one of the machine's own
keep_out='^(libc|libm|libdl|librt|libpthread|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libgomp|libz|linux-vdso)\.so'
copy_lib() { # copy_lib PATH: PATH's real file under its soname (and nothing if kept out)
  local f=$1 so
  so=$(objdump -p "$f" 2>/dev/null | awk '/SONAME/ {print $2}')
  [[ -n "$so" ]] || so=$(basename "$f")
  [[ "$so" =~ $keep_out ]] && return 0
  [[ -f "$D/usr/lib/$ARCH/$so" ]] && return 0
  cp -L "$f" "$D/usr/lib/$ARCH/$so"
  local dep
  for dep in $(ldd "$f" | awk '$3 ~ /^\// {print $3}'); do copy_lib "$dep"; done
}
for l in zmq msgpackc jansson yaml pcre2-8 ev utf8proc png16 sodium; do
  f=/usr/lib/$ARCH/lib$l.so
  [[ -e "$f" ]] || { echo "gpu-deps: no $f here" >&2; exit 1; }
  copy_lib "$f"
  so=$(objdump -p "$f" | awk '/SONAME/ {print $2}')
  ln -sf "$so" "$D/usr/lib/$ARCH/lib$l.so"
done
ln -sf libpng16.so "$D/usr/lib/$ARCH/libpng.so"
ob=$(realpath /usr/lib/$ARCH/libopenblas.so)
mkdir -p "$D/usr/lib/$ARCH/openblas-pthread"
copy_lib "$ob"
obso=$(objdump -p "$ob" | awk '/SONAME/ {print $2}')
ln -sf "../$obso" "$D/usr/lib/$ARCH/openblas-pthread/libopenblas.so"
ln -sf "$obso" "$D/usr/lib/$ARCH/libopenblas.so"
# pkg-config itself (pkgconf), for a machine without it, behind a wrapper that finds its library
mkdir -p "$D/bin"
cp -L "$(command -v pkgconf)" "$D/bin/pkgconf.real"
copy_lib "$(ldd "$(command -v pkgconf)" | awk '/libpkgconf/ {print $3}')"
cat >"$D/bin/pkg-config" <<'SH'
#!/bin/sh
d=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$d/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/pkgconf.real" "$@"
SH
chmod +x "$D/bin/pkg-config"
echo "gpu-deps: $(du -sh "$D" | cut -f1) in $D ($(find "$D/usr/lib" -name '*.so*' | wc -l) libraries, $(find "$D/pkgconfig" -name '*.pc' | wc -l) pkg-config files)"

#!/usr/bin/env bash
# Builds libktier_cuda.so with nvcc alone: no CMake, no library but the toolkit's. For a GPU
# machine whose driver is older than the toolkit the carried bundle was built with (doctor:
# cudaErrorInsufficientDriver): bench/device-check.sh calls it there, with that machine's nvcc.
# Every .cu file of cuda/ with cuda/CMakeLists.txt's device flags (no fast math), the export
# map and static cudart; it differs from the CMake build in that host code is -O3 without -g,
# libstdc++ is the machine's shared one, and cuBLAS is not linked in but dlopen()ed at run time
# (as where the toolkit has no libcublas_static.a). The module must come from the same sources
# as the ktier that loads it (the ABI version is checked at load).
# Usage: [NVCC=path] [NVCC_EXTRA="flags"] tools/build-cuda-module.sh OUT.so [SM, default 90]
set -euo pipefail
OUT=$(realpath -m "$1")
mkdir -p "$(dirname "$OUT")"
SM=${2:-90}
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
read -r -a EXTRA <<<"${NVCC_EXTRA:-}"
OBJ=$(mktemp -d /tmp/ktier-cuda-module.XXXXXX)
trap 'rm -rf "$OBJ"' EXIT
FLAGS=(-std=c++17 -O3 -DNDEBUG "-arch=sm_$SM" --ftz=false --prec-div=true --prec-sqrt=true
       -Xcompiler -fPIC,-fvisibility=hidden,-ffp-contract=off,-fno-fast-math -I src
       "${EXTRA[@]}")
pids=()
for f in cuda/*.cu; do
  "$NVCC" "${FLAGS[@]}" -c "$f" -o "$OBJ/$(basename "$f" .cu).o" &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done  # every compile ends before the exit
[ "$failed" = 0 ] || { echo "build-cuda-module: a compile failed" >&2; exit 1; }
"$NVCC" -shared "-arch=sm_$SM" -cudart static "${EXTRA[@]}" "$OBJ"/*.o -o "$OUT" -ldl \
  -Xlinker --version-script=cuda/exports.map -Xlinker --exclude-libs,ALL
echo "built $OUT (sm_$SM, $("$NVCC" --version | tail -1))"

#!/usr/bin/env bash
# Builds libktier_cuda.so with nvcc alone: no CMake, no library but the toolkit's. For a GPU
# machine whose driver is older than the toolkit the carried bundle was built with (doctor:
# cudaErrorInsufficientDriver): bench/device-check.sh calls it there, with that machine's nvcc.
# Every .cu file of cuda/ with cuda/CMakeLists.txt's flags (no fast math, hidden symbols, the
# export map, static cudart); cuBLAS is not linked in but dlopen()ed at run time, as where the
# toolkit has no libcublas_static.a.
# Usage: tools/build-cuda-module.sh OUT.so [SM, default 90]
set -euo pipefail
OUT=$(realpath -m "$1")
mkdir -p "$(dirname "$OUT")"
cd "$(dirname "$0")/.."
SM=${2:-90}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
OBJ=$(mktemp -d /tmp/ktier-cuda-module.XXXXXX)
trap 'rm -rf "$OBJ"' EXIT
FLAGS=(-std=c++17 -O3 -DNDEBUG "-arch=sm_$SM" --ftz=false --prec-div=true --prec-sqrt=true
       -Xcompiler -fPIC,-fvisibility=hidden -I src)
pids=()
for f in cuda/*.cu; do
  "$NVCC" "${FLAGS[@]}" -c "$f" -o "$OBJ/$(basename "$f" .cu).o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
"$NVCC" -shared "-arch=sm_$SM" -cudart static "$OBJ"/*.o -o "$OUT" -ldl \
  -Xlinker --version-script=cuda/exports.map -Xlinker --exclude-libs,ALL
echo "built $OUT (sm_$SM, $("$NVCC" --version | tail -1))"

#!/usr/bin/env bash
# Builds the files a GPU machine needs into build-device/ (git-ignored): the ktier executable
# and libktier_cuda.so for sm_80..sm_90, third-party libraries linked statically, so the
# bundle runs on a machine that has only the CUDA driver. Carry build-device to run
# bench/device-check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-device-tree -DKTIER_CUDA=ON -DKTIER_BUILD_TESTS=OFF -DKTIER_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" \
  -DCMAKE_SHARED_LINKER_FLAGS="-static-libstdc++ -static-libgcc"
cmake --build build-device-tree -j "$(nproc)" --target ktier ktier_cuda
rm -rf build-device && mkdir -p build-device
cp build-device-tree/ktier build-device-tree/libktier_cuda.so build-device/
ls -la build-device

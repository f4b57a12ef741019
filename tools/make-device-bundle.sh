#!/usr/bin/env bash
# Collects what a GPU machine needs into build-device/ (git-ignored): the ktier executable and
# libktier_cuda.so (sm_80..sm_90), built in ./build. Third-party libraries are linked statically
# (KTIER_STATIC_DEPS), so the bundle runs where only the CUDA driver is installed.
# Carry build-device to run bench/device-check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KTIER_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DKTIER_CUDA=ON
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ktier ktier_cuda
rm -rf build-device && mkdir -p build-device
cp "$BUILD_DIR/ktier" "$BUILD_DIR/libktier_cuda.so" build-device/
strip build-device/ktier  # debug info would exceed the 64 MiB a device call carries
ls -la build-device

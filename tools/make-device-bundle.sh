#!/usr/bin/env bash
# Collects what a GPU machine needs into build-device/ (git-ignored): the ktier executable,
# libktier_cuda.so and the test executables that exercise CUDA (backend_test: every op against
# the CPU; runtime_test: GPU mode end to end) and a copy of this machine's glibc (used there
# only if the binaries do not start otherwise). Built in build-bundle/ with the CUDA module for
# sm_90 (the lent H200 or H100; KTIER_BUNDLE_ARCHS to change) and with libstdc++/libgcc linked
# statically, so the bundle needs only the NVIDIA driver and a C library there (third-party
# libraries are static already: KTIER_STATIC_DEPS). A first build takes ~15 minutes on 2 cores.
# Carry build-device to run bench/device-check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KTIER_BUNDLE_DIR:-build-bundle}
digest=$(bash tools/source-digest.sh)  # of what the build below compiles
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKTIER_CUDA=ON -DKTIER_SERVER=OFF \
  -DKTIER_CUDA_EMULATION=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="${KTIER_BUNDLE_ARCHS:-90}" -DKTIER_BUILD_BENCH=OFF \
  -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" \
  -DCMAKE_SHARED_LINKER_FLAGS="-static-libstdc++ -static-libgcc" \
  -DCMAKE_MODULE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target ktier ktier_cuda backend_test runtime_test
# A source edited while it built: the stamp below could name sources the bundle was not made of.
[ "$(bash tools/source-digest.sh)" = "$digest" ] ||
  { echo "the sources changed during the build: run this again"; exit 1; }
rm -rf build-device && mkdir -p build-device
cp "$BUILD_DIR/ktier" "$BUILD_DIR/libktier_cuda.so" build-device/
cp "$BUILD_DIR/tests/backend/backend_test" "$BUILD_DIR/tests/runtime/runtime_test" build-device/
# Debug info would exceed the 64 MiB a device call carries.
strip build-device/ktier build-device/backend_test build-device/runtime_test
# The conformance vectors backend_test's BackendConformance cases read (3 MB; the device machine
# has no ../shared): device-check.sh points KTIER_CONFORMANCE_DIR at them.
conformance=$(sed -n 's/^KTIER_CONFORMANCE_DIR:PATH=//p' "$BUILD_DIR/CMakeCache.txt")
mkdir -p build-device/conformance/ops
cp "$conformance/mxfp4.json" build-device/conformance/
for op in rmsnorm situ_glu shortconv kda_decay kda_recur1 kda_recur8 router attnres; do
  cp "$conformance/ops/$op.json" build-device/conformance/ops/
done
# Insurance against an older C library there (the GPU machine's OS is not recorded): this
# machine's loader and the glibc libraries that the binaries, the driver and cuBLAS link.
# bench/device-check.sh runs the binaries through that loader only if they do not start as
# they are. (glibc's libpthread, libdl and librt must come along: mixing two glibcs fails.)
need=$(objdump -T build-device/ktier build-device/libktier_cuda.so build-device/*_test |
       grep -o -E 'GLIBC_[0-9.]+' | sort -u -V | tail -1)
echo "the bundle needs $need; this machine has $(getconf GNU_LIBC_VERSION)"
mkdir -p build-device/glibc
for lib in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 \
           libgcc_s.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$lib" build-device/glibc/
done
ls -la build-device
du -sh build-device
# Pre-flight here, without a GPU, so the lent minutes are not spent finding it out: the bundle's
# module (libstdc++ linked in, as nowhere else) must load through dlopen and report no GPU, and
# the test binaries must start and skip their CUDA cases rather than fail.
doctor=$(KTIER_CUDA_MODULE="$PWD/build-device/libktier_cuda.so" build-device/ktier doctor 2>&1)
echo "$doctor" | grep '^cuda:' || true
echo "$doctor" | grep -q '^cuda: module .* loaded' ||
  { echo "$doctor"; echo "the bundle's module did not load"; exit 1; }
KTIER_CONFORMANCE_DIR="$PWD/build-device/conformance" build-device/backend_test --gtest_brief=1 \
  >build-device/bundle-check-backend.log 2>&1 ||
  { tail -20 build-device/bundle-check-backend.log; echo "backend_test fails without a GPU"; exit 1; }
build-device/runtime_test --gtest_brief=1 --gtest_filter='DeviceMode*:*PromptCache*' \
  >build-device/bundle-check-runtime.log 2>&1 ||
  { tail -20 build-device/bundle-check-runtime.log; echo "runtime_test fails without a GPU"; exit 1; }
# The fallback itself: the module loads in a process started by the carried loader.
KTIER_CUDA_MODULE="$PWD/build-device/libktier_cuda.so" build-device/glibc/ld-linux-x86-64.so.2 \
  --library-path build-device/glibc build-device/ktier doctor 2>&1 |
  grep -q '^cuda: module .* loaded' || { echo "the carried loader does not start ktier"; exit 1; }
# The stamp bench/device-check.sh requires: written only once the pre-flight has passed, with the
# digest of the sources built (compared there with the carried tree's).
{ echo "source_digest $digest"
  echo "git $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "preflight passed $(date -u +%FT%TZ)"; } >build-device/BUNDLE
echo "pre-flight: module loads (also under the carried glibc), backend_test and runtime_test's"
echo "device cases pass (CUDA cases skipped); carry build-device ($(sed -n 2p build-device/BUNDLE))"

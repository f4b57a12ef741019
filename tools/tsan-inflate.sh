#!/usr/bin/env bash
# ThreadSanitizer over the parallel inflate path (issue 7): builds the block codec test and the
# runtime test with -fsanitize=thread in a separate build folder and runs the cases that inflate
# blocks on the thread pool while the I/O engine reads later blocks (the five adversarial shapes
# at 1..8 threads; compressed-pack runs at 1, 2, 3, 5 and 8 threads, io_uring and pread), the
# I/O engine tests (io_test: both engines, faults, cancellation, queues freed while reads run),
# and the live tiers' tests (expert RAM tier with prefetch, trunk store, GPU mode's placement on
# the emulated device, VRAM tier).
# Runs in CI as the CTest `pack.tsan_inflate` (label `slow`; `ctest -LE slow` skips it) (build folder <build>/tsan; about 7 minutes on 2 cores,
# the TSan build at -O1 -g1 being most of it); by hand after touching src/pack/block_codec.*,
# src/runtime/trunk_store.* or the thread pool:
#   tools/tsan-inflate.sh            # build folder: build-tsan (KTIER_TSAN_DIR to change)
# Exit status: that of the tests; TSan reports make them fail (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${KTIER_TSAN_DIR:-build-tsan}
JOBS=${KTIER_JOBS:-2}
# -O1 -g1: a third of the -O2 -g build time, and TSan's reports keep their line numbers.
cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DKTIER_SANITIZE=thread -DKTIER_CUDA=OFF -DKTIER_BUILD_BENCH=OFF >/dev/null
cmake --build "$DIR" -j "$JOBS" --target block_codec_test runtime_test io_test
/usr/bin/python3 tools/trunk_blocks.py fixture "$DIR/tsan_block_fixture"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
# allocator_may_return_null: an I/O test asks for an impossible buffer and expects the error.
TSAN_OPTIONS="allocator_may_return_null=1 $TSAN_OPTIONS" "$DIR/tests/io/io_test"
KTIER_BLOCK_FIXTURE_DIR="$DIR/tsan_block_fixture" "$DIR/tests/pack/block_codec_test"
# The live tiers too: the expert RAM tier's prefetch completions, the streamed trunk's ring and
# the emulated device's copy queues and fences. LatePrefetches... is left out: it needs reads
# slower than the compute, and TSan's slowdown of the compute lets 30 ms reads land in time.
"$DIR/tests/runtime/runtime_test" --gtest_filter='CompressedTrunkTest.*:ExpertCacheTest.*:'\
'TrunkStoreTest.*:DeviceModeTest.*:VramExpertTier.*'\
'-ExpertCacheTest.LatePrefetchesAreWaitedForAndCountedAsMisses'
echo "tsan-inflate: no ThreadSanitizer reports"

#!/usr/bin/env bash
# README command 2: install what is missing, build, and run the whole test suite
# (GoogleTest via CTest, the float64 PyTorch reference's pytest, the js-tiktoken cross-check).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${KTIER_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 1800

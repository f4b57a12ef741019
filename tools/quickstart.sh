#!/usr/bin/env bash
# README command 1: install what is missing, build, synthesize the demo checkpoint and run
# the main job on it. Until the forward pass lands (issue 3) the main job is `ktier inspect`;
# afterwards it decodes.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${KTIER_BUILD_DIR:-build}
DEMO_DIR=${KTIER_DEMO_DIR:-$BUILD_DIR/demo-checkpoint}
if [ ! -f "$DEMO_DIR/config.json" ]; then
  "$BUILD_DIR/ktier" synth --preset demo -o "$DEMO_DIR" --seed 1
fi
"$BUILD_DIR/ktier" inspect -m "$DEMO_DIR"

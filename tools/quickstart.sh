#!/usr/bin/env bash
# README command 1: install what is missing, build, synthesize the demo checkpoint (once) and
# decode a prompt on it, streaming the text. Extra arguments go to `ktier run` (e.g. -n 64).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${KTIER_BUILD_DIR:-build}
DEMO_DIR=${KTIER_DEMO_DIR:-$BUILD_DIR/demo-checkpoint}
if [ ! -f "$DEMO_DIR/model.safetensors.index.json" ]; then
  "$BUILD_DIR/ktier" synth --preset demo -o "$DEMO_DIR" --seed 1 --force
fi
"$BUILD_DIR/ktier" run -m "$DEMO_DIR" -p "The lighthouse keeper checked the lamp, the lens and the" \
  -n 32 "$@"

#!/usr/bin/env bash
# README command 1: install what is missing, build, synthesize the demo checkpoint (once) and
# decode a prompt on it, streaming the text. Arguments replace the default `-n 32` and go to
# `ktier run` (e.g. tools/quickstart.sh -n 64 --temp 0.8 --seed 7).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
BUILD_DIR=${KTIER_BUILD_DIR:-build}
DEMO_DIR=${KTIER_DEMO_DIR:-$BUILD_DIR/demo-checkpoint}
if [ ! -f "$DEMO_DIR/model.safetensors.index.json" ]; then
  "$BUILD_DIR/ktier" synth --preset demo -o "$DEMO_DIR" --seed 1 --force
fi
[ $# -gt 0 ] || set -- -n 32
"$BUILD_DIR/ktier" run -m "$DEMO_DIR" -p "The lighthouse keeper checked the lamp, the lens and the" "$@"

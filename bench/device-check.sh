#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (see README "GPU checks").
# Build here first:   tools/make-device-bundle.sh      (writes build-device/: ktier + libktier_cuda.so)
# Then run there, from the repository root, with build-device carried:
#   bash bench/device-check.sh build-device | tee $OUT/device-check.log
# Prints what docs/PERFORMANCE.md records. Each step is independent; failures are reported,
# not fatal, so one run shows everything.
set -u
B=${1:-build-device}
step() { echo; echo "== $*"; }
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv || true
nproc; grep MemTotal /proc/meminfo; uname -r
step "ktier --version / doctor (module probe through dlopen)"
"$B/ktier" --version
"$B/ktier" doctor; echo "doctor rc=$?"
step "CPU fallback forced by a missing module"
KTIER_CUDA_MODULE=/nonexistent/libktier_cuda.so "$B/ktier" doctor | tail -1
step "synth tiny + inspect"
rm -rf /tmp/ktier-tiny
"$B/ktier" synth --preset tiny -o /tmp/ktier-tiny --seed 1 && "$B/ktier" inspect -m /tmp/ktier-tiny | head -40
echo "inspect rc=${PIPESTATUS[0]}"

#!/usr/bin/env bash
# Prints a digest of the sources a build is made from (the build's CMake files and the C++/CUDA
# trees with their tests, bench/'s kernel bench linked into ktier included), by content and
# path. tools/make-device-bundle.sh stamps build-device/
# with it and bench/device-check.sh compares it on the GPU machine, where the working tree is
# copied without .git: a bundle built from other sources must not be measured as this tree's.
# Only coreutils, findutils and sort are used: that machine has none of the Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
find CMakeLists.txt cmake cpu cuda src strata tests bench -type f \
     ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path 'bench/*.sh' ! -path 'bench/*.py' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16

#!/usr/bin/env bash
# Installs what ktier needs on Debian 12 (only what is missing), then configures and builds.
# Idempotent: a second run installs nothing and rebuilds incrementally.
#   tools/setup.sh            # deps + build into ./build
#   KTIER_BUILD_DIR=dir tools/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KTIER_BUILD_DIR:-build}

# Debian packages: build tools, libraries, and the Python/Node tooling used by the tests.
PACKAGES=(build-essential cmake pkg-config git
  liburing-dev libzstd-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev nlohmann-json3-dev
  libcli11-dev libxxhash-dev libcpp-httplib-dev unicode-data
  libboost-context-dev  # cuda/emulation: the tests run the CUDA module's kernels on the CPU
  python3-torch python3-numpy python3-pytest python3-matplotlib
  python3-zstandard)  # tools/trunk_blocks.py: the cross-language test of compressed packs
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm (tokenizer cross-check against js-tiktoken). NodeSource's nodejs already
# bundles npm and conflicts with Debian's npm package, so only install what is absent.
# The test looks for /usr/bin/node only (CMake, tests/tokenizer): a node elsewhere on the PATH
# (nvm, /usr/local) does not count.
[ -x /usr/bin/node ] || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then
    echo "setup: error: ${missing[*]} must be installed, and this user is not root and has no" \
      "sudo: install them as root (apt-get install ${missing[*]}), then run this again" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  # Through env: sudo's env_reset would drop a DEBIAN_FRONTEND set before it.
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

# js-tiktoken, pinned by package-lock.json, for the tokenizer cross-check test.
# Installed again when the lock file is not the one the last install was made from (a stamp
# beside the modules), so that a half-made or outdated node_modules is not kept; one without
# the stamp that `npm ls` finds whole (made before the stamp existed) is kept,
# since npm ci deletes it before it fetches.
XCHECK=tools/tokenizer/xcheck
STAMP=$XCHECK/node_modules/.ktier-installed-lock.json
if [ -f "$XCHECK/package-lock.json" ] && ! cmp -s "$XCHECK/package-lock.json" "$STAMP"; then
  if [ ! -f "$STAMP" ] && [ -d "$XCHECK/node_modules" ] &&
    npm ls --prefix "$XCHECK" --all >/dev/null 2>&1; then
    echo "setup: $XCHECK/node_modules is whole; keeping it"
  else
    echo "setup: npm ci in $XCHECK"
    npm ci --prefix "$XCHECK" --no-audit --no-fund --loglevel=error
  fi
  cp "$XCHECK/package-lock.json" "$STAMP"
fi

# Configure and build. CUDA is used when nvcc is found (KTIER_CUDA=AUTO), never required;
# `serve` and the emulated CUDA tests are required (their packages are installed above), so that
# a package gone missing fails here instead of dropping their tests from the suite.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKTIER_SERVER=ON \
  -DKTIER_CUDA_EMULATION=ON ${KTIER_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built $BUILD_DIR/ktier"

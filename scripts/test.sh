#!/usr/bin/env bash
# Builds and runs every test. Usage: scripts/test.sh [preset]   (release by default; also debug,
# asan = AddressSanitizer + UndefinedBehaviorSanitizer, tsan = ThreadSanitizer). The release run
# also builds the Python package and runs its pytest suite (scripts/test-python.sh), then the vLLM
# plugin's tests in their own vLLM venv (scripts/test-vllm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
scripts/install-deps.sh
# ccache, when present, makes the second compile of the same sources (the Python package's build
# after the release build) nearly free.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CMAKE_CUDA_COMPILER_LAUNCHER=${CMAKE_CUDA_COMPILER_LAUNCHER:-ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  # The sanitizer presets build with debug info, for which ccache hashes the build directory by
  # default: without this, another clone or worktree of the same sources never hits (.ci/run).
  case "$preset" in
    asan | tsan) export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1} ;;
  esac
fi
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)" --timeout 1200
# The Python package and its tests (pytest) after the C++ tests, in the release configuration.
if [ "$preset" = release ]; then
  scripts/test-python.sh
  scripts/test-vllm.sh
fi

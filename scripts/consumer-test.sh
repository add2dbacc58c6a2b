#!/usr/bin/env bash
# Proves the installed package works: installs kvattn into a temporary prefix and builds and runs
# tests/consumer, a separate CMake project doing find_package(kvattn) + kvattn::kvattn.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
# The library's build sits at build/consumer-lib, as deep as build/release, so that with ccache
# (CCACHE_BASEDIR = the clone) its objects are the release build's (the CPU sources compile the
# same with or without CUDA): a fresh CI machine compiles them once, not twice.
lib=build/consumer-lib
trap 'rm -rf "$work" "$lib"' EXIT
rm -rf "$lib"
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
fi
cmake -S . -B "$lib" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVATTN_CUDA=OFF \
  -DKVATTN_BUILD_TESTS=OFF -DKVATTN_BUILD_TOOLS=OFF -DKVATTN_BUILD_BENCH=OFF >/dev/null
cmake --build "$lib" -j "$(nproc)"
cmake --install "$lib" --prefix "$work/prefix" >/dev/null
cmake -S tests/consumer -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer"
"$work/consumer/consumer"

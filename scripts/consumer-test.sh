#!/usr/bin/env bash
# Proves the installed package works: installs kvattn into a temporary prefix and builds and runs
# tests/consumer, a separate CMake project doing find_package(kvattn) + kvattn::kvattn.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -S . -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVATTN_CUDA=OFF \
  -DKVATTN_BUILD_TESTS=OFF -DKVATTN_BUILD_TOOLS=OFF -DKVATTN_BUILD_BENCH=OFF >/dev/null
cmake --build "$work/build" -j "$(nproc)"
cmake --install "$work/build" --prefix "$work/prefix" >/dev/null
cmake -S tests/consumer -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer"
"$work/consumer/consumer"

#!/usr/bin/env bash
# Builds kvattn and runs the main job: one serving step of a Llama-3-8B-shaped layer over a paged
# FP8 cache (prefill, then decode), on the backend kvattn selects, checked against the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target kvattn_serving_step
exec build/release/examples/kvattn_serving_step "$@"

#!/usr/bin/env bash
# Builds and runs every test. Usage: scripts/test.sh [preset]   (release by default; also debug,
# asan = AddressSanitizer + UndefinedBehaviorSanitizer, tsan = ThreadSanitizer)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
scripts/install-deps.sh
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)" --timeout 1200

#!/usr/bin/env bash
# Builds the multithreaded tests with ThreadSanitizer in build-tsan/ and runs them: the cpu
# backend's tests (targets tests/cpu/cpu_*_test, test names Cpu*), the hardening tests (which
# drive every backend through the public API, threads included) and the CTA emulator's tests
# (kvattn_cuda_host_tests, test names CtaEmulator*: one std::thread per CUDA thread, so a kernel
# body missing a barrier between warps is a race). Exits non-zero on any failure or data race.
#
# Usage: scripts/tsan.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-tsan

# clang if present (its TSan runtime is what the fuzz script installs too), else gcc.
compiler=()
if command -v clang++ >/dev/null 2>&1; then compiler=(-DCMAKE_CXX_COMPILER=clang++); fi
if [ -f "$build/CMakeCache.txt" ] && [ ${#compiler[@]} -gt 0 ] &&
  ! grep -q "CMAKE_CXX_COMPILER:.*clang++" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
cmake -S . -B "$build" "${generator[@]}" "${compiler[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DKVATTN_SANITIZE=thread -DKVATTN_CUDA=OFF -DKVATTN_BUILD_TESTS=ON -DKVATTN_BUILD_TOOLS=OFF \
  -DKVATTN_BUILD_BENCH=OFF >/dev/null

# Only the threaded test executables: the cpu backend's, the hardening catalogue, the emulator's.
mapfile -t targets < <(cmake --build "$build" --target help | grep -oE '\bcpu_[a-z0-9_]+_test\b' | sort -u)
targets+=(kvattn_hardening_tests kvattn_cuda_host_tests)
echo "tsan.sh: building ${targets[*]}"
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

# halt_on_error: the first race fails the test that raced, with its report.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
ctest --test-dir "$build" -R '^(Cpu|Catalogue/|CtaEmulator)' -j "$(nproc)" --output-on-failure \
  --timeout 1200 "$@"

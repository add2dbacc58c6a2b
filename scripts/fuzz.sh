#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer) in
# build-fuzz/ and runs each over a working copy of its seed corpus (fuzz/corpus/<target>/), the
# targets side by side. Exits non-zero if any target crashes, leaks or times out.
# The library is built without the decode kernels unrolled for head dims 64 / 128 / 256
# (KVATTN_CPU_UNROLLED_DECODE=OFF): the fuzzer's dims stay <= 12, which only the runtime-dim
# kernel runs, and the unrolled ones were three quarters of this build's compile time.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [MAX_RUNS_PER_TARGET]
#   SECONDS_PER_TARGET  time budget of each target (default 60)
#   MAX_RUNS_PER_TARGET stop a target after this many executions (default: no limit)
# Crash reproducers land in build-fuzz/artifacts/; replay one with
#   build-fuzz/fuzz/<target> <file>
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
max_runs=${2:--1}
build=build-fuzz

# clang with the libFuzzer runtime (Debian: clang + libclang-rt-14-dev).
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
have_libfuzzer() {
  command -v clang++ >/dev/null 2>&1 &&
    printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' |
      clang++ -x c++ -fsanitize=fuzzer - -o "$probe/probe" >/dev/null 2>&1
}
if ! have_libfuzzer; then
  echo "fuzz.sh: installing clang and the libFuzzer runtime"
  sudo_cmd=""
  if [ "$(id -u)" != 0 ]; then sudo_cmd=sudo; fi
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y clang libclang-rt-14-dev
  have_libfuzzer || { echo "fuzz.sh: clang++ cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

# A build directory configured with another compiler cannot switch to clang in place.
if [ -f "$build/CMakeCache.txt" ] && ! grep -q "CMAKE_CXX_COMPILER:.*clang++" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DKVATTN_FUZZ=ON -DKVATTN_CUDA=OFF \
  -DKVATTN_SANITIZE="address;undefined" -DKVATTN_BUILD_TESTS=OFF -DKVATTN_BUILD_BENCH=OFF \
  -DKVATTN_BUILD_TOOLS=ON \
  -DKVATTN_CPU_UNROLLED_DECODE=OFF >/dev/null
targets=(fuzz_attention)
if grep -q "fuzz_case_file" "$build/fuzz/Makefile" "$build/build.ninja" 2>/dev/null; then
  targets+=(fuzz_case_file)
else
  echo "fuzz.sh: fuzz_case_file is not configured (no kvattn_caseio target); skipping it"
fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

mkdir -p "$build/artifacts" "$build/logs"
pids=()
for t in "${targets[@]}"; do
  work="$build/corpus/$t"
  mkdir -p "$work"
  "$build/fuzz/$t" -max_total_time="$seconds" -runs="$max_runs" -timeout=30 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
    "$work" "fuzz/corpus/$t" >"$build/logs/$t.log" 2>&1 &
  pids+=($!)
done

status=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  if wait "${pids[$i]}"; then
    result=ok
  else
    result=FAILED
    status=1
  fi
  runs=$(grep -o 'number_of_executed_units: [0-9]*' "$build/logs/$t.log" | grep -o '[0-9]*$' || echo "?")
  rate=$(grep -o 'average_exec_per_sec: *[0-9]*' "$build/logs/$t.log" | grep -o '[0-9]*$' || echo "?")
  echo "fuzz.sh: $t: $result, $runs executions ($rate/s), log $build/logs/$t.log"
  if [ "$result" = FAILED ]; then
    grep -E "ERROR|FINDING|runtime error|SUMMARY|Test unit written" "$build/logs/$t.log" | head -20 >&2
  fi
done
exit $status

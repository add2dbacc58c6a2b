#!/usr/bin/env bash
# run.sh of the GPU bundle (scripts/gpu-bundle.sh copies this file to DIR/run.sh; docs/cuda.md):
# on a machine with an NVIDIA GPU and its driver, and nothing else installed, runs the CUDA host
# replays, fa2's and fa3's GPU tests and both GPU benchmarks, each under a time limit, and writes
# at most 8 files under OUT:
#
#   summary.txt                 bundle, device, every step's verdict and time, the bench figures
#   host-tests.log/.xml         the CUDA host tests (CTA replays; CPU only, run alongside the GPU)
#   fa2-gpu-tests.log/.xml      fa2 on the GPU against the reference
#   fa3-gpu-tests.log/.xml      fa3 on the GPU (SM90) against the reference
#   bench.log                   kvattn_gpu_bundle fa2-bench and fa3-bench
#
#   DIR/run.sh OUT
#
# Exit 0 only when every step passed. A GPU test that skipped, a GPU step that ran no test and a
# benchmark that skipped are failures, never passes. Without a CUDA device: says "no CUDA
# device", exit 3. Limits (seconds) from the environment: LIMIT_HOST (default 300, in parallel
# with the GPU steps), LIMIT_FA2 (150), LIMIT_FA3 (300), LIMIT_FA2_BENCH (60), LIMIT_FA3_BENCH
# (45); a --full bundle doubles the test limits. A test step runs as several processes
# (GoogleTest's sharding; each under the step's limit), its logs and XML merged into the step's
# two files: SHARDS_HOST (default nproc / 2, at most 8) for the host replays, SHARDS_GPU (nproc /
# 4, at most 4; a --full bundle: nproc / 2, at most 12) for each GPU step. A --full bundle's GPU
# steps split by kernel key (each process tests every key i, i + n, ...: KVATTN_GPU_KEY_SHARD=i/n),
# the CI bundle's by test. FA2_TESTS / FA3_TESTS narrow the GPU steps (GoogleTest filters; default
# every test); HOST_TESTS=0 leaves the host replays out (CI runs them; "not run" in the summary).
# Most of a GPU step's time is the fp64 reference on the CPU: on the first run (H200, 16 cores,
# 2026-12-04) fa3's tests took 165 s in one process (100 s, the old limit, cut them off) and the
# host replays more than 240 s.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT" >&2
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$HERE/bin/kvattn_gpu_bundle
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
START=$SECONDS
log() { echo "[run.sh $(date -u +%H:%M:%S) +$((SECONDS - START))s] $*" | tee -a "$SUMMARY"; }

FULL=OFF
[[ -f "$HERE/bundle.info" ]] && grep -q '^full kernels: ON' "$HERE/bundle.info" && FULL=ON
scale=1
[[ $FULL == ON ]] && scale=2
LIMIT_HOST=${LIMIT_HOST:-$((300 * scale))}
LIMIT_FA2=${LIMIT_FA2:-$((150 * scale))}
LIMIT_FA3=${LIMIT_FA3:-$((300 * scale))}
LIMIT_FA2_BENCH=${LIMIT_FA2_BENCH:-60}
LIMIT_FA3_BENCH=${LIMIT_FA3_BENCH:-45}
CORES=$(nproc 2>/dev/null || echo 1)
clamp() { local v=$1; ((v < 1)) && v=1; ((v > $2)) && v=$2; echo "$v"; }
SHARDS_HOST=${SHARDS_HOST:-$(clamp $((CORES / 2)) 8)}
if [[ $FULL == ON ]]; then
  SHARDS_GPU=${SHARDS_GPU:-$(clamp $((CORES / 2)) 12)}
  GPU_SPLIT=keys
else
  SHARDS_GPU=${SHARDS_GPU:-$(clamp $((CORES / 4)) 4)}
  GPU_SPLIT=tests
fi
FA2_TESTS=${FA2_TESTS:-'Fa2Gpu.*:Fa2GpuAux.*'}
FA3_TESTS=${FA3_TESTS:-'Fa3Gpu.*'}
HOST_TESTS=${HOST_TESTS:-1}

log "bundle $HERE, out $OUT"
[[ -f "$HERE/bundle.info" ]] && sed 's/^/  /' "$HERE/bundle.info" >>"$SUMMARY"
if [[ ! -e "$BIN" && -f "$BIN.xz" ]]; then  # a bundle over the size limit ships compressed
  if command -v xz >/dev/null; then
    xz -dk "$BIN.xz"
  else
    python3 -c 'import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$BIN.xz" "$BIN"
  fi && chmod +x "$BIN" && log "unpacked $(basename "$BIN").xz"
fi
if [[ ! -x "$BIN" ]]; then
  log "FAILED: $BIN is missing (rebuild the bundle: scripts/gpu-bundle.sh DIR)"
  exit 2
fi
if command -v nvidia-smi >/dev/null; then
  { echo "nvidia-smi:"; nvidia-smi 2>&1 | sed 's/^/  /'; } >>"$SUMMARY"
fi

# The device probe: no device, no GPU check (and no crash: the binary reports why).
probe=$("$BIN" device 2>&1)
probe_rc=$?
sed 's/^/  /' <<<"$probe" >>"$SUMMARY"
if [[ $probe_rc -ne 0 ]]; then
  reason=$(grep -m1 '^no CUDA device' <<<"$probe")
  [[ -n "$reason" ]] || reason="no CUDA device (the probe exited $probe_rc: $(tail -1 <<<"$probe"))"
  log "$reason"
  log "nothing run: the GPU check needs a CUDA device of SM80 or newer; status FAILED"
  exit 3
fi
SM=$(sed -n 's/^sm //p' <<<"$probe")
FA3_BUILT=$(sed -n 's/^fa3 kernels built: \([0-9]*\).*/\1/p' <<<"$probe")
log "device: $(grep -m1 '^device' <<<"$probe"), fa3 kernels built: ${FA3_BUILT:-0}"

STATUS=0
fail() {
  log "$1: FAILED - $2"
  STATUS=1
}

# A GoogleTest step: passed only when it exited 0, its XML exists, it ran at least one test and
# skipped none.
check_gtest() {
  local name=$1 rc=$2 secs=$3 xml=$OUT/$1.xml logf=$OUT/$1.log
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$name" "timed out after ${secs} s (limit) - see $name.log"
    return
  fi
  if [[ $rc -ne 0 ]]; then
    fail "$name" "exit $rc after ${secs} s - see $name.log"
    grep -E '^\[  FAILED  \]' "$logf" | sort -u | head -20 | sed 's/^/  /' | tee -a "$SUMMARY"
    return
  fi
  if [[ ! -s "$xml" ]]; then
    fail "$name" "no JUnit XML written"
    return
  fi
  local tests skipped
  tests=$(grep -m1 -o '<testsuites tests="[0-9]*"' "$xml" | grep -o '[0-9]*')
  skipped=$(grep -c 'result="skipped"' "$xml")
  if [[ -z "$tests" || "$tests" -eq 0 ]]; then
    fail "$name" "ran no test"
  elif [[ $skipped -gt 0 ]] || grep -q '^\[  SKIPPED \]' "$logf"; then
    fail "$name" "$skipped of $tests test(s) SKIPPED (a skipped GPU test is not a pass); why:"
    grep -A1 ': Skipped$' "$logf" | grep -v -e ': Skipped$' -e '^--$' | sort | uniq -c |
      head -5 | sed 's/^/  /' | tee -a "$SUMMARY"
  else
    log "$name: passed, $tests test(s), ${secs} s"
  fi
}

# Runs the tests of FILTER as SHARDS processes, each under LIMIT seconds, split by test
# (GoogleTest's sharding) or, with SPLIT=keys, by kernel key (KVATTN_GPU_KEY_SHARD);
# merges their logs into OUT/NAME.log and their XML into OUT/NAME.xml (one <testsuites> whose
# tests count is the shards' sum; none when a shard wrote none). Returns the worst exit code, a
# timeout first.
gtest_shards() {
  local name=$1 limit=$2 filter=$3 shards=$4 split=${5:-tests} i r rc=0 tests=0 n
  local dir
  dir=$(mktemp -d)
  local pids=()
  local share
  for ((i = 0; i < shards; ++i)); do
    if [[ $split == keys ]]; then
      share=("KVATTN_GPU_KEY_SHARD=$i/$shards")
    else
      share=("GTEST_TOTAL_SHARDS=$shards" "GTEST_SHARD_INDEX=$i")
    fi
    env "${share[@]}" timeout -k 10 "$limit" "$BIN" tests "--gtest_filter=$filter" \
      "--gtest_output=xml:$dir/$i.xml" >"$dir/$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    r=$?
    if [[ $r -eq 124 || $r -eq 137 ]]; then
      rc=$r
    elif [[ $rc -eq 0 ]]; then
      rc=$r
    fi
  done
  : >"$OUT/$name.log"
  for ((i = 0; i < shards; ++i)); do
    ((shards > 1)) && echo "=== shard $i of $shards" >>"$OUT/$name.log"
    cat "$dir/$i.log" >>"$OUT/$name.log"
  done
  rm -f "$OUT/$name.xml"
  for ((i = 0; i < shards; ++i)); do
    [[ -s "$dir/$i.xml" ]] || { rm -rf "$dir"; return $rc; }
    n=$(grep -m1 -o '<testsuites tests="[0-9]*"' "$dir/$i.xml" | grep -o '[0-9]*')
    tests=$((tests + ${n:-0}))
  done
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites tests=\"$tests\" name=\"AllTests\" shards=\"$shards\">"
    for ((i = 0; i < shards; ++i)); do
      sed -n '/<testsuites /,/<\/testsuites>/p' "$dir/$i.xml" | sed '1d;$d'
    done
    echo '</testsuites>'
  } >"$OUT/$name.xml"
  rm -rf "$dir"
  return $rc
}

run_gtest() {
  local name=$1 t0=$SECONDS
  gtest_shards "$@"
  check_gtest "$name" $? $((SECONDS - t0))
}

GPU_SUITES='Fa2Gpu.*:Fa2GpuAux.*:Fa3Gpu.*'
# Host tests of the no-device case (the runtime query's "no CUDA device" reading): they skip
# where a device is present, so the host step leaves them out (CI runs them, without a GPU).
NO_DEVICE_TESTS='CudaRuntimeQueryTest.CudaZeroFailsWithAReasonWhenThereIsNoDevice:CudaRuntimeQueryTest.Fa2AvailabilitySaysWhyAndSelectionOnDescribedDevicesWorks'

# The host replays need no GPU: they run alongside the GPU steps.
t_host=$SECONDS
host_pid=
if [[ $HOST_TESTS != 0 ]]; then
  gtest_shards host-tests "$LIMIT_HOST" "-$GPU_SUITES:$NO_DEVICE_TESTS" "$SHARDS_HOST" &
  host_pid=$!
fi
log "processes: $SHARDS_HOST for the host replays, $SHARDS_GPU for each GPU step (split by" \
  "$GPU_SPLIT; $CORES cores)"

run_gtest fa2-gpu-tests "$LIMIT_FA2" "$FA2_TESTS" "$SHARDS_GPU" "$GPU_SPLIT"
if [[ "${FA3_BUILT:-0}" -eq 0 ]]; then
  log "fa3-gpu-tests: not run - fa3's kernels are not in this bundle (90a not in its archs)"
elif [[ "$SM" != 90 ]]; then
  fail fa3-gpu-tests "the device is SM$SM; fa3's kernels (sm_90a) need SM90"
else
  run_gtest fa3-gpu-tests "$LIMIT_FA3" "$FA3_TESTS" "$SHARDS_GPU" "$GPU_SPLIT"
fi

# Benchmarks: figures only (never a pass/fail on speed), but one that skipped or failed is a
# failed step.
: >"$OUT/bench.log"
run_bench() {
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  echo "=== $name $*" >>"$OUT/bench.log"
  local tmp
  tmp=$(timeout -k 10 "$limit" "$BIN" "$@" 2>&1)
  local rc=$? secs=$((SECONDS - t0))
  echo "$tmp" >>"$OUT/bench.log"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    fail "$name" "timed out after ${secs} s (limit)"
  elif [[ $rc -ne 0 ]]; then
    fail "$name" "exit $rc after ${secs} s - see bench.log"
  elif grep -qi 'skipped' <<<"$tmp"; then
    fail "$name" "$(grep -i -m1 'skipped' <<<"$tmp")"
  else
    log "$name: ran, ${secs} s"
    sed 's/^/  /' <<<"$tmp" >>"$SUMMARY"
  fi
}
run_bench fa2-bench "$LIMIT_FA2_BENCH" fa2-bench --quick
if [[ "${FA3_BUILT:-0}" -gt 0 && "$SM" == 90 ]]; then
  run_bench fa3-bench "$LIMIT_FA3_BENCH" fa3-bench --quick
fi

if [[ -n $host_pid ]]; then
  wait $host_pid
  check_gtest host-tests $? $((SECONDS - t_host))
else
  log "host-tests: not run (HOST_TESTS=0)"
fi

if [[ $STATUS -eq 0 ]]; then
  log "done: every step passed ($((SECONDS - START)) s)"
else
  log "done: status FAILED ($((SECONDS - START)) s); files in $OUT"
fi
exit $STATUS

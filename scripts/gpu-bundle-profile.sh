#!/usr/bin/env bash
# profile.sh of the GPU bundle (scripts/gpu-bundle.sh copies this file to DIR/profile.sh;
# docs/cuda.md): Nsight Compute over fa2's and fa3's quick benchmarks, where the GPU machine has
# ncu (it comes with the CUDA toolkit). Writes two files under OUT: ncu-fa2.txt and ncu-fa3.txt,
# every attention kernel launch of the benchmark with the sections below (speed of light,
# occupancy, launch statistics, warp states, memory and compute workload), kernel names
# demangled, so that each launch names its tile configuration.
#
#   DIR/profile.sh OUT
#
# LIMIT_PROFILE (seconds a benchmark, default 150), COUNT (launches profiled a benchmark, default
# 80), KERNELS (ncu's --kernel-name, default every fa2/fa3 attention kernel and the split merge).
# Exit 3 when there is no ncu, 0 when both ran (a profile cut off by its limit says so in its
# file and exits 1).
set -uo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 OUT" >&2; exit 2; }
BIN=$(dirname "$0")/bin/kvattn_gpu_bundle
OUT=$1
mkdir -p "$OUT" || exit 2
if [[ ! -x $BIN && -f $BIN.xz ]]; then
  echo "profile.sh: unpack the bundle first (run.sh does)" >&2
  exit 2
fi
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null |
  head -1)
if [[ -z $NCU ]]; then
  echo "profile.sh: no ncu on this machine" | tee "$OUT/ncu-fa2.txt"
  exit 3
fi
LIMIT_PROFILE=${LIMIT_PROFILE:-150}
COUNT=${COUNT:-80}
KERNELS=${KERNELS:-regex:attention_kernel|prefill_kernel|merge}
rc=0
for bench in fa2 fa3; do
  file=$OUT/ncu-$bench.txt
  echo "=== $NCU ($("$NCU" --version | tail -1)) over $bench-bench --quick" >"$file"
  timeout "$LIMIT_PROFILE" "$NCU" --kernel-name "$KERNELS" --launch-count "$COUNT" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    --print-kernel-base demangled "$BIN" "$bench-bench" --quick >>"$file" 2>&1
  status=$?
  echo "=== exit $status" >>"$file"
  ((status != 0)) && rc=1
done
exit $rc

#!/usr/bin/env bash
# fa2's and fa3's GPU check on a machine with an NVIDIA GPU (SM80 or newer; fa3's tests need
# SM90): the CUDA host replays, the GPU tests against the reference and the GPU benchmarks, with
# per-step time limits, logs, JUnit XML and a summary in OUTDIR (docs/cuda.md).
#
#   scripts/gpu-check.sh OUTDIR [--full] [--bundle DIR]
#
#   --bundle DIR  run a GPU bundle built elsewhere (scripts/gpu-bundle.sh DIR on a machine with
#                 GoogleTest; nothing is built here): DIR/run.sh OUTDIR
#   --full        without --bundle: every fa2 and fa3 kernel (KVATTN_CUDA_FULL_KERNELS=ON)
#   ARCHS=...     without --bundle: CUDA architectures (default: the GPU's own, 90a on Hopper)
#   JOBS=...      parallel build jobs (default: all cores)
#
# Without --bundle it needs the full toolchain (nvcc, CMake, ninja, GoogleTest): it builds the
# same bundle with scripts/gpu-bundle.sh into build/gpu-check-bundle and runs it. Either way a
# skipped GPU test is a failure, never a pass (run.sh).
set -euo pipefail

usage() {
  echo "usage: $0 OUTDIR [--full] [--bundle DIR]" >&2
  exit 2
}
[[ $# -ge 1 ]] || usage
OUTDIR=$1
shift
FULL=""
BUNDLE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --full) FULL=--full ;;
    --bundle)
      [[ $# -ge 2 ]] || usage
      BUNDLE=$2
      shift
      ;;
    *) usage ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [[ -z "$BUNDLE" ]]; then
  # The GPU's own architecture: 90 -> 90a (the arch-specific Hopper target), else as reported.
  if [[ -z "${ARCHS:-}" ]]; then
    CC=$( (nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true) |
      head -1 | tr -d ' .')
    case "$CC" in
      90) ARCHS=90a ;;
      "") ARCHS=90a ;;
      *) ARCHS=$CC ;;
    esac
  fi
  BUNDLE=${BUNDLE_DIR:-$ROOT/build/gpu-check-bundle}
  ARCHS=$ARCHS BUILD=${BUILD:-$ROOT/build/gpu-check} "$ROOT/scripts/gpu-bundle.sh" "$BUNDLE" $FULL
fi
if [[ ! -x "$BUNDLE/run.sh" ]]; then
  echo "gpu-check: $BUNDLE/run.sh is missing (not a bundle)" >&2
  exit 2
fi
exec "$BUNDLE/run.sh" "$OUTDIR"

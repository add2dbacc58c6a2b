#!/usr/bin/env bash
# Builds the GPU bundle on a machine without a GPU (docs/cuda.md): one self-contained binary with
# every GPU test and benchmark of fa2 and fa3 (and the CUDA host replays), for the target GPU's
# arch, plus DIR/run.sh, which runs them there. The binary needs nothing but glibc and the
# driver's libcuda (GoogleTest, cudart and the C++ runtime are linked statically; checked here
# with tests/cuda/check_bundle_deps.sh), so the GPU machine needs no GoogleTest, no packages and
# no network.
#
#   scripts/gpu-bundle.sh DIR [--full]
#
#   --full     every fa2 and fa3 kernel (KVATTN_CUDA_FULL_KERNELS=ON), not only the CI set
#   ARCHS=...  CUDA architectures (default 90a: Hopper, an H100/H200; 80 for an A100)
#   JOBS=...   parallel build jobs (default: all cores)
#   BUILD=...  build directory (default build/gpu-bundle[-full] in the repository)
#   MAX_MIB=.. the size limit of what is carried (default 40)
#
# DIR gets bin/kvattn_gpu_bundle (stripped), run.sh, profile.sh (ncu over the benchmarks) and
# bundle.info (commit, archs, kernels). A binary over MAX_MIB (the --full one: 62.6 MiB for 90a,
# which with the repository would pass the 64 MiB a device call carries) is shipped as
# bin/kvattn_gpu_bundle.xz instead (5.8 MiB), which run.sh unpacks there (xz, or python3's lzma).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || ( $# -eq 2 && "${2:-}" != "--full" ) ]]; then
  echo "usage: $0 DIR [--full]" >&2
  exit 2
fi
DIR=$(mkdir -p "$1" && cd "$1" && pwd)
FULL=OFF
[[ "${2:-}" == "--full" ]] && FULL=ON
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ARCHS=${ARCHS:-90a}
JOBS=${JOBS:-$(nproc)}
MAX_MIB=${MAX_MIB:-40}
suffix=""
[[ $FULL == ON ]] && suffix=-full
BUILD=${BUILD:-$ROOT/build/gpu-bundle$suffix}

log() { echo "[gpu-bundle $(date -u +%H:%M:%S)] $*"; }
START=$SECONDS
log "archs $ARCHS, full kernels $FULL, $JOBS jobs, build $BUILD, bundle $DIR"
mkdir -p "$(dirname "$BUILD")"  # a fresh clone has no build/ for the configure log
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVATTN_CUDA=ON \
  "-DKVATTN_CUDA_ARCHS=$ARCHS" -DKVATTN_CUDA_FULL_KERNELS=$FULL -DKVATTN_BUILD_TESTS=ON \
  -DKVATTN_BUILD_TOOLS=OFF -DKVATTN_BUILD_BENCH=OFF -DKVATTN_BUILD_PYTHON=OFF \
  >"$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$JOBS" --target kvattn_gpu_bundle
log "built in $((SECONDS - START)) s"

mkdir -p "$DIR/bin"
rm -f "$DIR/bin/kvattn_gpu_bundle" "$DIR/bin/kvattn_gpu_bundle.xz"
cp "$BUILD/tests/cuda/kvattn_gpu_bundle" "$DIR/bin/kvattn_gpu_bundle"
strip "$DIR/bin/kvattn_gpu_bundle"
cp "$ROOT/scripts/gpu-bundle-run.sh" "$DIR/run.sh"
cp "$ROOT/scripts/gpu-bundle-profile.sh" "$DIR/profile.sh"
chmod +x "$DIR/run.sh" "$DIR/profile.sh"
"$ROOT/tests/cuda/check_bundle_deps.sh" "$DIR/bin/kvattn_gpu_bundle"

mib_of() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
bytes=$(stat -c %s "$DIR/bin/kvattn_gpu_bundle")
mib=$(mib_of "$bytes")
{
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(
    git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "archs: $ARCHS"
  echo "full kernels: $FULL"
  echo "binary: bin/kvattn_gpu_bundle, $mib MiB stripped"
  "$DIR/bin/kvattn_gpu_bundle" device 2>/dev/null | grep -E '^ *(fa2|fa3)' || true
} >"$DIR/bundle.info"
if (( bytes > MAX_MIB * 1048576 )); then
  xz -T0 -6 "$DIR/bin/kvattn_gpu_bundle"
  bytes=$(stat -c %s "$DIR/bin/kvattn_gpu_bundle.xz")
  mib=$(mib_of "$bytes")
  echo "shipped: bin/kvattn_gpu_bundle.xz, $mib MiB (run.sh unpacks it)" >>"$DIR/bundle.info"
fi
cat "$DIR/bundle.info"
if (( bytes > MAX_MIB * 1048576 )); then
  log "FAILED: the bundle's binary is $mib MiB, over the $MAX_MIB MiB limit"
  exit 1
fi
log "bundle ready in $((SECONDS - START)) s: $DIR ($mib MiB); on the GPU machine: $DIR/run.sh OUT"

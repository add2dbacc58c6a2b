#!/usr/bin/env bash
# The Python package on a GPU machine (docs/cuda.md): builds and installs it into the Python that
# already has torch (and nanobind and scikit-build-core: no build isolation, no network), with
# the CUDA kernels for this GPU's arch only, then runs the tests on CUDA torch tensors
# (tests/python/test_cuda_tensors.py). Writes OUT/python-build.log, OUT/python-tests.log,
# OUT/python-tests.xml and OUT/python-summary.txt.
#
#   scripts/gpu-python.sh OUT
#
#   PYTHON=...  the interpreter with torch (default: python3)
#   ARCHS=...   CUDA architectures (default: the GPU's own: 90a on an H100/H200, 80 on an A100)
#   JOBS=...    parallel build jobs (default: all cores)
#   WHEELS=DIR  where pytest's wheels are when the machine's Python lacks pytest (made here by
#               `pip download -d DIR pytest`; installed with --no-index)
#
# Exit 0 only when the package built, imported with CUDA support, and every test passed: a
# skipped test (no device seen, a kernel not built) is a failure here.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
SUMMARY=$OUT/python-summary.txt
: >"$SUMMARY"
START=$SECONDS
log() { echo "[gpu-python $(date -u +%H:%M:%S) +$((SECONDS - START))s] $*" | tee -a "$SUMMARY"; }

if [[ -z "${ARCHS:-}" ]]; then
  CC=$( (nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true) |
    head -1 | tr -d ' .')
  case "$CC" in
    90) ARCHS=90a ;;
    "")
      log "FAILED: no CUDA device (nvidia-smi reports no GPU); set ARCHS to build anyway"
      exit 3
      ;;
    *) ARCHS=$CC ;;
  esac
fi
log "python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>&1), torch $(
  "$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
log "build: archs $ARCHS, $JOBS jobs"

# No isolation: the build uses the machine's nanobind, scikit-build-core, cmake and ninja; no
# dependency is fetched (--no-deps: numpy and torch are there).
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
t0=$SECONDS
if ! (cd "$ROOT" && "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -v . \
  -C build-dir=build/python-gpu -C cmake.define.KVATTN_CUDA=ON \
  "-C" "cmake.define.KVATTN_CUDA_ARCHS=$ARCHS") >"$OUT/python-build.log" 2>&1; then
  log "FAILED: pip install (see python-build.log):"
  grep -E "error|Error" "$OUT/python-build.log" | head -10 | tee -a "$SUMMARY"
  exit 1
fi
log "built and installed in $((SECONDS - t0)) s"

# The installed package, imported from outside the source tree, must see the GPU.
if ! (cd "$OUT" && "$PYTHON" -c '
import kvattn, sys
d = kvattn.devices()
print("kvattn devices:", d.get("cuda"), d.get("cuda_status"))
sys.exit(0 if d.get("cuda") else 1)') >>"$SUMMARY" 2>&1; then
  log "FAILED: the installed kvattn sees no CUDA device (see above)"
  exit 1
fi

if ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
  if [[ -n "${WHEELS:-}" && -d "$WHEELS" ]]; then
    "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" pytest >>"$SUMMARY" 2>&1 ||
      { log "FAILED: installing pytest from $WHEELS"; exit 1; }
  else
    log "FAILED: pytest is not installed here; make its wheels where there is network" \
      "(pip download -d WHEELS_DIR pytest), carry them, and rerun with WHEELS=WHEELS_DIR"
    exit 1
  fi
fi

t0=$SECONDS
(cd "$ROOT/tests/python" && timeout -k 10 600 "$PYTHON" -m pytest -q -rs -p no:cacheprovider \
  "--junitxml=$OUT/python-tests.xml" test_cuda_tensors.py) >"$OUT/python-tests.log" 2>&1
rc=$?
tail -5 "$OUT/python-tests.log" >>"$SUMMARY"
skipped=$(grep -o 'skipped="[0-9]*"' "$OUT/python-tests.xml" 2>/dev/null | head -1 | grep -o '[0-9]*')
tests=$(grep -o 'tests="[0-9]*"' "$OUT/python-tests.xml" 2>/dev/null | head -1 | grep -o '[0-9]*')
if [[ $rc -ne 0 ]]; then
  log "FAILED: pytest exit $rc after $((SECONDS - t0)) s (see python-tests.log)"
  exit 1
elif [[ -z "$tests" || "$tests" -eq 0 ]]; then
  log "FAILED: no test ran"
  exit 1
elif [[ "${skipped:-0}" -gt 0 ]]; then
  log "FAILED: $skipped of $tests test(s) skipped (a skip is not a pass on a GPU machine)"
  exit 1
fi
log "passed: $tests test(s) in $((SECONDS - t0)) s; total $((SECONDS - START)) s"

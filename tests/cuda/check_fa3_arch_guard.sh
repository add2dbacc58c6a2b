#!/usr/bin/env bash
# fa3's kernel translation units compiled for any target but sm_90a must fail to build, never
# yield an empty kernel (prefill.cuh's #error): the device pass of one generated fa3 TU is
# preprocessed (nvcc -E, a few seconds) for sm_80 and sm_90 (must fail, naming sm_90a) and for
# sm_90a (must pass: the guard is not unconditional).
#
#   tests/cuda/check_fa3_arch_guard.sh NVCC SOURCE.cu -I... 
set -uo pipefail
nvcc=$1 src=$2
shift 2
status=0
for arch in 80 90 90a; do
  out=$("$nvcc" -std=c++20 --expt-relaxed-constexpr "$@" \
    "--generate-code=arch=compute_${arch},code=sm_${arch}" -E -o /dev/null "$src" 2>&1)
  rc=$?
  if [[ $arch == 90a ]]; then
    if [[ $rc -ne 0 ]]; then echo "FAIL sm_$arch: refused ($out)"; status=1; else echo "ok   sm_$arch builds"; fi
  elif [[ $rc -eq 0 ]]; then
    echo "FAIL sm_$arch: fa3's TU preprocessed without error (an empty kernel would be built)"
    status=1
  elif ! grep -q "compile them for sm_90a only" <<<"$out"; then
    echo "FAIL sm_$arch: failed, but not with fa3's arch guard: $out"
    status=1
  else
    echo "ok   sm_$arch refused: $(grep -m1 -o 'fa3.s kernels use wgmma.*' <<<"$out")"
  fi
done
exit $status

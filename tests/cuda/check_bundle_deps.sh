#!/usr/bin/env bash
# The GPU bundle's dependency check (docs/cuda.md): every binary given may need, at run time,
# only glibc's libraries (the driver's libcuda is dlopened by the static CUDA runtime, never
# NEEDED). Names any other NEEDED entry - libgtest/libgmock, libstdc++, libgcc_s, libcudart -
# and the binary holding it.
#
#   tests/cuda/check_bundle_deps.sh BINARY...
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 BINARY..." >&2; exit 2; }
allowed='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$'
status=0
for bin in "$@"; do
  if [[ ! -f "$bin" ]]; then
    echo "FAIL $bin: no such file"
    status=1
    continue
  fi
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  if ! grep -qx 'libc.so.6' <<<"$needed"; then
    echo "FAIL $bin: readelf shows no NEEDED libc.so.6 (not a dynamically linked glibc binary?)"
    status=1
  fi
  bad=$(grep -Ev "$allowed" <<<"$needed" || true)
  if [[ -n "$bad" ]]; then
    echo "FAIL $bin needs $(tr '\n' ' ' <<<"$bad")(only glibc may be needed: GoogleTest, the C++"
    echo "     runtime and cudart must be linked statically)"
    status=1
  else
    echo "ok   $bin needs only: $(tr '\n' ' ' <<<"$needed")"
  fi
done
exit $status

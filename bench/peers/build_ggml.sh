#!/usr/bin/env bash
# Builds the ggml peer: a ggml checkout (targets ggml-base, ggml-cpu; Release, GGML_NATIVE=ON)
# and this directory's driver ggml_fa.cc against it, all outside the repository.
#
#   bench/peers/build_ggml.sh GGML [OUT]
#
# GGML: a ggml source tree, or a ggml git directory (a clone's .git or a bare repository), from
# which the commit $GGML_COMMIT (default HEAD) is exported with `git archive` into OUT/ggml-src.
# OUT (default ~/.cache/kvattn/peers) receives ggml-src/ (when GGML is a git directory),
# ggml-build/, ggml_fa_bench and ggml-commit.txt (the commit the driver reports in its JSON).
# JOBS (default 2) and NICE (default 10) keep the build polite on a shared machine.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src_arg="${1:?usage: build_ggml.sh GGML_SOURCE_OR_GIT_DIR [OUT_DIR]}"
out="${2:-$HOME/.cache/kvattn/peers}"
jobs="${JOBS:-2}"
nice_level="${NICE:-10}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [ -f "$src_arg/CMakeLists.txt" ] && [ -f "$src_arg/include/ggml.h" ]; then
  src="$(cd "$src_arg" && pwd)"
  commit="$(git -C "$src" rev-parse HEAD 2>/dev/null || true)"
  [ -n "$commit" ] || commit="${GGML_COMMIT:-unknown}"
else
  # A git directory: export one commit's tree (no work tree needed, nothing written to GGML).
  rev="${GGML_COMMIT:-HEAD}"
  commit="$(git --git-dir="$src_arg" rev-parse "$rev^{commit}")"
  src="$out/ggml-src"
  if [ "$(cat "$src/.kvattn-commit" 2>/dev/null)" != "$commit" ]; then
    rm -rf "$src"
    mkdir -p "$src"
    git --git-dir="$src_arg" archive "$commit" | tar -x -C "$src"
    echo "$commit" > "$src/.kvattn-commit"
  fi
fi
echo "$commit" > "$out/ggml-commit.txt"
echo "ggml $commit from $src"

build="$out/ggml-build"
nice -n "$nice_level" cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
nice -n "$nice_level" cmake --build "$build" -j "$jobs" --target ggml-base ggml-cpu

# The static libraries, in link order; ggml-cpu uses OpenMP when ggml found it (its default).
libs=()
for name in ggml-cpu ggml-base; do
  lib="$(find "$build" -name "lib$name.a" | head -1)"
  [ -n "$lib" ] || { echo "lib$name.a not found under $build" >&2; exit 1; }
  libs+=("$lib")
done
openmp=()
if grep -q '^GGML_OPENMP_ENABLED:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null ||
   grep -rqs 'GGML_USE_OPENMP' "$build/src/ggml-cpu/CMakeFiles" 2>/dev/null; then
  openmp=(-fopenmp)
fi
nice -n "$nice_level" "${CXX:-g++}" -std=c++20 -O2 -march=native \
  -DKVATTN_GGML_COMMIT="\"$commit\"" -I "$src/include" \
  "$here/ggml_fa.cc" "${libs[@]}" "${openmp[@]}" -lpthread -lm -o "$out/ggml_fa_bench"
echo "built $out/ggml_fa_bench (ggml $commit${openmp:+, OpenMP})"

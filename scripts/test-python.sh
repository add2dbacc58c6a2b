#!/usr/bin/env bash
# Builds and installs the Python package into a cached virtual environment and runs its pytest
# suite. The environment lives outside the clone (torch is gigabytes), one per set of pinned
# requirements: ~/.cache/kvattn/venv-<hash of python/requirements-test.txt>.
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/requirements-test.txt
hash=$(sha256sum "$req" | cut -c1-12)
venv="${KVATTN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvattn/venv-$hash}"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "test-python: making $venv"
  python3 -m venv --clear "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r "$req"
  touch "$venv/.complete"
fi
# The compiler the C++ build takes (CMake's default c++, or $CXX): pip's build would otherwise
# take Python's sysconfig g++, and ccache keys on the compiler's name, so the package's every
# object compiled again after the release build's (~9 min of CI on 2 cores).
export CXX=${CXX:-c++}
# The package as a user installs it (`pip install .`), built with the pinned build requirements
# already in the venv; the build tree is kept in build/python so a rerun is incremental.
"$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps . \
  -C build-dir=build/python
# Run from outside the source tree so the installed package is what is imported.
cd tests/python
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# The test suite on other releases than CI's (torch 2.13.0 CPU, Python 3.11), one fresh venv each,
# on this CPU machine (Triton under its interpreter). Not part of CI: each venv downloads a CUDA
# build of torch from PyPI (~4.6 GB). Run by hand before a GPU session, or after a dependency
# moves:
#   bash .ci/version_matrix.sh [LOG_DIR]            (default /tmp/version_matrix)
#   ONLY=gpu-image bash .ci/version_matrix.sh       (one row, by name)
# Rows: name | python | pip requirements. "gpu-image" is the GPU machine's torch 2.11 + triton
# 3.6 (README "On a GPU machine"); its NumPy is held below 2.4, whose change breaks triton 3.6's
# interpreter (tests/conftest.py stops at once with that message otherwise). "newest" is the
# newest torch release on PyPI (2.15.0 on 2026-12-03; this machine's pip config caps torch at
# 2.14.1, the release on its disk, so the rows' installs set PIP_CONSTRAINT=/dev/null and pin
# exact releases instead), "oldest-python" the floor of requires-python, "newest-python" the
# newest Python here (3.13) on the newest torch. Writes LOG_DIR/<name>.log and one summary line
# per row to LOG_DIR/summary.txt; the exit status is 1 when a row's suite failed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${1:-/tmp/version_matrix}
mkdir -p "$LOGS"
: > "$LOGS/summary.txt"
DEPS="numpy scipy pytest pytest-benchmark hypothesis matplotlib tqdm scikit-learn torch-geometric"
python_of() {   # pyenv's build of Python $1 where there is one, else python$1 on PATH
  local p
  p=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python 2>/dev/null | tail -1)
  if [ -n "$p" ]; then echo "$p"; else command -v "python$1"; fi
}
ROWS=(
  "gpu-image|$(python_of 3.11)|torch==2.11.0 triton==3.6.0 numpy<2.4"
  "newest|$(python_of 3.11)|torch==2.15.0"
  "oldest-python|$(python_of 3.10)|torch==2.13.0"
  "newest-python|$(python_of 3.13)|torch==2.15.0"
)
export PIP_CONSTRAINT=/dev/null   # every row pins its releases itself
status=0
for row in "${ROWS[@]}"; do
  IFS='|' read -r name py reqs <<< "$row"
  [ -z "${ONLY:-}" ] || [ "$name" = "$ONLY" ] || continue
  log="$LOGS/$name.log"
  if [ -z "$py" ] || [ ! -x "$py" ]; then
    echo "$name: no interpreter found, skipped" | tee -a "$LOGS/summary.txt"; continue
  fi
  env_dir="$LOGS/venv-$name"
  rm -rf "$env_dir"
  {
    "$py" -m venv "$env_dir" &&
    "$env_dir/bin/python" -m pip install -q -U pip "setuptools>=70.1" &&
    # shellcheck disable=SC2086  # reqs / DEPS: several words on purpose
    "$env_dir/bin/python" -m pip install -q $reqs $DEPS &&
    "$env_dir/bin/python" -m pip install -q --no-deps -e . &&
    "$env_dir/bin/python" -c "import sys, torch, triton, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)" &&
    "$env_dir/bin/python" -m pytest --benchmark-disable -q -p no:cacheprovider
  } > "$log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$name: rc $rc; $(grep -m1 '^python ' "$log"); $(tail -1 "$log")" | tee -a "$LOGS/summary.txt"
  [ -n "${KEEP:-}" ] || rm -rf "$env_dir"     # ~5 GB each; KEEP=1 keeps them
done
# the editable installs above point at this checkout; reinstall yours if it was one of them
exit $status

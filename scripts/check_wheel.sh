#!/usr/bin/env bash
# The wheel check: build specscope's wheel, install it (not editable) into a fresh virtual
# environment, and run the commands from a folder outside the source tree. A module or a
# resource missing from the wheel fails here, which an editable install would hide.
#
# usage: scripts/check_wheel.sh [PYTHON]   PYTHON: an interpreter that has specscope's
#        dependencies (default .venv/bin/python); the fresh environment borrows them by
#        path, so nothing is downloaded, and gets specscope itself only from the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
WORK=$(mktemp -d /tmp/specscope-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" . 2>&1 | grep -v "^WARNING: Location" || true
rm -rf build
WHEEL=$(ls "$WORK"/dist/specscope-*.whl)
echo "wheel: built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"

python3 -m venv "$WORK/venv"
# the dependencies by path: a plain sys.path entry, so the source tree's editable hook (a
# .pth file there) is not run
DEPS=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$DEPS" > "$SITE/specscope-wheel-check-deps.pth"
"$WORK/venv/bin/python" -m pip install -q --no-deps "$WHEEL" 2>&1 | grep -v "^WARNING: Location" || true

cd "$WORK"  # no source tree on the path
BIN="$WORK/venv/bin"
where=$("$BIN/python" -c 'import specscope.app.cli, specscope.core.decode.decoder as d; print(d.__file__)')
case "$where" in
    "$SITE"/*) echo "wheel: specscope imports from the installed wheel ($where)";;
    *) echo "wheel: specscope imports from $where, not from the wheel"; exit 1;;
esac
"$BIN/specscope" --help >/dev/null && echo "wheel: specscope --help ok"
"$BIN/specscope" run --max-new 12 --seed 1 --db "$WORK/runs.sqlite" --json >"$WORK/run.json"
echo "wheel: specscope run --db ok ($(tr -d '\n' < "$WORK/run.json" | cut -c1-100)...)"
"$BIN/specscope" check "$WORK/runs.sqlite" && echo "wheel: specscope check ok"
"$BIN/specscope" open --help >/dev/null && echo "wheel: specscope open --help ok"
echo "wheel: all checks passed"

#!/usr/bin/env bash
# The guardrails, each run to the end so one report shows them all: ruff (lint), ruff
# (format check), mypy (strict on core/ and storage/, lenient on app/: pyproject.toml's
# [tool.mypy]), import-linter (the layer, no-Qt/no-SQL and no-cycle contracts in
# pyproject.toml's [tool.importlinter]) and scripts/check_references.py (no comment or doc names
# a module or path that does not exist). Exit status 1 when any of them fails.
#
#   bash scripts/lint.sh [PYTHON]        PYTHON: the environment's interpreter (default .venv/bin/python)
#   LINT_COUNTS=1 bash scripts/lint.sh   also print ruff's and mypy's counts per rule / per package
#   MYPY_STRICT=1 bash scripts/lint.sh   mypy must be clean (else: no folder over its ceiling in
#                                        scripts/mypy_ceiling.txt, while the errors are fixed)
#
# The fixers are not run here (they rewrite files): `ruff check --fix` and `ruff format` by hand.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
failed=()

step() {  # step NAME COMMAND...: run it, remember a failure, go on
    local name=$1; shift
    echo "lint: $name"
    if ! "$@"; then failed+=("$name"); fi
}

step "ruff check" "$PY" -m ruff check --output-format concise .
step "ruff format --check" "$PY" -m ruff format --check .
# mypy reads the folders under their installed names through build/typecheck/specscope (links)
mkdir -p build/typecheck/specscope
for folder in core storage app; do ln -sfn "../../../$folder" "build/typecheck/specscope/$folder"; done
mypy_ratchet() {  # mypy is not clean yet: fail when a folder has more errors than its ceiling
    local out folder count ceiling bad=0
    out=$("$PY" -m mypy 2>&1)
    while read -r folder ceiling; do
        [ -n "$folder" ] && [ "${folder#\#}" = "$folder" ] || continue
        count=$(printf '%s\n' "$out" | grep -cE "^build/typecheck/specscope/$folder/.*: error:" || true)
        if [ "$count" -gt "$ceiling" ]; then
            echo "mypy: $folder has $count errors, more than its ceiling $ceiling (scripts/mypy_ceiling.txt):"
            printf '%s\n' "$out" | grep -E "^build/typecheck/specscope/$folder/.*: error:" | sed 's#^build/typecheck/specscope/##' | tail -n 40
            bad=1
        elif [ "$count" -lt "$ceiling" ]; then
            echo "mypy: $folder has $count errors, below its ceiling $ceiling: lower it in scripts/mypy_ceiling.txt"
        else
            echo "mypy: $folder has $count errors (its ceiling)"
        fi
    done < scripts/mypy_ceiling.txt
    return $bad
}
if [ "${MYPY_STRICT:-0}" = 1 ]; then step "mypy" "$PY" -m mypy; else step "mypy (ceilings)" mypy_ratchet; fi
step "stale references" "$PY" scripts/check_references.py
step "lint-imports" "$PY" -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())' --no-cache

if [ "${LINT_COUNTS:-0}" = 1 ]; then
    echo "lint: ruff counts per rule"
    "$PY" -m ruff check --statistics . || true
    echo "lint: mypy errors per top-level folder"
    "$PY" -m mypy 2>/dev/null | grep -E '^[a-z_]+/.*: error:' | cut -d/ -f1 | sort | uniq -c || true
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "lint: FAILED: ${failed[*]}"
    exit 1
fi
echo "lint: all clean"

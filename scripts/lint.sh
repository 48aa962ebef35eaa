#!/usr/bin/env bash
# The guardrails, each run to the end so one report shows them all: ruff (lint), ruff
# (format check), mypy (strict on core/ and storage/, lenient on app/: pyproject.toml's
# [tool.mypy]), import-linter (the layer, no-Qt/no-SQL and no-cycle contracts in
# pyproject.toml's [tool.importlinter]) and scripts/check_references.py (no comment or doc names
# a module or path that does not exist). Exit status 1 when any of them fails.
#
#   bash scripts/lint.sh [PYTHON]        PYTHON: the environment's interpreter (default .venv/bin/python)
#   LINT_COUNTS=1 bash scripts/lint.sh   also print ruff's and mypy's counts per rule / per package
#   MYPY_STRICT=1 bash scripts/lint.sh   mypy must be clean everywhere (else: no folder over its
#                                        ceiling in scripts/mypy_ceiling.txt: 0 for storage/ and
#                                        core/, a ratchet for core/check/ and app/)
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
# mypy reads the folders under their installed names through build/typecheck/specscope (links;
# resources only so that `from specscope import resources` resolves: it holds no code to check)
mkdir -p build/typecheck/specscope
for folder in core storage app resources; do ln -sfn "../../../$folder" "build/typecheck/specscope/$folder"; done
mypy_ratchet() {  # fail when a folder has more errors than its ceiling (0: it must be clean)
    local out folders attributed folder count ceiling bad=0
    out=$("$PY" -m mypy 2>&1)
    if ! printf '%s\n' "$out" | grep -qE "^(Success: no issues found|Found [0-9]+ errors?) in "; then
        printf '%s\n' "$out" | tail -n 20
        echo "mypy: did not run to the end"
        return 1
    fi
    folders=$(awk 'NF && $1 !~ /^#/ {print $1}' scripts/mypy_ceiling.txt)
    # "FOLDER<tab>error line": each error counts toward the most specific folder listed (an error
    # in core/check/ is core/check's, not core's); "?" for a file under none of them
    attributed=$(printf '%s\n' "$out" | grep -E "^build/typecheck/specscope/.*: error:" | sed 's#^build/typecheck/specscope/##' |
        awk -v folders="$folders" 'BEGIN { n = split(folders, f, "\n") }
            { path = $0; sub(/:.*/, "", path); best = "?"
              for (i = 1; i <= n; i++) if (index(path, f[i] "/") == 1 && (best == "?" || length(f[i]) > length(best))) best = f[i]
              print best "\t" $0 }')
    if printf '%s\n' "$attributed" | grep -q "^?"$'\t'; then
        echo "mypy: errors in files under no folder of scripts/mypy_ceiling.txt:"
        printf '%s\n' "$attributed" | grep "^?"$'\t' | cut -f2- | tail -n 40
        bad=1
    fi
    while read -r folder ceiling; do
        [ -n "$folder" ] && [ "${folder#\#}" = "$folder" ] || continue
        count=$(printf '%s\n' "$attributed" | grep -c "^$folder"$'\t' || true)
        if [ "$count" -gt "$ceiling" ]; then
            echo "mypy: $folder has $count errors, more than its ceiling $ceiling (scripts/mypy_ceiling.txt):"
            printf '%s\n' "$attributed" | grep "^$folder"$'\t' | cut -f2- | tail -n 40
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
    "$PY" -m mypy 2>/dev/null | grep -E ': error:' | sed 's#^build/typecheck/specscope/##' | cut -d/ -f1 | sort | uniq -c || true
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "lint: FAILED: ${failed[*]}"
    exit 1
fi
echo "lint: all clean"

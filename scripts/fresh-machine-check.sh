#!/usr/bin/env bash
# The README's Quick start as a newcomer types it: a fresh clone of this repository's committed
# HEAD, a new virtual environment and an empty pip cache, then every command of the Quick start's
# code block, verbatim, in order. Fails if one fails, or if they leave files git does not ignore.
# Prints each command's time and the virtual environment's size.
#
# Usage: scripts/fresh-machine-check.sh [WORKDIR | --list]
#   WORKDIR (must not exist) keeps the clone; without it a temporary folder is used and removed.
#   --list prints the commands it would run, one a line, and runs nothing (tests/test_docs.py).
# PYTHON selects the interpreter the virtual environment is made from (default: python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

# The Quick start's commands: the 4-space-indented lines between "## Quick start" and the next
# "## " heading.
mapfile -t commands < <(
    awk '/^## /{inside = ($0 == "## Quick start")} inside && /^    [^ ]/{sub(/^    /, ""); print}' \
        "$repo/README.md"
)
if [[ ${#commands[@]} -ne 2 ]]; then
    echo "fresh-machine-check: expected 2 commands in the README's Quick start, found ${#commands[@]}" >&2
    exit 1
fi
if [[ ${1:-} == --list ]]; then
    printf '%s\n' "${commands[@]}"
    exit 0
fi

if [[ $# -gt 0 ]]; then
    work=$1
    mkdir "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
work=$(cd "$work" && pwd)

git clone --quiet "$repo" "$work/attnconv"
cd "$work/attnconv"
"$python" -m venv .venv
unset PYTHONPATH VIRTUAL_ENV PIP_USER
export PIP_CACHE_DIR="$work/pip-cache"

summary=()
for command in "${commands[@]}"; do
    echo "fresh-machine-check: \$ $command"
    start=$(date +%s)
    # a new shell per command, as a newcomer pastes them: activate, then the command verbatim
    bash -c ". .venv/bin/activate && $command"
    summary+=("$(($(date +%s) - start)) s  $command")
done

echo "fresh-machine-check: done, from a clone of $(git rev-parse --short HEAD) in $work"
printf 'fresh-machine-check: %s\n' "${summary[@]}"
echo "fresh-machine-check: virtual environment $(du -sh .venv | cut -f1)"
untracked=$(git status --porcelain --untracked-files=all)
if [[ -n $untracked ]]; then
    echo "fresh-machine-check: the commands left files git does not ignore:" >&2
    echo "$untracked" >&2
    exit 1
fi

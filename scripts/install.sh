#!/bin/sh
# Installs attnconv from this checkout (editable) into the active Python environment.
#
# A torch that is already installed is kept: any torch >= 2.1 works. With no torch and no NVIDIA
# driver (no nvidia-smi), it first installs the CPU build of torch 2.13.0, the version CI tests,
# from PyTorch's CPU index or any index pip is configured with, rather than PyPI's default build
# and its ~3 GB of CUDA libraries. Where download.pytorch.org cannot be reached pip prints a few
# "Retrying" warnings and uses the other indexes.
#
# Usage: sh scripts/install.sh [--dev]
#   --dev  also install what the tests and the docs need (pytest, pytest-xdist, hypothesis, ruff,
#          playwright, onnx, mkdocs with mkdocstrings, pymdown-extensions and the MathJax the
#          site ships, from django-static-mathjax: the dev extra of pyproject.toml)
# PYTHON selects the interpreter (default: python3, the active virtual environment's).
set -eu
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
case "${1-}" in
"") target="." ;;
--dev) target=".[dev]" ;;
*)
    echo "usage: sh scripts/install.sh [--dev]" >&2
    exit 2
    ;;
esac

if "$python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
    echo "install.sh: keeping the installed torch $("$python" -c "import importlib.metadata as m; print(m.version('torch'))")"
elif command -v nvidia-smi >/dev/null 2>&1; then
    echo "install.sh: NVIDIA driver found: pip installs PyPI's torch (with CUDA)"
else
    echo "install.sh: no torch and no NVIDIA GPU: installing torch's CPU build"
    # --no-deps: torch's own dependencies come from PyPI with the next command.
    "$python" -m pip install --no-deps "torch==2.13.0" \
        --extra-index-url https://download.pytorch.org/whl/cpu
fi
"$python" -m pip install -e "$target"

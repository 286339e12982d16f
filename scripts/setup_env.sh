#!/usr/bin/env bash
# Create (or reuse) ./.venv with everything sage-grpo and its tests need: requirements.txt (runtime), with SAGE_DEV=1
# requirements-dev.txt (the test-only packages), and this checkout installed editable (`pip install -e .`), so
# `.venv/bin/sage-grpo` and `python -m sage_grpo` run the code here. Idempotent: it installs again only what changed
# since the last install (a requirements file, pyproject.toml, the checkout's place).
#   SAGE_TORCH_SPEC   torch requirement installed first (default torch==2.13.0, the CPU build here)
#   SAGE_VENV         virtual-environment folder (default ./.venv)
#   SAGE_DEV          1: also requirements-dev.txt (the test-only packages; scripts/test.sh sets it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${SAGE_VENV:-.venv}
TORCH_SPEC=${SAGE_TORCH_SPEC:-torch==2.13.0}
SETUPTOOLS_SPEC="setuptools>=77"  # pyproject.toml's build requirement: the editable install builds with it, offline
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_env] creating virtual environment in $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.sage_grpo_installed"
want="$(sha256sum requirements.txt | cut -d' ' -f1) $TORCH_SPEC $SETUPTOOLS_SPEC"
if [ "${SAGE_DEV:-0}" = 1 ]; then want="$want dev $(sha256sum requirements-dev.txt | cut -d' ' -f1)"; fi
have="$(cat "$stamp" 2>/dev/null || true)"
# up to date: the same install, or one that also has the dev packages when they are not asked for
if [ "$have" != "$want" ] && { [ "${SAGE_DEV:-0}" = 1 ] || [[ "$have" != "$want dev "* ]]; }; then
  echo "[setup_env] installing $TORCH_SPEC and requirements.txt$([ "${SAGE_DEV:-0}" = 1 ] && echo ' and requirements-dev.txt') (about a minute on first run)"
  "$VENV/bin/python" -m pip install -q --upgrade pip "$SETUPTOOLS_SPEC"
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
  "$VENV/bin/python" -m pip install -q -r requirements.txt
  if [ "${SAGE_DEV:-0}" = 1 ]; then "$VENV/bin/python" -m pip install -q -r requirements-dev.txt; fi
  echo "$want" > "$stamp"
fi
# The package itself, editable: its dependencies are in place (--no-deps) and it builds with the setuptools above
# (--no-build-isolation), so this step reads no package index (--no-index) and takes seconds. Again only when
# pyproject.toml (the console commands) or the checkout's place changed, or the command is gone.
editable="$VENV/.sage_grpo_editable"
want_editable="$(pwd) $(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$editable" 2>/dev/null || true)" != "$want_editable" ] || [ ! -x "$VENV/bin/sage-grpo" ]; then
  echo "[setup_env] installing sage-grpo from $(pwd) (editable: the commands run this checkout)"
  # (setuptools warns that a folder named like the package sits in the working directory: that is the point here)
  PYTHONWARNINGS=ignore::UserWarning "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation --no-index -e .
  echo "$want_editable" > "$editable"
fi

#!/usr/bin/env bash
# Create (or reuse) ./.venv with everything sage-grpo and its tests need: requirements.txt (runtime) and
# with SAGE_DEV=1 requirements-dev.txt (the test-only packages). Idempotent: it reinstalls only when a file changed
# since the last install.
#   SAGE_TORCH_SPEC   torch requirement installed first (default torch==2.13.0, the CPU build here)
#   SAGE_VENV         virtual-environment folder (default ./.venv)
#   SAGE_DEV          1: also requirements-dev.txt (the test-only packages; scripts/test.sh sets it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${SAGE_VENV:-.venv}
TORCH_SPEC=${SAGE_TORCH_SPEC:-torch==2.13.0}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_env] creating virtual environment in $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.sage_grpo_installed"
want="$(sha256sum requirements.txt | cut -d' ' -f1) $TORCH_SPEC"
if [ "${SAGE_DEV:-0}" = 1 ]; then want="$want dev $(sha256sum requirements-dev.txt | cut -d' ' -f1)"; fi
have="$(cat "$stamp" 2>/dev/null || true)"
# up to date: the same install, or one that also has the dev packages when they are not asked for
if [ "$have" = "$want" ] || { [ "${SAGE_DEV:-0}" != 1 ] && [[ "$have" == "$want dev "* ]]; }; then
  exit 0
fi
echo "[setup_env] installing $TORCH_SPEC and requirements.txt$([ "${SAGE_DEV:-0}" = 1 ] && echo ' and requirements-dev.txt') (about a minute on first run)"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q -r requirements.txt
if [ "${SAGE_DEV:-0}" = 1 ]; then "$VENV/bin/python" -m pip install -q -r requirements-dev.txt; fi
echo "$want" > "$stamp"

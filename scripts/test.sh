#!/usr/bin/env bash
# The test command of the README: sets up ./.venv if needed and runs the whole test suite on the CPU, then prints its
# wall time. Extra arguments go to pytest (for example: bash scripts/test.sh -m unit, or bash scripts/test.sh -k sde;
# on a GPU: bash scripts/test.sh --device cuda -m device).
#   SAGE_PYTHON   an interpreter that already has everything (a GPU image without network): used as it is, no ./.venv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -n "${SAGE_PYTHON:-}" ]; then
  PY=$SAGE_PYTHON
else
  SAGE_DEV=1 bash scripts/setup_env.sh  # with the test-only packages (requirements-dev.txt)
  PY=.venv/bin/python
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
status=0
"$PY" -m pytest -q tests "$@" || status=$?
echo "test suite wall time: $(( $(date +%s) - start )) s on $(nproc) cores ($("$PY" -c 'import torch; print("CPU capability", torch.backends.cpu.get_cpu_capability())'))"
exit $status

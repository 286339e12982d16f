#!/usr/bin/env bash
# The test command of the README: sets up ./.venv if needed and runs the whole test suite on the CPU, then prints its
# wall time. Extra arguments go to pytest (for example: bash scripts/test.sh -m unit, or bash scripts/test.sh -k sde).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SAGE_DEV=1 bash scripts/setup_env.sh  # with the test-only packages (requirements-dev.txt)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
status=0
.venv/bin/python -m pytest -q tests "$@" || status=$?
echo "test suite wall time: $(( $(date +%s) - start )) s on $(nproc) cores ($(.venv/bin/python -c 'import torch; print("CPU capability", torch.backends.cpu.get_cpu_capability())'))"
exit $status

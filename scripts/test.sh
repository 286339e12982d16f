#!/usr/bin/env bash
# The test command of the README: sets up ./.venv if needed and runs the whole test suite on the CPU.
# Extra arguments go to pytest (for example: bash scripts/test.sh -k sde).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q tests "$@"

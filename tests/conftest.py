"""Shared test setup. Must run before triton is imported anywhere."""

import os

# Without a GPU, run Triton kernels on CPU tensors through the interpreter.
# torch only imports triton lazily, so setting this first is enough.
try:
    import torch  # noqa: E402

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["pytester"]  # tests/test_pytest_plugin.py runs pytest on example test files

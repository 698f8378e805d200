"""Shared test setup. Must run before triton is imported anywhere. Marks the tests listed in
``tests/slow_tests.txt`` slow (the fast tier: ``python -m pytest -m "not slow"``)."""

import os
from pathlib import Path

import pytest

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

SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def slow_tests() -> set[str]:
    """``path::function`` of every test listed in ``tests/slow_tests.txt`` (comments dropped)."""
    lines = (line.split("#")[0].strip() for line in SLOW_TESTS.read_text(encoding="utf-8").splitlines())
    return {line for line in lines if line}


def pytest_collection_modifyitems(config, items):
    """Mark the listed slow tests ``slow`` (all parametrizations of a listed function)."""
    slow = slow_tests()
    for item in items:
        if item.nodeid.split("[")[0] in slow:
            item.add_marker(pytest.mark.slow)

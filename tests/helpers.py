"""Project-specific test helpers, on top of kda_inductor.testing (the pytest plugin's)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
device_params = pytest.mark.parametrize(
    "device", [pytest.param(d, marks=[pytest.mark.cuda] if d == "cuda" else []) for d in DEVICES]
)


def compile_and_run(fn, *args, options: dict[str, Any] | None = None, **compile_kw):
    """Compile ``fn`` with the backend (strict unless ``options["kda"]`` says otherwise),
    caches off, run it once. Returns ``(result, matches)`` summed over graphs."""
    with fresh_compile():
        compiled = compile_for_test(fn, options=options, **compile_kw)
        out = compiled(*args)
    return out, compiled.matches


def assert_bytes_equal(actual, expected):
    """Bit-identical outputs (gathers and copies must be)."""
    assert_close_to_eager(tuple(actual), tuple(expected), exact=True)

"""pytest plugin (``pytest11`` entry point): fixtures and markers for compiled models.

* ``kda_compile`` fixture: ``kda_compile(fn, mode=..., options=..., caches=False)``
  returns a :class:`~kda_inductor.testing.CompiledForTest` that keeps the report;
  ``kda_compile.compiled`` lists every one made in the test.
* ``@pytest.mark.kda_expect(gdn_spec_split=1, ...)``: after the test, the rewrites
  of everything compiled through ``kda_compile`` must match exactly; the failure
  shows the graph diff.
* ``@pytest.mark.cuda``: skipped cleanly when no CUDA GPU is available.

Torch is imported lazily, so the plugin costs nothing in unrelated test runs.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped cleanly without one)")
    config.addinivalue_line(
        "markers",
        "kda_expect(**counts): exact kda_inductor rewrite counts over everything the test "
        "compiled with the kda_compile fixture",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")


class _Compiler:
    """The ``kda_compile`` fixture's value: a compile function that remembers."""

    def __init__(self) -> None:
        self.compiled: list[Any] = []

    def __call__(self, fn: Any, **kwargs: Any) -> Any:
        from kda_inductor.testing import compile_for_test

        c = compile_for_test(fn, **kwargs)
        self.compiled.append(c)
        return c

    @property
    def matches(self) -> dict[str, int]:
        from kda_inductor.patterns import REWRITE_NAMES

        return {n: sum(c.matches[n] for c in self.compiled) for n in REWRITE_NAMES}

    def diff(self) -> str:
        return "\n\n".join(c.diff() for c in self.compiled)


@pytest.fixture
def kda_compile() -> Any:
    """Compile with ``backend="kda_inductor"`` (caches off, strict) and keep the reports."""
    import torch

    torch._dynamo.reset()
    compiler = _Compiler()
    yield compiler
    torch._dynamo.reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    result = yield
    marker = item.get_closest_marker("kda_expect")
    if marker is not None:
        compiler = getattr(item, "funcargs", {}).get("kda_compile")
        if compiler is None:
            raise pytest.UsageError("@pytest.mark.kda_expect needs the kda_compile fixture")
        from kda_inductor.testing import assert_rewrites

        assert_rewrites(compiler, expect=dict(marker.kwargs))
    return result

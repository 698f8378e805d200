"""pytest plugin (``pytest11`` entry point): fixtures and markers for compiled models.

* ``kda_compile`` fixture: ``kda_compile(fn, mode=..., options=..., caches=False)``
  returns a :class:`~kda_inductor.testing.CompiledForTest` that keeps the report;
  ``kda_compile.compiled`` lists every one made in the test. Compiles inside it print
  neither torch's structured-trace records nor the warnings caches-off brings.
* ``@pytest.mark.kda_expect(gdn_spec_split=1, ...)``: after the test, the rewrites
  of everything compiled through ``kda_compile`` must match exactly. Names and counts are
  checked before the test runs; a failure says why a rewrite did not match (the closest
  candidates at your source lines, or that the graph was traced with grad enabled) and
  shows the graph diff, without the plugin's own frames.
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
    marker = item.get_closest_marker("kda_expect")
    if marker is not None:
        from kda_inductor.testing import check_expect

        where = f"@pytest.mark.kda_expect on {item.nodeid}"
        if marker.args:
            pytest.fail(f"{where}: give counts by name, e.g. kda_expect(indexer_k_gather=1), "
                        f"not positional arguments {marker.args}", pytrace=False)
        try:
            check_expect(dict(marker.kwargs))
        except ValueError as err:
            pytest.fail(f"{where}: {err}", pytrace=False)
        if "kda_compile" not in getattr(item, "fixturenames", ()):
            pytest.fail(f"{where} needs the kda_compile fixture (counts cover what it compiles)",
                        pytrace=False)


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
    def records(self) -> list[dict[str, Any]]:
        """Every graph record of every compile made through the fixture."""
        return [r for c in self.compiled for r in c.records]

    @property
    def matches(self) -> dict[str, int]:
        from kda_inductor.patterns import REWRITE_NAMES

        return {n: sum(c.matches[n] for c in self.compiled) for n in REWRITE_NAMES}

    def diff(self) -> str:
        return "\n\n".join(c.diff() for c in self.compiled)


@pytest.fixture
def kda_compile() -> Any:
    """Compile with ``backend="kda_inductor"`` (graph caches off, strict) and keep the reports."""
    import torch

    torch._dynamo.reset()
    compiler = _Compiler()
    yield compiler
    torch._dynamo.reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    result = yield
    marker = item.get_closest_marker("kda_expect")
    compiler = getattr(item, "funcargs", {}).get("kda_compile")
    if marker is not None and compiler is not None:
        from kda_inductor.testing import rewrite_mismatch

        message = rewrite_mismatch(compiler.records, dict(marker.kwargs))
        if message is not None:
            pytest.fail(message, pytrace=False)
    return result

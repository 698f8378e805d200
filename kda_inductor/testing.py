"""Test helpers for models compiled with ``backend="kda_inductor"``.

Also exposed as pytest fixtures and markers by ``kda_inductor.pytest_plugin``
(registered through the ``pytest11`` entry point: installing the package is
enough). Typical use::

    def test_my_layer(kda_compile):
        layer = MyLayer().eval()
        x = torch.randn(256, 8192)
        compiled = kda_compile(layer)                      # caches off, strict rewrites
        assert_close_to_eager(compiled(x), layer(x))
        assert_rewrites(compiled, expect={"gdn_spec_split": 1})   # fails with the graph diff
        ops = op_counts(compiled)                          # the graph's ops before / after our pass
        assert ops.before[torch.ops.aten.index] == 6 and ops.after[torch.ops.kda.gdn_spec_split] == 1
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TYPE_CHECKING

import torch

from kda_inductor import logs, pass_manager
from kda_inductor.diff import records_diff, short_location
from kda_inductor.options import mode_as_options
from kda_inductor.patterns import REWRITE_NAMES

__all__ = [
    "CompiledForTest",
    "OpCounter",
    "OpCounts",
    "assert_close_in_range",
    "assert_close_to_eager",
    "assert_cudagraph_safe",
    "assert_no_cudagraph_skips",
    "assert_rewrites",
    "compile_for_test",
    "counting_ops",
    "default_tolerance",
    "fresh_compile",
    "max_ulps",
    "op_counts",
]

if TYPE_CHECKING:  # pragma: no cover
    from kda_inductor.record import PassRecord


@contextlib.contextmanager
def fresh_compile(caches: bool = False) -> Iterator[None]:
    """Dynamo reset before and after; Inductor's graph caches off unless ``caches``
    (``pass_manager.graph_caches_off``: kernel caches stay on)."""
    torch._dynamo.reset()
    try:
        with _caches(caches):
            yield
    finally:
        torch._dynamo.reset()


def _caches(on: bool):
    """Every Inductor cache on (``on``), or the graph caches off: a graph compiled for a test
    goes through our pass; its kernels may come from the kernel caches."""
    return torch._inductor.config.patch(force_disable_caches=False) if on else pass_manager.graph_caches_off()


class CompiledForTest:
    """A compiled callable that keeps what our pass did to every graph it compiled."""

    def __init__(self, fn: Callable[..., Any], *, options: dict[str, Any], caches: bool, dynamic: bool | None):
        self.fn = fn
        self.caches = caches
        self.compiled = torch.compile(fn, backend="kda_inductor", options=options, dynamic=dynamic)
        self.records: list[PassRecord] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with pass_manager.observe() as records, _caches(self.caches), quiet_compile():
            try:
                return self.compiled(*args, **kwargs)
            finally:
                self.records.extend(records)

    @property
    def matches(self) -> dict[str, int]:
        """Every rewrite -> replacements summed over the graphs compiled so far."""
        return pass_manager.total_matches(self.records)

    def diff(self) -> str:
        """Rewrite table and before/after diff of every graph compiled so far."""
        return records_diff(self.records) or "(no graph was compiled: cached, or not called yet)"


class OpCounter(Counter):
    """How many ``call_function`` nodes call each op, by name (``"aten.index.Tensor"``,
    ``"kda.gated_norm_merge.default"``; a mutating op by its own name, not
    ``auto_functionalized``'s); also indexed by the op (``counts[torch.ops.aten.index.Tensor]``)
    or its packet (``counts[torch.ops.aten.index]``: every overload)."""

    def __getitem__(self, op: Any) -> int:
        if isinstance(op, str):
            return super().__getitem__(op)
        if isinstance(op, torch._ops.OpOverloadPacket):
            return sum(n for name, n in self.items() if name.startswith(f"{op}."))
        return super().__getitem__(str(op))


@dataclasses.dataclass
class OpCounts:
    """The ops of the graphs our pass ran on, counted before and after it (summed over the
    graphs), as vLLM's fusion tests count a pass's ops: ``before[op]``, ``after[op]``."""

    before: OpCounter = dataclasses.field(default_factory=OpCounter)
    after: OpCounter = dataclasses.field(default_factory=OpCounter)

    def changed(self) -> dict[str, tuple[int, int]]:
        """Op name -> ``(before, after)`` for every op whose count our pass changed."""
        names = sorted(set(self.before) | set(self.after))
        return {n: (self.before[n], self.after[n]) for n in names if self.before[n] != self.after[n]}

    def add(self, records: Iterable[PassRecord]) -> OpCounts:
        """Count the graphs of ``records`` (observed records: they hold the graphs' snapshots)."""
        for r in records:
            for counter, rows in ((self.before, r.before_nodes), (self.after, r.after_nodes)):
                counter.update(row.target for row in rows or () if row.op == "call_function")
        return self


def op_counts(compiled: CompiledForTest | Iterable[PassRecord]) -> OpCounts:
    """The ops of every graph ``compiled`` (a :func:`compile_for_test` result, or
    ``pass_manager.observe`` records) compiled so far, before and after our pass."""
    records = compiled.records if isinstance(compiled, CompiledForTest) else compiled
    return OpCounts().add(records)


@contextlib.contextmanager
def counting_ops() -> Iterator[OpCounts]:
    """The ops of the graphs our pass runs on while the block runs, before and after it, for any
    compile with the backend (``torch.compile(fn, backend="kda_inductor")``; a graph a cache served
    is not seen: ``fresh_compile()``). Filled in on exit."""
    counts = OpCounts()
    with pass_manager.observe() as records:
        try:
            yield counts
        finally:
            counts.add(records)


@contextlib.contextmanager
def quiet_compile() -> Iterator[None]:
    """What a test compile should not print: torch's structured-trace records (caught by
    pytest's log capture: empty ``DEBUG torch.__trace`` lines in failure reports) and the
    warnings that caches being off brings (dynamo_pgo "force disabled by ...")."""
    with logs.quiet_trace_log(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*force disabled by.*force_disable_caches")
        yield


def compile_for_test(fn: Callable[..., Any], *, mode: str | None = None,
                     options: dict[str, Any] | None = None, caches: bool = False,
                     strict: bool = True, force: bool = True, dynamic: bool | None = None) -> CompiledForTest:
    """``torch.compile(fn, backend="kda_inductor")`` for tests.

    Graph caches are off by default (a cache hit would skip our pass and leave nothing
    to check); ``strict`` makes a failing rewrite raise instead of warning; ``force``
    rewrites wherever a pattern matches, ignoring the speed rules (which leave code
    to Inductor where our op is not faster, e.g. on CPU): tests check matching and
    numerics. ``force=False`` compiles what a user gets.
    """
    options = dict(options or {})
    kda = dict(options.get("kda", {}))
    kda.setdefault("strict", strict)
    kda.setdefault("force", force)
    options["kda"] = kda
    # a mode is spelled as its options, so that ``strict`` and ``force`` reach our pass under it
    return CompiledForTest(fn, options=mode_as_options(mode, options), caches=caches, dynamic=dynamic)


def check_expect(expect: dict[str, Any]) -> dict[str, int]:
    """``expect`` as ``{rewrite: count}``, or ValueError naming the bad rewrite or count."""
    unknown = sorted(set(expect) - set(REWRITE_NAMES))
    if unknown:
        raise ValueError(f"unknown rewrite(s) {unknown}; valid names are {list(REWRITE_NAMES)}")
    bad = {k: v for k, v in expect.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0}
    if bad:
        raise ValueError(f"expected counts must be non-negative ints, got {bad}")
    return dict(expect)


def rewrite_mismatch(records: Sequence[PassRecord], expect: dict[str, int]) -> str | None:
    """None when every named rewrite matched exactly ``expect[name]`` times over ``records``
    (``pass_manager.observe`` records), else the failure message: what differs, why (graphs
    traced with grad enabled, the closest candidates at the user's source lines), then the
    rewrite table and graph diff of every graph."""
    total = pass_manager.total_matches(list(records))
    got = {name: total[name] for name in expect}
    if got == dict(expect):
        return None
    lines = [f"kda_inductor rewrites: expected {dict(expect)}, got {got}"]
    if not records:
        lines.append("no graph went through our pass (nothing compiled: was the compiled function called? "
                     "a cache hit?)")
        return "\n".join(lines)
    for reason in dict.fromkeys(r.skipped for r in records if r.skipped):
        lines.append(f"not rewritten: {reason}")
    for name, want in expect.items():
        if got[name] >= want:
            if got[name] > want:
                lines.append(f"{name}: {got[name] - want} more match(es) than expected")
            continue
        misses = {(m.location, m.check): m for r in records for m in r.misses.get(name, []) if m.shown}
        if not misses:
            if not all(r.skipped for r in records):
                lines.append(f"{name}: {want - got[name]} fewer match(es); no {'other ' if got[name] else ''}"
                             "candidate of this shape in the compiled graphs")
            continue
        lines.append(f"{name}: {want - got[name]} fewer match(es); closest candidates not rewritten:")
        for m in misses.values():
            where = f"{short_location(m.location)}: " if m.location else ""
            lines.append(f"  {where}not rewritten: {m.check}")
            if m.code:
                lines.append(f"      {m.code}")
    changed = any(ch["removed"] or ch["added"] for r in records for ch in r.changes.values())
    lines.append("")
    if changed:
        lines.append(records_diff(list(records)))
    else:
        lines.append(f"our pass changed nothing in the {len(records)} compiled graph(s)")
    return "\n".join(lines)


def assert_rewrites(compiled: CompiledForTest, expect: dict[str, int]) -> None:
    """Exact match counts for the named rewrites; the failure says why (misses at your
    source lines, grad mode) and shows the graph diff."""
    __tracebackhide__ = True
    message = rewrite_mismatch(compiled.records, check_expect(expect))
    if message is not None:
        raise AssertionError(message)


# torch.testing.assert_close's documented per-dtype defaults (rtol, atol), as a fallback where
# torch.testing._comparison.default_tolerances is missing. Ints, bools, fp8 compare bytewise.
_TORCH_TESTING_DEFAULTS = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def default_tolerance(expected: torch.Tensor) -> tuple[float, float]:
    """``(rtol, atol)`` that :func:`assert_close_to_eager` uses for a float tensor.

    ``rtol`` is torch.testing's default for the dtype; so is ``atol`` for float32 and float64.
    For bf16 and fp16, ``atol`` is at least one rounding step at the tensor's scale
    (``finfo(dtype).eps`` times its largest finite magnitude): eager rounds every op's result to
    16 bits while Inductor keeps a fused chain's intermediates in float32 and rounds once, so an
    output that is a difference of larger terms (a residual add, ``x - mean``) differs by a
    rounding step of those terms, not of itself. torch.testing's 16-bit ``atol`` (1e-5) fails stock
    Inductor against eager on a small bf16 model (RMSNorm, SwiGLU MLP, residual: elements near 0
    differ by up to 9e-4 where the largest is about 4; ``tests/test_pytest_plugin.py``).
    """
    comparison = getattr(torch.testing, "_comparison", None)
    if hasattr(comparison, "default_tolerances"):
        rtol, atol = comparison.default_tolerances(expected.dtype)
    else:  # pragma: no cover - every torch 2.9-2.14 has it
        rtol, atol = _TORCH_TESTING_DEFAULTS[expected.dtype]
    if expected.dtype in _LOW_PRECISION:
        finite = expected.detach()[expected.detach().isfinite()]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        atol = max(atol, torch.finfo(expected.dtype).eps * scale)
    return rtol, atol


def max_ulps(actual: torch.Tensor, expected: torch.Tensor) -> int:
    """Largest distance in units in the last place between two 16-bit float tensors of the
    same dtype (bf16 or fp16, same sign): how many representable values apart they are."""
    if actual.dtype != expected.dtype or actual.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"max_ulps: expected two bf16 or two fp16 tensors, got {actual.dtype} and {expected.dtype}")
    if actual.numel() == 0:
        return 0
    diff = actual.view(torch.int16).int() - expected.to(actual.device).view(torch.int16).int()
    return int(diff.abs().max())


def assert_close_to_eager(actual: Any, expected: Any, *, exact: bool = False,
                          rtol: float | None = None, atol: float | None = None) -> None:
    """Compare (nested) outputs with the tolerance their dtype deserves.

    Integers, bools and fp8 must be bit-identical (gathers and copies are); floats get
    :func:`default_tolerance` unless ``exact``, or ``rtol``/``atol`` when given (say, after a
    bf16 matmul that amplifies rounding differences). NaNs must sit at the same positions with
    the same bit patterns (a float32 scale read from cache bytes may be one). Shapes and dtypes
    must agree.
    """
    if isinstance(actual, (list, tuple)):
        assert isinstance(expected, (list, tuple)) and len(actual) == len(expected), (
            f"structure differs: {type(actual).__name__}[{len(actual)}] vs "
            f"{type(expected).__name__}[{len(expected) if hasattr(expected, '__len__') else '?'}]"
        )
        for i, (a, e) in enumerate(zip(actual, expected)):
            try:
                assert_close_to_eager(a, e, exact=exact, rtol=rtol, atol=atol)
            except AssertionError as err:
                raise AssertionError(f"output {i}: {err}") from None
        return
    if not isinstance(actual, torch.Tensor):
        assert actual == expected, f"{actual!r} != {expected!r}"
        return
    assert isinstance(expected, torch.Tensor), f"expected a tensor, got {type(expected).__name__}"
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{actual.dtype}{list(actual.shape)} vs {expected.dtype}{list(expected.shape)}"
    )
    if exact or actual.dtype not in _TORCH_TESTING_DEFAULTS:
        a = actual.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        e = expected.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(a, e):
            bad = int((a != e).sum())
            raise AssertionError(f"{actual.dtype} results differ in {bad} of {a.numel()} bytes")
        return
    _assert_same_nans(actual.detach().cpu(), expected.detach().cpu())
    default_rtol, default_atol = default_tolerance(expected)
    torch.testing.assert_close(actual, expected, rtol=default_rtol if rtol is None else rtol,
                               atol=default_atol if atol is None else atol, equal_nan=True)


def _assert_same_nans(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """NaN where eager has NaN, with the same bytes (compiled code copies NaNs as bytes).
    Both tensors on the CPU."""
    nan_a, nan_e = actual.isnan(), expected.isnan()
    for where, got, want in ((nan_a & ~nan_e, "NaN", "a number"), (nan_e & ~nan_a, "a number", "NaN")):
        if where.any():
            first = tuple(int(i) for i in where.nonzero()[0])
            raise AssertionError(
                f"{actual.dtype}: {got} where eager has {want} at {int(where.sum())} of {where.numel()} "
                f"position(s); first at index {first}: got {actual[first].item()}, eager {expected[first].item()}")
    a, e = (t[nan_a].view(torch.uint8) for t in (actual, expected))
    if not torch.equal(a, e):
        size = actual.element_size()
        bad = int((a.view(-1, size) != e.view(-1, size)).any(1).sum())
        raise AssertionError(f"{actual.dtype}: {bad} of {int(nan_a.sum())} NaN(s) have other bit patterns than eager's")


def assert_close_in_range(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> None:
    """Each output within one bf16 step of its range (rtol and atol 2**-7 of its largest
    magnitude): for whole layers, whose compiled parts round differently from eager (a
    recurrence, a projection summing thousands of products: values near 0 are noise)."""
    for a, e in zip(actual, expected, strict=True):
        assert_close_to_eager(a, e, rtol=2**-7, atol=2**-7 * float(e.abs().max()))


def assert_cudagraph_safe(fn: Callable[..., Any], *args: Any) -> torch.cuda.CUDAGraph:
    """``fn`` (compiled, already warmed up) runs without host syncs and can be captured
    in ``torch.cuda.graph``; the replay writes the same bytes as a plain call."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        expected = fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = _clone(expected)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_eager(captured, expected, exact=True)
    graph.captured = captured  # keep the outputs alive with the graph
    return graph


def assert_no_cudagraph_skips(fn: Callable[[], Any]) -> list[str]:
    """Run ``fn`` (which compiles with ``mode="reduce-overhead"``) and assert Inductor
    skipped CUDA graphs nowhere; the failure lists Inductor's reasons. Compiles inside
    ``fn`` run with Inductor's ``triton.cudagraph_or_error`` where it has it, so a skip
    also fails at once, where it happens."""
    from torch._dynamo.utils import counters

    from kda_inductor._explain import CompileLogCapture

    patches = ({"triton.cudagraph_or_error": True}
               if hasattr(torch._inductor.config.triton, "cudagraph_or_error") else {})
    before = counters["inductor"]["cudagraph_skips"]
    with CompileLogCapture().attached() as capture, torch._inductor.config.patch(patches):
        fn()
    skipped = counters["inductor"]["cudagraph_skips"] - before
    reasons = capture.parsed()[2]
    assert skipped == 0, f"{skipped} cudagraph skip(s): {reasons}"
    return reasons


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, Sequence) and not isinstance(x, str):
        return type(x)(_clone(v) for v in x)
    return x

"""The spelling corpus: real-world spellings of the four rewrites' code shapes, and near-misses.

Each :class:`Spelling` is our own function written in the style of one public source (named
in ``source``; read with the search tools, never copied), a builder of fresh random inputs
(outputs and caches poisoned with random bytes, never zeros), the exact number of matches
expected per rewrite (rewrites not named must match 0 times) and an eager comparison.

``run_case`` compiles the spelling with the backend (strict, forced: on CPU the speed rules
would otherwise leave everything to Inductor), runs it and eager on clones of the same
inputs, checks the match counts and compares outputs and mutated arguments; arguments the
spelling does not mutate must come back unchanged. ``tests/spellings/test_corpus.py``
parametrizes it over the corpus; ``python -m tests.spellings.status`` prints the status table
with the closest misses of every failing case.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kda_inductor.patterns import REWRITE_NAMES
from kda_inductor.reference import QUANT_GROUP, written_cache_mismatch
from kda_inductor.testing import assert_close_to_eager, compile_for_test, fresh_compile, max_ulps

FORCED = {"kda": {"strict": True, "force": True}}
"""Compile options of every case: failing rewrites raise, speed rules ignored."""

Compare = Callable[["Run", "Run"], None]
"""``compare(got, want)``: ``got`` from the compiled spelling, ``want`` from eager."""


@dataclasses.dataclass
class Run:
    """One call of a spelling: its result and its (possibly mutated) arguments."""

    out: Any
    args: list[Any]


@dataclasses.dataclass(frozen=True)
class Spelling:
    """One real-world spelling (or near-miss) of a rewrite's code shape."""

    name: str
    source: str
    """``owner/repo: path`` of the public code this spelling imitates (or what it varies)."""
    fn: Callable[..., Any]
    make_inputs: Callable[[int], Sequence[Any]]
    """``seed -> args``: fresh random inputs; caches and output buffers poisoned."""
    expect: dict[str, int]
    """Exact matches per rewrite; rewrites not named must match 0 times."""
    compare: Compare
    mutated_args: tuple[int, ...] = ()
    """Indices of the arguments the spelling writes in place (compared by ``compare``);
    every other tensor argument must come back bit-identical."""
    why: str = ""
    """For near-misses and judgement calls: why this count."""
    graph_check: Callable[[list[dict[str, Any]]], str | None] | None = None
    """Optional check of the pass records (e.g. that the merge itself was fused, not just the
    norm): returns what is wrong, or None."""

    @property
    def expected(self) -> dict[str, int]:
        unknown = set(self.expect) - set(REWRITE_NAMES)
        if unknown:
            raise ValueError(f"{self.name}: unknown rewrite(s) {sorted(unknown)}")
        return {name: self.expect.get(name, 0) for name in REWRITE_NAMES}


# --------------------------------------------------------------------------- running


def clone_args(args: Sequence[Any]) -> list[Any]:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def run_eager(case: Spelling, args: Sequence[Any]) -> Run:
    args = clone_args(args)
    with torch.no_grad():
        out = case.fn(*args)
    return Run(out, args)


def run_compiled(case: Spelling, args: Sequence[Any]):
    """``(Run, CompiledForTest)``; the compiled object keeps the pass records (misses)."""
    args = clone_args(args)
    with torch.no_grad(), fresh_compile():
        compiled = compile_for_test(case.fn, options=FORCED)
        out = compiled(*args)
    return Run(out, args), compiled


def misses_text(compiled, names: Sequence[str] | None = None) -> str:
    """The closest misses the pass recorded, per rewrite: ``"name: location: check"`` lines."""
    lines = []
    for record in compiled.records:
        for name, misses in record.misses.items():
            if names is not None and name not in names:
                continue
            for miss in misses:
                lines.append(f"  {name}: {miss.location or '?'}: {miss.check}")
        if record.skipped:
            lines.append(f"  (graph skipped: {record.skipped})")
    return "\n".join(lines) or "  (no misses recorded)"


def on_device(case: Spelling, seed: int, device: str):
    """``(fn, args)`` of ``case`` on ``device`` (modules copied there, inputs moved)."""
    fn = case.fn
    if device != "cpu" and isinstance(fn, torch.nn.Module):
        fn = copy.deepcopy(fn).to(device)
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in case.make_inputs(seed)]
    return fn, args


def check_case(case: Spelling, seed: int = 0, device: str = "cpu"):
    """Compile and run ``case`` on fresh inputs; assert counts, numerics and untouched inputs.
    Returns the compiled object (for its records)."""
    fn, args = on_device(case, seed, device)
    case = dataclasses.replace(case, fn=fn)
    want = run_eager(case, args)
    got, compiled = run_compiled(case, args)
    expected = case.expected
    if compiled.matches != expected:
        wrong = sorted(n for n in expected if compiled.matches[n] != expected[n])
        raise AssertionError(
            f"{case.name}: matches {dict(compiled.matches)}, expected {expected}\n"
            f"closest misses:\n{misses_text(compiled, wrong)}"
        )
    if case.graph_check is not None:
        why = case.graph_check(compiled.records)
        if why:
            raise AssertionError(f"{case.name}: {why}\n{compiled.diff()}")
    for i, (a, g) in enumerate(zip(args, got.args)):
        if isinstance(a, torch.Tensor) and i not in case.mutated_args:
            assert_close_to_eager(g, a, exact=True)
    case.compare(got, want)
    return compiled


# --------------------------------------------------------------------------- graph checks

_SCATTER = re.compile(r"aten\.(index_put|index_copy|slice_scatter|select_scatter|copy)\b")
_NORM_CALL = re.compile(r"kda\.gated_norm_merge\.default\]\(args = \(\[[^\]]*\], \[([^\]]*)\]")


def merge_fused(records: list[dict[str, Any]]) -> str | None:
    """The merge (index_put / index_copy) and the copy into the output (slice / select
    scatter) are gone: the fused op reads the halves, not a merged buffer."""
    after = "\n".join(r.after for r in records)
    left = sorted(set(m.group(1) for m in _SCATTER.finditer(after)))
    if left:
        return f"only part of the merge was fused: aten.{', aten.'.join(left)} still in the graph after our pass"
    calls = _NORM_CALL.findall(after)
    if not calls or not all(c.strip() for c in calls):
        return "the fused op takes no indices: the merge was not fused"
    return None


def copy_fused(records: list[dict[str, Any]]) -> str | None:
    """The copy into the (padded) output is gone: the fused op reads the source directly."""
    after = "\n".join(r.after for r in records)
    left = sorted(set(m.group(1) for m in _SCATTER.finditer(after)))
    return f"the copy into the output is still in the graph: aten.{', aten.'.join(left)}" if left else None


# --------------------------------------------------------------------------- comparisons


def _flat(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def exact(got: Run, want: Run) -> None:
    """Bit-identical outputs and mutated arguments (gathers and copies)."""
    assert_close_to_eager(_flat(got.out), _flat(want.out), exact=True)
    assert_close_to_eager(got.args, want.args, exact=True)


def within_ulps(limit: int = 2) -> Compare:
    """16-bit float outputs within ``limit`` ulps (the norm bound); other outputs by dtype."""

    def compare(got: Run, want: Run) -> None:
        for i, (g, w) in enumerate(zip(_flat(got.out), _flat(want.out), strict=True)):
            assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype, w.dtype)
            if g.dtype in (torch.bfloat16, torch.float16):
                ulps = max_ulps(g, w)
                assert ulps <= limit, f"output {i}: {ulps} ulps apart (at most {limit})"
            else:
                assert_close_to_eager(g, w)

    return compare


def close(rtol: float, atol: float) -> Compare:
    """Stock Inductor's own rounding of code it keeps (near-misses computed in 16-bit floats)."""

    def compare(got: Run, want: Run) -> None:
        assert_close_to_eager(_flat(got.out), _flat(want.out), rtol=rtol, atol=atol)

    return compare


def blocked_cache(cache_arg: int, slots: Callable[[Sequence[Any]], torch.Tensor], head_dim: int, *,
                  block_size: int | None = None, exact_scales: bool = True,
                  also: Compare | None = None) -> Compare:
    """The cache argument ``cache_arg`` (blocked layout, 3-D, 2-D page buffer or any view with
    ``block_size`` tokens per block) as eager writes it: bytes outside the written slots
    identical, written values within one fp8 step, and (``exact_scales``) the float32 scales
    bit-identical. ``slots(args)`` gives the slot each token lands in (< 0: not written)."""

    def compare(got: Run, want: Run) -> None:
        g, w = got.args[cache_arg].cpu(), want.args[cache_arg].cpu()
        s = slots(want.args).cpu().long()
        bs = block_size or g.shape[1]
        row = head_dim + 4 * (head_dim // QUANT_GROUP)
        g3 = g.reshape(-1).view(-1, bs, row)
        w3 = w.reshape(-1).view(-1, bs, row)
        why = written_cache_mismatch(g3, w3, s, head_dim)
        assert why is None, why
        if exact_scales:
            sb = row - head_dim
            s = s[s >= 0]
            cols = (bs * head_dim + (s % bs) * sb)[:, None] + torch.arange(sb)
            gs = g3.reshape(g3.shape[0], -1)[(s // bs)[:, None], cols]
            ws = w3.reshape(w3.shape[0], -1)[(s // bs)[:, None], cols]
            bad = int((gs != ws).any(1).sum())
            assert bad == 0, f"{bad} of {s.numel()} written scales differ from eager"
        if also is not None:
            also(got, want)

    return compare


# --------------------------------------------------------------------------- inputs


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, dtype=torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def poison(g: torch.Generator, *shape: int, dtype=torch.uint8) -> torch.Tensor:
    """Random bytes viewed as ``dtype`` (a buffer the code overwrites)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).view(*shape)


def partition(g: torch.Generator, num_tokens: int, num_spec: int, dtype=torch.int32, sort: bool = True):
    """Two disjoint index tensors covering ``range(num_tokens)``: (spec, non_spec)."""
    perm = torch.randperm(num_tokens, generator=g)
    spec, non_spec = perm[:num_spec], perm[num_spec:]
    if sort:  # vLLM's token indices come from masks: ascending
        spec, non_spec = spec.sort().values, non_spec.sort().values
    return spec.to(dtype), non_spec.to(dtype)


def all_cases() -> list:
    """Every case of every ``tests/spellings/cases_*.py`` module (a new rewrite adds its own
    module; nothing lists them), in file-name order."""
    import importlib
    import pathlib

    here = pathlib.Path(__file__).parent
    return [case for path in sorted(here.glob("cases_*.py"))
            for case in importlib.import_module(f"tests.spellings.{path.stem}").CASES]

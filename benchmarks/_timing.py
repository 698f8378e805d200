"""Timing, table and result-recording helpers shared by the project's benchmarks.

GPU timings come from CUDA-graph replay (``graph_replay_median_us``): the function
is warmed up (which also triggers ``torch.compile``), ONE call is captured into a
``torch.cuda.CUDAGraph`` and the graph is replayed back to back, ``inner`` replays
between one pair of CUDA events, ``reps`` times; the result is the median of the
per-replay averages. This takes Python, guards and launch overhead out of the
number, like the project's anchor measurements.

L2 caching: by default one input set is captured, so small inputs may be served
from L2 (H200: 50 MB). Pass several callables (one per input set, same shapes)
to rotate: each is captured into its own graph and the graphs are replayed
round-robin, so the data one replay touches was last touched ``len(fns) - 1``
replays earlier; choose enough sets that their footprint is well beyond L2.
The copy-bandwidth floor uses a 2 GiB buffer and therefore is always a DRAM
number.

Functions that cannot be captured (host syncs) are timed call by call with
``eager_median_us``; ``perf_counter_median_us`` is the CPU-only stand-in used by
smoke runs, whose numbers are not meaningful.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

Column = tuple[str, str, str]
"""A table column: (row key, header, format spec); ``None`` values print as ``-``."""


# --------------------------------------------------------------------------- timing


def _as_list(fns: Callable | Sequence[Callable]) -> list[Callable]:
    """One callable or a sequence of them, as a list."""
    return [fns] if callable(fns) else list(fns)


def capture_graph(fn: Callable, *, warmup: int = 3, calls: int = 1):
    """Warm ``fn`` up on a side stream, then capture ``calls`` back-to-back calls
    into one CUDA graph.

    Returns ``(graph, output)``; keep the output alive as long as the graph.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            out = fn()
    torch.cuda.synchronize()
    return graph, out


def replay_median_us(graphs: Sequence, *, reps: int = 100, inner: int = 20) -> float:
    """Median microseconds per replay of ``graphs`` replayed round-robin.

    Each sample is one event pair around ``inner`` back-to-back replays.
    """
    order = itertools.cycle(graphs)
    for graph in graphs:  # first replays upload the graphs
        graph.replay()
    torch.cuda.synchronize()
    # keep the GPU busy ~50 ms first so that clocks have ramped up from idle
    # (latency-bound microsecond kernels are otherwise timed at idle clocks)
    t_end = time.perf_counter() + 0.05
    while time.perf_counter() < t_end:
        for _ in range(inner):
            next(order).replay()
        torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(reps):
        start.record()
        for _ in range(inner):
            next(order).replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(samples)


def alternating_replay_us(graphs: dict[str, Any], *, rounds: int = 3, reps: int = 10,
                          inner: int = 2) -> dict[str, list[float]]:
    """Per label, the ``replay_median_us`` of its CUDA graph in each of ``rounds`` rounds that
    replay every graph in turn: variants timed this way share the GPU's clock drift instead
    of favouring whichever was timed first (whole model steps; take the median of the rounds)."""
    samples: dict[str, list[float]] = {label: [] for label in graphs}
    for _ in range(rounds):
        for label, graph in graphs.items():
            samples[label].append(replay_median_us([graph], reps=reps, inner=inner))
    return samples


def graph_replay_median_us(fns: Callable | Sequence[Callable], *, warmup: int = 3,
                           reps: int = 100, inner: int = 20, calls: int = 1) -> float:
    """Median microseconds of one call of ``fn``, by CUDA-graph replay.

    ``fns`` is one zero-argument callable or several (one per input set, to rotate
    among input sets; see the module docstring). Each is warmed up ``warmup``
    times and captured once, ``calls`` calls per graph; see ``replay_median_us``
    for ``reps``/``inner``. With ``calls > 1`` the host's cost of launching a
    graph (2-5 us, and jittery) is amortized: a microsecond kernel replayed
    one per graph measures the host, not the GPU.
    """
    captured = [capture_graph(fn, warmup=warmup, calls=calls) for fn in _as_list(fns)]
    graphs = [graph for graph, _ in captured]
    return replay_median_us(graphs, reps=reps, inner=inner) / calls


def eager_median_us(fn: Callable, reps: int = 5, *, warmup: int = 1) -> float:
    """Median microseconds of plain calls of ``fn``, each between two CUDA events.

    For functions that cannot be captured (host syncs); host time is included.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def kernel_profile(fn: Callable, *, calls: int = 3, warmup: int = 2,
                   device: str = "cuda") -> dict[str, tuple[float, int]]:
    """Each GPU kernel ``calls`` calls of ``fn`` launch (``torch.profiler``, after ``warmup``
    calls): ``{kernel name: (mean us per call, launches per call)}``. ``device="cpu"``: the
    operators' self CPU time instead (smoke runs: not meaningful)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
    out: dict[str, tuple[float, int]] = {}
    for evt in prof.key_averages():
        if cuda:
            us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
        else:
            us = getattr(evt, "self_cpu_time_total", 0.0)
        if us and evt.key and not evt.key.startswith("ProfilerStep"):
            prev_us, prev_n = out.get(evt.key, (0.0, 0))
            out[evt.key] = (prev_us + us / calls, prev_n + evt.count // calls)
    return out


def perf_counter_median_us(fn: Callable, reps: int = 5, *, warmup: int = 1) -> float:
    """Median wall-clock microseconds of ``fn`` by ``time.perf_counter`` (CPU smoke only)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def measure_copy_bandwidth(device, nbytes: int = 2 << 30, *, reps: int = 10,
                           inner: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write.

    Copies an ``nbytes`` buffer (default 2 GiB, far beyond L2) two ways and
    returns the faster: ``cudaMemcpy`` (``dst.copy_(src)``) timed with events
    outside a graph, and an SM copy kernel (``bitwise_or(src, 0)`` on int32
    words) timed by graph replay. Inside a CUDA graph a plain ``copy_``
    becomes a memcpy node that can run far below the SMs' bandwidth (2.7
    against 4.3 TB/s seen on an H200), which would flatter every ratio.
    """
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)
    memcpy_us = eager_median_us(lambda: dst.copy_(src), reps=reps, warmup=2)
    s32, d32 = src.view(torch.int32), dst.view(torch.int32)
    kernel_us = graph_replay_median_us(
        lambda: torch.bitwise_or(s32, 0, out=d32), warmup=2, reps=reps, inner=inner
    )
    del src, dst, s32, d32
    torch.cuda.empty_cache()
    return 2 * nbytes / (min(memcpy_us, kernel_us) * 1e-6)


def sm_copy_us(nbytes: int, *, reps: int = 50, calls: int = 10) -> float:
    """Graph-replay time per call of a plain SM copy kernel moving ``nbytes`` (read plus
    written, as the floors count them): what a kernel moving those bytes can hope for."""
    src = torch.empty(max(1, nbytes // 8), dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    return graph_replay_median_us(lambda: torch.bitwise_or(src, 0, out=dst), reps=reps, calls=calls)


# --------------------------------------------------------------------------- tables


def _cell(value, spec: str) -> str:
    """Format one table cell; ``None`` becomes ``-``."""
    return "-" if value is None else format(value, spec)


def table_cells(rows: Iterable[dict], columns: Sequence[Column]) -> list[list[str]]:
    """Rows formatted as strings, one list per row, in column order."""
    return [[_cell(row.get(key), spec) for key, _, spec in columns] for row in rows]


def print_table(rows: Sequence[dict], columns: Sequence[Column], title: str = "") -> None:
    """Print ``rows`` as a table: with ``rich`` if importable, else aligned text."""
    headers = [header for _, header, _ in columns]
    cells = table_cells(rows, columns)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
        if title:
            print(title)
        for line in [headers, ["-" * w for w in widths], *cells]:
            print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
        return
    table = Table(title=title or None)
    for header in headers:
        table.add_column(header, justify="right")
    for row in cells:
        table.add_row(*row)
    Console().print(table)


def markdown_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    """``rows`` as a GitHub markdown table."""
    lines = ["| " + " | ".join(header for _, header, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in table_cells(rows, columns)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- recording


def environment_info() -> dict:
    """Date (UTC), GPU name, torch and triton versions of this run."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton_version,
    }


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    """Write ``payload`` as indented JSON to ``path``, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def append_markdown(path: str | os.PathLike, title: str, env: dict, table: str,
                    notes: str = "") -> Path:
    """Append a dated section (GPU, torch, triton, ``notes``, ``table``) to ``path``.

    Creates the file, headed by ``# title``, if it does not exist.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "" if path.exists() else f"# {title}\n"
    section = (f"\n## {env['date']}\n\n"
               f"GPU: {env['gpu']}; torch {env['torch']}; triton {env['triton']}\n\n"
               + (notes + "\n\n" if notes else "") + table)
    with path.open("a") as f:
        f.write(header + section)
    return path


def record_results(name: str, payload: dict, table: str, *, results_dir: str | os.PathLike,
                   title: str, notes: str = "") -> list[Path]:
    """Record one run: ``results_dir/name.json`` (latest run only) and a dated section
    appended to ``results_dir/name.md``. Returns the paths written.

    ``payload`` must hold the ``environment_info()`` dict under ``"env"``.
    """
    results_dir = Path(results_dir)
    return [write_json(results_dir / f"{name}.json", payload),
            append_markdown(results_dir / f"{name}.md", title, payload["env"], table, notes)]


def write_out_json(filename: str, payload: dict) -> Path | None:
    """Write ``payload`` to ``$OUT/filename`` if the ``OUT`` env var is set."""
    out = os.environ.get("OUT")
    return write_json(Path(out) / filename, payload) if out else None


def add_ratios(row: dict, ratios: Sequence[tuple[str, str, str]]) -> dict:
    """Set ``row[key] = row[numerator] / row[denominator]`` for each ``(key, numerator,
    denominator)``; None where either is missing or None. Returns ``row``."""
    for key, num, den in ratios:
        a, b = row.get(num), row.get(den)
        row[key] = None if a is None or b is None else a / b
    return row


def progress(row: dict) -> None:
    """Print one finished row at once (a run cut short by a time limit keeps them)."""
    print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)


def finish(name: str, rows: Sequence[dict], columns: Sequence[Column], notes: str, *, smoke: bool,
           record: bool, results_dir: str | os.PathLike, started: float) -> None:
    """Print the table; unless ``smoke``, write ``$OUT/bench_<name>.json`` and, if ``record``,
    the results files (``record_results``)."""
    print_table(rows, columns, title=f"{name}: {notes}")
    print(f"({time.perf_counter() - started:.0f} s)")
    if smoke:
        return
    payload = {"benchmark": name, "env": environment_info(), "notes": notes, "rows": list(rows)}
    write_out_json(f"bench_{name}.json", payload)
    if record:
        record_results(name, payload, markdown_table(rows, columns), results_dir=results_dir,
                       title=f"{name} benchmark", notes=notes)


def bypass_rule(name: str) -> Callable[[], None]:
    """Rewrite ``name`` wherever it matches (its speed rule returns None) from now on, every other
    rewrite keeping its rule; returns what puts the rule back."""
    from kda_inductor.patterns import REWRITES

    cls = REWRITES[name]
    saved = cls.__dict__.get("speed_rule")
    cls.speed_rule = lambda self, match: None

    def restore() -> None:
        if saved is None:
            del cls.speed_rule
        else:
            cls.speed_rule = saved
    return restore


@contextlib.contextmanager
def rule_bypassed(name: str):
    """:func:`bypass_rule` while the block compiles."""
    restore = bypass_rule(name)
    try:
        yield
    finally:
        restore()

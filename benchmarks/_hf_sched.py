"""How ``benchmarks.hf_models`` spends a device call: which compiles a case gets (the recipe),
the order they start in, several compiling at once while one at a time uses the GPU.

A compile's process is mostly CPU work: importing torch and transformers, Dynamo's trace,
Inductor's lowering and code generation, Triton's compiler. What it measures is GPU work: the
step's CUDA-graph replays, the kernel profile, the logits check, and before those the GPU work
that sets a case up (the model's random init, the fp32 reference, the eager prefill of a decode
case's cache) and Inductor's autotuning on the first call. ``--jobs N`` runs N compile
processes at once; each takes the run's **GPU lock** (``GpuLock``, an ``flock`` on a file of
the run) for every GPU phase: held while it sets its case up, given back while Dynamo and
Inductor compile, taken again when the compile ends (Dynamo's ``on_compile_end`` callback,
before the compiled code's first call runs and autotunes) and kept until the process ends. So
no two processes' GPU work overlaps, and a timed replay never shares the GPU with another
compile's work; only the CPU-bound compiles overlap. The time a process waited for the lock is
taken out of its ``compile_s`` and recorded (``lock_wait_s``); its time holding it is
``gpu_s``. Compiles that run beside others compete for the CPU: ``compile_s`` of a parallel
run is longer than a lone user's (``TORCHINDUCTOR_COMPILE_THREADS`` is set to the cores / jobs).

Recipes (``--recipe``): ``rounds`` (every variant ``--compiles`` times, the first on an empty
cache, the others reading it, variants alternating round by round) and ``table`` (the table a
user reads: stock and stock+fix ``--compiles`` times, each on an empty cache of its own, since
a warm compile repeats its cold compile's autotune choice and stock's choice is a lottery; kda
once cold and once warm; each kda-no-<rewrite> once cold; eager once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
import time
from typing import Any, Callable, Iterable

RECIPES = ("rounds", "table")


NO_FLA = "@no-fla"
"""A variant's suffix: the same variant in a process where fla-core cannot be imported
(``sys.modules["fla"] = None`` before transformers looks for it), so transformers runs its torch
paths: ``kda@no-fla`` against ``kda`` is issue 43's "kda without fla-core" in the step."""
NO_CUDNN_SDP = "@no-cudnn-sdp"
"""A variant's suffix: the same variant with cuDNN's attention off
(``torch.backends.cuda.enable_cudnn_sdp(False)``), so sdpa takes flash attention where it can.
What it measures: the decode step's costliest Inductor kernel under kda on an H100 (2026-12-05,
decode 128, 210-232 us) feeds cuDNN attention and is most likely the GQA repeat of K / V that
cuDNN's op needs (flash reads the KV heads as they are)."""
WITH = "@with-"
"""A variant's suffix naming a rewrite, ``kda@with-<rewrite>``: kda with that rewrite's speed rule
bypassed (it fires wherever it matches, every other rewrite keeping its rule): a forced-only
rewrite's whole-step A / B, ``kda@with-gqa_decode_attention`` against ``kda``. ``@with-gdn_chunk``
names the prefill Dynamo rules instead (``kda_inductor/_dynamo_chunk.py``): fla's chunk entry points
and transformers' torch chunk references traced as ``kda::gdn_chunk`` (every ``*_RULE_MEASURED`` there
set), issue 43's "our chunk core against fla's in the prefill step"; with ``@no-fla``, against
Inductor's code for the torch reference (Kimi Linear's, forced only until measured)."""
FLAGS = {
    "gdn_chunk": ("kda_inductor._dynamo_chunk", ("CHUNK_RULE_MEASURED", "KDA_CHUNK_RULE_MEASURED",
                                                 "TORCH_CHUNK_RULE_MEASURED", "TORCH_KDA_RULE_MEASURED")),
    "gqa_decode_kernel": ("kda_inductor.patterns.gqa_decode_attention", ("KERNEL_MEASURED",)),
}
"""``@with-`` names that are not registry rewrites: each sets its module's not-yet-measured flags
(``gdn_chunk``: the prefill Dynamo rules; ``gqa_decode_kernel``: ``gqa_decode_attention``'s fold
calls our decode kernel instead of torch's sdpa)."""
DYNAMO_RULES = tuple(FLAGS)
_WITH = re.compile(r"@with-([a-z0-9_]+)")
MODIFIERS = (NO_FLA, NO_CUDNN_SDP)


def hide_fla() -> str | None:
    """Makes fla-core unimportable in this process (``import fla`` fails, ``find_spec`` finds
    nothing) before transformers looks for it; an error text where it is already imported."""
    import sys

    if sys.modules.get("fla") is not None:
        return "fla-core is already imported in this process (--in-process): cannot hide it"
    sys.modules["fla"] = None
    return None


def apply_modifiers(variant: str) -> str | None:
    """What ``variant``'s suffixes ask of this process, done before the model is built; an error
    text where one cannot be."""
    if NO_CUDNN_SDP in variant:
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)
    for name in _WITH.findall(variant):  # a fresh process a compile: the rule stays bypassed in it
        from kda_inductor import REWRITE_NAMES

        if name in FLAGS:
            import importlib

            module = importlib.import_module(FLAGS[name][0])
            for flag in FLAGS[name][1]:  # a flag per device type (a dict) on for every device
                on = {"cuda": True, "cpu": True} if isinstance(getattr(module, flag), dict) else True
                setattr(module, flag, on)
            continue
        if name not in REWRITE_NAMES:
            return (f"{variant}: no rewrite {name!r} (the registry's: {', '.join(REWRITE_NAMES)}; "
                    f"Dynamo rules: {', '.join(DYNAMO_RULES)})")
        from benchmarks._timing import bypass_rule

        bypass_rule(name)
    return hide_fla() if NO_FLA in variant else None


def base_variant(variant: str) -> str:
    """``variant`` without its :data:`MODIFIERS`."""
    for suffix in MODIFIERS:
        variant = variant.replace(suffix, "")
    return _WITH.sub("", variant)


def modified(variant: str) -> bool:
    return base_variant(variant) != variant


def round_states(recipe: str, compiles: int, variant: str, caches: str) -> list[str]:
    """The cache state of each compile of ``variant``: ``cold`` (an empty cache), ``warm``
    (reading its first compile's) or ``disabled``; eager: one entry, ``-``."""
    variant = base_variant(variant)
    if variant == "eager":
        return ["-"]
    if recipe == "table":
        if variant.startswith("kda-no-"):
            states = ["cold"]
        elif variant == "kda":
            states = ["cold", "warm"]
        else:
            states = ["cold"] * compiles
    elif recipe == "rounds":
        states = ["cold"] + ["warm"] * (compiles - 1)
    else:
        raise ValueError(f"recipe: unknown {recipe!r} (one of {RECIPES})")
    if caches == "disable":
        return ["disabled"] * len(states)
    if caches == "each-fresh":
        return ["cold"] * len(states)
    return states


@dataclasses.dataclass(frozen=True)
class Job:
    """One compile: a variant's ``round``-th compile of a (family, case)."""

    family: str
    case: str
    variant: str
    round: int
    state: str          # cold / warm / disabled / - (eager)
    order: tuple        # where it starts in a sequential run

    @property
    def key(self) -> tuple:
        return (self.family, self.case, self.variant, self.round)

    @property
    def needs(self) -> tuple | None:
        """The job whose cache this one reads (a warm compile: its variant's first)."""
        return (self.family, self.case, self.variant, 0) if self.state == "warm" else None


def variant_rank(variant: str, fired_order: list[str]) -> tuple:
    base, hidden = {"eager": 0, "stock": 1, "stock+fix": 2, "kda": 3}, int(modified(variant))
    variant = base_variant(variant)
    if variant in base:
        return (base[variant], hidden)
    name = variant.removeprefix("kda-no-")
    return (4, fired_order.index(name) if name in fired_order else len(fired_order), name, hidden)


def case_jobs(family: str, case: str, case_index: int, variants: Iterable[str], recipe: str, compiles: int,
              caches: str, fired_order: list[str]) -> list[Job]:
    """Every compile of ``variants`` of one (family, case), in the order a sequential run takes:
    round by round, variants alternating within a round."""
    out = []
    for v in variants:
        for r, state in enumerate(round_states(recipe, compiles, v, caches)):
            out.append(Job(family, case, v, r, state, (case_index, r, variant_rank(v, fired_order))))
    return sorted(out, key=lambda j: j.order)


class Scheduler:
    """Runs jobs ``jobs`` at a time in ``order``, a warm compile only after the compile whose
    cache it reads finished; ``on_done(job, record)`` may return jobs to add (kda's first
    compile names the rewrites that fired: their kda-no-<rewrite> compiles). Nothing starts
    once ``spent()`` is true; what never started is returned."""

    def __init__(self, run: Callable[[Job], dict], on_done: Callable[[Job, dict], list[Job]],
                 spent: Callable[[], bool], jobs: int = 1):
        self.run, self.on_done, self.spent, self.jobs = run, on_done, spent, max(1, jobs)

    def __call__(self, jobs: list[Job]) -> list[Job]:
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        pending = sorted(jobs, key=lambda j: j.order)
        done: set[tuple] = set()
        running: dict[Any, Job] = {}
        not_started: list[Job] = []
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            while pending or running:
                started = False
                while pending and len(running) < self.jobs and not self.spent():
                    ready = next((j for j in pending if j.needs is None or j.needs in done), None)
                    if ready is None:
                        break
                    pending.remove(ready)
                    running[pool.submit(self.run, ready)] = ready
                    started = True
                if self.spent() and pending:
                    not_started += pending
                    pending = []
                if not running:
                    if pending and not started:  # waiting on a job that will never run
                        not_started += pending
                        pending = []
                    continue
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in finished:
                    job = running.pop(fut)
                    done.add(job.key)
                    added = self.on_done(job, fut.result())
                    pending = sorted(pending + [j for j in added if j.key not in done], key=lambda j: j.order)
        return not_started


class GpuLock:
    """An exclusive ``flock`` on ``path`` shared by a run's compile processes (no path: a lock
    that is always free, the sequential run's). Re-entrant within a process; released when the
    process ends whatever happens."""

    def __init__(self, path: str | None):
        self.path, self.fd = path, None
        self.waited = 0.0       # seconds spent waiting for it
        self.held_s = 0.0       # seconds held (closed spans)
        self._since: float | None = None
        self._mutex = threading.Lock()

    def acquire(self) -> None:
        with self._mutex:
            if self.fd is not None or not self.path:
                if self._since is None:
                    self._since = time.perf_counter()
                return
            import fcntl

            t0 = time.perf_counter()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.fd, self._since = fd, time.perf_counter()
            self.waited += self._since - t0

    def release(self) -> None:
        with self._mutex:
            if self._since is not None:
                self.held_s += time.perf_counter() - self._since
                self._since = None
            if self.fd is not None:
                import fcntl

                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                self.fd = None

    def held(self) -> float:
        """Seconds held so far, the open span included."""
        return self.held_s + (time.perf_counter() - self._since if self._since is not None else 0.0)

    @contextlib.contextmanager
    def during(self):
        """Held for the block, released after it."""
        self.acquire()
        try:
            yield self
        finally:
            self.release()

    @contextlib.contextmanager
    def from_compile_end(self):
        """For a compile: the lock taken again when Dynamo's compile of a frame ends (before its
        compiled code first runs: autotuning, fla's kernels between graph breaks) and kept. On a
        torch without Dynamo's compile callbacks it is taken before the compile (compiles then do
        not overlap)."""
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            callback_handler = None
        if callback_handler is None or not hasattr(callback_handler, "register_end_callback"):
            self.acquire()
            yield self
            return

        def taken(*_args) -> None:
            self.acquire()

        callback_handler.register_end_callback(taken)
        try:
            yield self
        finally:
            with contextlib.suppress(Exception):
                callback_handler.remove_end_callback(taken)
            self.acquire()  # eager, or a call that compiled nothing: its GPU work is ours


class QuietLock:
    """A run's second ``flock`` (no path: always free), for timings that are host-bound
    (``generate()``'s Python loop, one sync a token): every compile holds it shared while it
    compiles (:func:`outside_compiles`), a timing holds it exclusively, so no compile of another
    process runs on the CPU while a process times (a cold ``generate()`` timed beside others'
    compiles ran 2.8x slower: H200, 2026-12-06, 1,611 against 4,523 tokens/s warm). A timing that
    waits lets compiles already queued go first (``flock`` does not order waiters).

    Compiles were not all: with the model's build outside the lock (CPU-side weight init on every core,
    then the copy to the GPU), ``--jobs 4`` and ``--jobs 6`` runs timed kda's batch-32 ``generate()`` no
    faster than stock's, Qwen3-Next 1,575 against 1,572 tokens/s and Kimi Linear 2,024 against 1,254,
    where one process at a time gave 16,627 against 3,104 and 11,992 against 2,351 (H100, 2026-12-07,
    ``benchmarks/results/hf_generate.md``): a process holds it shared from its build on (``shared_during``).
    Waits never hold one lock while asking for the other: a holder of the GPU lock asks for it only
    exclusively, and a shared holder never waits for the GPU lock."""

    def __init__(self, path: str | None):
        self.path, self.fd, self.waited = path, None, 0.0

    def _take(self, how: str) -> None:
        if self.path and self.fd is None:
            import fcntl

            t0, fd = time.perf_counter(), os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, getattr(fcntl, how))
            self.fd, self.waited = fd, self.waited + time.perf_counter() - t0

    def shared(self) -> None:
        """Taken shared: this process compiles."""
        self._take("LOCK_SH")

    @contextlib.contextmanager
    def shared_during(self):
        """Held shared for the block (CPU work that must not overlap another process's timing)."""
        self.shared()
        try:
            yield self
        finally:
            self.release()

    def release(self) -> None:
        if self.fd is not None:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    @contextlib.contextmanager
    def exclusive(self):
        """Held alone for the block: no other process of the run compiles meanwhile."""
        self.release()
        self._take("LOCK_EX")
        try:
            yield self
        finally:
            self.release()


KNOWN_PEAKS_GIB = {"deepseek_v32/decode128": 66.0}
"""What one process of a (family, case) was seen to hold on the GPU in an earlier run (GiB, the
context included), claimed before this run has measured its own: DeepSeek-V3.2 decode 128 held
64.2 GiB on an H100 (2026-12-07, ``.ci/table``, 6 processes at once: two others of it ran out of
memory); an H100 then admits one such process at a time."""


class GpuMemory:
    """The GPU memory ledger of a run's compile processes (``--jobs > 1``), a JSON file beside the
    lock: each live process's claim (pid -> bytes) and the most any compile of a (family, case)
    reserved. A process builds its model on the GPU only once its claim fits beside the live
    ones (it waits, the lock given back, until enough of them end): six processes of 18 GB each
    put an H100's 80 GB out of memory (2026-12-05, kimi_linear decode 128). A (family, case) not
    yet measured claims :data:`KNOWN_PEAKS_GIB`'s figure, else ``unknown`` of the card; no path: every
    claim fits."""

    def __init__(self, path: str | None, *, unknown: float = 0.3, usable: float = 0.92, poll_s: float = 2.0):
        self.path, self.unknown, self.usable, self.poll_s = path, unknown, usable, poll_s

    def _edit(self, change: Callable[[dict], Any]) -> Any:
        import fcntl
        import json

        fd = os.open(self.path + ".lk", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                with open(self.path) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                data = {}
            data.setdefault("claims", {}), data.setdefault("peaks", {})
            data["claims"] = {pid: b for pid, b in data["claims"].items() if _alive(int(pid))}
            out = change(data)
            with open(self.path, "w") as f:
                json.dump(data, f)
            return out
        finally:
            os.close(fd)

    def try_claim(self, key: str, total: int) -> bool:
        """Claims this process's need for ``key`` if it fits beside the live claims (always when
        none is live)."""
        def change(data: dict) -> bool:
            need = data["peaks"].get(key) or KNOWN_PEAKS_GIB.get(key, 0) * (1 << 30) or self.unknown * total
            others = sum(b for pid, b in data["claims"].items() if int(pid) != os.getpid())
            if others and others + need > self.usable * total:
                return False
            data["claims"][str(os.getpid())] = need
            return True
        return True if not self.path else self._edit(change)

    def admit(self, lock: "GpuLock", key: str, total: int) -> float:
        """Waits (the lock given back meanwhile) until the claim fits; returns the seconds waited."""
        t0 = time.perf_counter()
        while not self.try_claim(key, total):
            lock.release()
            time.sleep(self.poll_s)
            lock.acquire()
        return time.perf_counter() - t0

    def done(self, key: str, reserved: int) -> None:
        """Records what this process reserved at most for ``key`` and drops its claim."""
        def change(data: dict) -> None:
            data["peaks"][key] = max(data["peaks"].get(key, 0), reserved)
            data["claims"].pop(str(os.getpid()), None)
        if self.path:
            self._edit(change)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def outside_compiles(lock: "GpuLock", quiet: "QuietLock | None" = None):
    """The lock held for the block except while Dynamo compiles (given back when a compile
    starts, taken again when it ends): for a process whose compiles happen inside a longer GPU
    call (``generate()`` compiles its decode step between eager GPU work); ``quiet`` held shared
    while it compiles (given back before the GPU lock is asked for again: no wait holds one lock
    while asking for the other). Without Dynamo's compile callbacks: held throughout."""
    quiet = quiet or QuietLock(None)
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        callback_handler = None
    lock.acquire()
    if callback_handler is None or not hasattr(callback_handler, "register_start_callback"):
        yield lock
        return

    def started(*_args) -> None:
        lock.release()
        quiet.shared()

    def ended(*_args) -> None:
        quiet.release()
        lock.acquire()

    callback_handler.register_start_callback(started)
    callback_handler.register_end_callback(ended)
    try:
        yield lock
    finally:
        with contextlib.suppress(Exception):
            callback_handler.remove_start_callback(started)
            callback_handler.remove_end_callback(ended)
        quiet.release()
        lock.acquire()


def compile_threads(jobs: int) -> str | None:
    """``TORCHINDUCTOR_COMPILE_THREADS`` for each of ``jobs`` compile processes: the machine's
    cores shared out (None: one process, Inductor's own default)."""
    if jobs <= 1:
        return None
    return str(max(1, (os.cpu_count() or 1) // jobs))

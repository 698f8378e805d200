"""What every rewrite implements, and the one way it edits the graph.

A rewrite is two steps over a post-grad FX graph:

* ``find(graph)`` looks, never mutates, and returns matches;
* ``replace(graph, match)`` states its replacement as a plain function of torch and
  ``torch.ops.kda`` calls and hands it to :func:`replace_by_function`, which traces it and
  splices it in; it returns which nodes its replacement stands for (old -> new: :func:`moved`).

Matches are frozen; the pass manager remaps their inputs to earlier replacements (:func:`remap`).

The pass manager runs ``replace`` inside :func:`transaction`, so a rewrite that raises half-way
leaves the graph as it found it. The node helpers (``_graph``), the speed rules' readings of
what Inductor fuses (``_fusion``) and the rejected candidates (``_misses``) are re-exported here.
"""

from __future__ import annotations

import contextlib
import functools
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

# re-exported: the rewrites import the graph helpers and the speed rules' readings from here
from kda_inductor.patterns._fusion import cpu_min_count_rule, fused_consumer_reduction, fused_into_users  # noqa: F401
from kda_inductor.patterns._fusion import cuda_min_count_rule, inline_producer  # noqa: F401
from kda_inductor.patterns._graph import SHAPE_VIEWS, VIEWS, aten, earliest, erase_dead, escaping  # noqa: F401
from kda_inductor.patterns._graph import in_graph_order, is_dead, is_op, live_users, mutated_nodes  # noqa: F401
from kda_inductor.patterns._graph import moved, positions, prims, reachable, remap, val  # noqa: F401
from kda_inductor.patterns._misses import Miss, Misses, Stage, shown_misses, source_location  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Match:
    """One place to rewrite. Each rewrite subclasses it with typed fields for what its
    ``replace`` needs; ``nodes`` is every node of the matched region (outputs included),
    erased once dead."""

    nodes: list[fx.Node]

    @property
    def anchor(self) -> fx.Node:
        """The node a miss of this match is reported at (the last one with a source line)."""
        traced = [n for n in self.nodes if n.meta.get("stack_trace")]
        return (traced or self.nodes)[-1]

    @property
    def part(self) -> str | None:
        """Which part of its rewrite this match fuses, where a rewrite fuses more or less of the
        code it finds (``gated_norm_merge``: ``"merge + norm"`` or ``"norm alone"``); the pass
        counts each in its record (``PassRecord.parts``) and the rewrite table shows them.
        None where a rewrite has one part."""
        return None

    @property
    def device(self) -> str:
        """The device type the matched code runs on ("cuda", "cpu", ...)."""
        for n in self.nodes:
            v = val(n)
            if isinstance(v, torch.Tensor):
                return v.device.type
        return "cpu"


class Analyses:
    """Readings of one graph that several rewrites use, each computed once, by the first rewrite
    that asks (``Rewrite.analysis(graph, compute)``, keyed by ``compute``), and read by the
    others. The pass manager makes one per graph it runs on and hands it to every rewrite. A
    reading made before another rewrite replaced some of its matches keeps them: ``alive``
    tells which are left (a replacement erases its match's nodes, and only those)."""

    def __init__(self) -> None:
        self._values: dict[Callable[[fx.Graph], Any], tuple[fx.Graph, Any]] = {}

    def get(self, graph: fx.Graph, compute: Callable[[fx.Graph], Any]) -> Any:
        if compute not in self._values or self._values[compute][0] is not graph:
            self._values[compute] = (graph, compute(graph))
        return self._values[compute][1]


def alive(match: Match) -> bool:
    """No node ``match`` refers to (its region, the inputs its fields name) was erased since it
    was found: a match read from an earlier ``Analyses`` reading is still there to replace."""
    return not any(getattr(n, "_erased", False) for n in _nodes_in(match))


def _nodes_in(x: Any) -> Iterator[fx.Node]:
    """Every ``fx.Node`` in ``x``: a node, or one inside its dataclass fields and containers."""
    if isinstance(x, fx.Node):
        yield x
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _nodes_in(getattr(x, f.name))
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in x:
            yield from _nodes_in(v)


class Rewrite(Misses):
    """Base class of one rewrite; subclasses live one per file in ``patterns/``."""

    name: ClassVar[str]
    finds: ClassVar[str]
    """What the rewrite recognizes, in one line: the README's rewrite table (generated from these:
    ``kda-inductor rewrites``)."""
    spellings: ClassVar[str | None] = None
    """Every spelling it reads, at length (``docs/rewrites.md``, generated too); None: ``finds``
    says it all."""
    becomes: ClassVar[str]
    """What it puts in the graph instead (the table's last column)."""
    eager_form_hint: ClassVar[str | None] = None
    """Where to find a traceable spelling, for ``explain()`` when a frame fell back to eager."""
    runs_before: ClassVar[tuple[str, ...]] = ()
    """Rewrites (by name) that must run after this one on a graph; the registry orders by these
    and ``runs_after`` (``ordered``), a comment beside each says why."""
    runs_after: ClassVar[tuple[str, ...]] = ()
    """Rewrites (by name) that must run before this one."""
    min_cuda_capability: ClassVar[tuple[int, int]] = (8, 0)
    """The oldest GPU generation the replacement runs on (our Triton kernels are written and tested
    for sm_80+: bf16 arithmetic and dots); older GPUs get a miss even when forced
    (:meth:`device_refuses`)."""

    def __init__(self, analyses: Analyses | None = None) -> None:
        super().__init__()
        self.analyses = Analyses() if analyses is None else analyses
        """The readings of the graph this rewrite shares with the others (the pass manager's,
        one per graph it runs on)."""

    def analysis(self, graph: fx.Graph, compute: Callable[[fx.Graph], Any]) -> Any:
        """``compute(graph)``, computed once per run of the pass by the first rewrite that asks
        and read by the others (``Analyses``): e.g. the norm search of ``_merged_norms``, which
        ``gated_norm_merge`` and ``gated_norm_quant`` both read."""
        return self.analyses.get(graph, compute)

    def find(self, graph: fx.Graph) -> list[Match]:
        raise NotImplementedError

    def device_refuses(self, match: Match) -> str | None:
        """Why the GPU the match runs on cannot run the replacement (older than
        ``min_cuda_capability``), or None. Not a speed rule: ``force`` does not lift it."""
        device = next((v.device for n in match.nodes if isinstance(v := val(n), torch.Tensor)), None)
        if device is None or device.type != "cuda":
            return None
        have = tuple(torch.cuda.get_device_capability(device))
        if have >= self.min_cuda_capability:
            return None
        need = "{}.{}".format(*self.min_cuda_capability)
        return f"a GPU of compute capability {have[0]}.{have[1]}: the replacement needs {need} or newer"

    def speed_rule(self, match: Match) -> str | None:
        """Why this match is left to Inductor (its op was measured slower than Inductor's
        code for it on this device and size), or None to rewrite it. Each rewrite writes
        its rule in its pattern file, citing the measurement in ``benchmarks/results/``;
        ``options["kda"]["force"]`` ignores the rules (tests of matching and numerics)."""
        return None

    def replace(self, graph: fx.Graph, match: Match) -> dict[fx.Node, fx.Node] | None:
        """Replace ``match``; return :func:`moved` of its outputs (old -> new), which the pass
        manager applies to the later matches of the run (:func:`remap`), or None."""
        raise NotImplementedError


def ordered(classes: Iterable[type[Rewrite]]) -> dict[str, type[Rewrite]]:
    """The registry: ``classes`` by name, in an order where each runs after its ``runs_after``
    and before its ``runs_before`` (a topological order, stable: among the rewrites free to go
    next, the first listed goes first). A name no class has, or a cycle, is a ValueError."""
    by_name = {cls.name: cls for cls in classes}
    after: dict[str, set[str]] = {name: set(cls.runs_after) for name, cls in by_name.items()}
    for name, cls in by_name.items():
        for later in cls.runs_before:
            after.setdefault(later, set()).add(name)
    unknown = sorted(f"{n} (in {cls.name}'s order)" for cls in by_name.values()
                     for n in (*cls.runs_before, *cls.runs_after) if n not in by_name)
    if unknown:
        raise ValueError(f"rewrite order names unregistered rewrites: {', '.join(unknown)}")
    order: list[str] = []
    while len(order) < len(by_name):
        free = [n for n in by_name if n not in order and after[n] <= set(order)]
        if not free:
            stuck = [n for n in by_name if n not in order]
            raise ValueError(f"rewrite order has a cycle among {stuck}: " + "; ".join(
                f"{n} runs after {sorted(after[n] - set(order))}" for n in stuck))
        order.append(free[0])
    return {name: by_name[name] for name in order}


# --------------------------------------------------------------------------- transactions


@contextlib.contextmanager
def transaction(graph: fx.Graph) -> Iterator[None]:
    """Undo node insertions if the body raises.

    Rewrites insert new nodes first and reroute users last, so erasing what was
    inserted restores the graph. If users were already rerouted the graph is
    not restorable and the error propagates as a hard failure.
    """
    before = set(graph.nodes)
    try:
        yield
    except BaseException:
        new = [n for n in graph.nodes if n not in before]
        for n in reversed(new):
            if any(u in before for u in n.users):
                raise RuntimeError(
                    "kda_inductor: a rewrite failed after rerouting users; "
                    "the graph cannot be restored"
                )
            graph.erase_node(n)
        raise


class ReplacementRefused(Exception):
    """Raised inside a rewrite's ``replace`` where the replacement cannot run where it would go:
    the pass undoes it (:func:`transaction`) and records a miss at ``stage`` with the message, no
    failure and no warning."""

    def __init__(self, reason: str, stage: Stage = Stage.VALIDATED) -> None:
        super().__init__(reason)
        self.stage = stage


def aot_refusal(gm: fx.GraphModule) -> str | None:
    """Why ``gm`` (a traced replacement) cannot go into an AOTInductor package, else None. Two defects of
    AOTInductor's proxy executor (which runs custom ops in a package): an empty ``Tensor[]`` argument reaches
    the op as None (the call fails with "Expected a value of type 'List[Tensor]'", torch 2.13; its fix for int
    lists, pytorch#194324, left tensor lists out); and where :func:`proxy_executor_reads_dtypes` is False, a
    ``torch.dtype`` argument reaches the op as another dtype. Only under AOT compilation
    (``V.aot_compilation``); a compile keeps the op."""
    from torch._inductor.virtualized import V

    if not getattr(V, "aot_compilation", False):
        return None
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None or not schema.name.startswith("kda::"):
            continue
        given = dict(zip((a.name for a in schema.arguments), node.args)) | dict(node.kwargs)
        for arg in schema.arguments:
            value = given.get(arg.name)
            if isinstance(value, (list, tuple)) and not value and str(arg.type) == "List[Tensor]":
                return (f"AOTInductor cannot pass {schema.name}'s empty Tensor[] {arg.name!r} (its proxy executor "
                        f"gives the op None): left to Inductor in a package")
            if isinstance(value, torch.dtype) and not proxy_executor_reads_dtypes():
                return (f"this torch's AOTInductor passes {schema.name}'s dtype argument {arg.name!r} as another "
                        "dtype (pytorch#173562, fixed after torch 2.11): left to Inductor in a package")
    return None


@functools.lru_cache(maxsize=None)
def proxy_executor_reads_dtypes() -> bool:
    """Whether this torch's AOTInductor proxy executor maps a serialized dtype to torch's own: before
    pytorch#173562 it cast the export schema's number (float32 is 7 there) to a c10 ``ScalarType`` (7 is
    float64), so an op of a package got every dtype argument shifted by one (float32 -> float64,
    bfloat16 -> a quantized type, float64 -> complex32: on CUDA a SIGSEGV; torch 2.11, CPU and an H100,
    2026-12-07). The fix ships the converters' header, ``generated_enum_converters.h``: its presence in
    the installed torch is the feature tested (no version string)."""
    root = Path(torch.__file__).resolve().parent / "include" / "torch" / "csrc" / "inductor" / "aoti_torch"
    return (root / "generated_enum_converters.h").is_file() or not root.is_dir()


# --------------------------------------------------------------------------- replacing by a function


def replace_by_function(graph: fx.Graph, fn: Callable[..., Any], args: Iterable[Any], *,
                        outputs: Iterable[fx.Node | None], before: fx.Node, region: Iterable[fx.Node] = (),
                        origin: fx.Node | None = None) -> list[fx.Node]:
    """Replace a match by ``fn(*args)``, a plain function of torch and ``torch.ops.kda`` calls
    (``Match.replace_by_example`` of PyTorch's pattern matcher, as a rewrite's ``replace`` calls
    it). ``fx.Node`` arguments (also inside lists) are read as their fake values, everything else
    is a constant baked in. ``fn`` is traced in the graph's fake mode (``make_fx`` with Inductor's
    decompositions, symbolic sizes read back as ``sym_size`` of its inputs or the graph's
    ``SymInt`` inputs) and functionalized: a mutating op comes out as ``auto_functionalized``,
    which Inductor re-inplaces (an argument ``fn`` mutates must be among its outputs: its new
    value). The traced nodes go right before ``before`` (``meta["val"]`` set, ``origin``'s stack
    trace lent); then the users of ``outputs[i]`` read ``fn``'s i-th output (pytree-flattened;
    None: not read), users that stood before it move after it, and what of ``region`` is left dead
    is erased. Returns the new output nodes.

    Everything is inserted before any user is rerouted, so :func:`transaction` can undo a
    failure; rerouting comes last. A replacement an AOTInductor package cannot run
    (:func:`aot_refusal`) raises :class:`ReplacementRefused` before anything is inserted."""
    inputs, gm = _trace(graph, fn, list(args))
    refused = aot_refusal(gm)
    if refused:
        raise ReplacementRefused(refused)
    outputs = list(outputs)
    with graph.inserting_before(before):
        made, results = _insert(graph, gm, inputs)
    if len(results) != len(outputs):
        raise ValueError(f"kda_inductor: the replacement returns {len(results)} values for {len(outputs)} outputs")
    trace = origin.meta.get("stack_trace") if origin is not None else None
    if trace:
        for n in made:
            n.meta["stack_trace"] = trace
    new = set(made)
    for old, out in zip(outputs, results):
        if old is not None:
            old.replace_all_uses_with(out, delete_user_cb=lambda u: u not in new)
    _users_after(made)
    erase_dead(graph, region)
    return results


def _trace(graph: fx.Graph, fn: Callable[..., Any], args: list) -> tuple[list[fx.Node], fx.GraphModule]:
    """``(inputs, gm)``: ``fn`` over ``args`` traced functionally in the graph's fake mode, its
    placeholders standing for ``inputs`` (the nodes among ``args``, then the graph's ``SymInt``
    inputs, through which sizes of the graph's symbols that no input tensor has are read)."""
    from torch._guards import detect_fake_mode
    from torch._inductor.pattern_matcher import fwd_only

    flat, spec = pytree.tree_flatten(args)
    nodes = [x for x in flat if isinstance(x, fx.Node)]
    sizes = [p for p in graph.find_nodes(op="placeholder") if isinstance(val(p), torch.SymInt) and p not in nodes]

    def flat_fn(*values: Any) -> list:
        given = iter(values)
        leaves = [next(given) if isinstance(x, fx.Node) else x for x in flat]
        return fn(*pytree.tree_unflatten(leaves, spec))

    values = [val(n) for n in nodes + sizes]
    missing = [n.name for n, v in zip(nodes, values) if v is None]
    if missing:
        raise RuntimeError(f"kda_inductor: an input of the replacement has no fake value: {missing}")
    mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)]) or detect_fake_mode(
        [val(p) for p in graph.find_nodes(op="placeholder") if isinstance(val(p), torch.Tensor)])
    with mode or contextlib.nullcontext(), _functionalized_v1():
        gm = fwd_only(_functionalized(flat_fn), values)
    return nodes + sizes, gm


def _functionalized(fn: Callable[..., Any]) -> Callable[..., list]:
    """``fn`` run on functional tensors (``torch.func.functionalize``'s dispatch form, as AOT
    Autograd runs a graph): its outputs pytree-flattened; an input it mutates must be returned."""
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    def run(*values: Any) -> list:
        skip = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))
        with skip, FunctionalTensorMode():
            ins = [FunctionalTensor.to_functional(v) if isinstance(v, torch.Tensor) else v for v in values]
            outs = pytree.tree_leaves(fn(*ins))
            for i, x in enumerate(ins):
                if isinstance(x, FunctionalTensor):
                    torch._sync(x)
                    if torch._functionalize_has_data_mutation(x.elem) and not any(o is x for o in outs):
                        raise ValueError(f"kda_inductor: the replacement mutates its input {i} but does not return it")
            return [_from_functional(o) for o in outs]

    return run


def _from_functional(t: Any) -> Any:
    from torch._subclasses.functional_tensor import FunctionalTensor

    if not isinstance(t, FunctionalTensor):
        return t
    torch._sync(t)
    return torch._from_functional_tensor(t.elem)


@contextlib.contextmanager
def _functionalized_v1() -> Iterator[None]:
    """Mutating ops functionalized as ``auto_functionalized`` (v1) where this torch has the switch:
    Inductor re-inplaces v1 and ``_v2`` alike (torch 2.9-2.14), and v1 names the mutated argument
    itself, which the graph listings show as "in place on" it (``diff.py``)."""
    import torch._inductor.config as inductor_config

    with contextlib.ExitStack() as stack:
        if hasattr(inductor_config, "enable_auto_functionalized_v2"):
            stack.enter_context(inductor_config.patch(enable_auto_functionalized_v2=False))
        export_config = getattr(getattr(torch, "_export", None), "config", None)
        if hasattr(export_config, "enable_auto_functionalized_v2_for_export"):
            stack.enter_context(export_config.patch(enable_auto_functionalized_v2_for_export=False))
        yield


def _insert(graph: fx.Graph, gm: fx.GraphModule, inputs: list[fx.Node]) -> tuple[list[fx.Node], list]:
    """Copy ``gm``'s nodes into ``graph`` at its insertion point, placeholders read as
    ``inputs``: ``(the new nodes, the nodes of gm's outputs)``."""
    env: dict[fx.Node, Any] = dict(zip(gm.graph.find_nodes(op="placeholder"), inputs))
    made: list[fx.Node] = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            env[n] = graph.call_function(n.target, *fx.map_arg((n.args, n.kwargs), env.__getitem__))
            env[n].meta["val"] = n.meta.get("val")
            made.append(env[n])
        elif n.op == "output":
            return made, [env[o] if isinstance(o, fx.Node) else o for o in pytree.tree_leaves(n.args[0])]
        elif n.op != "placeholder":
            raise NotImplementedError(f"kda_inductor: a replacement traced to a {n.op} node ({n.format_node()})")
    raise AssertionError("a traced graph has an output node")


def _users_after(made: list[fx.Node]) -> None:
    """Nodes that read the new nodes but stand before them (users of a replaced output that ran
    before ``before``), with what they feed up to there, move right after the last new node,
    in their order: the graph stays topologically sorted for the rewrites that follow."""
    if not made:
        return
    last, new = made[-1], set(made)
    early: set[fx.Node] = set()
    stack = [u for n in made for u in n.users if u not in new]
    while stack:
        u = stack.pop()
        if u not in early and in_graph_order([u, last])[0] is u:
            early.add(u)
            stack.extend(u.users)
    for n in reversed(in_graph_order(early)):
        last.append(n)

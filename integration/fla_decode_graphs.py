"""Graphs of transformers' decode step with fla-core, stock against kda_inductor.

On a GPU with fla-core installed, transformers' hybrid models (tiny dims, random weights, 3
linear-attention layers + 1 full attention) run one decode step eagerly and compiled four ways,
each compile fresh:

* ``stock``: ``backend="inductor"`` (torch <= 2.12 folds ``is_exporting()``: transformers' torch
  reference, one graph; torch 2.13: fla's kernels, a graph break per layer);
* ``stock+fix``: the same with kda_inductor's ``is_exporting`` rule applied to it (fla's kernels);
* ``kda``: ``backend="kda_inductor"``: one graph, one ``kda::gdn_recurrent_step`` per layer;
* ``kda-disable``: ``options={"kda": {"disable": ["gdn_recurrent_step"]}}``: fla's kernels again.

For each it prints the graphs Dynamo made, the graph breaks, the ``kda::gdn_recurrent_step``
calls in the graphs our pass saw, and the largest difference from eager.

    python integration/fla_decode_graphs.py                       # CUDA, the real fla-core
    python integration/fla_decode_graphs.py --standin --device cpu   # CPU, tests/fla_standin.py
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import types
from pathlib import Path

import torch
import torch._dynamo.testing

ROOT = Path(__file__).resolve().parents[1]
OP = "torch.ops.kda.gdn_recurrent_step.default"
VARIANTS = ("stock", "stock+fix", "kda", "kda-disable")


_FOR_THE_PROCESS = types.SimpleNamespace(setitem=lambda d, k, v: d.__setitem__(k, v))
"""``monkeypatch.setitem`` that keeps what it sets: the stand-in stays for the whole run."""


def _modeling(family, standin: bool):
    """The family's modeling module: transformers' own (dispatching to the installed fla-core), or
    executed anew against the stand-in (``tests/fla_standin.py``, installed once, before the first
    compile, as fla-core is imported when transformers loads a model's module)."""
    import importlib

    if not standin:
        return importlib.import_module(f"transformers.models.{family.module}.modeling_{family.module}")
    sys.path.insert(0, str(ROOT / "tests"))
    import fla_standin

    if "fla" not in sys.modules:
        fla_standin.install(_FOR_THE_PROCESS)
    return fla_standin.modeling(_FOR_THE_PROCESS, family.module)


def _compiled(decoder, variant: str):
    """``(compiled decoder, counter, records of our pass)`` for one variant."""
    from kda_inductor import _dynamo_fixes

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    if variant == "stock":
        return torch.compile(decoder, backend=counter), counter, contextlib.nullcontext()
    if variant == "stock+fix":
        return torch.compile(decoder, backend=counter), counter, _dynamo_fixes.applied_to_every_backend()
    options = {"kda": {"disable": ["gdn_recurrent_step"]}} if variant == "kda-disable" else None
    return torch.compile(decoder, backend="kda_inductor", options=options), None, contextlib.nullcontext()


def run(family_name: str, device: str, standin: bool) -> None:
    from benchmarks import hf_models
    from kda_inductor.pass_manager import graph_caches_off, observe

    import transformers

    family = hf_models.BY_NAME[family_name]
    modeling = _modeling(family, standin)
    config = hf_models.config_for(family, getattr(transformers, family.config), tiny=True)
    torch.manual_seed(0)
    model = getattr(modeling, family.model)(config).to(device=device, dtype=torch.float32).eval()
    step, reset = hf_models.decode_case(model, config, batch=2, context=8, device=device)
    with torch.inference_mode():
        reset()
        expected = step(model.model).clone()
        for variant in VARIANTS:
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            compiled, counter, scope = _compiled(model.model, variant)
            reset()
            with graph_caches_off(), observe() as records, scope:
                out = step(compiled)
            graphs = counter.frame_count if counter is not None else len(records)
            breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
            ops = sum(r.before.count(OP) for r in records if r.before)
            diff = float((out.float() - expected.float()).abs().max())
            print(f"{family_name:12s} {variant:12s} graphs {graphs:3d}  breaks {breaks:3d}  "
                  f"gdn_recurrent_step {ops}  max|diff| {diff:.2e}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", action="append", help="default: qwen3_next, qwen3_5, kimi_linear, olmo_hybrid")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--standin", action="store_true", help="tests/fla_standin.py instead of fla-core")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if not args.standin:
        import fla  # noqa: F401  (fla-core: the point of the check)
    for name in args.family or ["qwen3_next", "qwen3_5", "kimi_linear", "olmo_hybrid"]:
        run(name, args.device, args.standin)


if __name__ == "__main__":
    main()

"""What ``kda_inductor.explain()`` says about a transformers family's step, in full: the report a
user reads, then what it leaves out (each graph's errors and notes, every recorded miss with its
stage, also the ``Stage.INCIDENTAL`` ones logged at DEBUG only).

    python integration/hf_explain.py --family kimi_linear --case decode32          # GPU: released dims
    python integration/hf_explain.py --family qwen3_next --case prefill --tiny     # CPU: tiny dims

``--every-miss`` records every rejected candidate of each rewrite, not only the closest ones.

Default options (the speed rules decide, as a user gets them); ``--force`` rewrites every match.
Builds the model as ``benchmarks/hf_models.py`` does (4 layers, 16 experts, bf16, random weights).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import hf_models  # noqa: E402


def _step(model, config, case: str, device: str, tiny: bool):
    if case == "prefill":
        return hf_models.prefill_case(model, config, tokens=16 if tiny else 4096, device=device)
    batch = 2 if tiny else int(case.removeprefix("decode"))
    return hf_models.decode_case(model, config, batch=batch, context=8 if tiny else 256, device=device)


def details(report) -> list[str]:
    """Each graph's errors and notes, and every miss it recorded (stage, shown or DEBUG only)."""
    lines = []
    for i, g in enumerate(report.graphs):
        lines += [f"graph {i}: {name} FAILED: {err}" for name, err in g.errors.items()]
        lines += [f"graph {i}: note: {g.note}"] if g.note else []
        for name, misses in g.all_misses.items():
            counts = Counter((m.stage, m.shown, str(m)) for m in misses)
            for (stage, shown, text), n in counts.items():
                lines.append(f"graph {i}: {name} [{stage.name}, {'shown' if shown else 'DEBUG only'}, "
                             f"{n}x, matched {g.matches.get(name, 0)}]: {text}")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", required=True, choices=sorted(hf_models.BY_NAME))
    p.add_argument("--case", default="decode32", choices=["decode32", "decode128", "prefill"])
    p.add_argument("--tiny", action="store_true", help="tiny dims on CPU")
    p.add_argument("--force", action="store_true", help="rewrite every match (ignore the speed rules)")
    p.add_argument("--every-miss", action="store_true",
                   help="record every rejected candidate, not only the closest (a diagnosis, not what users get)")
    args = p.parse_args(argv)
    import kda_inductor
    from kda_inductor.patterns.base import Rewrite

    if args.every_miss:
        Rewrite.closest_misses = lambda self: list(self.misses)

    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    family = hf_models.BY_NAME[args.family]
    built = hf_models.build(family, tiny=args.tiny, device=device)
    if built is None:
        raise SystemExit(f"{args.family}: not in this transformers")
    model, config = built
    step, reset = _step(model, config, args.case, device, args.tiny)
    options = {"kda": {"force": True}} if args.force else None
    with torch.inference_mode():
        reset()
        report = kda_inductor.Explainer(options=options)(model.model, **step.inputs())
    import transformers

    print(f"{args.family} {args.case} on {device}, transformers {transformers.__version__}, torch {torch.__version__}")
    print(report)
    print("\n--- every graph's errors, notes and recorded misses ---")
    print("\n".join(details(report)) or "(none)")


if __name__ == "__main__":
    main()

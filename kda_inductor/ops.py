"""``import kda_inductor.ops``: every ``torch.ops.kda.*`` op registered, for code that calls the
ops directly (``torch.ops.kda.gated_norm_merge(...)``, ``torch.ops.kda.gdn_recurrent_step(...)``).

``import kda_inductor`` alone registers none (it imports no torch); a compile with the backend
registers those of its rewrites (and the fla rules theirs). Each op's docstring and CPU
implementation are its computation: ``kda_inductor/lowerings/<op>.py``, one file per op family.
"""

from __future__ import annotations

import importlib
import pkgutil

from kda_inductor import lowerings

LOWERINGS = tuple(m.name for m in pkgutil.iter_modules(lowerings.__path__) if not m.name.startswith("_"))
"""The op families registered here: every public module of ``kda_inductor.lowerings``."""

for _name in LOWERINGS:
    importlib.import_module(f"kda_inductor.lowerings.{_name}")

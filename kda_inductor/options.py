"""The ``"kda"`` options of the backend: parsed once, validated, hashable.

``torch.compile(m, backend="kda_inductor", options={"kda": {...}, **inductor})``:
the ``"kda"`` key holds these options, every other key goes to Inductor as is.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

TRACE_RULES = ("gdn_recurrent_step", "gdn_chunk")
"""Names ``disable`` takes besides the rewrites': the trace rules of :mod:`kda_inductor._dynamo_fixes`
(``gdn_recurrent_step``: fla's recurrent decode entry points traced as that op; ``gdn_chunk``:
fla's ``chunk_gated_delta_rule`` and ``chunk_kda`` and transformers' torch chunk references traced as
``kda::gdn_chunk``), each named after the op it emits."""


@dataclasses.dataclass(frozen=True)
class KdaOptions:
    """Options of our post-grad pass.

    disable: names of rewrites not to run (see ``kda_inductor.REWRITE_NAMES``) and of trace rules
        not to apply (:data:`TRACE_RULES`); every other one runs (none is opt-in).
    strict: raise when a rewrite fails instead of warning and skipping it
        (for tests and debugging; users want the default, a warning).
    force: rewrite wherever a pattern matches, ignoring each rewrite's speed rule (where its
        op was measured faster than Inductor's code, by device and size): for tests of
        matching and numerics, e.g. on CPU, where the rules leave most code to Inductor.
    """

    disable: frozenset[str] = frozenset()
    strict: bool = False
    force: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | KdaOptions | None) -> KdaOptions:
        """Validate user options; unknown keys or rewrite names are a clear error."""
        if raw is None:
            return cls()
        if isinstance(raw, KdaOptions):
            return raw
        if not isinstance(raw, Mapping):
            raise TypeError(f'options["kda"] must be a dict, got {type(raw).__name__}')
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(
                f'unknown kda_inductor option(s) {unknown}; valid options are {known}'
            )
        disable = _names(raw, "disable")
        flags = {}
        for key in ("strict", "force"):
            flags[key] = raw.get(key, False)
            if not isinstance(flags[key], bool):
                raise TypeError(f'options["kda"]["{key}"] must be a bool, got {flags[key]!r}')
        return cls(disable=disable, **flags)

    def enabled(self) -> list[str]:
        """Names of the rewrites that run, in registry order."""
        from kda_inductor.patterns import REWRITES

        return [n for n in REWRITES if n not in self.disable]

    def cache_key(self) -> str:
        return f"disable={sorted(self.disable)};strict={self.strict};force={self.force}"

    def pass_uuid(self, *, grad: bool = False) -> str:
        """Our post-grad pass's content hash with these options: every kda_inductor source file,
        the options, and whether the graph is a training one (``grad``). Inductor's FX graph cache
        and vLLM's compile cache key on it (``CustomGraphPass.uuid``). Reads no torch."""
        h = hashlib.sha256(source_hash().encode())
        h.update(self.cache_key().encode())
        h.update(b"grad" if grad else b"")
        return h.hexdigest()


@functools.cache
def source_hash() -> str:
    """sha256 of every ``.py`` file of the package, with its path."""
    root = pathlib.Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _names(raw: Mapping[str, Any], key: str) -> frozenset[str]:
    """``raw[key]`` as a set of registered rewrite (or trace rule) names, or a clear error."""
    from kda_inductor.patterns import REWRITE_NAMES

    names = raw.get(key, ())
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f'options["kda"]["{key}"] must be a list of rewrite names, got {names!r}')
    names = frozenset(names)
    valid = [*REWRITE_NAMES, *(n for n in TRACE_RULES if n not in REWRITE_NAMES)]
    bad = sorted(names - set(valid))
    if bad:
        raise ValueError(
            f"unknown rewrite name(s) {bad} in options['kda']['{key}']; "
            f"valid names are {valid}"
        )
    return names


def mode_as_options(mode: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for ``torch.compile`` with ``mode`` spelled as the Inductor options it
    stands for (``"reduce-overhead"`` -> ``{"triton.cudagraphs": True}``): torch.compile takes
    one or the other, and ``options["kda"]`` has no other way in. ``options`` win."""
    if mode is None:
        return options
    import torch._inductor

    return {**torch._inductor.list_mode_options(mode), **options}

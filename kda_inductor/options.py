"""The ``"kda"`` options of the backend: parsed once, validated, hashable.

``torch.compile(m, backend="kda_inductor", options={"kda": {...}, **inductor})``:
the ``"kda"`` key holds these options, every other key goes to Inductor as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class KdaOptions:
    """Options of our post-grad pass.

    disable: names of rewrites not to run (see ``kda_inductor.REWRITE_NAMES``); every other
        rewrite runs (none is opt-in).
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


def _names(raw: Mapping[str, Any], key: str) -> frozenset[str]:
    """``raw[key]`` as a set of registered rewrite names, or a clear error."""
    from kda_inductor.patterns import REWRITE_NAMES

    names = raw.get(key, ())
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f'options["kda"]["{key}"] must be a list of rewrite names, got {names!r}')
    names = frozenset(names)
    bad = sorted(names - set(REWRITE_NAMES))
    if bad:
        raise ValueError(
            f"unknown rewrite name(s) {bad} in options['kda']['{key}']; "
            f"valid names are {list(REWRITE_NAMES)}"
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

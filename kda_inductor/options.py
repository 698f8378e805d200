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

    disable: names of rewrites not to run (see ``kda_inductor.REWRITE_NAMES``).
    strict: raise when a rewrite fails instead of warning and skipping it
        (for tests and debugging; users want the default, a warning).
    """

    disable: frozenset[str] = frozenset()
    strict: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | KdaOptions | None) -> KdaOptions:
        """Validate user options; unknown keys or rewrite names are a clear error."""
        from kda_inductor.patterns import REWRITE_NAMES

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
        disable = raw.get("disable", ())
        if isinstance(disable, str) or not isinstance(disable, Iterable):
            raise TypeError(
                f'options["kda"]["disable"] must be a list of rewrite names, got {disable!r}'
            )
        disable = frozenset(disable)
        bad = sorted(disable - set(REWRITE_NAMES))
        if bad:
            raise ValueError(
                f"unknown rewrite name(s) {bad} in options['kda']['disable']; "
                f"valid names are {list(REWRITE_NAMES)}"
            )
        strict = raw.get("strict", False)
        if not isinstance(strict, bool):
            raise TypeError(f'options["kda"]["strict"] must be a bool, got {strict!r}')
        return cls(disable=disable, strict=strict)

    def enabled(self) -> list[str]:
        """Names of the rewrites that run, in registry order."""
        from kda_inductor.patterns import REWRITE_NAMES

        return [n for n in REWRITE_NAMES if n not in self.disable]

    def cache_key(self) -> str:
        return f"disable={sorted(self.disable)};strict={self.strict}"

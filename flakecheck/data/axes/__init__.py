"""The composition axes, one module a file in this folder, each with an `AXIS` (flakecheck/data/axes/base.py
says what it declares). Adding an axis is adding its file: `declared()` finds every module here, and the
Composition's fields, the engine knobs a replay sets, explain's mechanisms, fixes and prices, and repro's
text are read from the declarations."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from flakecheck.data.axes.base import Axis


@cache
def declared() -> tuple[Axis, ...]:
    """Every axis of this folder, by rank (then name). Read once: flakecheck/data/compositions.py builds the
    Composition's fields from it when it loads."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        axis = getattr(importlib.import_module(f"{__name__}.{module.name}"), "AXIS", None)
        if isinstance(axis, Axis):
            found.append(axis)
    names = [a.name for a in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two composition axes share a name: {sorted(names)}")
    return tuple(sorted(found, key=lambda a: (a.rank, a.name)))

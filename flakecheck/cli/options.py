"""A command's typer options built from the declarations (flakecheck/run/options.py): typer reads the
signature, so a command declared with **options gets one typer.Option per declared option."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import typer

from flakecheck.run.options import RunOption

F = TypeVar("F", bound=Callable[..., Any])


def declared_options(options: Sequence[RunOption], unset: str | None = None) -> Callable[[F], F]:
    """Decorate a typer command `f(first..., **options)`: its signature keeps the parameters before
    **options and gains each declared option, with its flag, default, type and help. `unset`: the options
    default to not given (None; a switch to False), their help led by this text (`diff`'s "suites: ")."""
    def decorate(command: F) -> F:
        own = [p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=_type(o, unset),
                                   default=typer.Option(_default(o, unset), *([o.flag] if o.flag else []),
                                                        help=o.help if unset is None else unset + o.help))
                 for o in options]
        command.__signature__ = inspect.Signature([*own, *added])  # type: ignore[attr-defined]
        return command
    return decorate


def _type(option: RunOption, unset: str | None) -> Any:
    return option.cli if unset is None or option.cli is bool else option.cli | None


def _default(option: RunOption, unset: str | None) -> Any:
    if unset is None:
        return option.cli_value_default
    return False if option.cli is bool else None

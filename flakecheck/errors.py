"""Errors a user can act on. The CLI maps each to exit code 2 and one clear line."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or usage: exit code 2, nothing half-written."""

    exit_code = 2


class InputError(UserError):
    """An error located in a user's file: names the file, the line and the field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = path, line, field, message
        where = path if line is None else f"{path}:{line}"
        what = f" field '{field}':" if field else ""
        super().__init__(f"{where}:{what} {message}")


class ModelError(UserError):
    """The model cannot be found or is not an architecture the engine supports."""

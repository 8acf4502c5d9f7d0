"""The server's address: where each route is, and how the address may be shown (never a credential)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from flakecheck.errors import UserError


@dataclass(frozen=True)
class Endpoint:
    """`http://host:8000`, `http://host:8000/v1` and `https://api.example.com/v1` all name the same
    OpenAI-style API: the routes are under `<base>/v1`, server extras (`/version`) under `<base>`."""

    base: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"--endpoint: expected an http(s) URL such as http://127.0.0.1:8000, got {redact(url)!r}")
        if parts.query or parts.fragment:
            raise UserError("--endpoint: the URL must not have a query or fragment (pass an API key with "
                            "--api-key-env VAR)")
        path = parts.path.rstrip("/")
        if path.endswith("/v1"):
            path = path[: -len("/v1")]
        return cls(urlunsplit((parts.scheme, parts.netloc, path, "", "")))

    def api(self, route: str) -> str:
        return f"{self.base}/v1{route}"

    def root(self, route: str) -> str:
        return f"{self.base}{route}"

    @property
    def public(self) -> str:
        """The address without any user:password part: what meta.json and the terminal show."""
        return redact(self.base)


def redact(url: str) -> str:
    """`https://user:secret@host/x` -> `https://host/x`; anything unparsable is left as it is."""
    try:
        parts = urlsplit(url)
        if parts.username is None and parts.password is None:
            return url
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    except ValueError:
        return url


def api_key_from_env(variable: str | None) -> str | None:
    """The API key in `variable` (--api-key-env), None without one; UserError when it is unset or empty."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise UserError(f"--api-key-env {variable}: that environment variable is not set or empty")
    return value

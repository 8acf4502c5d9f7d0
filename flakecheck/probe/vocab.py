"""Token ids for a probe's traces, and their texts for the reports.

Where the server reports token ids (vLLM's "token_id:N", llama.cpp's `id`), those are the ids.
Where it reports only text, each distinct token byte-string gets a run-local id in order of first
sight, so the analysis can still compare sequences token by token (two tokens with the same bytes
become one id: a server that reports only text cannot tell them apart either). Texts are kept for
the reports; a server that spells ids as placeholders can fill them in later (`needs_text`).
"""

from __future__ import annotations

from typing import Any

from flakecheck.probe.parse import AnswerError, TokenRef

SERVER, INTERNED = "server", "interned"
MISSING = -1  # the runner-up of a step whose alternatives list only the chosen token


class Vocab:
    def __init__(self) -> None:
        self.mode: str | None = None  # decided by the first token seen
        self._texts: dict[int, str] = {}
        self._raw: dict[int, bytes] = {}
        self._interned: dict[bytes, int] = {}
        self._placeholders: set[int] = set()  # ids whose only text so far is "token_id:N"

    def id_of(self, ref: TokenRef) -> int:
        mode = SERVER if ref.id is not None else INTERNED
        if self.mode is None:
            self.mode = mode
        elif mode != self.mode:
            raise AnswerError("the server reported token ids for some tokens and only text for others")
        if ref.id is not None:
            token_id = ref.id
        else:
            key = ref.key
            assert isinstance(key, bytes)
            token_id = self._interned.setdefault(key, len(self._interned))
        self._learn(token_id, ref)
        return token_id

    def _learn(self, token_id: int, ref: TokenRef) -> None:
        if ref.raw is None and ref.id is not None and ref.text == f"token_id:{ref.id}":
            if token_id not in self._texts:
                self._placeholders.add(token_id)
            return
        if token_id in self._texts and token_id not in self._placeholders:
            if ref.raw is not None:
                self._raw.setdefault(token_id, ref.raw)
            return
        self._placeholders.discard(token_id)
        self._texts[token_id] = ref.raw.decode("utf-8", errors="replace") if ref.raw is not None else ref.text
        if ref.raw is not None:
            self._raw[token_id] = ref.raw

    def needs_text(self) -> list[int]:
        """Ids known only by a "token_id:N" placeholder."""
        return sorted(self._placeholders)

    def set_text(self, token_id: int, text: str) -> None:
        self._placeholders.discard(token_id)
        self._texts[token_id] = text

    def text(self, token_id: int) -> str:
        if token_id == MISSING:
            return ""
        return self._texts.get(token_id, f"token_id:{token_id}")

    def decode(self, token_ids: list[int]) -> str:
        """The tokens' text joined (bytes first, so a character split across tokens comes out whole)."""
        if all(t in self._raw for t in token_ids):
            return b"".join(self._raw[t] for t in token_ids).decode("utf-8", errors="replace")
        return "".join(self.text(t) for t in token_ids)

    # ------------------------------------------------------------------ saved beside partial traces

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "texts": {str(k): v for k, v in self._texts.items()},
            "raw": {str(k): list(v) for k, v in self._raw.items()},
            "interned": [[list(k), v] for k, v in self._interned.items()],
            "placeholders": sorted(self._placeholders),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Vocab:
        vocab = cls()
        vocab.mode = data.get("mode")
        vocab._texts = {int(k): str(v) for k, v in data.get("texts", {}).items()}
        vocab._raw = {int(k): bytes(v) for k, v in data.get("raw", {}).items()}
        vocab._interned = {bytes(k): int(v) for k, v in data.get("interned", [])}
        vocab._placeholders = {int(k) for k in data.get("placeholders", [])}
        return vocab

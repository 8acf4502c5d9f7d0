"""Per-token logprobs in the two shapes clients parse: chat's `content[]` and the legacy completions one.

Decoding is greedy, so the chosen token is always the top-1 candidate and its logprob is top-1's.
A token's `bytes` are its exact bytes (a byte-level BPE token may hold part of a UTF-8 character,
which its text shows as U+FFFD); with `return_tokens_as_token_ids` (vLLM's option) every token is
rendered as "token_id:N", so a client gets exact ids.
"""

from __future__ import annotations

import threading
from typing import Any

from flakecheck.serve.engine_loop import Update


class TokenTexts:
    """Text and bytes of single token ids, cached; the tokenizer is shared with the engine thread."""

    def __init__(self, tokenizer: Any, lock: threading.Lock) -> None:
        self.tokenizer, self.lock = tokenizer, lock
        self._texts: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}
        self._byte_of_char = _byte_level_map(tokenizer)

    def text(self, token_id: int) -> str:
        if token_id not in self._texts:
            with self.lock:
                self._texts[token_id] = self.tokenizer.decode([token_id])
        return self._texts[token_id]

    def bytes(self, token_id: int) -> list[int]:
        if token_id not in self._bytes:
            raw = None
            if self._byte_of_char is not None:
                with self.lock:
                    piece = self.tokenizer.convert_ids_to_tokens(token_id)
                if isinstance(piece, str) and all(ch in self._byte_of_char for ch in piece):
                    raw = [self._byte_of_char[ch] for ch in piece]
            self._bytes[token_id] = raw if raw is not None else list(self.text(token_id).encode("utf-8"))
        return self._bytes[token_id]

    def label(self, token_id: int, as_id: bool) -> str:
        return f"token_id:{token_id}" if as_id else self.text(token_id)


def _byte_level_map(tokenizer: Any) -> dict[str, int] | None:
    """GPT-2 style byte-level BPE writes each byte as one printable character; invert that map."""
    try:
        from tokenizers import decoders
        from transformers.convert_slow_tokenizer import bytes_to_unicode
    except ImportError:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    return {ch: b for b, ch in bytes_to_unicode().items()}


def _candidates(update: Update, i: int, top_n: int) -> list[tuple[int, float]]:
    return [(update.token_ids[i], update.top1_logprobs[i]), (update.top2_ids[i], update.top2_logprobs[i])][:top_n]


def chat_logprobs(update: Update, texts: TokenTexts, top_n: int, as_id: bool) -> list[dict[str, Any]]:
    """`choices[].logprobs.content` entries for the tokens of an update."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": texts.label(token_id, as_id), "logprob": logprob, "bytes": texts.bytes(token_id)}

    return [{**entry(update.token_ids[i], update.top1_logprobs[i]),
             "top_logprobs": [entry(t, lp) for t, lp in _candidates(update, i, top_n)]}
            for i in range(len(update.token_ids))]


def completion_logprobs(update: Update, texts: TokenTexts, top_n: int, as_id: bool, offset: int = 0
                        ) -> dict[str, Any]:
    """The legacy `{tokens, token_logprobs, top_logprobs, text_offset}`; `offset` is where the first
    token's text starts in the choice's text (a stream continues it)."""
    text_offset, top = [], []
    for i, token_id in enumerate(update.token_ids):
        text_offset.append(offset)
        offset += len(texts.text(token_id))
        alternatives: dict[str, float] = {}
        # The chosen token is always listed (as vLLM does), so logprobs: 0 still names it; where two
        # candidates share a text, the key keeps the higher logprob (ids are exact with token_id:N).
        for t, lp in _candidates(update, i, max(top_n, 1)):
            alternatives.setdefault(texts.label(t, as_id), lp)
        top.append(alternatives)
    return {
        "tokens": [texts.label(t, as_id) for t in update.token_ids],
        "token_logprobs": list(update.top1_logprobs),
        "top_logprobs": top,
        "text_offset": text_offset,
    }

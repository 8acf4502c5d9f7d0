"""Server-sent events as OpenAI streams them: `data: {json}` chunks, then `data: [DONE]`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi.responses import StreamingResponse

from flakecheck.data.stops import streamable_length
from flakecheck.serve.engine_loop import Update
from flakecheck.serve.errors import APIError
from flakecheck.serve.generation import Generation


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class TextDeltas:
    """The new text of each choice since its last chunk, holding back what a stop string may still cut."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops, self.sent = stops, dict[int, int]()

    def __call__(self, index: int, update: Update) -> str:
        text = update.text or ""
        start = self.sent.get(index, 0)
        end = streamable_length(text, self.stops, update.last)
        if end <= start:
            return ""
        self.sent[index] = end
        return text[start:end]


def stream_response(gen: Generation, chunks: Callable[[int, Update, str], dict[str, Any] | None],
                    first: list[dict[str, Any]], usage_chunk: Callable[[], dict[str, Any]] | None
                    ) -> StreamingResponse:
    """Chunks built by `chunks(index, update, text_delta)` (None: nothing to send), after the `first`
    ones; a final usage chunk when asked; an engine failure becomes an error event."""
    deltas = TextDeltas(gen.stop_strings)

    async def events() -> AsyncIterator[str]:
        for chunk in first:
            yield sse(chunk)
        try:
            async for index, update in gen.updates():
                chunk = chunks(index, update, deltas(index, update))
                if chunk is not None:
                    yield sse(chunk)
        except APIError as exc:
            yield sse(exc.body())
        else:
            if usage_chunk is not None:
                yield sse(usage_chunk())
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

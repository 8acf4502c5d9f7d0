"""Token texts for a server that answers with vLLM's "token_id:N" placeholders and no bytes.

The texts only label tokens in the reports (the analysis compares ids), so this is best effort:
vLLM's (and `flakecheck serve`'s) `POST /detokenize` is asked for each id, a few at a time, and the
first refusal stops it quietly; ids left without text read "token_id:N".
"""

from __future__ import annotations

import asyncio

from flakecheck.probe.client import RequestFailed, ServerClient
from flakecheck.probe.vocab import Vocab


async def fill_token_texts(client: ServerClient, model: str, vocab: Vocab, parallel: int = 8) -> None:
    url = client.endpoint.root("/detokenize")
    gate = asyncio.Semaphore(parallel)
    broken = asyncio.Event()

    async def one(token_id: int) -> None:
        async with gate:
            if broken.is_set():
                return
            try:
                status, body = await client.post_json(url, {"model": model, "tokens": [token_id]})
            except RequestFailed:
                broken.set()
                return
            if status == 200 and isinstance(body, dict) and isinstance(body.get("prompt"), str):
                vocab.set_text(token_id, body["prompt"])
            else:
                broken.set()

    await asyncio.gather(*(one(t) for t in vocab.needs_text()))

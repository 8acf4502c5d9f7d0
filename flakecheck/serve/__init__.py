"""`flakecheck serve`: the built-in engine behind an OpenAI-compatible API.

One engine loop (`engine_loop`) steps the engine for every request at once; `app` wires the routes
(`chat`, `completions`, `tokenize`) over the server's `state`; `server` runs uvicorn, `command` is
the CLI entry.
"""

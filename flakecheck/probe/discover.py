"""Before anything is written: is this an OpenAI-compatible server that gives what a probe needs?

`GET /v1/models` (reachable? which model?), the server's version where it reports one (vLLM's
`GET /version`, llama.cpp's `GET /props`), then one short real request per API the suite uses:
it must come back as a completion with logprobs and a runner-up per token. Every problem here is
a UserError (exit 2) that says what the server did, before the run directory exists.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flakecheck.errors import UserError
from flakecheck.probe.bodies import BodyOptions, CasePrompt, completion_body
from flakecheck.probe.client import RequestFailed, ServerClient
from flakecheck.probe.parse import Answer
from flakecheck.probe.retries import RetryPolicy

CHECK_TOKENS = 4
# A server still starting may answer 503 for a while; a refused connection is answered at once.
CHECK_POLICY = RetryPolicy(attempts=4, base_s=0.5, cap_s=4.0, max_wait_s=15.0)
VERSION_POLICY = RetryPolicy(attempts=3, base_s=0.2, cap_s=1.0, max_wait_s=3.0)  # nice to have, never worth a wait


@dataclass(frozen=True)
class ServerInfo:
    model: str
    models: list[str] | None  # what /v1/models listed (None: the server has no such route)
    version: str | None
    options: BodyOptions
    token_ids: str  # "server" (the server reports token ids) | "interned" (only text)
    system_fingerprint: str | None


async def discover(client: ServerClient, model: str | None, isolation: str, checks: list[CasePrompt]) -> ServerInfo:
    public = client.endpoint.public
    models = await _models(client)
    if model is None:
        if not models:
            raise UserError(f"{public}: GET /v1/models lists no model; name one with --model")
        model = models[0]
    elif models is not None and model not in models:
        raise UserError(f"{public}: unknown model {model!r}; the server offers: {', '.join(models[:20])}")
    version = await _version(client)
    options = BodyOptions(model, isolation, token_ids=True)
    answer: Answer | None = None
    for case in checks:
        options, answer = await _check(client, options, case)
    mode = "server" if answer is not None and answer.steps and answer.steps[0].token.id is not None else "interned"
    return ServerInfo(model, models, version, options, mode, answer.system_fingerprint if answer else None)


async def _models(client: ServerClient) -> list[str] | None:
    public = client.endpoint.public
    try:
        status, body = await client.get_json(client.endpoint.api("/models"), policy=CHECK_POLICY)
    except RequestFailed as exc:
        raise UserError(f"cannot reach {public}: {exc.what}") from None
    if status in (401, 403):
        raise UserError(f"{public} refused the request (HTTP {status}): pass the API key in an environment "
                        "variable named by --api-key-env")
    if status == 404:
        return None
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise UserError(f"{public} is not an OpenAI-compatible server: GET /v1/models answered HTTP {status} "
                        "without a 'data' list")
    return [str(m["id"]) for m in body["data"] if isinstance(m, dict) and "id" in m]


async def _version(client: ServerClient) -> str | None:
    for route, key in (("/version", "version"), ("/props", "build_info")):
        try:
            status, body = await client.get_json(client.endpoint.root(route), policy=VERSION_POLICY)
        except RequestFailed:
            return None
        if status == 200 and isinstance(body, dict) and isinstance(body.get(key), (str, int, float)):
            return client.scrub(str(body[key]))
    return None


async def _check(client: ServerClient, options: BodyOptions, case: CasePrompt) -> tuple[BodyOptions, Answer]:
    public = client.endpoint.public
    for _ in range(2):
        body = completion_body(options, case.api, case.prompt, min(CHECK_TOKENS, case.max_tokens),
                               salt="flakecheck-check")
        try:
            answer = await client.complete(case.api, body, policy=CHECK_POLICY)
        except RequestFailed as exc:
            if exc.status in (400, 422) and options.token_ids and "return_tokens_as_token_ids" in exc.what:
                options = replace(options, token_ids=False)  # only an optimisation: ask for text instead
                continue
            raise UserError(_refusal(public, case, options, exc)) from None
        _check_answer(public, case, answer)
        return options, answer
    raise AssertionError("unreachable")


def _refusal(public: str, case: CasePrompt, options: BodyOptions, exc: RequestFailed) -> str:
    hint = ""
    if exc.status in (400, 422) and any(f in exc.what for f in ("cache_salt", "cache_prompt")):
        hint = (" — it rejects the cache-isolation fields: rerun with --isolation none and turn its prefix "
                "cache off on the server")
    elif exc.status == 404:
        other = "completions" if case.api == "chat" else "chat"
        hint = f" — if it has no /v1/{'chat/' if case.api == 'chat' else ''}completions route, try --api {other}"
    elif exc.status in (401, 403):
        hint = " — pass the API key in an environment variable named by --api-key-env"
    return f"{public}: the check request (case '{case.case_id}', {case.api} API) failed: {exc}{hint}"


def _check_answer(public: str, case: CasePrompt, answer: Answer) -> None:
    where = f"{public}: the check request (case '{case.case_id}', {case.api} API)"
    if not answer.steps:
        if answer.text:
            raise UserError(f"{where} came back with text but no logprobs; the probe needs a server that returns "
                            "logprobs")
        return
    if answer.steps[0].top2()[1] is None:
        param = "top_logprobs=2" if case.api == "chat" else "logprobs=2"
        raise UserError(f"{where} listed no runner-up token; the server must honour {param}")


def check_prompts(cases: list[CasePrompt]) -> list[CasePrompt]:
    """The first case of each API the suite uses: what the check requests send."""
    firsts: dict[str, CasePrompt] = {}
    for case in cases:
        firsts.setdefault(case.api, case)
    return list(firsts.values())

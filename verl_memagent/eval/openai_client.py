"""verl's token-in/token-out `generate()` over an OpenAI-compatible `/v1/completions` server (vLLM, SGLang).

The agent loops call `generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput`, the
interface of verl's rollout server manager. This client posts the prompt as token ids and needs the
sampled token ids back exactly, never a re-tokenisation of the returned text (which can differ from
what was sampled). It asks for them both ways servers offer:

- `"return_token_ids": true`: `choices[i].token_ids` (vLLM >= 0.10.2, SGLang with return_token_ids on
  `/v1/completions`);
- `"return_tokens_as_token_ids": true` with `logprobs`: `choices[i].logprobs.tokens` as `"token_id:N"`
  (older vLLM).

A server that answers with neither raises `MissingTokenIdsError`: upgrade the server instead.
"""

from __future__ import annotations

from typing import Any

import httpx
from verl.workers.rollout.replica import TokenOutput

#: verl's sampling-param names this client forwards, with the request field each becomes
_FORWARDED = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
    "max_tokens": "max_tokens",
    "max_new_tokens": "max_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "seed": "seed",
    "include_stop_str_in_output": "include_stop_str_in_output",
}
_TOKEN_ID_PREFIX = "token_id:"


class MissingTokenIdsError(RuntimeError):
    """The server did not return the sampled token ids."""


def server_root(url: str) -> str:
    """An OpenAI-compatible server's root from a URL given either way: `http://host:8000` or the
    `http://host:8000/v1` that OpenAI clients take as their base URL."""
    return url.rstrip("/").removesuffix("/v1")


class CompletionsClient:
    """`generate()` of verl's server manager, answered by an OpenAI-compatible completions endpoint.

    Args:
        base_url: the server root, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted).
        model: the served model name; None asks `/v1/models` once and takes the first.
        timeout_s: per request; a long generation on a loaded server can take minutes.
        max_connections: concurrent requests in flight (the eval's concurrency bounds them too).
        api_key: sent as a bearer token when given.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        timeout_s: float = 600.0,
        max_connections: int = 256,
        api_key: str | None = None,
    ) -> None:
        self.base_url = server_root(base_url)
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            timeout=timeout_s, limits=limits, headers=headers, transport=httpx.AsyncHTTPTransport(retries=3)
        )

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self._http.aclose()

    async def model_name(self) -> str:
        """The served model to ask: the one given, else the first that `/v1/models` lists."""
        if self.model is None:
            response = await self._http.get(f"{self.base_url}/v1/models")
            response.raise_for_status()
            models = response.json().get("data") or []
            if not models:
                raise RuntimeError(f"{self.base_url}/v1/models lists no model; pass the served model name")
            self.model = str(models[0]["id"])
        return self.model

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        """Generate one continuation of `prompt_ids`; `kwargs` (verl's priority, media) are not sent."""
        want_logprobs = bool(sampling_params.get("logprobs", False))
        body = {"model": await self.model_name(), "prompt": list(prompt_ids), **completion_fields(sampling_params)}
        body.update(logprobs=1, return_token_ids=True, return_tokens_as_token_ids=True)
        response = await self._http.post(f"{self.base_url}/v1/completions", json=body)
        if response.status_code != 200:
            raise RuntimeError(
                f"{self.base_url}/v1/completions answered {response.status_code} for request {request_id}: "
                f"{response.text[:500]}"
            )
        choice = response.json()["choices"][0]
        token_ids = sampled_token_ids(choice)
        log_probs = None
        if want_logprobs:
            log_probs = (choice.get("logprobs") or {}).get("token_logprobs")
            if log_probs is None or len(log_probs) != len(token_ids):
                raise RuntimeError(
                    f"{self.base_url}: logprobs.token_logprobs missing or not one per token for request {request_id}"
                )
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"finish_reason": choice.get("finish_reason")},
        )


def completion_fields(sampling_params: dict[str, Any]) -> dict[str, Any]:
    """The request fields for verl's sampling params; an unknown param is an error, never dropped."""
    unknown = set(sampling_params) - set(_FORWARDED) - {"logprobs"}
    if unknown:
        raise ValueError(f"completions client: unsupported sampling_params {sorted(unknown)}")
    fields = {_FORWARDED[key]: value for key, value in sampling_params.items() if key in _FORWARDED}
    if fields.get("top_k", -1) <= 0:  # verl's "off" is -1; vLLM and SGLang default to off
        fields.pop("top_k", None)
    return fields


def sampled_token_ids(choice: dict[str, Any]) -> list[int]:
    """The generated token ids of one completion choice, exactly as the server sampled them."""
    if choice.get("token_ids") is not None:
        return [int(token) for token in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if tokens is not None and all(str(token).startswith(_TOKEN_ID_PREFIX) for token in tokens):
        return [int(str(token)[len(_TOKEN_ID_PREFIX) :]) for token in tokens]
    raise MissingTokenIdsError(
        "the completions server returned no sampled token ids (neither choices[].token_ids nor "
        "logprobs.tokens as 'token_id:N'); re-encoding the text would not give the sampled tokens. "
        "Use vLLM >= 0.10.2 or SGLang with `return_token_ids` support on /v1/completions."
    )

"""A real OpenAI-compatible completions server for the tests: the tiny model through HFGenerator.

It speaks vLLM's `/v1/completions` request and response format for the fields the eval client uses
(token-id prompt, `max_tokens`, `temperature`, `top_p`, `top_k`, `stop`, `seed`, `logprobs`,
`return_token_ids`, `return_tokens_as_token_ids`) and lists its model at `/v1/models`. With
`token_ids=False` it plays a server without token-id support: it ignores both flags and returns
decoded text pieces only.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from verl_memagent.generation.generator import HFGenerator

MODEL_NAME = "tiny-qwen2"


class CompletionRequest(BaseModel):
    model: str
    prompt: list[int]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


def completions_app(generator: HFGenerator, token_ids: bool = True) -> FastAPI:
    app = FastAPI()
    tokenizer = generator.tokenizer

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL_NAME, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict:
        params = {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "stop": request.stop or [],
            "logprobs": request.logprobs is not None,
            "seed": request.seed,
        }
        output = await generator.generate("http", prompt_ids=request.prompt, sampling_params=params)
        ids = list(output.token_ids)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        for stop in request.stop or []:  # vLLM's text ends before the stop string
            text = text.split(stop)[0] if stop in text else text
        choice = {"index": 0, "text": text, "finish_reason": output.extra_fields["finish_reason"]}
        if token_ids and request.return_token_ids:
            choice["token_ids"] = ids
        if request.logprobs is not None:
            as_ids = token_ids and request.return_tokens_as_token_ids
            tokens = [f"token_id:{i}" if as_ids else tokenizer.decode([i]) for i in ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": output.log_probs}
        usage = {"prompt_tokens": len(request.prompt), "completion_tokens": len(ids)}
        return {"object": "text_completion", "model": request.model, "choices": [choice], "usage": usage}

    return app


class CompletionsServer:
    """`completions_app` served by uvicorn in a thread on a free loopback port; `.stop()` ends it."""

    def __init__(self, generator: HFGenerator, token_ids: bool = True):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(completions_app(generator, token_ids), log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[sock])), daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("completions server failed to start")
            threading.Event().wait(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

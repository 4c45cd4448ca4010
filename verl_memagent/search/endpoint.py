"""Where the retriever is and whether it answers: the default address, `MEMAGENT_RETRIEVER_URL`, and the
one `/health` probe that the agents' settings, `eval`, `doctor` and the recipe scripts share.

The rule: a retriever answers when `GET /health` gives a 2xx status. The server says 200 `ready` while
every search process is live and 200 `degraded` while some restart (it still searches, and the agents'
client retries on its own), 503 while its index loads or no search process is live. A degraded
server is therefore usable: refusing one would fail a run at its start for a restart the server
recovers from by itself, which the run's own searches ride out. The status is shown, not hidden.

`python -m verl_memagent.search.endpoint [URLS]` is the probe for shell scripts: exit 0 when every
comma-separated URL (default: `MEMAGENT_RETRIEVER_URL`, else the default address) answers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

#: the retriever's address when nothing names one: `python -m retriever_server serve`'s own default port
DEFAULT_RETRIEVER_URL = "http://127.0.0.1:8000"
#: a comma-separated list of retriever URLs for every agent that does not name its own (`retriever_urls`)
RETRIEVER_URL_ENV = "MEMAGENT_RETRIEVER_URL"


class RetrieverUnavailable(RuntimeError):
    """The retriever at a URL does not answer `/health` with a 2xx status; the message says what happened."""


def split_urls(urls: str) -> list[str]:
    """`a, b` -> `["a", "b"]`: the comma-separated form the environment and the command lines take."""
    return [url.strip() for url in urls.split(",") if url.strip()]


def configured_retriever_urls() -> list[str]:
    """The URLs of `MEMAGENT_RETRIEVER_URL`, else the default address."""
    return split_urls(os.environ.get(RETRIEVER_URL_ENV, "")) or [DEFAULT_RETRIEVER_URL]


def retriever_health(url: str, timeout_s: float = 5.0) -> dict:
    """The body of the retriever's `GET /health` when it answers (module docstring: any 2xx, `ready` or
    `degraded`); RetrieverUnavailable naming the URL and the status or error otherwise."""
    health = url.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=timeout_s) as response:
            return _body(response.read())
    except urllib.error.HTTPError as e:  # a status outside 2xx: 503 while loading or without live processes
        status = _body(e.read()).get("status", "")
        raise RetrieverUnavailable(f"{health} answers {e.code} {status}".rstrip()) from None
    except (urllib.error.URLError, OSError) as e:
        raise RetrieverUnavailable(f"{health} does not answer ({getattr(e, 'reason', e)})") from None


def _body(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    """The probe for shell scripts: exit status 1 if any URL does not answer (each named on stderr unless --quiet)."""
    parser = argparse.ArgumentParser(
        prog="python -m verl_memagent.search.endpoint",
        description="Exit 0 when every retriever answers GET /health with a 2xx status (ready or degraded).",
    )
    parser.add_argument("urls", nargs="?", help=f"comma-separated (default: ${RETRIEVER_URL_ENV}, else the default)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="S", help="seconds per request (default 5)")
    parser.add_argument("--quiet", action="store_true", help="print nothing, only the exit status")
    args = parser.parse_args(argv)
    urls = split_urls(args.urls) if args.urls else configured_retriever_urls()
    failed = 0
    for url in urls:
        try:
            body = retriever_health(url, args.timeout)
            message, stream = f"{url}: {body.get('status', 'answers')}", sys.stdout
        except RetrieverUnavailable as e:
            message, stream, failed = str(e), sys.stderr, failed + 1
        if not args.quiet:
            print(message, file=stream)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

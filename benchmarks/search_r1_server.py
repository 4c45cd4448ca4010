"""Search-R1's own retrieval server as a baseline of `retriever_bench.py --search-r1`: run as released,
on a CPU too."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared import TOPK, drive, minilm_dir

#: Search-R1's retrieval_server.py as released, but for what a torch without CUDA
#: needs: its model.cuda(), each input's .cuda() and model.half() (fp16 is fixed in its __main__) made
#: no-ops there, and its uvicorn.run(host="0.0.0.0", port=8000) sent to loopback and a free port
SEARCH_R1_SITECUSTOMIZE = """import os

import torch
import uvicorn

if not torch.cuda.is_available():
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.half = lambda self, *args, **kwargs: self
_run, _port = uvicorn.run, int(os.environ["SEARCH_R1_PORT"])
uvicorn.run = lambda app, **kwargs: _run(app, **{**kwargs, "host": "127.0.0.1", "port": _port})
"""


class SearchR1Server:
    """Search-R1's own server (`--search-r1`) over our dense index's faiss file and its corpus, the same
    MiniLM (`--retriever_name minilm`: no prefix, mean pooling, normalised, 256 tokens, as MiniLM's
    own settings), run as released but for `SEARCH_R1_SITECUSTOMIZE`; ready once /retrieve answers
    (it has no /health). `sitecustomize`: more of it (a CPU stand-in's)."""

    def __init__(self, script: Path, index_dir: Path, corpus: Path, sitecustomize: str = ""):
        site = Path(tempfile.mkdtemp(prefix="retriever_bench_search_r1_"))
        (site / "sitecustomize.py").write_text(SEARCH_R1_SITECUSTOMIZE + sitecustomize)  # first on the path
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url, self.log = f"http://127.0.0.1:{port}", site / "server.log"
        path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        environment = {**os.environ, "PYTHONPATH": path, "SEARCH_R1_PORT": str(port), "HF_HUB_OFFLINE": "1"}
        arguments = ["--index_path", str(index_dir / "faiss.index"), "--corpus_path", str(corpus)]
        arguments += ["--topk", str(TOPK), "--retriever_name", "minilm", "--retriever_model", minilm_dir()]
        started = time.monotonic()
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(script), *arguments], cwd=script.parent, env=environment, stdout=log, stderr=log
            )
        while not self._answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"Search-R1's server exited with {self.process.returncode}: see {self.log}")
            time.sleep(0.1)
        self.ready_s = time.monotonic() - started

    def _answers(self) -> bool:
        return asyncio.run(drive(self.url, [["warm up"]], 1))["errors"] == 0  # drive sends return_scores: it needs it

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()

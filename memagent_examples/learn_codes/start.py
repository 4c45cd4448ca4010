"""The warm start the learning demo reinforces: the one shipped in `start/`.

A warm start built from the same inputs on another machine is another model: another CPU's float
arithmetic, amplified over the training steps of a tiny model, moved it from EM 0.62 to 0.19 on the
task (docs/learn_codes.md). So the demo starts from the reference warm start in `start/`, built once
by the project's own `task warm-start` command and copied there, on every machine and for every RL
seed; `START=build` builds one on this machine instead. Its `build.json` (`build_records`) digests the
contexts of the first `DIGESTED_DOORS` demonstrations.
"""

from __future__ import annotations

from pathlib import Path

#: the reference warm start (a transformers model directory with its tokenizer, and `build.json`)
SHIPPED = Path(__file__).resolve().parent / "start"
#: demonstrations whose contexts `build.json` digests: the first this many doors of `demos.jsonl`
DIGESTED_DOORS = 16

"""An index build in a log (stderr not a terminal) reports each phase in plain lines: how far it is
every few seconds, and when it is done; no progress bars' carriage returns."""

import io
import re
import subprocess
import time

from memagent_examples.retriever_process import build_command
from retriever_server.progress import BuildProgress


def test_a_build_logs_its_phases_and_progress_in_plain_lines(tmp_path, data_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join((data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines(True)[:3000]))
    command = build_command("bm25", corpus, tmp_path / "index", "--progress-every-s", "0.05")
    result = subprocess.run(command, capture_output=True, check=True)  # bytes: text mode would turn \r into \n
    stderr = result.stderr.decode()
    assert "\r" not in stderr, stderr
    lines = stderr.splitlines()
    assert all(line.startswith("build [") for line in lines), lines
    done = [line for line in lines if ": done" in line]
    assert [line.split(":")[0] for line in done] == ["build [1/3] corpus", "build [2/3] tokenize", "build [3/3] index"]
    # tqdm's meter without the bar, as verl_memagent's progress lines
    assert re.match(r"build \[2/3\] tokenize: done, 100% 3\.00k/3\.00k \[\d\d:\d\d<00:00, ", done[1]), done[1]
    meter = re.compile(r"build \[2/3\] tokenize: +\d+% [\d.]+k?/3\.00k \[\d\d:\d\d<(\d\d:\d\d|\?), .* passages/s\]")
    assert any(meter.fullmatch(line) for line in lines), lines
    assert result.stdout.decode().startswith("built bm25 index of 3000 passages")


def test_a_phase_ending_while_its_reporter_writes_still_gives_whole_lines():
    """The reporter thread's line and the phase's `done` line never interleave (CI once saw a torn line)."""

    class SlowStream(io.StringIO):  # a pipe to a busy reader: each write takes a while
        def write(self, text: str) -> int:
            time.sleep(1e-4)
            return super().write(text)

    stream = SlowStream()
    progress = BuildProgress(["count"], every_s=1e-5, stream=stream)
    for _ in range(300):
        with progress.phase("count", total=2) as update:
            update(2)
            time.sleep(1e-4)
    lines = stream.getvalue().split("\n")
    assert lines.pop() == ""
    whole = re.compile(r"build \[1/1\] count: (running for \d\d:\d\d|(done, )?\d+% [^\]]* passages/s\](, finishing)?)")
    torn = [line for line in lines if not whole.fullmatch(line)]
    assert not torn, torn[:5]
    assert sum(": done, " in line for line in lines) == 300

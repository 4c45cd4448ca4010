"""An index build in a log (stderr not a terminal) reports each phase in plain lines: how far it is
every few seconds, and when it is done; no progress bars' carriage returns."""

import re
import subprocess

from retriever_process import build_command


def test_a_build_logs_its_phases_and_progress_in_plain_lines(tmp_path, data_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join((data_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines(True)[:3000]))
    command = build_command("bm25", corpus, tmp_path / "index", "--progress-every-s", "0.05")
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = result.stderr.splitlines()
    assert "\r" not in result.stderr and all(line.startswith("build [") for line in lines), lines
    done = [line for line in lines if ": done" in line]
    assert [line.split(":")[0] for line in done] == ["build [1/3] corpus", "build [2/3] tokenize", "build [3/3] index"]
    # tqdm's meter without the bar, as verl_memagent's progress lines
    assert re.match(r"build \[2/3\] tokenize: done, 100% 3\.00k/3\.00k \[\d\d:\d\d<00:00, ", done[1]), done[1]
    meter = re.compile(r"build \[2/3\] tokenize: +\d+% [\d.]+k?/3\.00k \[\d\d:\d\d<(\d\d:\d\d|\?), .* passages/s\]")
    assert any(meter.fullmatch(line) for line in lines), lines
    assert result.stdout.startswith("built bm25 index of 3000 passages")

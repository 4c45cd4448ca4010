"""`EvalOptions`: the eval command line read once into a frozen object, and what the runner derives from it."""

from __future__ import annotations

import dataclasses

import pytest

from verl_memagent.agent import AGENT_LOOPS_YAML
from verl_memagent.cli import build_parser, main
from verl_memagent.eval.cli import EvalOptions

SERVER_ARGS = ["--server", "http://127.0.0.1:8001", "--tokenizer", "tok"]


def parse(*argv: str):
    return build_parser().parse_args(["eval", "--data", "nq=nq.jsonl", "--out", "out", *argv])


def test_every_option_of_the_parser_is_a_field():
    args = parse("--agent", "react", "--model", "m")
    assert set(vars(args)) - {"command", "func"} == {field.name for field in dataclasses.fields(EvalOptions)}


def test_options_are_the_command_line_and_frozen():
    options = EvalOptions.from_args(
        parse(
            "--agent",
            "react",
            "--agent",
            "mem1",
            "--agent",
            "react",
            "--set",
            "topk=5",
            "--max-turns",
            "3",
            *SERVER_ARGS,
        )
    )
    assert options.agents == ("react", "mem1")
    assert options.overrides == ("topk=5",) and options.data == ("nq=nq.jsonl",)
    assert options.tokenizer_path == "tok" and options.agent_loops_path == AGENT_LOOPS_YAML
    assert options.agent_settings() == {"react": {"max_turns": 3, "topk": 5}, "mem1": {"max_turns": 3, "topk": 5}}
    assert options.sampling_params()["temperature"] == 0.0
    assert options.run_info()["server"] == "http://127.0.0.1:8001"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.concurrency = 1  # type: ignore[misc]


def test_a_server_without_a_tokenizer_is_refused_with_the_flag():
    with pytest.raises(ValueError, match="--tokenizer: required with --server"):
        EvalOptions.from_args(parse("--agent", "react", "--server", "http://127.0.0.1:8001"))
    with pytest.raises(SystemExit, match="--tokenizer"):  # the command says so without a traceback
        main(["eval", "--agent", "react", "--data", "x", "--out", "o", "--server", "http://127.0.0.1:8001"])

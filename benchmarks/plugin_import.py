"""What the plugin adds to a plain `import verl`: time, modules, and which heavy modules it loads.

Every verl process of a run (driver, trainer workers, rollout servers, agent-loop and reward
workers) pays it. Each measurement is a fresh interpreter running `import verl` with verl's plugin
discovery off (`VERL_USE_EXTERNAL_PLUGINS=none`, the baseline) or on (`auto`, which loads
`verl_memagent.plugin`); the two alternate round by round so that a change in machine load hits
both. Reported per setting: the median time of `import verl` and the module count; the ratio
auto/none (target at most 1.10); the plugin's own import time, timed in the baseline interpreters
right after `import verl` as verl's loader would import it; the modules the plugin adds beyond its
own; and which heavy modules (pandas, datasets, sklearn, fastapi, uvicorn, our agent loops) are
loaded. Last line: one JSON object.

    python benchmarks/plugin_import.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

TARGET_RATIO = 1.10
HEAVY = ("pandas", "datasets", "sklearn", "fastapi", "uvicorn")
#: modules of the agent package that `import verl` may load: the package and its registration
AGENT_REGISTRATION = ("verl_memagent.agent", "verl_memagent.agent.register")

PROBE = """
import importlib, json, sys, time
start = time.perf_counter()
import verl
seconds = time.perf_counter() - start
modules = sorted(sys.modules)
start = time.perf_counter()
importlib.import_module("verl_memagent.plugin")  # a no-op where verl has loaded it already
print(json.dumps({"seconds": seconds, "modules": modules, "plugin_seconds": time.perf_counter() - start}))
"""


def measure(policy: str) -> dict:
    """One fresh `import verl` under VERL_USE_EXTERNAL_PLUGINS=policy."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": policy}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def heavy_modules(modules: set[str]) -> list[str]:
    """Top-level heavy libraries and agent-loop modules among `modules`."""
    heavy = {name.split(".")[0] for name in modules if name.split(".")[0] in HEAVY}
    heavy |= {name for name in modules if name.startswith("verl_memagent.agent") and name not in AGENT_REGISTRATION}
    return sorted(heavy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="pairs of fresh imports (none, auto), alternating order")
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {"none": [], "auto": []}
    for round_ in range(args.rounds):
        order = ("none", "auto") if round_ % 2 == 0 else ("auto", "none")
        for policy in order:
            runs[policy].append(measure(policy))
        print(
            f"round {round_ + 1}/{args.rounds}: none {runs['none'][-1]['seconds']:.2f} s, "
            f"auto {runs['auto'][-1]['seconds']:.2f} s",
            flush=True,
        )

    none_s = statistics.median(run["seconds"] for run in runs["none"])
    auto_s = statistics.median(run["seconds"] for run in runs["auto"])
    plugin_s = statistics.median(run["plugin_seconds"] for run in runs["none"])
    without, with_plugin = set(runs["none"][-1]["modules"]), set(runs["auto"][-1]["modules"])
    added = with_plugin - without
    ours = sorted(name for name in added if name.split(".")[0] == "verl_memagent")
    others = sorted(name for name in added if name.split(".")[0] != "verl_memagent")
    heavy = heavy_modules(with_plugin)
    ratio = auto_s / none_s
    print(f"import verl, median of {args.rounds}: without the plugin {none_s:.2f} s, with it {auto_s:.2f} s")
    print(f"ratio {ratio:.3f} (target <= {TARGET_RATIO}); the plugin's own import {plugin_s * 1e3:.0f} ms")
    print(f"modules: {len(without)} -> {len(with_plugin)}; ours: {', '.join(ours) or 'none'}")
    print(f"other modules the plugin adds: {', '.join(others) or 'none'}; heavy modules loaded: {heavy or 'none'}")
    print(
        json.dumps(
            {
                "rounds": args.rounds,
                "none_s": round(none_s, 3),
                "auto_s": round(auto_s, 3),
                "ratio": round(ratio, 3),
                "target_ratio": TARGET_RATIO,
                "plugin_import_ms": round(plugin_s * 1e3, 1),
                "modules_none": len(without),
                "modules_auto": len(with_plugin),
                "modules_added_outside_plugin": others,
                "heavy_loaded": heavy,
            }
        )
    )


if __name__ == "__main__":
    main()

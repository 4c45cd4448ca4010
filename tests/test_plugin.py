"""verl must find the plugin by itself: a plain `import verl` in a fresh interpreter."""

import json
import os
import subprocess
import sys

PROBE = """
import json, sys
import verl
loaded = "verl_memagent.plugin" in sys.modules
from verl_memagent import plugin
from verl_memagent.doctor import _registry
seen = {kind: sorted(_registry(kind)) for kinds in plugin.PROVIDES.values() for kind in kinds}
print(json.dumps({"loaded": loaded, "provides": plugin.PROVIDES, "seen": seen}))
"""


def _run(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def test_import_verl_loads_plugin_and_its_registrations():
    result = json.loads(_run(PROBE))
    assert result["loaded"] is True
    for kinds in result["provides"].values():
        for kind, names in kinds.items():
            assert set(names) <= set(result["seen"][kind]), (kind, names)


def test_plugin_policy_none_disables_loading():
    # proves that verl's entry-point discovery, not an import of ours, loads the plugin
    probe = "import sys, verl; print('verl_memagent.plugin' in sys.modules)"
    assert _run(probe, VERL_USE_EXTERNAL_PLUGINS="none") == "False"
    assert _run(probe, VERL_USE_EXTERNAL_PLUGINS="memagent") == "True"

"""Does MemSearcher learn on CPU? recipes/cpu/learn_codes.sh with a fixed seed: reward and EM before vs after RL.

The baseline is the same run's first steps and the warm-started policy's EM before reinforcement
learning. Takes about 25 minutes on 2 cores. The last printed line is one JSON object: the main
job's (`reward_first`, `reward_last`, `reward_gain`, `answered_*`, `searches_*`, `seconds_per_step`,
`em_before_rl_*`, `em_after_rl_*`, `steps`) plus `seed` and `wall_s`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "recipes" / "cpu" / "learn_codes.sh"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="output directory (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="cpu_learning_"))
    env = {**os.environ, "WORK": str(work), "SEED": str(args.seed)}
    start = time.perf_counter()
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"learn_codes.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    print(done.stdout.rstrip())
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps({**result, "seed": args.seed, "wall_s": round(time.perf_counter() - start, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

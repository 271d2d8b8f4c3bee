"""What every job pays to read the project config: ``load_config`` (the config, its experiment files and
claims.yaml through :class:`protoclip.config.strict.StrictLoader`) with libyaml's parser vs PyYAML's pure-Python
one (the loader before it moved to ``yaml.CSafeLoader``).

Each round starts two fresh interpreters, one of them with ``yaml.CSafeLoader`` removed before protoclip is
imported (so StrictLoader falls back to ``yaml.SafeLoader``); each times ``load_config`` alone, after its imports.
Rounds alternate the two; the loaded configs are compared (their ``to_dict`` equal).

    python bench/bench_config_load.py --config config/config.yaml --rounds 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

JOB = """
import json, sys, time
import yaml
if sys.argv[2] == "pure":
    del yaml.CSafeLoader
from protoclip.config.strict import StrictLoader, to_dict
from protoclip.project import load_config
t = time.perf_counter()
cfg = load_config(sys.argv[1])
s = time.perf_counter() - t
print(json.dumps({"s": s, "parser": StrictLoader.__mro__[1].__name__,
                  "runs": {r: to_dict(cfg.run(r)) for r in cfg.run_names()}}, default=str))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"libyaml": [], "pure": []}
    seen: dict[str, dict] = {}
    for _ in range(args.rounds):
        for side in times:
            out = json.loads(subprocess.run([sys.executable, "-c", JOB, args.config, side], check=True,
                                            capture_output=True, text=True).stdout)
            times[side].append(out["s"])
            seen[side] = out
    print(f"load_config({args.config}), {args.rounds} alternating rounds, fresh interpreters")
    for side, ts in times.items():
        print(f"  {side:8s} ({seen[side]['parser']}): median {statistics.median(ts):.3f} s, min {min(ts):.3f} s")
    print(f"  ratio (median): {statistics.median(times['libyaml']) / statistics.median(times['pure']):.2f}x; "
          f"every run's resolved config equal: {seen['libyaml']['runs'] == seen['pure']['runs']}")


if __name__ == "__main__":
    main()

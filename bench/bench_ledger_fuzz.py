"""The eBPF ledger against /proc/PID/maps over a million fuzzed mapping operations (tests/ledger_fuzz.py: the
fuzzer tests/fixtures/mapfuzz.c in rounds under the real probe, every process compared byte for byte at each
checkpoint; a mismatch stops the run and is shrunk to its shortest operation list). Also the fuzzer's own pace
untraced, on the first seed's first round, in the same run: the traced pace as a ratio of it. Prints the report,
then one JSON document.

    .venv/bin/python -m bench ledger_fuzz
    .venv/bin/python bench/bench_ledger_fuzz.py --seeds 10 --ops-per-seed 100000

Goal: 0 mismatches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from ledger_fuzz import Fuzzer, fuzz  # noqa: E402


def untraced_pace(seed: int, ops: int) -> float:
    fz = Fuzzer()
    try:
        t0 = time.monotonic()
        fz.run(seed, ops)
        return ops / (time.monotonic() - t0)
    finally:
        fz.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--ops-per-seed", type=int, default=100_000)
    ap.add_argument("--round", type=int, default=2000, help="operations between checkpoints")
    args = ap.parse_args()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    base = untraced_pace(seeds[0], args.round * 10)
    res = fuzz(seeds, args.ops_per_seed, round_ops=args.round)
    print(res.report(), flush=True)
    print(json.dumps({"ops": res.ops, "checkpoints": res.checkpoints, "mismatches": len(res.mismatches),
                      "seconds": round(res.seconds, 1), "ops_per_s": round(res.ops_per_s),
                      "untraced_ops_per_s": round(base), "traced_vs_untraced": round(res.ops_per_s / base, 3),
                      "failing_seed": res.failing_seed,
                      "shrunk_ops": len(res.shrunk) if res.shrunk is not None else None}, indent=1))


if __name__ == "__main__":
    main()

"""The verdict measured on the labelled corpus (bench/verdict_corpus, issue 42): every window of the frozen
(held-out) and the tuning split replayed through the analysis; false alarms on clean and bounded windows,
detection by leak-rate band, library right, rate error, each with its 95% interval; the reliability of the
confidence; and a day of clean serving replayed through watch's judging.

`python -m bench verdicts [--json] [--fit-calibration]`: with --json the last line is the contract's JSON
object (DESIGN.md "Verdict corpus"); --fit-calibration first refits the verdict's confidence table on the
tuning split (leaktrace/analysis/calibration.py)."""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by `python -m bench`: the repository root holds bench/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.verdict_corpus import score  # noqa: E402
from bench.verdict_corpus.windows import Split, replay_all  # noqa: E402


def _pct(x: float) -> str:
    return "  n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:5.1f}%"


def _ci(c: tuple[float, float]) -> str:
    return f"[{_pct(c[0]).strip()}, {_pct(c[1]).strip()}]"


def table(name: str, figs: dict[str, dict[str, Any]], bands: dict[str, list[dict[str, Any]]]) -> str:
    lines = [f"## {name}", "",
             "| window | windows | false alarms (clean+bounded) | detected (>= 2 MB/min) | library right "
             "| rate error median | rate error p90 |",
             "|---|---|---|---|---|---|---|"]
    for n, f in figs.items():
        v, ci, c = f["figures"], f["ci"], f["counts"]
        lines.append(f"| {n} s | {v['windows']} | {_pct(v['false_alarm_rate'])} ({c['false_alarms']}/{c['quiet']}) "
                     f"{_ci(ci['false_alarm_rate'])} | {_pct(v['detection_rate'])} ({c['detected']}/{c['leaks']}) "
                     f"{_ci(ci['detection_rate'])} | {_pct(v['library_right_rate'])} {_ci(ci['library_right_rate'])} "
                     f"| {_pct(v['rate_error_median'])} {_ci(ci['rate_error_median'])} "
                     f"| {_pct(v['rate_error_p90'])} {_ci(ci['rate_error_p90'])} |")
    lines += ["", "False alarms by class: " + "; ".join(
        f"{n} s clean {_pct(f['by_class']['clean'][0])} ({f['by_class']['clean'][1]}), bounded "
        f"{_pct(f['by_class']['bounded'][0])} ({f['by_class']['bounded'][1]})" for n, f in figs.items())]
    lines += ["", "False alarms where the held memory rose through the window (a cache still filling, a sawtooth's "
              "rise: nothing in the window tells it from a leak) and elsewhere: " + "; ".join(
                  f"{n} s filling {_pct(f['by_class']['filling'][0])} ({f['by_class']['filling'][1]}), settled "
                  f"{_pct(f['by_class']['settled'][0])} ({f['by_class']['settled'][1]})" for n, f in figs.items())]
    lines += ["", "Detection by leak-rate band (MB/min, the window's truth):", "",
              "| window | " + " | ".join(b["band"] for b in next(iter(bands.values()))) + " |",
              "|---|" + "---|" * len(next(iter(bands.values())))]
    for n, rows in bands.items():
        lines.append(f"| {n} s | " + " | ".join(f"{_pct(b['rate'])} ({b['detected']}/{b['windows']}) {_ci(b['ci'])}"
                                             for b in rows) + " |")
    return "\n".join(lines)


# The watch's early confirmation is off by default; the bench measures it at the rate its --help suggests.
OPT_IN_FAST_MB_PER_MIN = 10.0


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure() -> tuple[dict[str, Any], str]:
    t0, c0 = time.monotonic(), _cpu()
    df = replay_all()
    replay_s, replay_cpu = time.monotonic() - t0, _cpu() - c0
    out: dict[str, Any] = {}
    text = []
    for split in ("frozen", "tuning"):
        mine = df[df["split"] == split]
        if mine.empty:
            continue
        figs = score.split_figures(mine)
        bands = {n: score.by_band(mine[mine["length"] == int(n)]) for n in figs}
        out[split] = {n: f["figures"] for n, f in figs.items()}
        text.append(table(f"{split} split ({len(mine)} windows)", figs, bands))
    frozen = df[df["split"] == "frozen"]
    out["calibration"] = score.calibration(frozen)
    text.append("## Reliability (frozen split): of the windows called a leak, by confidence\n\n"
                "| confidence | windows | leaks among them |\n|---|---|---|\n"
                + "\n".join(f"| {c['confidence_from']:.2f}-{c['confidence_to']:.2f} | {c['windows']} "
                            f"| {_pct(c['leak_share'])} |" for c in out["calibration"]))
    frozen_split = Split("frozen")
    day = score.watch_day(frozen_split)
    out["watch_day"] = {k: day[k] for k in ("hours", "false_incidents", "confirm_s_median")}
    fast = score.watch_day(frozen_split, fast_mb_per_min=OPT_IN_FAST_MB_PER_MIN)
    out["watch_day_fast"] = {k: fast[k] for k in ("hours", "false_incidents", "confirm_s_median")}
    text.append("## watch (frozen split)\n\n" + "\n".join(
        f"- {what}: clean serving strung to {d['hours']:.1f} h: {d['false_incidents']} false incident(s); "
        f"leaks >= 10 MB/min confirmed after {d['confirm_s']} s (median {d['confirm_s_median']:.0f} s; "
        f"not confirmed: {d['leaks_not_confirmed']})"
        for what, d in (("defaults", day), (f"--fast-confirm-mb-per-min {OPT_IN_FAST_MB_PER_MIN:g}", fast))))
    alone = {what: score.watch_alone(frozen_split, fast_mb_per_min=f)
             for what, f in (("defaults", None), (f"--fast-confirm-mb-per-min {OPT_IN_FAST_MB_PER_MIN:g}",
                                                  OPT_IN_FAST_MB_PER_MIN))}
    out["watch_alone"] = alone
    text.append("Each clean and bounded recording judged alone (no joins; two tick phases): "
                + "; ".join(f"{what}: {a['incidents']} incident(s) in {a['hours']:.2f} h of clean series, "
                            f"{a['per_day']:.1f} a day" for what, a in alone.items()))
    text.append(f"replayed {len(df)} windows in {replay_s:.1f} s (CPU {replay_cpu:.1f} s, "
                f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f})")
    return out, "\n\n".join(text)


def _finite(x: Any) -> Any:
    """NaN (no window to measure) as null: JSON has no NaN."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="end with the contract's JSON object")
    ap.add_argument("--fit-calibration", action="store_true",
                    help="fit the verdict's confidence table on the tuning split only and write it to "
                         "leaktrace/analysis/calibration.toml (then measure as usual)")
    a = ap.parse_args()
    if a.fit_calibration:
        from bench.verdict_corpus.calibrate import fit, toml_text
        from leaktrace.analysis.calibration import CALIBRATION_FILE

        CALIBRATION_FILE.write_text(toml_text(fit(replay_all(("tuning",), workers=1))))
        print(f"wrote {CALIBRATION_FILE} (fitted on the tuning split)", flush=True)
    out, text = measure()
    print(text, flush=True)
    if a.json:
        print(json.dumps(_finite(out), sort_keys=True))


if __name__ == "__main__":
    main()

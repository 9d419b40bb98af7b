"""The verdict's thresholds: constants only, importable without pandas (the watch reads them)."""

from __future__ import annotations

# Verdict thresholds (stated in the report so a reader can judge the verdict).
THRESHOLDS: dict[str, float] = {
    "leak_mb_per_min": 1.0,        # a process growing at least this fast (RSS or anonymous) ...
    "min_confidence": 0.75,        # ... with this fraction of pairwise slopes agreeing in sign ...
    "min_span_s": 8.0,             # ... over at least this many seconds (after the warm-up cut),
                                   # and not one step (a step is an allocation, not a leak)
    "short_lived_min_span_s": 3.0,  # a target that exited: this much (≥ 4 samples) is enough for a verdict
    "no_leak_span_s": 15.0,        # a clean verdict needs at least this much observation
    "inconclusive_confidence": 0.6,  # growth above the rate with confidence between this and min_confidence
    "class_mb_per_min": 0.5,       # a memory class of a leaking process counts from this rate ...
    "class_confidence": 0.6,       # ... and this confidence
    "ledger_mb_per_min": 1.0,      # a library named by the eBPF ledger counts from this rate
}

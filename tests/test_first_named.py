"""``first_named_s`` of a ledger culprit whose growth follows traffic (analysis/first_named.py): whether a
prefix of the session names it is not monotone, so the earliest naming prefix is found by a scan, not a
binary search. Recorded data: the outstanding bytes of libucm in the leaking prefill worker of a vintage
P/D run, hunt attached at 47.9 s; a lull of traffic from ~78 s makes the prefixes that end at 94-113 s and
136-154 s read as a plateau forming."""

from __future__ import annotations

import numpy as np
import pandas as pd

from leaktrace.analysis.candidates import THRESHOLDS
from leaktrace.analysis.first_named import _first_named_from_snapshots
from leaktrace.analysis.growth import rate

ATTACH_S = 47.9
T = [48.8, 50.3, 51.4, 52.5, 53.2, 53.9, 55.5, 56.1, 58.3, 60.1, 63.2, 64.2, 64.6, 65.5, 67.3, 67.6, 68.7, 70.5,
     71.2, 72.2, 77.6, 78.0, 92.0, 93.1, 94.0, 94.4, 96.9, 98.6, 99.1, 101.1, 103.7, 104.3, 105.1, 106.0, 107.0,
     108.4, 109.1, 110.7, 111.5, 113.4, 114.4, 115.1, 117.0, 117.4, 120.4, 121.8, 125.4, 125.7, 127.1, 128.2,
     136.6, 154.4, 158.8, 188.3]
PAGES = [1776, 1813, 1887, 1961, 1998, 2035, 2072, 2146, 2553, 2627, 2738, 2775, 2775, 2849, 2960, 2960, 3034,
         3071, 3108, 3145, 3404, 3404, 3478, 3515, 3552, 3552, 3626, 3663, 3663, 3774, 3848, 3885, 3885, 3959,
         3996, 4033, 4070, 4181, 4181, 4255, 4255, 4292, 4329, 4366, 4366, 4366, 4366, 4366, 4440, 4477, 4625,
         5106, 5513, 6623]


def test_a_leak_named_before_a_lull_is_named_early():
    t, y = np.array(T), np.array(PAGES, dtype=float) * 4096
    # The premise: some prefix after the first naming one does not name it (not monotone).
    named = [rate(t[: i + 1], y[: i + 1], warmup_s=0.0).steady_mb_per_min >= THRESHOLDS["ledger_mb_per_min"]
             for i in range(2, len(t))]
    assert named[-1] and not all(named[named.index(True):]), named
    snaps = pd.DataFrame({"t": t, "pid": 7, "library": "libucm-39cc26dc.so.0.0.0", "kind": "anon",
                          "outstanding_bytes": y.astype(np.int64)})
    c = {"pid": 7, "library": "libucm-39cc26dc.so.0.0.0", "kind": "native-mmap", "source": "ledger"}
    t_named = _first_named_from_snapshots(snaps, c, THRESHOLDS)
    # named from the first prefix whose rate passes the thresholds: seconds after attach (a binary search
    # lands at 114.4 s: 66.5 s after attach, past the 60 s bound)
    assert t_named is not None and t_named - ATTACH_S <= 10.0, t_named
    first = next(i for i in range(2, len(t)) if named[i - 2])
    assert t_named == t[first]

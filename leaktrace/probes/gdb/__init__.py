"""The gdb stack sampler: full stacks at the mmap/munmap/mremap syscalls, bounded pause, always detaches.

- :mod:`.checks` — ``leaktrace doctor``'s gdb checks and the preflight that stops a hunt gdb cannot sample.
- :mod:`.attach` — one gdb over MI running gdb_scripts/sampler.py on one process (:func:`sample_process`).
- :mod:`.budget` — what a run may cost the target (:class:`PauseBudget`) and what it cost (:class:`GdbRun`).
- :mod:`.rows` — the ``gdb_samples`` and ``gdb_runs`` session tables, decoded from the sampler's records.
- :mod:`.probe` — :class:`GdbProbe`, the hunt's probe.

The in-gdb program itself stays in gdb_scripts/ (found through leaktrace/resources.py).
"""

from __future__ import annotations

from leaktrace.probes.gdb.attach import GdbAttach, sample_process
from leaktrace.probes.gdb.budget import GdbRun, PauseBudget
from leaktrace.probes.gdb.checks import (
    SAMPLER_SCRIPT,
    SCRIPTS_DIR,
    SEED002_SCRIPT,
    find_gdb,
    gdb_doctor_checks,
    preflight,
    proc_state,
    tracer_of,
)
from leaktrace.probes.gdb.probe import GdbProbe
from leaktrace.probes.gdb.rows import frame_string, run_row, sample_row, stack_strings

__all__ = ["SAMPLER_SCRIPT", "SCRIPTS_DIR", "SEED002_SCRIPT", "GdbAttach", "GdbProbe", "GdbRun", "PauseBudget",
           "find_gdb", "frame_string", "gdb_doctor_checks", "preflight", "proc_state", "run_row", "sample_process",
           "sample_row", "stack_strings", "tracer_of"]

"""The Python-heap probe: the GC state of Python targets and their objects counted by type, read through
``/proc/PID/mem`` (no code run in the target, never stopped).

- :mod:`.interpreter` — where a target's interpreter lives (maps, symbols, structure offsets) and one read
  of its GC state (:func:`~.interpreter.read_python_heap`).
- :mod:`.walk` — the walk of the GC lists, objects counted by type.
- :mod:`.worker` — the walker process's entry point (``python -m leaktrace.probes.pyheap.worker``).
- :mod:`.client` — the hunt's side of the walker process (:class:`~.client.WalkerProcess`).
- :mod:`.probe` — :class:`~.probe.PyHeapProbe`, the hunt's probe.
- :mod:`.frames` — where a target's Python frames are (for leaktrace.pyframes, read at the gdb sampler's
  stops): ``_PyRuntime`` and the frame structures' offsets.

Nothing is imported here: the walker process imports this package, and needs none of the probe.
"""

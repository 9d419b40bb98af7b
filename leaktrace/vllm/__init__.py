"""The vLLM side: what leaktrace knows about a vLLM deployment, read from outside its processes.

Knowledge only, no probe: the probes that record it into a session (``probes/vllm.py``,
``probes/ucx_state.py``, ``probes/metrics.py``) import from here, never the reverse. Nothing here imports
``leaktrace.probes``, ``hunt``, ``analysis``, ``report`` or ``commands``.
"""

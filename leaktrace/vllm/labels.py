"""What a vLLM process is, from its command line alone: the label vocabulary, process titles, a
``vllm serve`` command line's settings and a P/D proxy's ports.

vLLM's process model (V1 engine): ``vllm serve`` is the API server (never retitled), its child
``VLLM::EngineCore`` (``EngineCore_DP{n}``), grandchildren ``VLLM::Worker…``; also ``VLLM::APIServer_{i}``,
``VLLM::DPCoordinator`` and a multiprocessing ``resource_tracker``. Titles come from setproctitle with a
configurable prefix (``VLLM_PROCESS_NAME_PREFIX``), so we match ``<prefix>::<Kind>`` rather than exact names.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from leaktrace import redact

LABELS = ("api-server", "engine-core", "worker", "dp-coordinator", "proxy", "other")
ROLES = ("prefill", "decode", "both", "unknown")

# "<prefix>::<Kind><suffix>" as set by vLLM's bind_process_name / setproctitle.
TITLE_RE = re.compile(r"^(?P<prefix>[A-Za-z0-9_.-]+)::(?P<kind>EngineCore|Worker|DPCoordinator|APIServer)(?P<rest>\S*)")
_TITLE_LABEL = {"EngineCore": "engine-core", "Worker": "worker", "DPCoordinator": "dp-coordinator",
                "APIServer": "api-server"}


# A Python interpreter's executable (python, python3, python3.12).
_PYTHON_EXE = re.compile(r"(^|/)python[0-9.]*$")


def is_python(exe: str, comm: str) -> bool:
    """The process is a Python interpreter, by its executable or its command name."""
    return bool(_PYTHON_EXE.search(exe or "")) or (comm or "").startswith("python")


def _opt(argv: list[str], *names: str) -> str | None:
    """Value of ``--name V`` or ``--name=V`` (last one wins, as argparse does)."""
    val = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                val = argv[i + 1]
            elif a.startswith(n + "="):
                val = a[len(n) + 1:]
    return val


def _ints(text: str | None) -> list[int]:
    return [int(x) for x in re.split(r"[,\s]+", text or "") if x.isdigit()]


def is_vllm_serve(argv: list[str]) -> bool:
    """``vllm serve MODEL``, ``python -m vllm.entrypoints.cli.main serve`` or the OpenAI api_server module."""
    for i, a in enumerate(argv[:4]):
        base = os.path.basename(a)
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return True
        if a in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"):
            return a.endswith("api_server") or "serve" in argv[i + 1:i + 2]
    return False


_PREFILL_FLAGS = ("--prefiller-ports", "--prefiller-port", "--prefill-ports", "--prefill-port")
_DECODE_FLAGS = ("--decoder-ports", "--decoder-port", "--decode-ports", "--decode-port")


def _flag_ints(argv: list[str], flags: tuple[str, ...]) -> list[int]:
    """Ports after any of ``flags``: ``--f 1 2``, ``--f 1,2`` or ``--f=1,2``."""
    out: list[int] = []
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        if name not in flags:
            continue
        if eq:
            out += _ints(val)
            continue
        for nxt in argv[i + 1:]:
            if nxt.startswith("-") or not _ints(nxt):
                break
            out += _ints(nxt)
    return out


def proxy_ports(argv: list[str]) -> dict[str, list[int]] | None:
    """Ports named by a P/D proxy's command line, e.g. vLLM's toy proxy: {"prefill": [...], "decode": [...]}."""
    pre, dec = _flag_ints(argv, _PREFILL_FLAGS), _flag_ints(argv, _DECODE_FLAGS)
    if not pre and not dec:
        return None
    return {"prefill": pre, "decode": dec}


def serve_settings(argv: list[str]) -> dict[str, Any]:
    """Model, host, port and kv-transfer-config from a ``vllm serve`` command line."""
    model = _opt(argv, "--model")
    if model is None:
        for i, a in enumerate(argv):
            if a == "serve" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                model = argv[i + 1]
                break
    port = _opt(argv, "--port")
    kv_raw = _opt(argv, "--kv-transfer-config")
    kv: Any = None
    if kv_raw:
        try:
            # Secrets inside the config (kv_connector_extra_config passwords, tokens) never leave here.
            kv = json.loads(redact.redact_json_text(kv_raw))
        except json.JSONDecodeError:
            kv = {"unparsed": redact.redact_json_text(kv_raw)}
    return {"model": model, "host": _opt(argv, "--host"), "port": int(port) if port and port.isdigit() else 8000,
            "port_source": "cmdline --port" if port else "vLLM default (8000)",
            "kv_transfer_config": kv, "data_parallel_size": _opt(argv, "--data-parallel-size", "-dp"),
            "tensor_parallel_size": _opt(argv, "--tensor-parallel-size", "-tp")}


def classify_argv(argv: list[str]) -> tuple[str, str | None]:
    """(label in :data:`LABELS`, title or kind detail) of a process from its command line alone."""
    title = argv[0] if argv else ""
    m = TITLE_RE.match(title)
    if m:
        return _TITLE_LABEL[m.group("kind")], m.group(0)
    if is_vllm_serve(argv):
        return "api-server", None
    if proxy_ports(argv):
        return "proxy", None
    if any("multiprocessing.resource_tracker" in a for a in argv[:4]):
        return "other", "resource_tracker"
    return "other", None

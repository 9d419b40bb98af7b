"""Process discovery with vLLM labels, for ``leaktrace ps`` and ``hunt --vllm``.

What one command line says (label, title, a server's settings, a proxy's ports) is
:mod:`leaktrace.vllm.labels`; here the processes are scanned, grouped into instances and read.

Retitled processes show an all-NUL ``/proc/PID/environ`` and their title as cmdline. Settings are read, in
order, from the live environment in process memory (libc ``__environ``, which setproctitle keeps valid and
which sees in-process ``os.environ`` changes), from ``/proc/PID/environ``, then from the nearest untitled
ancestor; every value says where it came from.

A P/D role comes from a proxy's command line (``--prefiller-ports`` / ``--decoder-ports``, as vLLM's toy
proxy), else from ``kv_role`` when it is producer/consumer, else from /metrics (KV received from a remote
instance = decode).
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from typing import Any

from leaktrace import procfs, procmem, redact
from leaktrace.errors import AccessDenied, LeaktraceError, ProcessGone
from leaktrace.vllm import ucx
from leaktrace.vllm.labels import TITLE_RE, classify_argv, is_vllm_serve, proxy_ports, serve_settings

# Libraries of interest, by group; file names as mapped (wheels rename them with a hash suffix).
LIB_GROUPS: dict[str, re.Pattern[str]] = {
    "ucx": re.compile(r"^libuc[pmst](-[0-9a-f]{8})?\.so|^libuct_\w+(-[0-9a-f]{8})?\.so|^libucm_\w+\.so"),
    "nixl": re.compile(r"^libnixl|^libplugin_\w+\.so"),
    "nccl": re.compile(r"^libnccl"),
    "cuda": re.compile(r"^libcuda\.so|^libcudart|^libcublas|^libnvidia|^libcupti"),
    "torch": re.compile(r"^libtorch|^libc10(_\w+)?\.so"),
}

# Settings worth showing (values pass procfs' redaction too).
CONFIG_ENV_PREFIXES = ("UCX_", "NIXL_", "VLLM_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LD_PRELOAD",
                       "MALLOC_", "PYTHONMALLOC", "GLIBC_TUNABLES", "NCCL_")

SRC_LIVE = "live environ of pid {pid} (process memory)"
SRC_PROC = "/proc/{pid}/environ"
SRC_ANCESTOR = "/proc/{pid}/environ of untitled ancestor {pid} (this process is retitled)"


# ----------------------------------------------------------------------------- one process

def libs_of_interest(maps: list[procfs.Mapping]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for m in maps:
        if not m.path or not m.path.startswith("/") or ".so" not in m.path:
            continue
        name = os.path.basename(m.path)
        if name in seen:
            continue
        seen.add(name)
        for group, rx in LIB_GROUPS.items():
            if group == "nixl" and "nixl" not in m.path.lower():
                continue  # libplugin_*.so of something else
            if rx.search(name):
                out.setdefault(group, []).append(name)
                break
    return out


def _config_env(env: dict[str, str]) -> dict[str, str]:
    return {k: redact.redact_env_value(k, v) for k, v in sorted(env.items()) if k.startswith(CONFIG_ENV_PREFIXES)}


def _read_env(pid: int, maps: list[procfs.Mapping] | None) -> tuple[dict[str, str], str]:
    """(environment, where it came from) for one process; empty when nothing is readable."""
    try:
        live = procmem.read_live_environ(pid, maps)
    except (LeaktraceError, OSError, ValueError):
        live = None
    if live:
        return live, SRC_LIVE.format(pid=pid)
    try:
        env = procfs.read_environ(pid, redact=False)
    except (AccessDenied, ProcessGone):
        env = {}
    return env, SRC_PROC.format(pid=pid) if env else ""


# ----------------------------------------------------------------------------- the scan

def _scan() -> tuple[dict[int, dict[str, Any]], dict[int, list[int]]]:
    """{pid: {ppid, comm, argv}} for every readable process with a command line (not a kernel thread or a
    zombie), and ppid -> children among them."""
    procs: dict[int, dict[str, Any]] = {}
    stats = procfs.process_stats()
    for pid, st in stats.items():
        try:
            argv = procfs.read_cmdline(pid, redact=False)
        except (ProcessGone, AccessDenied):
            continue
        if argv:
            procs[pid] = {"pid": pid, "ppid": int(st["ppid"]), "comm": str(st["comm"]), "argv": argv}  # type: ignore[call-overload]
    return procs, procfs.children_map({pid: stats[pid] for pid in procs})


def _label(p: dict[str, Any]) -> tuple[str, str | None]:
    """(label, title or kind detail)."""
    return classify_argv(p["argv"])


def _scrape_role(host: str | None, port: int, timeout: float = 1.0) -> tuple[str | None, str]:
    """Role from a server's /metrics: KV received from a remote instance means decode."""
    h = host if host and host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    url = f"http://{h}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # a URL we built
            text = r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, f"{url} unreachable ({e.__class__.__name__})"
    from leaktrace.vllm.metrics import parse_metrics, summarize

    role, why = role_from_counters(summarize(parse_metrics(text)))
    return role, f"{url}: {why}"


def role_from_counters(s: dict[str, float]) -> tuple[str | None, str]:
    """A kv_both server's P/D role from its /metrics counters (summarize()): KV received from a remote
    instance, or more than one token generated per request (a P/D proxy asks prefill for one token, and
    a decode that recomputed its prompts after a failed transfer still answers in full), means decode."""
    if s.get("kv_external_prompt_tokens", 0) > 0 or s.get("nixl_transfers", 0) > 0:
        return "decode", "prompt tokens received by KV transfer"
    requests = s.get("requests", 0)
    if requests > 0 and s.get("generation_tokens", 0) > requests:
        return "decode", "generates more than one token per request"
    if s.get("prompt_tokens", 0) > 0:
        return "prefill", "computes prompts, receives no KV, one token per request"
    return None, "no traffic yet"


def discover(pids: list[int] | None = None, with_metrics: bool = True, all_processes: bool = False,
             ucx_state: bool = True) -> list[dict[str, Any]]:
    """Processes with labels, instances, roles, ports, libraries of interest and redacted settings.

    ``pids=None``: every vLLM server on the host (API servers and their trees), P/D proxies, and any
    process mapping UCX/NIXL/NCCL libraries. With ``pids``: those processes and their descendants.
    ``all_processes``: every process (libraries read for all of them)."""
    procs, kids = _scan()
    labels: dict[int, tuple[str, str | None]] = {pid: _label(p) for pid, p in procs.items()}
    instance_of = _instances(procs, kids, labels)
    maps_of = _MapsCache()
    if pids is not None:
        wanted: set[int] = set()
        for p in pids:
            if p in procs:
                wanted.update(procfs.walk_tree([p], kids))
    elif all_processes:
        wanted = set(procs)
    else:
        wanted = set(instance_of) | {pid for pid, (lb, _t) in labels.items() if lb == "proxy"}
        # Other candidates: anything that maps UCX/NIXL/NCCL (a NIXL agent, a UCX program).
        own = os.getpid()
        for pid in procs:
            if pid in wanted or pid == own:
                continue
            libs = libs_of_interest(maps_of(pid))
            if any(g in libs for g in ("ucx", "nixl", "nccl")):
                wanted.add(pid)
    port_roles = _port_roles(procs, labels)
    inst_info = {inst: _instance_info(inst, procs[inst]["argv"], port_roles, maps_of(inst), with_metrics)
                 for inst in set(instance_of.values())}
    return [_process_row(pid, procs, labels, instance_of.get(pid), inst_info, maps_of, ucx_state)
            for pid in sorted(wanted) if pid in procs]


def instance_members() -> dict[int, tuple[str, str, int]]:
    """pid -> (label, P/D role, instance) of every process in a vLLM instance, from command lines alone:
    what :func:`discover` gives them with ``with_metrics=False``, without its reads of every process's maps
    (libraries), environment and UCX settings. For a caller that looks again every few seconds (the watch:
    on a node serving a P/D pair those reads took most of its CPU)."""
    procs, kids = _scan()
    labels = {pid: _label(p) for pid, p in procs.items()}
    instance_of = _instances(procs, kids, labels)
    port_roles = _port_roles(procs, labels)
    roles = {}
    for inst in set(instance_of.values()):
        argv = procs[inst]["argv"]
        roles[inst] = _role(inst, argv, _serve_settings(argv), port_roles, with_metrics=False)[0]
    return {pid: (labels[pid][0], roles[inst], inst) for pid, inst in instance_of.items()}


class _MapsCache:
    """Each process's maps, read once per discovery (an unreadable one reads as no mapping)."""

    def __init__(self) -> None:
        self._maps: dict[int, list[procfs.Mapping]] = {}

    def __call__(self, pid: int) -> list[procfs.Mapping]:
        if pid not in self._maps:
            try:
                self._maps[pid] = procfs.read_maps(pid)
            except (ProcessGone, AccessDenied, procfs.ParseError):
                self._maps[pid] = []
        return self._maps[pid]


def _instances(procs: dict[int, dict[str, Any]], kids: dict[int, list[int]],
               labels: dict[int, tuple[str, str | None]]) -> dict[int, int]:
    """pid -> its instance (the pid of the instance's root)."""
    # Instances: each top-most vLLM API server owns its tree (extra APIServer_N, EngineCore, workers…).
    instance_of: dict[int, int] = {}
    for pid, (label, _t) in labels.items():
        if label != "api-server" or TITLE_RE.match(procs[pid]["argv"][0]):
            continue
        anc = procs[pid]["ppid"]
        nested = False
        while anc in procs and anc > 1:
            if labels[anc][0] == "api-server":
                nested = True
                break
            anc = procs[anc]["ppid"]
        if nested:
            continue
        for d in procfs.walk_tree([pid], kids):
            instance_of.setdefault(d, pid)
    # Titled vLLM processes whose API server is gone or elsewhere (offline LLM(), a bare EngineCore)
    # form an instance rooted at their top-most titled ancestor.
    for pid, (_kind, title) in labels.items():
        if pid in instance_of or not title or not TITLE_RE.match(title):
            continue
        root = pid
        while procs.get(procs[root]["ppid"]) and labels[procs[root]["ppid"]][1]:
            root = procs[root]["ppid"]
        for d in procfs.walk_tree([root], kids):
            instance_of.setdefault(d, root)
    return instance_of


def _port_roles(procs: dict[int, dict[str, Any]], labels: dict[int, tuple[str, str | None]]
                ) -> dict[int, tuple[str, str]]:
    """Proxies name the ports of prefill and decode instances: port -> (role, where it was read)."""
    port_roles: dict[int, tuple[str, str]] = {}
    for pid, (label, _t) in labels.items():
        if label == "proxy":
            pp = proxy_ports(procs[pid]["argv"]) or {}
            for role, ports in pp.items():
                for port in ports:
                    port_roles[port] = (role, f"cmdline of proxy pid {pid}")
    return port_roles


def _serve_settings(argv: list[str]) -> dict[str, Any]:
    return serve_settings(argv) if is_vllm_serve(argv) else {"model": None, "host": None, "port": None,
                                                             "port_source": None, "kv_transfer_config": None}


def _role(inst: int, argv: list[str], settings: dict[str, Any], port_roles: dict[int, tuple[str, str]],
          with_metrics: bool) -> tuple[str, str]:
    """(P/D role, where it was read) of the instance rooted at ``inst`` (its API server's ``argv`` and
    ``settings``)."""
    kv = settings.get("kv_transfer_config")
    role, role_src = "unknown", "no P/D evidence"
    port = settings.get("port")
    if port in port_roles:
        role, role_src = port_roles[port]
    elif isinstance(kv, dict) and kv.get("kv_role") in ("kv_producer", "kv_consumer"):
        role = "prefill" if kv["kv_role"] == "kv_producer" else "decode"
        role_src = f"kv_role={kv['kv_role']} in --kv-transfer-config of pid {inst}"
    elif kv:
        if with_metrics and port:
            r, why = _scrape_role(settings.get("host"), port)
            role, role_src = (r or "unknown"), why
        else:
            role_src = "kv-transfer-config present; the proxy decides the role (no proxy found)"
    elif is_vllm_serve(argv):
        role, role_src = "both", "no kv-transfer-config: this server prefills and decodes"
    return role, role_src


def _instance_info(inst: int, argv: list[str], port_roles: dict[int, tuple[str, str]],
                   maps: list[procfs.Mapping], with_metrics: bool) -> dict[str, Any]:
    """Instance-level facts from the API server (the untitled ancestor of everything in the tree)."""
    settings = _serve_settings(argv)
    env, env_src = _read_env(inst, maps)
    role, role_src = _role(inst, argv, settings, port_roles, with_metrics)
    mp = env.get("VLLM_WORKER_MULTIPROC_METHOD")
    return {
        **settings, "role": role, "role_source": role_src, "env": env, "env_source": env_src,
        "multiproc_method": {"value": mp or "fork", "source": env_src if mp else "vLLM default (not set)"},
    }


def _process_row(pid: int, procs: dict[int, dict[str, Any]], labels: dict[int, tuple[str, str | None]],
                 inst: int | None, inst_info: dict[int, dict[str, Any]], maps_of: _MapsCache,
                 ucx_state: bool) -> dict[str, Any]:
    """One process as `ps --json` lists it."""
    p = procs[pid]
    label, title = labels[pid]
    info = inst_info.get(inst, {}) if inst else {}
    maps = maps_of(pid)
    lib_groups = libs_of_interest(maps)
    libs = sorted({n for names in lib_groups.values() for n in names})

    env, env_src = _read_env(pid, maps)
    if not env:
        # Retitled with nothing readable: the untitled ancestor's launch environment.
        anc = p["ppid"]
        while anc in procs and TITLE_RE.match(procs[anc]["argv"][0]):
            anc = procs[anc]["ppid"]
        if anc in procs:
            try:
                env = procfs.read_environ(anc, redact=False)
                env_src = SRC_ANCESTOR.format(pid=anc) if env else ""
            except (AccessDenied, ProcessGone):
                env = {}
    config: dict[str, Any] = {
        "env": {k: {"value": v, "source": env_src} for k, v in _config_env(env).items()},
    }
    if info:
        config["kv_transfer_config"] = info.get("kv_transfer_config")
        config["kv_transfer_config_source"] = f"cmdline of api-server pid {inst}" if info.get(
            "kv_transfer_config") is not None else None
        config["multiproc_method"] = info.get("multiproc_method")
    if ucx_state and "ucx" in lib_groups:
        try:
            config["ucx"] = ucx.read_ucx_config(pid, maps=maps_of(pid) or None).to_dict()
        except (LeaktraceError, OSError, ValueError) as e:
            config["ucx"] = {"error": str(e)}
    row: dict[str, Any] = {
        "pid": pid, "ppid": p["ppid"], "comm": p["comm"], "label": label,
        "title": title, "instance": inst,
        "role": info.get("role", "unknown") if inst else "unknown",
        "role_source": info.get("role_source") if inst else None,
        "port": info.get("port") if inst else None,
        "host": info.get("host") if inst else None,
        "model": info.get("model") if inst else None,
        "cmdline": " ".join(redact.redact_cmdline(p["argv"]))[:500],
        "libs": libs, "lib_groups": sorted(lib_groups),
        "config": config,
    }
    if label == "proxy":
        row["proxy_ports"] = proxy_ports(p["argv"])
    return row


def instances(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group discovered processes by vLLM instance (one per API server)."""
    by: dict[int, dict[str, Any]] = {}
    for p in procs:
        inst = p.get("instance")
        if inst is None:
            continue
        i = by.setdefault(inst, {"instance": inst, "role": p.get("role", "unknown"),
                                 "role_source": p.get("role_source"), "port": p.get("port"),
                                 "host": p.get("host"),
                                 "model": p.get("model"), "pids": [], "processes": []})
        i["pids"].append(p["pid"])
        i["processes"].append({"pid": p["pid"], "ppid": p["ppid"], "label": p["label"], "title": p.get("title")})
        if p["label"] == "api-server" and p["pid"] == inst:
            i["kv_transfer_config"] = p["config"].get("kv_transfer_config")
            i["multiproc_method"] = p["config"].get("multiproc_method")
    return sorted(by.values(), key=lambda i: i["instance"])


def vllm_targets() -> list[int]:
    """Root pids for ``hunt --vllm``: each vLLM instance's top-most process (its API server)."""
    found = discover(with_metrics=False, ucx_state=False)
    return sorted({p["instance"] for p in found if p.get("instance") is not None})

"""The shape of report.json (``leaktrace.report/1``): what the analysis builds and every reporter reads.

The required keys are the contract in DESIGN.md (acceptance checks and other tools read them); the
others are present when the hunt had the probe that knows them. ``total=False`` classes list keys that
may be absent.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

Verdict = Literal["leak", "no-leak", "inconclusive"]
CulpritKind = Literal["native-mmap", "malloc-heap", "shm", "file", "python-heap", "other"]


class ExitInfo(TypedDict, total=False):
    """How a process that ended during the hunt ended (``processes[].exit``, ``ledger.exits[].exit``)."""

    how: Literal["exited", "signal", "oom-killed", "unknown"]
    status: int | None  # exit status (how == "exited")
    signal: str | None  # "SIGKILL", ... (killed by a signal; SIGKILL when OOM-killed)
    core: bool
    source: str | None  # "ebpf" (the kernel's exit code at the exit) | "proc" (a zombie's /proc/PID/stat)
    t: float | None  # seconds since the hunt started
    before_ebpf: bool  # it died while the eBPF program compiled: nothing of it was traced
    ebpf_live_s: float
    note: str


class _ProcessRequired(TypedDict):
    pid: int
    ppid: int
    label: str  # the ps vocabulary: api-server, engine-core, worker, dp-coordinator, proxy, other
    rss_mb_per_min: float
    anon_mb_per_min: float
    uss_mb_per_min: float


class ProcessEntry(_ProcessRequired, total=False):
    title: str
    comm: str
    pss_mb_per_min: float
    rss_confidence: float
    anon_confidence: float
    rss_step: bool
    rss_shape: str  # "decelerating" (a plateau forming) | "warm-up" (then steady); absent: steady or too short
    rss_first_mb: float
    rss_last_mb: float
    samples: int
    exited_s: float | None
    exit: ExitInfo | None  # None while it lived to the end of the hunt
    leaking: bool
    instance: int | None
    growth_by_class: dict[str, float]
    python: dict[str, Any]  # GC state, when the Python-heap probe ran
    allocator: str  # who serves malloc, where the malloc probe ran: "glibc" (books read), "jemalloc", "tcmalloc", "mimalloc"
    # effective UCX state, when UCX is mapped: {"settings": {UCX_*: value}, "sources", "hooks_active", "version"}
    ucx: dict[str, Any]


class _CulpritRequired(TypedDict):
    kind: CulpritKind
    library: str | None
    pid: int
    mb_per_min: float
    outstanding_bytes: int
    stack: list[str]
    evidence: list[str]
    remedy: str


class Culprit(_CulpritRequired, total=False):
    process_label: str
    process_title: str
    instance: int | None
    first_named_s: float | None
    finding: str
    rule: str | None
    rule_title: str | None
    source: str  # ledger | watcher | pyheap
    cls: str
    measured_kind: str
    # the settings the rule's remedy changes, with their effective values in the process (rules.toml)
    remedy_settings: dict[str, str | None]
    # python-heap: the growing types with their counts and the gc.freeze state (analysis.pyobjects)
    python: dict[str, Any]
    hostname: str  # merged cluster reports
    node_id: str


class _LedgerRequired(TypedDict):
    outstanding_bytes: int
    events: int
    lost_events: int


class Ledger(_LedgerRequired, total=False):
    available: bool
    by_library: Any
    exits: list[dict[str, Any]]  # targets that ended: pid, t, outstanding_bytes, regions held then, exit


class _ReportRequired(TypedDict):
    schema: str
    verdict: Verdict
    duration_s: float
    processes: list[ProcessEntry]
    growth_by_class: dict[str, float]
    culprits: list[Culprit]
    ledger: Ledger


class Report(_ReportRequired, total=False):
    verdict_reason: str
    confidence: float  # P(the judged growth is a leak | verdict, seconds observed): analysis/calibration.py
    attach_s: float | None
    probe_attach_s: dict[str, float]
    stop_reason: str
    session_complete: bool
    session_id: str | None
    target: dict[str, Any]
    host: dict[str, Any]
    probes: list[str]
    thresholds: dict[str, float]
    regions: list[dict[str, Any]]
    total_rss_mb: float
    warnings: list[str]
    shm_segments: list[dict[str, Any]]
    demo: dict[str, Any]
    instances: list[dict[str, Any]]  # hunt --vllm: one per vLLM server
    load: dict[str, Any]  # /metrics scraped: requests, tokens, KV transfers, growth per 1,000 requests
    nodes: list[dict[str, Any]]  # merged cluster reports
    tick_costs: dict[str, Any]  # per probe: ticks, wall and CPU seconds; ticks started late (leaktrace.probes.TickCosts)

"""A real multi-node Ray cluster on one machine, sealed off from the network, for the cluster tests.

Layout (../shared/RECIPES.md, "Ray, several nodes on one machine"):

* one private **network namespace** with only ``lo`` up, held open by a small holder process. Ray rewrites
  127.0.0.1 to the machine's outward address and listens on all interfaces, so the only safe place for it
  is a namespace where no other interface exists. Every node and the driver join it with ``nsenter -n``.
* every node in its own **PID, mount and UTS namespace** (``unshare --pid --fork --mount-proc --uts``),
  with its own hostname, node IP (127.0.0.2, .3, .4), ``--temp-dir`` and dashboard-agent port, as on
  real hosts: a task on node B sees only node B's processes in /proc.
* ``ray start --block`` is PID 1 of its namespace: SIGTERM to it stops the node, and when it exits the
  kernel kills whatever is left in that namespace.

Nothing here ever runs ``ray stop``: it kills every Ray process on the machine by name, including other
people's. Every process started here dies with the test process (PR_SET_PDEATHSIG), even on a crash.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
GCS_PORT = 6379  # free by construction: nothing else lives in the private network namespace
PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: int = signal.SIGKILL):
    """preexec_fn: the child gets ``sig`` when the test process dies, so a crashed test leaves nothing."""
    libc = ctypes.CDLL(None, use_errno=True)

    def set_pdeathsig() -> None:
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return set_pdeathsig


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _wait_until(pred, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return st.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class NetNamespace:
    """A private network namespace with only loopback up, kept alive by a holder process that reads its
    stdin: when the test process dies the pipe closes and the holder exits."""

    popen: subprocess.Popen

    @classmethod
    def create(cls, timeout: float = 10) -> NetNamespace:
        script = "ip link set lo up && echo ready && read _unused"
        p = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=_die_with_parent())
        ns = cls(p)
        ready, _, _ = select.select([p.stdout], [], [], timeout)
        line = p.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if line.strip() != "ready":
            ns.close()
            err = p.stderr.read() if p.poll() is not None else "no answer"  # type: ignore[union-attr]
            raise RuntimeError(f"could not create the network namespace: {err.strip()}")
        return ns

    @property
    def pid(self) -> int:
        return self.popen.pid

    def enter(self) -> list[str]:
        """Command prefix that runs a program inside this network namespace."""
        return ["nsenter", "-t", str(self.pid), "-n", "--"]

    def interfaces(self) -> list[str]:
        out = subprocess.run([*self.enter(), "ip", "-o", "link", "show"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


@dataclass
class RayNode:
    name: str  # also the node's hostname (own UTS namespace)
    ip: str
    head: bool
    temp_dir: Path
    popen: subprocess.Popen  # nsenter → unshare (exec'd), the parent of the namespace's PID 1
    log_path: Path
    pid1: int = 0  # host PID of `ray start --block`, PID 1 inside the node's namespace
    node_id: str = ""

    def enter(self) -> list[str]:
        """Command prefix that runs a program on this node: its PID and mount namespaces (so it has a
        PID there and its /proc is the node's)."""
        return ["nsenter", "-t", str(self.pid1), "-p", "-m", "--"]

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class RayNamespaceCluster:
    netns: NetNamespace
    root: Path
    nodes: list[RayNode] = field(default_factory=list)
    up_s: float = 0.0
    down_s: float = 0.0
    fixtures: dict = field(default_factory=dict)  # processes a test placed on nodes, by node name
    venv_bin: Path = VENV_BIN  # the bin/ of the Python environment the nodes run

    @property
    def address(self) -> str:
        return f"{self.nodes[0].ip}:{GCS_PORT}"

    def node(self, name: str) -> RayNode:
        return next(n for n in self.nodes if n.name == name)

    # -- start
    @classmethod
    def start(cls, names_ips: list[tuple[str, str]], timeout: float = 120,
              wrappers: dict[str, list[str]] | None = None, venv_bin: Path = VENV_BIN) -> RayNamespaceCluster:
        """Start a head (the first entry) and workers, each in its own PID namespace, all in one private
        network namespace; returns once every node is alive in the GCS (or raises, after tearing down).
        ``wrappers``: a command prefix per node name for its `ray start` (e.g. setpriv dropping capabilities:
        a node without eBPF). ``venv_bin``: the Python environment the nodes run (Ray's workers use its
        interpreter): by default the repository's; :func:`wheel_venv` makes one holding the built wheel."""
        t0 = time.monotonic()
        root = Path(tempfile.mkdtemp(prefix="ltray-", dir="/tmp"))  # short: Ray's socket paths are limited
        netns = NetNamespace.create()
        cluster = cls(netns=netns, root=root, venv_bin=venv_bin)
        try:
            for i, (name, ip) in enumerate(names_ips):
                cluster._start_node(name, ip, head=(i == 0), agent_port=52365 + i,
                                    wrapper=(wrappers or {}).get(name, []))
                if i == 0:
                    cluster._wait_gcs(timeout=max(5.0, timeout - (time.monotonic() - t0)))
            cluster._wait_alive(timeout=max(5.0, timeout - (time.monotonic() - t0)))
        except BaseException:
            cluster.stop()
            raise
        cluster.up_s = time.monotonic() - t0
        return cluster

    def _start_node(self, name: str, ip: str, head: bool, agent_port: int, wrapper: list[str]) -> None:
        temp_dir = self.root / name
        temp_dir.mkdir()
        log_path = self.root / f"{name}.log"
        resources = json.dumps({f"lt_{name}": 1})
        args = [str(self.venv_bin / "ray"), "start", "--block", "--node-ip-address", ip, "--temp-dir", str(temp_dir),
                "--object-store-memory", "100000000", "--num-cpus", "1", "--resources", resources,
                "--dashboard-agent-listen-port", str(agent_port), "--disable-usage-stats"]
        if head:
            args += ["--head", "--port", str(GCS_PORT), "--include-dashboard", "false"]
        else:
            args += ["--address", self.address]
        script = f"hostname {name} && exec " + " ".join(_sh_quote(a) for a in [*wrapper, *args])
        argv = [*self.netns.enter(), "unshare", "--pid", "--fork", "--kill-child=SIGTERM", "--mount-proc",
                "--uts", "--", "sh", "-c", script]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{self.venv_bin}:{os.environ.get('PATH', '')}",
               # Real hosts each have their own /run; these "hosts" share one file system, and PIDs (and
               # start times) repeat across their PID namespaces, so each gets its own hunt-lock folder.
               "LEAKTRACE_LOCK_DIR": str(temp_dir / "locks")}
        env.pop("RAY_ADDRESS", None)
        with open(log_path, "w") as log:
            # SIGKILL on parent death kills unshare, whose --kill-child then SIGTERMs the node's PID 1.
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env, preexec_fn=_die_with_parent())
        node = RayNode(name=name, ip=ip, head=head, temp_dir=temp_dir, popen=popen, log_path=log_path)
        self.nodes.append(node)
        if not _wait_until(lambda: bool(_children(popen.pid)) or popen.poll() is not None, 10):
            raise RuntimeError(f"node {name}: unshare forked no child\n{node.log_tail()}")
        if popen.poll() is not None:
            raise RuntimeError(f"node {name} exited at start (rc {popen.returncode})\n{node.log_tail()}")
        node.pid1 = _children(popen.pid)[0]

    def _ray_state(self) -> list[dict]:
        """Nodes as the GCS sees them, asked from inside the network namespace (bounded)."""
        code = ("import json, ray\n"
                f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
                "print('NODES=' + json.dumps([{k: n[k] for k in ('NodeID', 'NodeManagerAddress', "
                "'NodeManagerHostname', 'Alive')} for n in ray.nodes()]))\n")
        r = self.run_in_netns([sys.executable, "-c", code], timeout=60)
        for line in r.stdout.splitlines():
            if line.startswith("NODES="):
                return json.loads(line[len("NODES="):])
        raise RuntimeError(f"could not list Ray nodes: {r.stderr[-2000:]}")

    def _wait_gcs(self, timeout: float) -> None:
        head = self.nodes[0]
        sock_ok = lambda: head.popen.poll() is not None or _gcs_listening(self, head.ip)  # noqa: E731
        if not _wait_until(sock_ok, timeout, step=0.5) or head.popen.poll() is not None:
            raise RuntimeError(f"Ray head did not come up in {timeout:.0f}s\n{head.log_tail()}")

    def _wait_alive(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        want = {n.ip for n in self.nodes}
        state: list[dict] = []
        while time.monotonic() < deadline:
            dead = [n for n in self.nodes if n.popen.poll() is not None]
            if dead:
                raise RuntimeError(f"node {dead[0].name} exited at start\n{dead[0].log_tail()}")
            try:
                state = self._ray_state()
            except (RuntimeError, subprocess.TimeoutExpired):
                state = []
            alive = {s["NodeManagerAddress"]: s for s in state if s["Alive"]}
            if want <= set(alive):
                for n in self.nodes:
                    n.node_id = alive[n.ip]["NodeID"]
                return
            time.sleep(1.0)
        raise RuntimeError(f"not every Ray node was alive after {timeout:.0f}s: {state}\n"
                           + "\n".join(f"--- {n.name}\n{n.log_tail(15)}" for n in self.nodes))

    # -- use
    def run_in_netns(self, argv: list[str], timeout: float, env: dict[str, str] | None = None,
                     cwd: str | None = None) -> subprocess.CompletedProcess:
        full_env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        full_env.pop("RAY_ADDRESS", None)
        return subprocess.run([*self.netns.enter(), *argv], capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=cwd, preexec_fn=_die_with_parent())

    # -- stop
    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to each node's PID 1 (Ray's own orderly shutdown), then SIGKILL to what is left; the
        kernel kills the rest of a PID namespace with its PID 1. Workers first, the head last."""
        t0 = time.monotonic()
        for node in reversed(self.nodes):
            if node.pid1 and _alive(node.pid1):
                try:
                    os.kill(node.pid1, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for node in reversed(self.nodes):
            try:
                node.popen.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                for pid in (node.pid1, node.popen.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                node.popen.wait(timeout=10)
        self.netns.close()
        self.down_s = time.monotonic() - t0
        shutil.rmtree(self.root, ignore_errors=True)


def _gcs_listening(cluster: RayNamespaceCluster, ip: str) -> bool:
    code = (f"import socket; s = socket.socket(); s.settimeout(1); "
            f"print(s.connect_ex(({ip!r}, {GCS_PORT})))")
    try:
        r = cluster.run_in_netns([sys.executable, "-c", code], timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return r.stdout.strip() == "0"


def _sh_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# -- shared by the cluster test modules
def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network and PID namespaces)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (bash .ci/setup.d/50-cluster.sh)"
    for tool in ("unshare", "nsenter", "ip"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} missing (apt-get install util-linux iproute2)"
    r = subprocess.run(["unshare", "--net", "--", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    return None


class NodeFixture:
    """A fixture process started inside one node's PID and mount namespaces; ``pid`` is its PID there."""

    def __init__(self, node, argv: list[str]) -> None:
        self.popen = subprocess.Popen([*node.enter(), *map(str, argv)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = _readline(self.popen, timeout=15)
        if not line.startswith("ready "):
            self.kill()
            raise RuntimeError(f"fixture on {node.name} did not start: {line!r}")
        self.pid = int(line.split()[1])

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)


def _readline(p: subprocess.Popen, timeout: float) -> str:
    import select

    ready, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline() if ready else ""  # type: ignore[union-attr]


def cluster_cli(cluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`leaktrace cluster …` as the driver, inside the cluster's network namespace."""
    return cluster.run_in_netns([sys.executable, "-m", "leaktrace", "cluster", *map(str, args)],
                                timeout=timeout, cwd=str(REPO))


def _why(out: Path) -> str:
    """What each node answered (status, reason, the tail of its hunt's stderr), for a failing assert."""
    meta = json.loads((out / "cluster.json").read_text())
    return "\n".join(f"{n['hostname']}: {n['status']} {n['reason']} rc={n['rc']}\n{n['stderr_tail'][-1500:]}"
                     for n in meta["nodes"])


def _node(report: dict, hostname: str) -> dict:
    return next(n for n in report["nodes"] if n["hostname"] == hostname)


def _node_hunts() -> dict[int, Path]:
    """Host pid → --out of every `leaktrace hunt` that a node task runs (their --out is a node temp dir)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "hunt" in argv and "--out" in argv and "leaktrace-node-" in argv[argv.index("--out") + 1]:
            found[int(entry.name)] = Path(argv[argv.index("--out") + 1])
    return found


def _lock_holders() -> set[int]:
    """Host pids holding a leaktrace target lock on a process of another PID namespace (a node's: the lock file
    names the namespace, leaktrace/targetlock.py). A hunt that is tearing down holds its locks after its
    command line reads empty (the kernel frees the memory before the files)."""
    here = f"-ns{os.stat('/proc/self/ns/pid').st_ino}.lock"
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if ("/leaktrace-locks/" in target or target.startswith("/run/leaktrace/")) and not target.endswith(here):
                    found.add(int(entry.name))
                    break
        except OSError:
            continue
    return found


def wheel_venv(root: Path) -> Path:
    """A Python environment that holds leaktrace as a fleet installs it — the wheel built from this checkout,
    no repository on sys.path — beside the project's dependencies (Ray, pandas, …) taken from the repository's
    environment by a path entry (its own .pth files, the editable install among them, are not read).
    Returns its bin/ (with a `ray` entry point)."""
    dist = root / "dist"
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)], cwd=str(root),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"building the wheel failed: {r.stderr[-2000:]}")
    (wheel,) = dist.glob("leaktrace-*.whl")
    venv = root / "node-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    base = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "_project_dependencies.pth").write_text(f"{base}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--disable-pip-version-check", str(wheel)], cwd=str(root), env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"installing the wheel failed: {r.stderr[-2000:]}")
    ray = venv / "bin" / "ray"
    ray.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom ray.scripts.scripts import main\n"
                   "sys.exit(main())\n")
    ray.chmod(0o755)
    return venv / "bin"

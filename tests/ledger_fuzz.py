"""The eBPF ledger against the kernel's own account: the mapping-operation fuzzer (tests/fixtures/mapfuzz.c) runs in
rounds under the real probe, and at every checkpoint (the fuzzer and its children paused, every event of the ring
applied) each process's ledger is compared with its /proc/PID/maps, byte for byte. Shared by
tests/test_ledger_fuzz.py and bench/bench_ledger_fuzz.py.

What the ledger holds, per process (its contract, both halves: the kernel-owned regions and the user-side address
space): every mapping of the process, each byte once. Mappings made since the process was first traced carry the
origin of the call that made them; those that existed when it was first traced (at attach, or at its fork or exec:
the maps read then) are held as the process's pre-existing mappings, cut, moved and replaced like any other by the
calls that touch them since. So at a checkpoint the union of the ledger's intervals equals the union of the
/proc/PID/maps intervals, with these out of the contract:

- ``[stack]``: the main thread's stack grows by page faults, not by a mapping call (the fault probe's business);
  the ledger keeps it as it was read, so the comparison leaves out the current ``[stack]`` range (a ledger piece
  there other than the pre-existing stack is still a mismatch). The fuzzer grows its stack before the attach.
- ``[vsyscall]``: kernel space, no call of the process maps or unmaps it (the probe never seeds it).

Beyond the extent, what the ledger counts: a piece it holds as a reservation (PROT_NONE anonymous: no memory until
committed) must be PROT_NONE in /proc, and an anonymous or heap piece it counts must not be. Overlapping pieces
(one byte held twice: a MAP_FIXED overlay counted over a kernel-owned region) are a mismatch of their own.

A failing run is shrunk (:func:`shrink`): the shortest failing prefix of the operations, then chunks of it removed
while the rest still fails, each candidate replayed by a fresh fuzzer under the same probe.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fixtures.build import build

from leaktrace.probes import HuntContext, HuntOptions, TargetSet
from leaktrace.probes.bpf.probe import BpfProbe
from leaktrace.session import SessionWriter

OP_NAMES = ["mmap_anon", "mmap_file", "mmap_shared", "fixed_over", "arena_map", "arena_unmap", "munmap", "mremap",
            "mprotect", "madvise", "brk", "shmat", "shmdt", "fork", "child", "malloc", "malloc_big", "thread"]
OUT_OF_CONTRACT = ("[stack]", "[vsyscall]")


def fuzzer_exe() -> Path:
    return build("mapfuzz", ["mapfuzz.c"], ldflags=["-pthread"])


def describe(line: str) -> str:
    """An operation line as a reader would like it: its name first."""
    f = line.split()
    return f"{OP_NAMES[int(f[0])] if f and int(f[0]) < len(OP_NAMES) else '?'} {line}"


class Fuzzer:
    """mapfuzz as a child process; ``log`` collects the operations it runs (one line each)."""

    def __init__(self, log: Path | None = None) -> None:
        self.log = log
        self.p = subprocess.Popen([str(fuzzer_exe()), str(log) if log else "/dev/null"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None and self.p.stdout.readline().startswith("ready")
        self.pid = self.p.pid

    def _command(self, text: str) -> list[int]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()
        reply = self.p.stdout.readline().split()
        if not reply or reply[0] != "ok":
            raise RuntimeError(f"mapfuzz {self.pid} stopped on {text!r}: {reply} (exit {self.p.poll()})")
        return [int(x) for x in reply[1:]]

    def run(self, seed: int, n: int) -> list[int]:
        """n more operations of ``seed``'s stream; the pids to check (the fuzzer's and its live children's)."""
        return self._command(f"run {seed} {n}")

    def replay(self, ops: Path) -> list[int]:
        return self._command(f"replay {ops}")

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                assert self.p.stdin is not None
                self.p.stdin.write("quit\n")
                self.p.stdin.flush()
                self.p.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait()


# ----------------------------------------------------------------------------- the oracle

def read_maps(pid: int) -> list[tuple[int, int, str, str]]:
    """(start, end, perms, path) of /proc/PID/maps."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(None, 5)
            a, b = (int(x, 16) for x in parts[0].split("-"))
            out.append((a, b, parts[1], parts[5] if len(parts) > 5 else ""))
    return out


def merged(pieces: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(pieces):
        if out and out[-1][1] >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _diff(want: list[tuple[int, int]], got: list[tuple[int, int]]) -> tuple[list, list]:
    """(ranges mapped that the ledger lacks, ranges the ledger holds that are not mapped)."""
    def minus(x: list[tuple[int, int]], y: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out, j = [], 0
        for a, b in x:
            cur = a
            while j < len(y) and y[j][1] <= cur:
                j += 1
            k = j
            while k < len(y) and y[k][0] < b:
                if y[k][0] > cur:
                    out.append((cur, y[k][0]))
                cur = max(cur, y[k][1])
                k += 1
            if cur < b:
                out.append((cur, b))
        return out
    return minus(want, got), minus(got, want)


def _hex(r: list[tuple[int, int]], most: int = 6) -> str:
    s = ", ".join(f"{a:#x}-{b:#x} ({(b - a) // 4096}p)" for a, b in r[:most])
    return s + (f" ... {len(r) - most} more" if len(r) > most else "")


def compare(pid: int, held: list[tuple[int, int, str, str]], maps: list[tuple[int, int, str, str]]) -> list[str]:
    """Mismatches of one process: ``held`` the ledger's (start, end, kind, path) pieces, ``maps`` /proc's."""
    problems: list[str] = []
    outside = [(a, b) for a, b, _p, path in maps if path in OUT_OF_CONTRACT]
    held = sorted(held)
    reach, reach_kind = 0, ""  # the furthest end of the pieces before, and its piece's kind
    for a, b, kind, _path in held:
        if a < reach:
            problems.append(f"pid {pid}: held twice {a:#x}-{min(b, reach):#x} ({reach_kind} and {kind})")
        if b > reach:
            reach, reach_kind = b, kind

    def in_contract(a: int, b: int, kind: str, path: str) -> bool:
        return not (kind == "preexisting" and path in OUT_OF_CONTRACT
                    and any(x <= a and b <= y for x, y in outside))

    got = merged((a, b) for a, b, kind, path in held if in_contract(a, b, kind, path))
    want = merged((a, b) for a, b, _p, path in maps if path not in OUT_OF_CONTRACT)
    missing, extra = _diff(want, got)
    if missing:
        problems.append(f"pid {pid}: mapped, not in the ledger: {_hex(missing)}")
    if extra:
        problems.append(f"pid {pid}: in the ledger, not mapped: {_hex(extra)}")
    none = merged((a, b) for a, b, perms, _path in maps if perms.startswith("---"))
    for kinds, must_be_none in ((("reserve",), True), (("anon", "heap"), False)):
        pieces = merged((a, b) for a, b, kind, _ in held if kind in kinds)
        bad = _diff(pieces, none)[0] if must_be_none else _diff(pieces, _diff(pieces, none)[0])[0]
        if bad:
            what = "held as a reservation, not PROT_NONE" if must_be_none else "counted, but PROT_NONE"
            problems.append(f"pid {pid}: {what}: {_hex(bad)}")
    return problems


# ----------------------------------------------------------------------------- the probe and its checkpoints

@dataclass
class Traced:
    """The real probe over a session in a temporary directory."""

    pids: list[int]
    probe: BpfProbe = field(default_factory=BpfProbe)

    def __post_init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ledger-fuzz-")
        self.session = SessionWriter(Path(self._dir.name) / "s", meta={"target": {"pids": self.pids}})
        targets = TargetSet(roots=list(self.pids), pids=dict.fromkeys(self.pids, 0))
        self.ctx = HuntContext(self.session, targets, HuntOptions(), lambda _s: None)
        self.probe.start(self.ctx)

    def add(self, pid: int) -> None:
        self.probe.add_pid(pid)

    def held(self) -> dict[int, list[tuple[int, int, str, str]]]:
        """Every event applied, then what the ledger holds per pid (both halves)."""
        p = self.probe
        with p.lock.ahead():
            while p._drain():
                pass
            out: dict[int, list[tuple[int, int, str, str]]] = {}
            for pid, a, b, o, _t, _k in p.kernel.outstanding():
                out.setdefault(pid, []).append((a, b, o.kind, o.path))
        return out

    def lost(self) -> int:
        self.probe.kernel.read_counters(self.probe._counters)
        return self.probe._counters["lost_events"]

    def check(self, pids: list[int]) -> list[str]:
        held = self.held()
        problems = []
        for pid in pids:
            try:
                maps = read_maps(pid)
            except (FileNotFoundError, ProcessLookupError):
                continue
            problems += compare(pid, held.get(pid, []), maps)
        if (lost := self.lost()):
            problems.append(f"{lost} events lost (the ring was full): the ledger cannot be exact")
        return problems

    def close(self) -> None:
        self.probe.stop()
        self.session.close()
        self._dir.cleanup()


@dataclass
class FuzzResult:
    seeds: list[int]
    ops: int = 0
    checkpoints: int = 0
    seconds: float = 0.0
    mismatches: list[str] = field(default_factory=list)  # the first failing checkpoint's problems
    failing_seed: int | None = None
    shrunk: list[str] | None = None  # the shortest failing operation list found (lines, described)
    shrink_note: str = ""

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def report(self) -> str:
        lines = [f"{self.ops} operations, {self.checkpoints} checkpoints, {len(self.mismatches)} mismatches, "
                 f"{self.ops_per_s:.0f} ops/s"]
        if self.mismatches:
            lines += [f"seed {self.failing_seed}:"] + [f"  {m}" for m in self.mismatches[:20]]
            if self.shrunk is not None:
                lines += [f"shortest failing sequence ({len(self.shrunk)} operations; {self.shrink_note}):"]
                lines += [f"  {describe(x)}" for x in self.shrunk]
            elif self.shrink_note:
                lines.append(self.shrink_note)
        return "\n".join(lines)


def fuzz(seeds: list[int], ops_per_seed: int, round_ops: int = 2000, shrink_s: float = 90.0) -> FuzzResult:
    """Run every seed's stream in rounds of ``round_ops`` under one probe; stop at the first failing checkpoint and
    shrink it (for at most ``shrink_s`` seconds)."""
    res = FuzzResult(seeds=list(seeds))
    work = Path(tempfile.mkdtemp(prefix="mapfuzz-"))
    t0 = time.monotonic()
    tr: Traced | None = None
    try:
        for seed in seeds:
            log = work / f"seed-{seed}.ops"
            fz = Fuzzer(log)
            if tr is None:
                tr = Traced([fz.pid])
            else:
                tr.add(fz.pid)
            try:
                problems = tr.check([fz.pid])  # the seed alone, before any operation
                done = 0
                while not problems and done < ops_per_seed:
                    n = min(round_ops, ops_per_seed - done)
                    pids = fz.run(seed, n)
                    done += n
                    res.ops += n
                    res.checkpoints += 1
                    problems = tr.check(pids)
            finally:
                fz.close()
            if problems:
                res.mismatches = problems
                res.failing_seed = seed
                res.seconds = time.monotonic() - t0
                ops = log.read_text().splitlines()
                res.shrunk, res.shrink_note = shrink(tr, ops, work, time.monotonic() + shrink_s, round_ops)
                return res
        res.seconds = time.monotonic() - t0
        return res
    finally:
        if tr is not None:
            tr.close()
        for f in work.iterdir():
            f.unlink()
        work.rmdir()


def fails(tr: Traced, ops: list[str], work: Path) -> bool:
    """Does a fresh fuzzer replaying ``ops`` leave a ledger that differs from /proc?"""
    path = work / "candidate.ops"
    path.write_text("".join(x + "\n" for x in ops))
    fz = Fuzzer()
    tr.add(fz.pid)
    try:
        return bool(tr.check(fz.replay(path)))
    finally:
        fz.close()


def shrink(tr: Traced, ops: list[str], work: Path, deadline: float,
           round_ops: int = 2000) -> tuple[list[str] | None, str]:
    """The shortest failing suffix of whole rounds, its shortest failing prefix (bisected), then chunks removed while it still fails (ddmin), until
    ``deadline``. (None, why) when the whole list does not fail on replay (a failure that depends on timing)."""
    # A mismatch is mostly made by the last operations: the last rounds alone, from a fresh process, first.
    k = 1
    while k * round_ops < len(ops) and time.monotonic() < deadline:
        if fails(tr, ops[-k * round_ops:], work):
            ops = ops[-k * round_ops:]
            break
        k *= 2
    else:
        if not fails(tr, ops, work):
            return None, f"not reproduced by replaying the {len(ops)} operations: it depends on timing"
    lo, hi = 0, len(ops)  # ops[:hi] fails; ops[:lo] does not (an empty list never fails)
    while hi - lo > 1 and time.monotonic() < deadline:
        mid = (lo + hi) // 2
        if fails(tr, ops[:mid], work):
            hi = mid
        else:
            lo = mid
    cur = ops[:hi]
    chunk = max(1, len(cur) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        i, removed = 0, False
        while i < len(cur) and time.monotonic() < deadline:
            cand = cur[:i] + cur[i + chunk:]
            if cand and fails(tr, cand, work):
                cur, removed = cand, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    done = "minimal" if chunk < 1 else "shrinking stopped at its time limit"
    return cur, done


def main_seeds(n: int, base: int = 1) -> list[int]:
    return list(range(base, base + n))


if __name__ == "__main__":  # a quick manual run: python tests/ledger_fuzz.py SEEDS OPS
    import sys

    r = fuzz(main_seeds(int(sys.argv[1]) if len(sys.argv) > 1 else 1),
             int(sys.argv[2]) if len(sys.argv) > 2 else 20000)
    print(r.report())
    os._exit(1 if r.mismatches else 0)

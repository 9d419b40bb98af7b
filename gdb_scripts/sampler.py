"""leaktrace's in-gdb stack sampler: runs inside gdb's own Python (``gdb -x sampler.py``).

Handling a stop here costs ~0.2 ms (the target sees ~0.4 ms per stop, bench/bench_gdb.py); driving
every stop over MI from another process costs ~1.5–4 ms. The driver (leaktrace/probes/gdb/attach.py) talks to gdb over MI only to start and stop this program:

    leaktrace-symbols CONFIG.json  read the symbols of the target's libraries, not attached (takes long)
    leaktrace-sample CONFIG.json   attach to config["pid"] and let it run (returns at once)
    leaktrace-begin                sample in the background (returns at once)
    leaktrace-stop [REASON]        detach now (idempotent)

How it samples: ``catch syscall mmap munmap mremap`` (PTRACE_SYSCALL: writes no code into the target,
unlike a breakpoint) in non-stop mode, so only the thread that made the syscall is stopped. Each syscall
stops twice (entry and exit); the entry stop is resumed at once, the exit stop records the result and
the backtrace, then resumes the thread. Signals pass through untouched (sampler_settings.gdb).

At a call site (config["site"]: {"address", "label"}): once the eBPF ledger knows which call site grows, a
breakpoint at that return address (the instruction after the call that mapped the memory) stops only the
thread coming back through it, with the call's result in rax (the address mapped) and the full DWARF stack
above; each stop is one sample labelled ``label``. A breakpoint is an int3 written into the target: it is
deleted before every detach (``finish``), and gdb removes what it inserted if it exits attached.

Symbols first, before the attach (``leaktrace-symbols``: ``add-symbol-file`` of each library mapped in the
target, at the load bias the driver read from /proc/PID/maps; ``symbols_s``). They are never read while
attached: a command as long as that keeps gdb out of its event loop, and every thread of the target that
meets a ptrace event meanwhile (a thread created, a signal) stays stopped until it ends: read by
``sharedlibrary`` after the attach, a loaded vLLM worker's 50-70 s symbol read stops its traffic for
20-35 s while the pause budget sees 0.3 s. Attach sequence: ``attach`` (every thread stops;
shared-library symbols are not read then: auto-solib-add is off), ``continue -a &`` at once, and a stop
handler that resumes each further thread as its attach stop reaches gdb's event loop; the driver waits
until no thread of the target is in a ptrace stop (the whole-process pause is ``attach_s``, ~0.1–0.2 s even
with torch loaded), then ``leaktrace-begin``: the catchpoint, and ``interrupt -a`` so that each thread is
resumed once more, now under syscall tracing. The one byte gdb
itself writes while attached is its dynamic-linker event breakpoint in ld.so (it tracks dlopen); detach
removes it, and tests check every end path leaves the target's code identical to its files.

Output: JSON lines appended to config["out"], one object per line:
    {"type": "attached", "pid", "t_mono", "attach_s", "symbols_s", "threads", "python": status,
     "state_before"}
    {"type": "sample", "pid", "tid", "t_mono", "syscall", "nr", "addr", "length", "old_addr",
     "old_length", "result", "error", "stop_us", "frames": [{"pc", "library", "path", "symbol", "offset",
     "file_offset", "python"?}, ...], "python_stack": ["file:function:line", ...], "python_us"}
    {"type": "end", "pid", "t_mono", "reason", "stops", "samples", "paused_s", "handler_s",
     "state_after", "sigcont"}
``t_mono`` is CLOCK_MONOTONIC seconds (the same clock as the driver's time.monotonic()).

Python frames: while the thread is stopped, its Python stack is read from the interpreter's memory
(leaktrace/pyframes.py, loaded by path: thread state by native thread id → frame chain → code objects; the
driver gives ``_PyRuntime``'s address and the structure offsets in config["python_frames"]), through gdb's
own reader of the inferior's memory: no code runs in the target, no debug info of the interpreter is needed,
and the thread is stopped anyway (``python_us``: the read's share of ``stop_us``). Without that config (not
Python, a version it does not read), the interpreter's gdb extension names the Python frames of each
_PyEval_EvalFrameDefault frame when its debug info was read (``python`` in the frames).

Never harm the target: a pause budget (stopped time as a fraction of elapsed time, and stops per
second) ends sampling; every end path detaches; if gdb is about to exit while still attached (the
driver died and gdb saw EOF on stdin), it detaches first. After detaching, a target that ended up
stopped (state T, no tracer) although it was running before is sent SIGCONT.
"""

import bisect
import collections
import importlib.util
import json
import os
import re
import signal
import time

import gdb

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = os.path.join(HERE, "sampler_settings.gdb")

ENOSYS = 38
SYSCALL_NAMES = {9: "mmap", 11: "munmap", 25: "mremap"}  # x86-64 numbers
ADDRESS_SYMBOL = re.compile(r"<(?P<sym>.+?)(?:\+(?P<off>\d+))?>")
EVAL_FRAME = "_PyEval_EvalFrameDefault"


def proc_state(pid):
    """(state letter, tracer pid) from /proc, or (None, None) when the process is gone."""
    try:
        # surrogateescape: a process name need not be UTF-8 (a multi-byte name cut at 15 bytes).
        with open(f"/proc/{pid}/stat", errors="surrogateescape") as f:
            stat = f.read()
        state = stat[stat.rindex(")") + 2]
        tracer = 0
        with open(f"/proc/{pid}/status", errors="surrogateescape") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    tracer = int(line.split()[1])
        return state, tracer
    except (OSError, ValueError):
        return None, None


class LibraryRanges:
    """pc -> mapped file, from /proc/PID/maps (works for stripped libraries and the executable alike), and
    whether a pc lies in executable memory at all. Re-read when a pc falls outside every known range (a
    library dlopen()ed since), at most twice a second."""

    def __init__(self, pid):
        self.pid = pid
        self.starts = []
        self.entries = []
        self.read_at = 0.0
        self.refresh()

    def refresh(self):
        entries = []
        try:
            with open(f"/proc/{self.pid}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) < 5:
                        continue
                    path = parts[5].strip() if len(parts) > 5 else ""
                    executable = "x" in parts[1]
                    if path.startswith("[") and path != "[vdso]":
                        path = ""
                    if not path and not executable:
                        continue  # data nobody names: only code there (JIT) matters to a backtrace
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    entries.append((lo, hi, int(parts[2], 16), path, executable))
        except OSError:
            return
        entries.sort()
        self.entries = entries
        self.starts = [e[0] for e in entries]
        self.read_at = time.monotonic()

    def lookup(self, pc):
        """(path, offset in the file) of a pc in a mapped file, else None."""
        hit = self._entry(pc)
        return (hit[3], pc - hit[0] + hit[2]) if hit is not None and hit[3] else None

    def is_code(self, pc):
        hit = self._entry(pc)
        return hit is not None and hit[4]

    def _entry(self, pc):
        hit = self._find(pc)
        if hit is None and time.monotonic() - self.read_at > 0.5:
            self.refresh()
            hit = self._find(pc)
        return hit

    def _find(self, pc):
        i = bisect.bisect_right(self.starts, pc) - 1
        if i >= 0 and pc < self.entries[i][1]:
            return self.entries[i]
        return None


class PythonFrames:
    """Python-level frames for _PyEval_EvalFrameDefault frames, via the interpreter's own gdb
    extension (python3.X-gdb.py, shipped next to pyenv builds or by Debian's python3.X-dbg)."""

    def __init__(self):
        self.libpython = None
        self.status = "n/a: not a Python process"
        self.fast = False
        self.fast_failures = 0
        self.entry_field = ""
        self.codes = {}
        self.lines = {}

    def load(self):
        interpreters = [o.filename for o in gdb.objfiles()
                        if o.filename and re.search(r"(^|/)(lib)?python3[.\d]*[dmu]*(\.so[.\d]*)?$", o.filename)]
        if not interpreters:
            return
        tried = []
        for objfile in interpreters:
            real = os.path.realpath(objfile)
            for candidate in (real + "-gdb.py", "/usr/share/gdb/auto-load" + real + "-gdb.py",
                              objfile + "-gdb.py"):
                tried.append(candidate)
                if not os.path.isfile(candidate):
                    continue
                namespace = {"__name__": "leaktrace_libpython", "__file__": candidate}
                try:
                    with open(candidate) as f:
                        exec(compile(f.read(), candidate, "exec"), namespace)  # noqa: S102 - the interpreter's own extension
                    gdb.lookup_type("PyObject")
                except gdb.error:
                    self.status = (f"unavailable: {os.path.basename(real)} has no debug info "
                                   f"(extension {candidate} needs it)")
                    return
                except Exception as e:  # noqa: BLE001 - a broken extension must not stop sampling
                    self.status = f"unavailable: loading {candidate} failed: {e.__class__.__name__}: {e}"
                    return
                self.libpython = namespace
                self.status = f"ok: {candidate}"
                self._prepare_fast_path()
                return
        self.status = ("unavailable: no gdb extension for " + ", ".join(interpreters)
                       + " (looked for " + ", ".join(tried[:3]) + "; install python3.X-dbg)")

    def _prepare_fast_path(self):
        """Use the cached walk when the interpreter frame has the fields it reads (3.11, 3.12). Looking
        the types up here also expands their debug info now, while the target runs, instead of at the
        first sample with the thread stopped."""
        try:
            fields = {f.name for f in gdb.lookup_type("_PyInterpreterFrame").fields()}
            code_fields = {f.name for f in gdb.lookup_type("PyCodeObject").fields()}
            gdb.lookup_symbol(EVAL_FRAME)
        except (gdb.error, RuntimeError):
            return
        if {"f_code", "prev_instr", "previous"} <= fields and "co_code_adaptive" in code_fields:
            self.entry_field = "is_entry" if "is_entry" in fields else ("owner" if "owner" in fields else "")
            self.fast = bool(self.entry_field)

    def frames_of(self, gdb_frame):
        """Python frames run by this C frame, innermost first; None when it is not an eval frame."""
        if self.libpython is None or gdb_frame.name() != EVAL_FRAME:
            return None
        if self.fast:
            try:
                return self._frames_fast(gdb_frame)
            except Exception:  # noqa: BLE001 - an unusual frame or layout: the extension's own walk
                self.fast_failures += 1
                self.fast = self.fast_failures < 20
        return self._frames_generic(gdb_frame)

    def _frames_fast(self, gdb_frame):
        """The 3.11/3.12 _PyInterpreterFrame walk with names and line numbers cached per code object
        and bytecode offset: ~10x cheaper per stop than the extension's PyFramePtr, which re-reads
        every code object's fields on each frame."""
        out = []
        iframe = gdb_frame.read_var("frame")
        if iframe.is_optimized_out:  # as the extension does: the thread state's current frame
            iframe = gdb_frame.read_var("cframe")["current_frame"]
        while int(iframe) != 0 and len(out) < 64:
            code = iframe["f_code"]
            key = int(code)
            info = self.codes.get(key)
            if info is None:
                co = self.libpython["PyCodeObjectPtr"].from_pyobject_ptr(code)
                first = int(code["co_code_adaptive"].address)
                info = (co.pyop_field("co_name").proxyval(set()), co.pyop_field("co_filename").proxyval(set()),
                        first, co)
                if len(self.codes) < 50_000:
                    self.codes[key] = info
            name, filename, first, co = info
            lasti = (int(iframe["prev_instr"]) - first) // 2  # in _Py_CODEUNITs, as the extension counts
            line = self.lines.get((key, lasti))
            if line is None:
                try:
                    line = co.addr2line(lasti)
                except Exception:  # noqa: BLE001 - the extension's own guard (bpo-34989)
                    line = None
                if len(self.lines) < 200_000:
                    self.lines[(key, lasti)] = line
            out.append({"func": name, "file": filename, "line": line})
            if "is_entry" in self.entry_field and bool(iframe["is_entry"]):
                break
            if self.entry_field == "owner" and int(iframe["owner"]) == 3:  # FRAME_OWNED_BY_CSTACK (3.12)
                break
            iframe = iframe["previous"]
        return out

    def _frames_generic(self, gdb_frame):
        out = []
        try:
            pyframe = self.libpython["Frame"](gdb_frame).get_pyop()
            while pyframe is not None and len(out) < 64:
                if pyframe.is_optimized_out():
                    out.append({"func": None, "file": None, "line": None})
                    break
                out.append({"func": pyframe.co_name.proxyval(set()), "file": pyframe.filename(),
                            "line": pyframe.current_line_num()})
                if pyframe.is_entry():
                    break
                pyframe = pyframe.previous()
        except Exception as e:  # noqa: BLE001 - unreadable interpreter state: say so in the frame
            out.append({"error": f"{e.__class__.__name__}: {e}"[:200]})
        return out


class InferiorMemory:
    """read(addr, size) over gdb's reader of the inferior's memory (what leaktrace.pyframes reads through)."""

    def __init__(self, inferior):
        self.inferior = inferior

    def read(self, addr, size):
        try:
            return bytes(self.inferior.read_memory(addr, size))
        except (gdb.MemoryError, gdb.error, ValueError, OverflowError):
            return None


def load_python_stacks(config):
    """(PythonStacks reader or None, status) from config["python_frames"] (see the module docstring)."""
    if not config:
        return None, ""
    if config.get("error"):
        return None, config["error"]
    try:
        spec = importlib.util.spec_from_file_location("leaktrace_pyframes", config["module"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        reader = module.PythonStacks(InferiorMemory(gdb.selected_inferior()), int(config["runtime"]),
                                     config["version"], {k: int(v) for k, v in config["offsets"].items()})
    except Exception as e:  # noqa: BLE001 - no Python frames must not stop the native sampling
        return None, f"unavailable: loading {config.get('module')} failed: {e.__class__.__name__}: {e}"[:300]
    return reader, f"ok: Python {config['version']} frames from memory ({config.get('source', '?')})"


class Sampler:
    def __init__(self, config):
        self.config = config
        self.pid = int(config["pid"])
        self.max_samples = int(config.get("max_samples") or 0)  # 0: no limit (time and budget only)
        self.max_seconds = float(config.get("max_seconds") or 0)
        self.pause_fraction = float(config.get("pause_fraction", 0.01))
        self.budget_floor_s = float(config.get("budget_floor_s", 30.0))
        self.max_stops_per_s = float(config.get("max_stops_per_s", 100.0))
        self.per_stop_overhead_s = float(config.get("per_stop_overhead_us", 150.0)) / 1e6
        self.max_frames = int(config.get("max_frames", 64))
        self.stacks_on_munmap = bool(config.get("stacks_on_munmap", True))
        site = config.get("site") or {}
        self.site = int(site.get("address") or 0)  # nonzero: sample at this call site, not at the syscalls
        self.site_label = str(site.get("label") or "mmap")
        self.out = open(config["out"], "a", buffering=1)  # noqa: SIM115 - lives as long as the sampling
        self.libs = None
        self.symbols = {}
        self.symbols_s = 0.0
        self.python = PythonFrames()
        self.python_stacks = None  # leaktrace.pyframes.PythonStacks once attached (begin)
        self.python_errors = 0
        self.catchpoint = None
        self.active = False
        self.ending = None
        self.ended = False
        self.stops = 0
        self.samples = 0
        self.paused_s = 0.0
        self.handler_s = 0.0
        self.recent_stops = collections.deque()
        self.in_syscall = set()  # tids stopped at a caught syscall's entry, whose exit stop comes next
        self.t_start = 0.0
        self.t_attach = 0.0
        self.state_before = None

    # -- output
    def emit(self, record):
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")

    # -- lifecycle
    def start(self):
        """First half of the attach (``leaktrace-sample``): attach and let every thread run again. The
        driver then waits, with gdb back in its event loop, until no thread of the target is in a ptrace
        stop, and calls begin() (``leaktrace-begin``)."""
        self.state_before, tracer = proc_state(self.pid)
        if self.state_before is None:
            raise gdb.GdbError(f"leaktrace: no such process {self.pid}")
        if tracer:
            raise gdb.GdbError(f"leaktrace: process {self.pid} is already traced by pid {tracer}")
        gdb.execute("source " + SETTINGS, to_string=True)
        # In non-stop mode `attach` returns once the main thread has stopped; the other threads' attach
        # stops reach gdb later, from its event loop, and each such thread stays stopped (non-stop) until
        # something resumes it: `continue -a &` only resumes the threads already seen stopped. Until the
        # sampling handler exists, this one resumes them as they come; the event loop runs between the
        # two commands. (Read within this command, the shared-library symbols would keep a 48-thread torch
        # process stopped for the whole read: seconds, 20 s in a loaded vLLM worker.)
        gdb.events.stop.connect(self.on_attach_stop)
        gdb.events.gdb_exiting.connect(self.on_gdb_exiting)  # detach first, whenever gdb exits
        self.t_attach = time.monotonic()
        gdb.execute(f"attach {self.pid}", to_string=True)
        gdb.execute("continue -a &", to_string=True)
        arch = gdb.selected_inferior().architecture().name()
        if arch != "i386:x86-64":  # registers read below follow the x86-64 syscall ABI
            raise gdb.GdbError(f"leaktrace: the sampler supports x86-64 targets only, not {arch}")

    def on_attach_stop(self, event):
        """A thread's attach stop, seen after `continue -a &`: resume it (no sampling yet)."""
        thread = getattr(event, "inferior_thread", None) or gdb.selected_thread()
        if thread is None or not thread.is_valid() or thread.inferior.pid != self.pid or self.ended:
            return
        try:
            if gdb.selected_thread() != thread:
                thread.switch()
            gdb.execute("continue &", to_string=True)
        except gdb.error as e:
            self.end_soon(f"resume failed: {e}")

    def begin(self):
        """Second half (``leaktrace-begin``): the symbols, read while the target runs, then sampling."""
        if self.ended:
            raise gdb.GdbError("leaktrace: the sampler already ended")
        # The whole process was stopped (threads in turn) from the attach until now at most: that
        # one-off cost is reported as attach_s and kept out of the per-stop budget (it would eat a short
        # budget alone).
        attach_s = time.monotonic() - self.t_attach
        self.symbols_s = SYMBOLS_READ["s"]
        self.libs = LibraryRanges(self.pid)
        self.python_stacks, status = load_python_stacks(self.config.get("python_frames"))
        if self.python_stacks is None:
            self.python.load()
            if status and not self.python.status.startswith("ok"):
                self.python.status = status
        else:
            self.python.status = status
        gdb.events.stop.disconnect(self.on_attach_stop)
        gdb.events.stop.connect(self.on_stop)
        gdb.events.exited.connect(self.on_exited)
        self.active = True
        if self.site:
            # Breakpoints stop threads running under PTRACE_CONT too: nothing to interrupt.
            self.catchpoint = self._break_at_site()
        else:
            self.catchpoint = self._catch_syscalls()
            # Threads resumed before the catchpoint existed run under PTRACE_CONT and would never stop
            # at a syscall: stop each once (on_stop resumes it at once, now with syscall tracing).
            gdb.execute("interrupt -a", to_string=True)
        self.t_start = time.monotonic()
        self.emit({"type": "attached", "pid": self.pid, "t_mono": self.t_start, "attach_s": attach_s,
                   "symbols_s": self.symbols_s, "threads": len(gdb.selected_inferior().threads()),
                   "python": self.python.status, "state_before": self.state_before})

    def _catch_syscalls(self):
        before = {b.number for b in gdb.breakpoints()}
        gdb.execute("catch syscall mmap munmap mremap", to_string=True)
        new = [b for b in gdb.breakpoints() if b.number not in before]
        for b in new:
            b.silent = True  # no stop banner on MI for every syscall
        return new[0] if new else None

    def _break_at_site(self):
        bp = gdb.Breakpoint(f"*{self.site:#x}", internal=True)
        bp.silent = True
        return bp

    def finish(self, reason):
        """Detach and write the end record. Safe to call more than once and from any gdb event."""
        if self.ended:
            return
        self.ended = True
        self.active = False
        for event, handler in ((gdb.events.stop, self.on_stop), (gdb.events.stop, self.on_attach_stop),
                               (gdb.events.exited, self.on_exited)):
            try:
                event.disconnect(handler)
            except Exception:  # noqa: BLE001
                pass
        try:
            if self.catchpoint is not None and self.catchpoint.is_valid():
                self.catchpoint.delete()
        except gdb.error:
            pass
        try:
            if gdb.selected_inferior().pid:
                gdb.execute("detach", to_string=True)
        except gdb.error as e:
            reason += f" (detach: {e})"
        state, tracer = proc_state(self.pid)
        sigcont = False
        if state == "T" and not tracer and self.state_before not in ("T", "t"):
            # A stop left behind by the attach/detach dance (a SIGSTOP delivered after detach): undo it.
            try:
                os.kill(self.pid, signal.SIGCONT)
                sigcont = True
            except OSError:
                pass
            state, tracer = proc_state(self.pid)
        self.emit({"type": "end", "pid": self.pid, "t_mono": time.monotonic(), "reason": reason,
                   "stops": self.stops, "samples": self.samples, "paused_s": self.paused_s,
                   "handler_s": self.handler_s, "state_after": state, "sigcont": sigcont})
        self.out.close()

    def end_soon(self, reason):
        """Ask for the end from inside a stop handler: detaching there is not safe, so it runs as a
        posted event right after the handler returns."""
        if self.ending is None:
            self.ending = reason
            gdb.post_event(lambda: self.finish(reason))

    # -- events
    def on_exited(self, event):
        self.end_soon("target exited")

    def on_gdb_exiting(self, event):
        if not self.ended:
            self.finish(self.ending or "gdb exiting (driver gone)")

    def on_stop(self, event):
        if not self.active:
            return
        t0 = time.perf_counter()
        thread = getattr(event, "inferior_thread", None) or gdb.selected_thread()
        if thread is None or not thread.is_valid():
            return
        if thread.inferior.pid != self.pid:
            return
        try:
            if gdb.selected_thread() != thread:
                thread.switch()
            ours = isinstance(event, gdb.BreakpointEvent) and self.catchpoint in event.breakpoints
            tid = thread.ptid[1]
            if ours and self.site:
                if self.ending is None:
                    self.record_at_site(thread, gdb.newest_frame(), t0)
            elif ours and tid not in self.in_syscall:
                # A thread's caught stops alternate entry, exit: at an entry there is nothing to read,
                # and building a frame (registers, unwinder) would cost more than the rest of the stop.
                self.in_syscall.add(tid)
            elif ours:
                self.in_syscall.discard(tid)
                frame = gdb.newest_frame()
                result = int(frame.read_register("rax"))
                if result == -ENOSYS:  # an entry after all (first stop was an exit): back in step
                    self.in_syscall.add(tid)
                elif self.ending is None:
                    self.record(thread, frame, result, t0)
        except Exception as e:  # noqa: BLE001 - whatever failed, the thread must be resumed below
            self.end_soon(f"sampler error: {e.__class__.__name__}: {e}"[:300])
        finally:
            try:
                gdb.execute("continue &", to_string=True)
            except gdb.error as e:
                self.end_soon(f"resume failed: {e}")
        spent = time.perf_counter() - t0
        self.stops += 1
        self.handler_s += spent
        self.paused_s += spent + self.per_stop_overhead_s
        self.check_budget()

    def check_budget(self):
        now = time.monotonic()
        elapsed = now - self.t_start
        allowed = self.pause_fraction * max(elapsed, self.budget_floor_s)
        self.recent_stops.append(now)
        while self.recent_stops and self.recent_stops[0] < now - 1.0:
            self.recent_stops.popleft()
        if self.max_samples and self.samples >= self.max_samples:
            self.end_soon("samples")
        elif self.max_seconds and elapsed >= self.max_seconds:
            self.end_soon("time")
        elif self.paused_s > allowed:
            self.end_soon(f"budget: paused {self.paused_s * 1000:.1f} ms > {self.pause_fraction:.1%} "
                          f"of {max(elapsed, self.budget_floor_s):.1f} s")
        elif len(self.recent_stops) > self.max_stops_per_s:
            self.end_soon(f"budget: more than {self.max_stops_per_s:.0f} stops/s")

    # -- one sample
    def record(self, thread, frame, result, t0):
        nr = int(frame.read_register("orig_rax"))
        syscall = SYSCALL_NAMES.get(nr, str(nr))
        arg0 = int(frame.read_register("rdi")) & 0xFFFFFFFFFFFFFFFF
        arg1 = int(frame.read_register("rsi")) & 0xFFFFFFFFFFFFFFFF
        arg2 = int(frame.read_register("rdx")) & 0xFFFFFFFFFFFFFFFF
        error = -result if -4096 < result < 0 else 0
        sample = {"type": "sample", "pid": self.pid, "tid": thread.ptid[1], "t_mono": time.monotonic(),
                  "syscall": syscall, "nr": nr, "result": result & 0xFFFFFFFFFFFFFFFF, "error": error,
                  "addr": None, "length": None, "old_addr": None, "old_length": None}
        if syscall == "mmap":
            sample.update(addr=None if error else result, length=arg1)
        elif syscall == "mremap":
            sample.update(addr=None if error else result, length=arg2, old_addr=arg0, old_length=arg1)
        else:  # munmap: what went away
            sample.update(addr=arg0, length=arg1)
        if syscall != "munmap" or self.stacks_on_munmap:
            sample["frames"] = self.backtrace(frame)
            sample["python_stack"], sample["python_us"] = self.python_stack(thread)
        else:
            sample["frames"] = []
        sample["stop_us"] = (time.perf_counter() - t0) * 1e6
        self.emit(sample)
        if syscall != "munmap":
            self.samples += 1

    def record_at_site(self, thread, frame, t0):
        """A thread back at the call site: the call's result (rax) and the stack from the site out."""
        result = int(frame.read_register("rax")) & 0xFFFFFFFFFFFFFFFF
        signed = result - (1 << 64) if result >= 1 << 63 else result
        error = -signed if -4096 < signed < 0 else 0
        frames = self.backtrace(frame, innermost_is_return=True)
        python_stack, python_us = self.python_stack(thread)
        self.emit({"type": "sample", "pid": self.pid, "tid": thread.ptid[1], "t_mono": time.monotonic(),
                   "syscall": self.site_label, "nr": -1, "result": result, "error": error,
                   "addr": None if error else result, "length": None, "old_addr": None, "old_length": None,
                   "site": self.site, "frames": frames, "python_stack": python_stack, "python_us": python_us,
                   "stop_us": (time.perf_counter() - t0) * 1e6})
        self.samples += 1

    def python_stack(self, thread):
        """(the stopped thread's Python stack, µs its read took) from the interpreter's memory."""
        if self.python_stacks is None:
            return [], 0.0
        t0 = time.perf_counter()
        try:
            # CPython 3.10 matches its thread states on pthread_t: the thread's fs base
            ident = 0 if "ts_native_tid" in self.python_stacks.o else \
                int(gdb.newest_frame().read_register("fs_base")) & 0xFFFFFFFFFFFFFFFF
            stack = self.python_stacks.stack(thread.ptid[1], ident)
        except Exception:  # noqa: BLE001 - an unreadable interpreter state: no Python frames for this one
            self.python_errors += 1
            stack = []
        return stack, (time.perf_counter() - t0) * 1e6

    def symbol_at(self, pc):
        """(symbol, offset) of a code address, cached: the same call sites repeat in every stack."""
        hit = self.symbols.get(pc)
        if hit is None:
            try:
                # an unwind that ran off the end gives pc 0, looked up at -1 (OverflowError)
                m = ADDRESS_SYMBOL.search(gdb.format_address(pc)) if pc > 0 else None
            except (gdb.error, RuntimeError, ValueError, OverflowError):
                m = None
            hit = (m.group("sym"), int(m.group("off") or 0)) if m else (None, None)
            if len(self.symbols) < 100_000:
                self.symbols[pc] = hit
        return hit

    def backtrace(self, frame, innermost_is_return=False):
        frames = []
        level = 0
        # At a call site the innermost pc is itself a return address (the call's last byte is before it).
        pc_is_return_address = innermost_is_return
        while frame is not None and level < self.max_frames:
            pc = frame.pc()
            if not self.libs.is_code(pc):
                # Not a code address (0, a small integer, a stack or heap address): the unwinder ran off
                # the end or guessed through a frame it had no unwind information for (libffi's call
                # trampoline); nothing it finds above is a frame a call reached.
                break
            # Above the innermost frame pc is usually a return address: look the symbol up at pc-1,
            # still inside the calling function even when the call was its last instruction. Not so
            # above an inlined frame (same pc) or a signal trampoline.
            lookup_pc = pc - 1 if pc_is_return_address else pc
            frame_type = frame.type()
            pc_is_return_address = frame_type not in (gdb.INLINE_FRAME, gdb.SIGTRAMP_FRAME)
            hit = self.libs.lookup(pc)
            path, file_offset = hit if hit else (None, None)
            name = frame.name()
            symbol, offset = self.symbol_at(lookup_pc)
            if offset is not None:
                offset += pc - lookup_pc
            if name and name != symbol:  # an inlined function: gdb's frame name is the precise one
                symbol, offset = name, None
            entry = {"pc": pc, "library": os.path.basename(path) if path else None, "path": path,
                     "symbol": symbol, "offset": offset, "file_offset": file_offset}
            if frame_type == gdb.INLINE_FRAME:
                entry["inline"] = True
            py = self.python.frames_of(frame)
            if py is not None:
                entry["python"] = py
            frames.append(entry)
            level += 1
            try:
                frame = frame.older()
            except gdb.error:
                break
        return frames


SYMBOLS_READ = {"s": 0.0}  # seconds leaktrace-symbols took (reported with the attach)


def _quoted(path):
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SymbolsCommand(gdb.Command):
    """leaktrace-symbols CONFIG.json: before the attach, read the symbols of config["symbol_files"]
    ([path, load bias] pairs) while the target runs untouched (see the module docstring)."""

    def __init__(self):
        super().__init__("leaktrace-symbols", gdb.COMMAND_USER)

    def invoke(self, argument, from_tty):
        with open(argument.strip()) as f:
            config = json.load(f)
        gdb.execute("source " + SETTINGS, to_string=True)
        t0 = time.monotonic()
        for path, bias in config.get("symbol_files") or []:
            try:
                gdb.execute(f"add-symbol-file {_quoted(path)} -o {int(bias):#x}", to_string=True)
            except gdb.error:
                pass  # unreadable or not ELF: its frames keep their library and offset
        SYMBOLS_READ["s"] = time.monotonic() - t0


class SampleCommand(gdb.Command):
    """leaktrace-sample CONFIG.json: attach and sample in the background (see the module docstring)."""

    def __init__(self):
        super().__init__("leaktrace-sample", gdb.COMMAND_USER)
        self.sampler = None

    def invoke(self, argument, from_tty):
        with open(argument.strip()) as f:
            config = json.load(f)
        if self.sampler is not None and not self.sampler.ended:
            raise gdb.GdbError("leaktrace: already sampling")
        self.sampler = Sampler(config)
        try:
            self.sampler.start()
        except gdb.error as e:
            self.sampler.finish(f"attach failed: {e}")
            raise gdb.GdbError(f"leaktrace: attach failed: {e}") from None


class BeginCommand(gdb.Command):
    """leaktrace-begin: start sampling (after leaktrace-sample, once the target runs)."""

    def __init__(self, sample_command):
        super().__init__("leaktrace-begin", gdb.COMMAND_USER)
        self.sample_command = sample_command

    def invoke(self, argument, from_tty):
        sampler = self.sample_command.sampler
        if sampler is None:
            raise gdb.GdbError("leaktrace: leaktrace-sample first")
        try:
            sampler.begin()
        except gdb.error as e:
            sampler.finish(f"attach failed: {e}")
            raise gdb.GdbError(f"leaktrace: attach failed: {e}") from None


class StopCommand(gdb.Command):
    """leaktrace-stop [REASON]: detach now."""

    def __init__(self, sample_command):
        super().__init__("leaktrace-stop", gdb.COMMAND_USER)
        self.sample_command = sample_command

    def invoke(self, argument, from_tty):
        sampler = self.sample_command.sampler
        if sampler is not None:
            sampler.finish(argument.strip() or "stopped")


SymbolsCommand()
_sample_command = SampleCommand()
BeginCommand(_sample_command)
StopCommand(_sample_command)

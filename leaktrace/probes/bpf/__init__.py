"""The eBPF probe family: every mmap/munmap/mremap/brk of the target tree, an exact outstanding ledger.

- :mod:`.loader` — finding Debian's BCC, the kernel headers (or the stub tree), compiling and loading
  the program; the PID namespace.
- :mod:`.checks` — ``leaktrace doctor``'s eBPF checks.
- :mod:`.btf` — kernel struct member offsets from the kernel's BTF, for the program's compile-time knobs.
- :mod:`.layout` — the Python mirror of bpf/leaktrace.h (event types, counters, ctypes structs).
- :mod:`.addrspace` — one process's address space: disjoint intervals and their interned origins.
- :mod:`.ledger` — the user-space ledger (:class:`OutstandingLedger`: the syscalls applied to address
  spaces).
- :mod:`.symbolizer` — addresses to ``library!symbol+off`` from kept copies of /proc/PID/maps
  (:class:`Symbolizer`).
- :mod:`.origins` — where a mapping comes from: an event's or a kernel region's own origin, and a heap
  growth's caller found in its stack window.
- :mod:`.stackscan` — return addresses found in a window of raw user stack (no frame pointers needed).
- :mod:`.procread` — the /proc reads the probe makes, shaped for the ledger.
- :mod:`.sysvshm` — the size of a SysV segment a target attached.
- :mod:`.kernel` — the loaded program, its ring and the maps user space writes; the kernel's region map
  seen from user space: scanned per tick, absorbed into the ledger when a slow-path event touches it.
- :mod:`.hookpaths` — the paths through memory hooks (UCX's libucm), learned and written to the kernel's maps.
- :mod:`.hookframes` — where a memory hook's callers sit on the stack: the offsets the kernel half reads.
- :mod:`.faults` — who touches memory: the kernel's write-fault counts, named.
- :mod:`.snapshots` — the session tables the probe writes (per tick, per event, at stop), and the library
  each call site names.
- :mod:`.probe` — :class:`BpfProbe`, the hunt's probe: owns the objects above; lifecycle, the ring's
  events applied in order to the ledger.

The C sources stay in the top-level bpf/ (found through leaktrace/resources.py). Nothing is imported
here: importers name the module they use.
"""

"""outstanding.pb.gz: the outstanding memory as a gzipped pprof profile (``go tool pprof``, Pyroscope, Parca,
speedscope read it).

Sample types: ``inuse_space`` (bytes still mapped at the end of the hunt), ``inuse_objects`` (regions) and
``growth_space_per_minute`` (bytes a minute: a culprit's rate shared among its call stacks by their bytes;
0 on stacks no culprit holds). One sample per (process, call stack, library, kind) of the eBPF ledger, labelled
with pid, process, role, instance, library and kind; frames are the ledger's ``library!function+0xoff``, each
with a Mapping naming its library file; a culprit's Python frames (``path/file.py:function:line``) sit above the
native frames of its growing call site as functions with their file name and line. Without the ledger, the culprits' stacks are the samples, and without
those the watcher's growth by process and memory class (as ``outstanding.folded``); the profile's comments
say which.

The message layout is written here from the public description of pprof's profile.proto (package
``perftools.profiles``) and built with the protobuf library at run time: no generated code, no protoc.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leaktrace.atomic import atomic_write_bytes
from leaktrace.report.stacks import Site, process_names, sites

if TYPE_CHECKING:
    from leaktrace.analysis.figures import Figures

_I64, _U64, _BOOL, _STR, _MSG = 3, 4, 8, 9, 11  # FieldDescriptorProto.Type
# message -> [(field, number, type, repeated, message type)], from profile.proto.
_LAYOUT: dict[str, list[tuple[str, int, int, bool, str | None]]] = {
    "Profile": [("sample_type", 1, _MSG, True, "ValueType"), ("sample", 2, _MSG, True, "Sample"),
                ("mapping", 3, _MSG, True, "Mapping"), ("location", 4, _MSG, True, "Location"),
                ("function", 5, _MSG, True, "Function"), ("string_table", 6, _STR, True, None),
                ("drop_frames", 7, _I64, False, None), ("keep_frames", 8, _I64, False, None),
                ("time_nanos", 9, _I64, False, None), ("duration_nanos", 10, _I64, False, None),
                ("period_type", 11, _MSG, False, "ValueType"), ("period", 12, _I64, False, None),
                ("comment", 13, _I64, True, None), ("default_sample_type", 14, _I64, False, None)],
    "ValueType": [("type", 1, _I64, False, None), ("unit", 2, _I64, False, None)],
    "Sample": [("location_id", 1, _U64, True, None), ("value", 2, _I64, True, None),
               ("label", 3, _MSG, True, "Label")],
    "Label": [("key", 1, _I64, False, None), ("str", 2, _I64, False, None), ("num", 3, _I64, False, None),
              ("num_unit", 4, _I64, False, None)],
    "Mapping": [("id", 1, _U64, False, None), ("memory_start", 2, _U64, False, None),
                ("memory_limit", 3, _U64, False, None), ("file_offset", 4, _U64, False, None),
                ("filename", 5, _I64, False, None), ("build_id", 6, _I64, False, None),
                ("has_functions", 7, _BOOL, False, None), ("has_filenames", 8, _BOOL, False, None),
                ("has_line_numbers", 9, _BOOL, False, None), ("has_inline_frames", 10, _BOOL, False, None)],
    "Location": [("id", 1, _U64, False, None), ("mapping_id", 2, _U64, False, None),
                 ("address", 3, _U64, False, None), ("line", 4, _MSG, True, "Line"),
                 ("is_folded", 5, _BOOL, False, None)],
    "Line": [("function_id", 1, _U64, False, None), ("line", 2, _I64, False, None)],
    "Function": [("id", 1, _U64, False, None), ("name", 2, _I64, False, None),
                 ("system_name", 3, _I64, False, None), ("filename", 4, _I64, False, None),
                 ("start_line", 5, _I64, False, None)],
}
_PACKAGE = "perftools.profiles"

# The C library's system-call wrappers and malloc internals at the leaf of a stack: the pprof tool drops them
# (profile.drop_frames, as Go's heap profiles drop the runtime's allocator), so that the first frame of the
# code that asked for the memory is on top. The samples keep them for tools that ignore drop_frames.
DROP_FRAMES = (r"(libc\.so[.0-9]*|ld-linux[^!]*)!(syscall|__?mmap(64)?|__?munmap|__?mremap|__?mprotect|__?brk|"
               r"__?sbrk|shmat|__libc_malloc|malloc|_int_malloc|sysmalloc|calloc|__libc_calloc|realloc|"
               r"__libc_realloc|_int_realloc|_?_?(posix_)?memalign|_mid_memalign|_int_memalign|aligned_alloc|"
               r"valloc|pvalloc|new_heap|alloc_new_heap|grow_heap|_int_new_arena|arena_get2(\.part\.0)?|"
               r"tcache_init(\.part\.0)?|malloc_consolidate)(\+0x[0-9a-f]+)?")

_LIBRARY = re.compile(r"^([^!\s()]+?)(?:!|\+0x[0-9a-f]+$| \(no stack\)$)")
_SOURCE = re.compile(r"^(.*?) \((.+):(\d+)\)$")  # python!main (/path/host.py:45)
_PYTHON = re.compile(r"^([^!]+):([^:!]+):(-?\d+)$")  # /path/host.py:main:45 (culprits[].python_stack)


@cache
def messages() -> dict[str, Any]:
    """The profile.proto message classes, built from a descriptor (protobuf's runtime, no generated code)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="leaktrace_pprof_profile.proto", package=_PACKAGE,
                                             syntax="proto3")
    for name, fields in _LAYOUT.items():
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, repeated, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=ftype,
                              label=3 if repeated else 1)  # LABEL_REPEATED, LABEL_OPTIONAL
            if type_name:
                f.type_name = f".{_PACKAGE}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    fd = pool.Add(fdp)
    make = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22; before: a factory's prototype
    if make is None:
        make = message_factory.MessageFactory(pool).GetPrototype
    return {name: make(fd.message_types_by_name[name]) for name in _LAYOUT}


@dataclass
class _Strings:
    table: list[str]
    index: dict[str, int]

    def __call__(self, s: str) -> int:
        if s not in self.index:
            self.index[s] = len(self.table)
            self.table.append(s)
        return self.index[s]


def library_of(frame: str) -> str | None:
    """The library file a ledger frame names (``libucm.so.0!ucm_mmap+0x62``, ``libffi.so.8+0x6f7a``)."""
    m = _LIBRARY.match(frame)
    return m.group(1) if m else None


def build_profile(report: Mapping[str, Any], figures: Figures | None = None) -> Any:
    """The Profile message of a report's outstanding memory by stack."""
    msgs = messages()
    prof = msgs["Profile"]()
    s = _Strings([""], {"": 0})
    for t in (("inuse_space", "bytes"), ("inuse_objects", "count"), ("growth_space_per_minute", "bytes")):
        prof.sample_type.add(type=s(t[0]), unit=s(t[1]))
    prof.default_sample_type = s("inuse_space")
    prof.period_type.type, prof.period_type.unit, prof.period = s("space"), s("bytes"), 1
    prof.drop_frames = s(DROP_FRAMES)
    start = figures.start_wall if figures is not None else None
    if start:
        prof.time_nanos = int(float(start) * 1e9)
    prof.duration_nanos = int(float(report.get("duration_s") or 0.0) * 1e9)
    found, source = sites(report, figures)
    what = {"ledger": "the eBPF ledger's outstanding mappings at the end of the hunt, by call stack",
            "culprits": "the culprits' stacks (no eBPF ledger in this session), sized by their outstanding bytes",
            "watcher-classes": "no stacks recorded (watcher only): growth during the hunt by process and "
                               "memory class"}[source]
    host = report.get("host") or {}
    for c in (f"leaktrace {host.get('leaktrace', '?')}: {what}",
              f"session {report.get('session_id', '?')} on {host.get('hostname', '?')}: verdict "
              f"{report.get('verdict', '?')}, {float(report.get('duration_s') or 0):.1f} s"):
        prof.comment.append(s(c))
    names = process_names(report)
    role, instance = _roles(report)
    mappings: dict[str, int] = {}
    functions: dict[str, int] = {}
    locations: dict[str, int] = {}

    def location(frame: str) -> int:
        if frame in locations:
            return locations[frame]
        m = _SOURCE.match(frame)
        py = None if m else _PYTHON.match(frame)
        if m:
            name, path, line = m.group(1), m.group(2), int(m.group(3))
        elif py:  # a Python function: its name, file and line (no library mapping)
            name, path, line = py.group(2), py.group(1), int(py.group(3))
        else:
            name, path, line = frame, "", 0
        lib = library_of(name) if not py else None
        map_id = 0
        if lib:
            if lib not in mappings:
                mappings[lib] = len(mappings) + 1
                prof.mapping.add(id=mappings[lib], filename=s(lib), has_functions=True, has_filenames=bool(path),
                                 has_line_numbers=bool(path))
            map_id = mappings[lib]
        key = f"{name}\0{path}"
        if key not in functions:
            functions[key] = len(functions) + 1
            prof.function.add(id=functions[key], name=s(name), system_name=s(name), filename=s(path))
        locations[frame] = len(locations) + 1
        loc = prof.location.add(id=locations[frame], mapping_id=map_id)
        loc.line.add(function_id=functions[key], line=line)
        return locations[frame]

    # pprof takes the first mapping as the profile's main file: the top culprit's library.
    for frame in sorted((f for x in found for f in x.frames), key=lambda f: _culprit_rank(report, f)):
        if _culprit_rank(report, frame) < len(report.get("culprits", [])):
            location(frame)
    for site in found:
        sample = prof.sample.add()
        sample.location_id.extend(location(f) for f in reversed(site.frames))  # leaf first
        sample.value.extend([site.bytes, site.regions or 0, round(site.growth_per_min)])
        _labels(sample, s, site, names, role, instance)
    prof.string_table.extend(s.table)
    return prof


def _culprit_rank(report: Mapping[str, Any], frame: str) -> int:
    """The rank of the first culprit whose library the frame names (the number of culprits when none)."""
    lib = library_of(frame)
    libs = [c.get("library") for c in report.get("culprits", [])]
    return libs.index(lib) if lib and lib in libs else len(libs)


def _roles(report: Mapping[str, Any]) -> tuple[dict[int, str], dict[int, int]]:
    """pid -> P/D role and pid -> vLLM instance, from the report's processes and instances."""
    instance = {int(p["pid"]): int(p["instance"]) for p in report.get("processes", [])
                if p.get("instance") is not None}
    role_of = {i.get("instance"): i.get("role") for i in report.get("instances") or [] if isinstance(i, dict)}
    role = {pid: str(role_of[i]) for pid, i in instance.items() if role_of.get(i)}
    for c in report.get("culprits", []):
        if c.get("role") and c.get("pid") is not None:
            role.setdefault(int(c["pid"]), str(c["role"]))
    return role, instance


def _labels(sample: Any, s: _Strings, site: Site, names: dict[int, str], role: dict[int, str],
            instance: dict[int, int]) -> None:
    if site.pid is None:
        return
    sample.label.add(key=s("pid"), num=site.pid)
    sample.label.add(key=s("process"), str=s(names.get(site.pid, f"pid {site.pid}")))
    if site.pid in role:
        sample.label.add(key=s("role"), str=s(role[site.pid]))
    if site.pid in instance:
        sample.label.add(key=s("instance"), num=instance[site.pid])
    if site.library:
        sample.label.add(key=s("library"), str=s(site.library))
    if site.kind:
        sample.label.add(key=s("kind"), str=s(site.kind))


def render(report: Mapping[str, Any], figures: Figures | None = None) -> bytes:
    """The gzipped profile (mtime 0: the same report gives the same bytes)."""
    return gzip.compress(build_profile(report, figures).SerializeToString(deterministic=True), mtime=0)


class PprofReporter:
    name = "pprof"
    filename = "outstanding.pb.gz"

    def write(self, doc: Mapping[str, Any], out_dir: Path, figures: Figures | None = None) -> Path:
        return atomic_write_bytes(Path(out_dir) / self.filename, render(doc, figures))


REPORTER = PprofReporter()

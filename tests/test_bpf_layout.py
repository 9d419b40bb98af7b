"""bpf/leaktrace.h against its Python mirror (leaktrace/probes/bpf/layout.py), checked by the C compiler.

A small C program includes the header and prints ``sizeof``/``offsetof`` of every struct and field the
ctypes classes declare (the list is generated from their ``_fields_``), the signedness of every scalar
field, and the value of every constant the mirror holds. A field, struct or constant added, moved or
resized on one side only fails here, before the kernel half and the ledger disagree on a live hunt.
"""

from __future__ import annotations

import ctypes as ct
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from leaktrace.probes.bpf import layout

BPF = Path(__file__).resolve().parent.parent / "bpf"
HEADER = BPF / "leaktrace.h"
PROGRAM = BPF / "leaktrace.bpf.c"

# The header is written for the kernel's types (linux/types.h, or BCC's vmlinux view); in user space the
# fixed-width C types have the same sizes and alignments on every target leaktrace runs on.
PRELUDE = """#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
typedef uint8_t __u8;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef uint64_t __u64;
typedef int64_t __s64;
"""

# Structs of the header that user space never reads or writes: a syscall's arguments between its entry and
# exit, and the key of the kernel's call-site cache.
KERNEL_ONLY_STRUCTS = {"lt_call", "lt_site_key"}
# Mirror fields named otherwise in C: WindowEvent inherits Event's `len`, so the window's is `win_len`.
C_FIELD_NAMES = {("WindowEvent", "win_len"): "len"}
# A mirror class deriving from another mirror class: the C struct embeds the base as this member.
C_EMBEDDED_BASE = {"WindowEvent": "ev"}
# Mirror constants whose C side is an expression, not an LT_ macro.
C_EXPRESSIONS = {"ANON_FD": "(__u32)-1"}  # lt_region.fd of an anonymous mapping
# Macros of the header the mirror has no use for (the kernel half's own knobs).
KERNEL_ONLY_MACROS = {"LT_SCAN_MEDIUM", "LT_SCAN_SMALL", "LT_NCOUNTERS"}
COUNTER_PREFIX = "LT_CNT_"


def _c_struct(cls: type) -> str:
    """``RegionKey`` -> ``lt_region_key``: the mirror's class names are the C names in CamelCase."""
    return "lt_" + re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def _mirrored() -> list[type]:
    return [v for v in vars(layout).values()
            if isinstance(v, type) and issubclass(v, ct.Structure) and v.__module__ == layout.__name__]


def _fields(cls: type) -> list[tuple[str, str, type]]:
    """(Python name, C member designator, ctypes type) of every field of ``cls``, its bases' included."""
    out: list[tuple[str, str, type]] = []
    base = cls.__bases__[0]
    if base is not ct.Structure:
        member = C_EMBEDDED_BASE[cls.__name__]
        out += [(name, f"{member}.{c}", t) for name, c, t in _fields(base)]
    for name, t in cls._fields_:
        out.append((name, C_FIELD_NAMES.get((cls.__name__, name), name), t))
    return out


def _header_macros(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#define\s+(LT_\w+)\s+(\S+)", text, re.M))


def _constants() -> dict[str, int]:
    """The mirror's integer constants (module-level UPPER_CASE names)."""
    return {k: v for k, v in vars(layout).items() if k.isupper() and isinstance(v, int) and not isinstance(v, bool)}


def _c_expression(name: str, known: set[str]) -> str:
    if name in C_EXPRESSIONS:
        return C_EXPRESSIONS[name]
    assert f"LT_{name}" in known, f"layout.{name} has no LT_{name} in {HEADER.name} or {PROGRAM.name}"
    return f"LT_{name}"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Every line ``KEY VALUE`` the generated program prints, compiled from the header with gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed (apt-get install gcc)")
    header_macros = _header_macros(HEADER.read_text())
    # Unconditional defines of the program itself (the mirror copies a few: MREMAP_DONTUNMAP); the knobs
    # under #ifndef are compile-time settings, not layout, and are left out.
    program_defines = [line for line in re.findall(r"^#define\s+LT_\w+\s+\S+.*$", PROGRAM.read_text(), re.M)
                       if _header_macros(line).keys().isdisjoint(header_macros)]
    known = set(header_macros) | set(_header_macros("\n".join(program_defines)))
    lines = []
    for cls in _mirrored():
        s = f"struct {_c_struct(cls)}"
        lines.append(f'printf("sizeof {cls.__name__} %zu\\n", sizeof({s}));')
        for name, member, t in _fields(cls):
            key = f"{cls.__name__}.{name}"
            lines.append(f'printf("offset {key} %zu\\n", offsetof({s}, {member}));')
            lines.append(f'printf("size {key} %zu\\n", sizeof((({s} *)0)->{member}));')
            if not issubclass(t, ct.Array):
                lines.append(f'printf("signed {key} %d\\n", (int)((__typeof__((({s} *)0)->{member}))-1 < 0));')
    for name in _constants():
        lines.append(f'printf("const {name} %lld\\n", (long long)({_c_expression(name, known)}));')
    for macro in header_macros:
        lines.append(f'printf("macro {macro} %lld\\n", (long long)({macro}));')
    src = (PRELUDE + f'#include "{HEADER.name}"\n' + "\n".join(program_defines)
           + "\nint main(void) {\n    " + "\n    ".join(lines) + "\n    return 0;\n}\n")
    tmp = tmp_path_factory.mktemp("layout")
    (tmp / "layout.c").write_text(src)
    cc = subprocess.run([gcc, "-std=gnu11", "-Wall", "-Werror", f"-I{BPF}", "-o", str(tmp / "layout"),
                         str(tmp / "layout.c")], capture_output=True, text=True)
    if cc.returncode != 0:  # a mirror field the header lacks: gcc names it ("has no member named ...")
        pytest.fail(f"the layout program ({tmp / 'layout.c'}) does not compile:\n{cc.stderr[-3000:]}")
    out = subprocess.run([str(tmp / "layout")], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.rsplit(" ", 1) for line in out.splitlines())}


def test_every_struct_of_the_header_is_mirrored_or_kernel_only():
    in_header = set(re.findall(r"^struct\s+(lt_\w+)\s*\{", HEADER.read_text(), re.M))
    mirrored = {_c_struct(c) for c in _mirrored()}
    assert mirrored - in_header == set(), "mirror classes without a struct in the header"
    assert in_header - mirrored - KERNEL_ONLY_STRUCTS == set(), "header structs without a mirror class"


@pytest.mark.parametrize("cls", _mirrored(), ids=lambda c: c.__name__)
def test_struct_layout_matches_the_header(compiled: dict[str, int], cls: type):
    assert ct.sizeof(cls) == compiled[f"sizeof {cls.__name__}"]
    py, c = {}, {}
    for name, _member, t in _fields(cls):
        key = f"{cls.__name__}.{name}"
        field = getattr(cls, name)
        py[name] = (field.offset, field.size, None if issubclass(t, ct.Array) else t(-1).value < 0)
        c[name] = (compiled[f"offset {key}"], compiled[f"size {key}"],
                   None if issubclass(t, ct.Array) else bool(compiled[f"signed {key}"]))
    assert py == c, "(offset, size, signed) per field: ctypes mirror vs the C header"


def test_constants_match_the_header(compiled: dict[str, int]):
    consts = _constants()
    assert consts, "no constants found in the mirror"
    assert consts == {k: compiled[f"const {k}"] for k in consts}


def test_every_event_type_and_exit_flag_is_mirrored(compiled: dict[str, int]):
    """The header's LT_EV_* and LT_EXIT_* all have a Python twin (the check above covers the other way),
    and every event type has a name."""
    macros = {k.removeprefix("macro "): v for k, v in compiled.items() if k.startswith("macro ")}
    for macro, value in macros.items():
        if macro.startswith(("LT_EV_", "LT_EXIT_")):
            assert getattr(layout, macro.removeprefix("LT_"), None) == value, macro
    events = {v for k, v in macros.items() if k.startswith("LT_EV_")}
    assert set(layout.EVENT_NAMES) == events


def test_counters_match_the_header(compiled: dict[str, int]):
    """COUNTERS[i] is the counter the header numbers i (names match by their C stem: LT_CNT_SLOW is
    slow_events), and there are LT_NCOUNTERS of them."""
    macros = {k.removeprefix("macro "): v for k, v in compiled.items() if k.startswith("macro ")}
    counters = {v: k.removeprefix(COUNTER_PREFIX).lower() for k, v in macros.items() if k.startswith(COUNTER_PREFIX)}
    assert len(layout.COUNTERS) == macros["LT_NCOUNTERS"] == len(counters)
    assert sorted(counters) == list(range(len(counters)))
    for i, name in enumerate(layout.COUNTERS):
        assert name.startswith(counters[i]), (i, name, counters[i])


def test_every_header_macro_is_mirrored_or_kernel_only(compiled: dict[str, int]):
    macros = {k.removeprefix("macro ") for k in compiled if k.startswith("macro ")}
    unmirrored = {m for m in macros if not m.startswith(COUNTER_PREFIX)
                  and m.removeprefix("LT_") not in _constants()} - KERNEL_ONLY_MACROS
    assert unmirrored == set(), "header macros with no Python twin: mirror them in layout.py or list them here"


def test_fault_sample_default_matches_the_program():
    """User space scales fault counts by the sampling the program was built with: the same default on both sides."""
    from leaktrace.probes.bpf.faults import DEFAULT_SAMPLE

    m = re.search(r"^#ifndef LT_FAULT_SAMPLE\n#define LT_FAULT_SAMPLE (\d+)$", PROGRAM.read_text(), re.M)
    assert m is not None and int(m.group(1)) == DEFAULT_SAMPLE

"""Pure parsers of /proc files (maps, smaps, smaps_rollup, status, stat, environ, cmdline): text or bytes
in, values out, no I/O — testable on recorded files (tests/data/proc)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------- maps

@dataclass(slots=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    dev: str
    inode: int
    path: str
    # Filled from smaps; zero when parsed from maps.
    rss: int = 0
    pss: int = 0
    private_clean: int = 0
    private_dirty: int = 0
    shared_clean: int = 0
    shared_dirty: int = 0
    anonymous: int = 0
    swap: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def uss(self) -> int:
        return self.private_clean + self.private_dirty


_MAPS_RE = re.compile(
    r"^([0-9a-fA-F]+)-([0-9a-fA-F]+)\s+([-rwxsp]{4})\s+([0-9a-fA-F]+)\s+"
    r"([0-9a-fA-F]+:[0-9a-fA-F]+)\s+(\d+)(?:\s(.*))?$"
)


class ParseError(ValueError):
    pass


def parse_maps_line(line: str) -> Mapping:
    m = _MAPS_RE.match(line.rstrip("\n"))
    if not m:
        raise ParseError(f"not a maps line: {line[:80]!r}")
    start, end = int(m.group(1), 16), int(m.group(2), 16)
    if end < start:
        raise ParseError(f"end before start: {line[:80]!r}")
    # The kernel pads the path column with spaces; the path itself may contain spaces.
    path = (m.group(7) or "").lstrip(" ")
    return Mapping(start, end, m.group(3), int(m.group(4), 16), m.group(5), int(m.group(6)), path)


def parse_maps(text: str) -> list[Mapping]:
    out: list[Mapping] = []
    # Only "\n" ends a line: file names may hold \r, \x0c, \x1e, \u2028… which str.splitlines()
    # would also split on (the kernel escapes nothing but "\n" in paths).
    for line in text.split("\n"):
        if line.strip():
            out.append(parse_maps_line(line))
    return out


# The inode column of each maps line, in one pass in C: a vLLM worker's 2,000 mappings parse to objects in ~35 ms
# of Python, their inodes come out of this in ~3.
_S = r"[^\S\n]"  # whitespace within a line (the maps lines are split on "\n" only)
_MAPS_INODE_RE = re.compile(rf"^[0-9a-fA-F]+-[0-9a-fA-F]+{_S}+[-rwxsp]{{4}}{_S}+[0-9a-fA-F]+{_S}+[0-9a-fA-F]+:[0-9a-fA-F]+"
                            rf"{_S}+(\d+)(?:{_S}[^\n]*)?$", re.M)


def mapped_inodes(text: str) -> set[int]:
    """The inodes /proc/PID/maps names (0, anonymous memory, left out): what :func:`parse_maps` gives as
    ``{m.inode for m in maps if m.inode}``; a line that is not a maps line raises ParseError, as there."""
    found = _MAPS_INODE_RE.findall(text)
    lines = sum(1 for line in text.split("\n") if line.strip())
    if len(found) != lines:
        bad = next(line for line in text.split("\n") if line.strip() and not _MAPS_INODE_RE.fullmatch(line))
        raise ParseError(f"not a maps line: {bad[:80]!r}")
    return {int(i) for i in found} - {0}


_SMAPS_KEY_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):\s+(\d+)\s*kB\s*$")
_SMAPS_FIELDS = {
    "Rss": "rss",
    "Pss": "pss",
    "Private_Clean": "private_clean",
    "Private_Dirty": "private_dirty",
    "Shared_Clean": "shared_clean",
    "Shared_Dirty": "shared_dirty",
    "Anonymous": "anonymous",
    "Swap": "swap",
}


def parse_smaps(text: str) -> list[Mapping]:
    """Parse /proc/PID/smaps: a maps header line followed by ``Key: N kB`` lines (bytes in the result).

    Hot path of the watcher (10,000 mappings ≈ 250,000 lines): header lines start with a lowercase hex
    digit, field lines with an uppercase letter, so one character decides which parser runs."""
    out: list[Mapping] = []
    cur: Mapping | None = None
    fields = _SMAPS_FIELDS
    hexstart = _HEX_START
    for line in text.split("\n"):
        if not line:
            continue
        if line[0] in hexstart:
            cur = parse_maps_line(line)
            out.append(cur)
            continue
        key, sep, rest = line.partition(":")
        if not sep or not rest.endswith("kB"):
            # Non-kB fields (VmFlags, THPeligible, ProtectionKey…) are not needed for growth accounting.
            if cur is None and sep == "":
                raise ParseError(f"not an smaps line: {line[:80]!r}")
            continue
        if cur is None:
            raise ParseError(f"smaps field before any mapping: {line[:80]!r}")
        try:
            val = int(rest[:-2]) * 1024
        except ValueError as e:
            raise ParseError(f"bad smaps value: {line[:80]!r}") from e
        attr = fields.get(key)
        if attr is not None:
            setattr(cur, attr, val)
        else:
            cur.extra[key] = val
    return out


_HEX_START = frozenset("0123456789abcdef")


# The lines the watcher reads, each found by a search for its literal prefix (the ~20 other lines of a mapping
# are skipped in C): a mapping's header (the first line, then each one after the VmFlags line that ends the
# mapping before it), its Rss and its Anonymous line. The kernel escapes a newline in a path (\012).
_HEADER = r"([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+ *([^\n]*)"
_FIRST_HEADER_RE = re.compile(_HEADER)
_NEXT_HEADER_RE = re.compile(r"VmFlags:[^\n]*\n" + _HEADER)
_RSS_RE = re.compile(r"\nRss: +(\d+) kB")
_ANON_RE = re.compile(r"\nAnonymous: +(\d+) kB")


def parse_smaps_compact(text: str) -> list[tuple[int, int, str, str, int, int]]:
    """(start, end, perms, path, rss, anonymous) per mapping — the watcher's hot path.

    Three searches over the text (~2x faster than a Python loop over its lines, ~8x than :func:`parse_smaps`);
    text where they do not find one header, one Rss and one Anonymous line per mapping (a kernel without
    VmFlags, a malformed file) goes through the line loop, which says what is wrong."""
    first = _FIRST_HEADER_RE.match(text)
    if first is not None:
        heads = [first.groups(), *_NEXT_HEADER_RE.findall(text)]
        rss, anon = _RSS_RE.findall(text), _ANON_RE.findall(text)
        if len(heads) == len(rss) == len(anon):
            return [(int(a, 16), int(b, 16), perms, path, int(r) * 1024, int(n) * 1024)
                    for (a, b, perms, path), r, n in zip(heads, rss, anon, strict=True)]
    return _parse_smaps_lines(text)


_SMAPS_HEADER_LINE_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ", re.M)


def parse_smaps_vmflags(text: str) -> list[tuple[int, int, str]]:
    """(start, end, VmFlags) of each mapping of /proc/PID/smaps ("" for one without the line; ``nr``:
    MAP_NORESERVE)."""
    out: list[tuple[int, int, str]] = []
    heads = list(_SMAPS_HEADER_LINE_RE.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        at = text.find("VmFlags:", m.end(), end)
        flags = text[at + len("VmFlags:"):text.find("\n", at)].strip() if at >= 0 else ""
        out.append((int(m.group(1), 16), int(m.group(2), 16), flags))
    return out


def _parse_smaps_lines(text: str) -> list[tuple[int, int, str, str, int, int]]:
    """:func:`parse_smaps_compact`, one line at a time: only two field lines are looked at and no per-mapping
    object is built. Field lines are ``Key:  N kB``; header lines start with hex."""
    out: list[tuple[int, int, str, str, int, int]] = []
    hexstart = _HEX_START
    start = end = rss = anon = -1
    perms = path = ""
    for line in text.split("\n"):
        if not line:
            continue
        c = line[0]
        if c in hexstart:
            if start >= 0:
                out.append((start, end, perms, path, rss, anon))
            parts = line.split(None, 5)
            if len(parts) < 5 or "-" not in parts[0]:
                raise ParseError(f"not an smaps header: {line[:80]!r}")
            a, _, b = parts[0].partition("-")
            try:
                start, end = int(a, 16), int(b, 16)
            except ValueError as e:
                raise ParseError(f"bad address range: {line[:80]!r}") from e
            perms = parts[1]
            path = parts[5] if len(parts) > 5 else ""
            rss = anon = 0
        elif c == "R" and line.startswith("Rss:"):
            rss = _kb(line, 4)
        elif c == "A" and line.startswith("Anonymous:"):
            anon = _kb(line, 10)
        elif start < 0 and ":" not in line:
            raise ParseError(f"not an smaps line: {line[:80]!r}")
    if start >= 0:
        out.append((start, end, perms, path, rss, anon))
    return out


def _kb(line: str, skip: int) -> int:
    try:
        return int(line[skip:].split()[0]) * 1024
    except (ValueError, IndexError) as e:
        raise ParseError(f"bad smaps value: {line[:80]!r}") from e


def parse_smaps_rollup(text: str) -> dict[str, int]:
    """Parse /proc/PID/smaps_rollup into ``{"Rss": bytes, ...}`` (header line ignored)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        km = _SMAPS_KEY_RE.match(line)
        if km:
            out[km.group(1)] = int(km.group(2)) * 1024
    if "Rss" not in out:
        raise ParseError("smaps_rollup without Rss")
    return out


def parse_status(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def status_kb(status: dict[str, str], key: str) -> int:
    """A ``VmRSS:  1234 kB`` style value in bytes (0 when absent)."""
    v = status.get(key, "")
    parts = v.split()
    if not parts:
        return 0
    try:
        return int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    except ValueError:
        return 0


def status_int(status: dict[str, str], key: str, base: int = 10) -> int:
    """A plain number (``TracerPid:  0``; ``CapEff: 000001ffffffffff`` with base 16); 0 when absent."""
    parts = status.get(key, "").split()
    return int(parts[0], base) if parts else 0


def parse_stat(text: str) -> dict[str, object]:
    """/proc/PID/stat: comm may contain spaces and parentheses, so split at the last ')'."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < 0:
        raise ParseError("malformed stat")
    rest = text[rpar + 2 :].split()
    return {
        "pid": int(text[:lpar].strip()),
        "comm": text[lpar + 1 : rpar],
        "state": rest[0],
        "ppid": int(rest[1]),
        "starttime": int(rest[19]),
    }


def stat_field(text: str, n: int) -> str:
    """Field ``n`` of /proc/PID/stat as proc(5) numbers them (1 pid, 2 comm, 3 state, ... 47 start_brk).
    comm may contain spaces and parentheses, so fields from 3 on are counted after the last ')'."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < 0:
        raise ParseError("malformed stat")
    if n <= 2:
        return text[:lpar].strip() if n == 1 else text[lpar + 1 : rpar]
    rest = text[rpar + 1 :].split()
    if n - 3 >= len(rest):
        raise ParseError(f"stat has {len(rest) + 2} fields, not {n}")
    return rest[n - 3]


# ----------------------------------------------------------------------------- environ / cmdline

def parse_environ(raw: bytes) -> dict[str, str]:
    """NUL-separated KEY=VALUE pairs. Retitled processes (setproctitle) show all-NUL: empty dict."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if not item or b"=" not in item:
            continue
        k, _, v = item.partition(b"=")
        out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def parse_cmdline(raw: bytes) -> list[str]:
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts = parts[:-1]
    return [p.decode("utf-8", "replace") for p in parts]

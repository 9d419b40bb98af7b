"""Secrets never reach disk: which environment values may be written (an allow-list of keys), and the
redaction of command lines, URLs and JSON settings (kv-transfer-config) — applied to everything a hunt
reads from its targets before it is logged, written to a session or printed."""

from __future__ import annotations

import re

# Keys whose values may reach disk. Anything else is written as "<redacted>".
ENV_ALLOW_PREFIXES = (
    "UCX_", "NIXL_", "VLLM_", "CUDA_", "NCCL_", "OMP_", "MALLOC_", "PYTHON", "LD_PRELOAD",
    "LD_LIBRARY_PATH", "GLIBC_TUNABLES", "KMP_", "MKL_", "TORCH_", "PYTORCH_", "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE", "RAY_", "UCX", "TOKENIZERS_PARALLELISM", "TCMALLOC_", "MIMALLOC_", "JE_MALLOC_CONF",
)
ENV_ALLOW_EXACT = {"PATH", "HOME", "USER", "HOSTNAME", "LANG", "PWD", "SHELL", "TERM", "CUDA_VISIBLE_DEVICES"}
_SECRET_RE = re.compile(r"(TOKEN|SECRET|PASSW|PASSWD|PWD_|API_?KEY|ACCESS_?KEY|PRIVATE|CREDENTIAL|AUTH|SIGNATURE|COOKIE|SESSION)", re.I)
REDACTED = "<redacted>"


def key_looks_secret(key: str) -> bool:
    return bool(_SECRET_RE.search(key))


def redact_env_value(key: str, value: str) -> str:
    if key_looks_secret(key):
        return REDACTED
    if key in ENV_ALLOW_EXACT or key.startswith(ENV_ALLOW_PREFIXES):
        return value
    return REDACTED


def redact_environ(env: dict[str, str]) -> dict[str, str]:
    return {k: redact_env_value(k, v) for k, v in env.items()}


_FLAG_SECRET_RE = re.compile(r"^(--?[\w.-]*(token|secret|passw|api[-_]?key|access[-_]?key|auth|credential)[\w.-]*)(=.*)?$", re.I)
_URL_CRED_RE = re.compile(r"(\w+://)([^/@\s:]+):([^/@\s]+)@")


def redact_cmdline(argv: list[str]) -> list[str]:
    """Hide values of secret-looking flags (``--api-key X``, ``--token=X``) and credentials in URLs."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        m = _FLAG_SECRET_RE.match(a)
        if m:
            if m.group(3):
                out.append(m.group(1) + "=" + REDACTED)
            else:
                out.append(a)
                hide_next = True
            continue
        a = _URL_CRED_RE.sub(lambda mm: f"{mm.group(1)}{mm.group(2)}:{REDACTED}@", a)
        if '"' in a:
            a = redact_json_text(a)
        out.append(a)
    return out


# "secret-looking key": "value" inside JSON arguments (--kv-transfer-config '{..."password": "x"}').
# Text-level, so malformed or truncated JSON is redacted too, and the rest keeps its formatting.
_JSON_SECRET_RE = re.compile(
    r'("[^"]*(?:token|secret|passw|api[-_]?key|access[-_]?key|auth|credential|private)[^"]*"\s*:\s*)'
    r'"(?:[^"\\]|\\.)*"', re.I)


def redact_json_text(text: str) -> str:
    return _JSON_SECRET_RE.sub(lambda m: f'{m.group(1)}"{REDACTED}"', text)


def redact_url(url: str) -> str:
    """``http://user:pass@host/x`` → ``http://user:<redacted>@host/x`` (for logs, meta and tables)."""
    return _URL_CRED_RE.sub(lambda mm: f"{mm.group(1)}{mm.group(2)}:{REDACTED}@", url)

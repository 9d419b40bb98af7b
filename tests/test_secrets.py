"""Secrets planted in a target's environment and arguments (and in leaktrace's own arguments) appear
nowhere in the session directory or the reports: not in any file's bytes, not in any decoded table
cell (Parquet pages are compressed, so the decoded values are searched too)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from leaktrace.session import SessionReader

SECRETS = {
    "HF_TOKEN": "hf_PlantedTokenQ7w3Zx9LmN2bV5cR8tY1",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTEDKEY",
    "DATABASE_URL_PASSWORD": "dbPw-Planted-4f9e2c",
    "VLLM_API_KEY": "vllm-key-Planted-88a1b2",
    "API_KEY": "sk-planted-envapikey-5d6e7f",
    "OPENAI_API_KEY": "sk-proj-PlantedOpenAI-1234abcd",
    "RANDOM_SETTING": "not-a-secret-but-not-allow-listed-7c7c",
    "arg_api_key": "sk-PlantedArgKey-0a1b2c3d4e5f",
    "arg_password": "hunter2-Planted-Password-9z",
    "arg_url_pass": "UrlPass-Planted-6u6u",
    "arg_token": "tok-Planted-Flag-3t3t",
    "metrics_url_pass": "MetricsPass-Planted-5m5m",
    "kv_config_password": "KvCfgPass-Planted-2k2k",
}

TARGET = """
import sys, time
print("ready", flush=True)
time.sleep(600)
"""


def _target_argv() -> list[str]:
    return [
        sys.executable,
        "-c",
        TARGET,
        "serve",
        "--api-key",
        SECRETS["arg_api_key"],
        f"--password={SECRETS['arg_password']}",
        f"https://admin:{SECRETS['arg_url_pass']}@hub.example/x",
        "--hf-token",
        SECRETS["arg_token"],
    ]


def _target_env() -> dict[str, str]:
    env = {k: v for k, v in SECRETS.items() if k.isupper()}
    env["DATABASE_URL"] = f"postgres://app:{SECRETS['DATABASE_URL_PASSWORD']}@db/x"
    return env


def _assert_clean(out: Path) -> None:
    needles = {k: v.encode() for k, v in SECRETS.items()}
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and (out / "report.json").exists()
    for p in files:
        data = p.read_bytes()
        for name, needle in needles.items():
            assert needle not in data, f"secret {name} found in {p.relative_to(out)}"
    reader = SessionReader(out)
    for table in reader.tables():
        df = reader.table(table)
        text = df.astype(str).to_csv(index=False)
        for name, v in SECRETS.items():
            assert v not in text, f"secret {name} found in table {table}"


@pytest.mark.parametrize(
    "metrics_url", [False, True], ids=["target-secrets", "plus-credentialed-metrics-url"]
)
def test_secrets_never_reach_the_session(tmp_path, spawn, metrics_url):
    """Default probes (BPF, gdb when available) on a target carrying secrets in its environment and
    command line; then also a hunt whose own command line carries a credentialed /metrics URL."""
    target = spawn(_target_argv(), env=_target_env())
    out = tmp_path / "s"
    extra = (
        ["--metrics", f"http://scraper:{SECRETS['metrics_url_pass']}@127.0.0.1:9/metrics"]
        if metrics_url
        else []
    )
    r = run_cli(
        "hunt",
        "--pid",
        target.pid,
        "--duration",
        "3",
        "--interval",
        "0.5",
        "--smaps-every",
        "2",
        *extra,
        "--out",
        out,
        "--format",
        "json,md,html",
    )
    assert r.returncode == 0, r.stderr
    for name, v in SECRETS.items():
        assert v not in r.stdout + r.stderr, f"secret {name} printed by hunt"
    procs = SessionReader(out).table("processes")
    assert procs["cmdline"].str.contains("--api-key").any()  # the command line is there, redacted
    # meta.json describes the target: its redacted command line and its allow-listed settings only.
    (described,) = json.loads((out / "meta.json").read_text())["target"]["processes"]
    assert described["pid"] == target.pid and "--api-key" in described["cmdline"]
    assert described["environ_redacted_keys"] >= len(_target_env())
    assert not set(described["environ"]) & set(_target_env()), described["environ"]
    _assert_clean(out)
    r = run_cli("report", out, "--format", "json,md,html")
    assert r.returncode == 0, r.stderr
    _assert_clean(out)


def test_secrets_with_vllm_discovery(tmp_path, spawn):
    """--vllm reads configuration (environment, command line, kv-transfer-config) of vLLM processes: a
    `vllm serve` look-alike (tests/targets/fake_vllm.py) carrying the same secrets must not leak them."""
    exe = tmp_path / "vllm"
    shutil.copy(Path(__file__).parent / "targets" / "fake_vllm.py", exe)
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"password": SECRETS["kv_config_password"]}}
    api = spawn([sys.executable, exe, "serve", "/models/tiny", "--host", "127.0.0.1", "--port", "18321",
                 "--kv-transfer-config", json.dumps(kv), *_target_argv()[4:]],
                env={**_target_env(), "UCX_TLS": "tcp", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"})
    r = run_cli("ps", "--json")
    assert r.returncode == 0, r.stderr
    for name, v in SECRETS.items():
        assert v not in r.stdout, f"secret {name} printed by ps --json"
    assert api.pid in [p["pid"] for p in json.loads(r.stdout)]
    out = tmp_path / "s"
    r = run_cli("hunt", "--vllm", "--duration", "3", "--interval", "0.5", "--no-gdb", "--out", out,
                "--format", "json,md")
    assert r.returncode == 0, r.stderr
    for name, v in SECRETS.items():
        assert v not in r.stdout + r.stderr, f"secret {name} printed by hunt --vllm"
    assert api.pid in json.loads((out / "meta.json").read_text())["target"]["pids"]  # the look-alike was hunted
    _assert_clean(out)

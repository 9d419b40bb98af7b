"""Not root → no BPF: `hunt` says so in one line with exit 5 and the way out (--no-bpf), which works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_unprivileged_hunt_without_bpf_is_one_clear_error(leaker_bin):
    base = Path(tempfile.mkdtemp(prefix="leaktrace-nobpf-"))
    os.chmod(base, 0o777)
    exe = base / "leaker"
    shutil.copy(leaker_bin, exe)
    os.chmod(exe, 0o755)
    target = subprocess.Popen([*NOBODY, str(exe), "--leak-kib-per-s", "512"], stdout=subprocess.PIPE, text=True)
    env = {**os.environ, "HOME": str(base), "MPLCONFIGDIR": str(base)}
    try:
        assert target.stdout.readline().startswith("ready")
        hunt = [*NOBODY, sys.executable, "-m", "leaktrace", "hunt", "--pid", str(target.pid), "--duration", "3",
                "--no-gdb"]
        r = subprocess.run([*hunt, "--out", str(base / "s1")], capture_output=True, text=True, timeout=180, env=env)
        assert r.returncode == 5, r.stderr
        assert "Traceback" not in r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("leaktrace: error:")]
        assert len(errors) == 1 and "root" in errors[0] and "--no-bpf" in errors[0]
        # Nothing lost: the session was finalized with the reason.
        assert json.loads((base / "s1" / "meta.json").read_text())["complete"]
        r = subprocess.run([*hunt, "--no-bpf", "--out", str(base / "s2")], capture_output=True, text=True,
                           timeout=180, env=env)
        assert r.returncode == 0, r.stderr
        rep = json.loads((base / "s2" / "report.json").read_text())
        assert rep["processes"] and rep["processes"][0]["pid"] == target.pid
    finally:
        target.kill()
        target.wait()
        shutil.rmtree(base, ignore_errors=True)

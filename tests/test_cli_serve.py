"""`fitevict serve` refuses settings that cannot hold before it binds a port, naming the key and the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    engine = tmp_path / "llama-server"
    engine.write_text("#!/bin/sh\necho usage\n")
    engine.chmod(0o755)
    env = {**os.environ, "FITEVICT_CONFIG": "", "FITEVICT_LLAMA_SERVER": str(engine)}
    return subprocess.run([sys.executable, "-m", "fitevict.cli", "serve", "--data-dir", str(tmp_path / "d"), *args],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args,words", [
    (["--ram-limit", "900TiB"], ["ram_limit", "900", "above"]),
    (["--ram-limit", "lots"], ["ram_limit", "lots"]),
    (["--port", "70000"], ["server.port", "70000"]),
    (["--idle-unload-seconds", "-3"], ["idle_unload_seconds", "-3"]),
    (["--models-dir", "/no/such/dir"], ["models_dirs", "/no/such/dir"]),
])
def test_bad_settings_exit_2_with_key_and_value(tmp_path: Path, args: list[str], words: list[str]) -> None:
    r = serve(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_bad_toml_names_the_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[policy]\nmax_queue = "many"\n')
    r = serve(tmp_path, "--config", str(cfg))
    assert r.returncode == 2 and "policy.max_queue" in r.stderr and "many" in r.stderr, r.stderr


def test_binding_beyond_loopback_without_keys_warns(tmp_path: Path) -> None:
    import socket
    import signal

    engine = tmp_path / "llama-server"
    engine.write_text("#!/bin/sh\necho usage\n")
    engine.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FITEVICT_CONFIG": "", "FITEVICT_LLAMA_SERVER": str(engine)}
    proc = subprocess.Popen([sys.executable, "-m", "fitevict.cli", "serve", "--host", "0.0.0.0", "--port", str(port),
                             "--data-dir", str(tmp_path / "d")], stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    seen = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # read until the server says it is up
            seen.append(line)
            if "Uvicorn running" in line or "Application startup complete" in line:
                break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    text = "".join(seen)
    assert "warning" in text and "0.0.0.0" in text and "api-key" in text.replace("_", "-")


def test_an_unusable_store_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = serve(tmp_path, "--data-dir", str(blocker / "sub"))
    assert r.returncode == 2 and "store error" in r.stderr and "Traceback" not in r.stderr, r.stderr

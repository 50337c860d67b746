"""Engine provisioning: lookup order, missing tools, and atomic installs (real cmake, real files)."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fitevict.engines import install as inst
from fitevict.engines.machine import this_cpu


def _exe(path: Path, body: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)
    return path


def _fake_cache_install(base: Path, cpu: str | None = None) -> Path:
    bin_dir = inst.installed_bin_dir(base)
    for b in inst.BINARIES:
        _exe(bin_dir / b)
    cpu = this_cpu().fingerprint if cpu is None else cpu
    (bin_dir / inst.STAMP).write_text(f'{{"version": "{inst.SDIST_VERSION}", "cpu": "{cpu}"}}')
    return bin_dir


def test_a_build_for_another_cpu_is_not_an_install_here(tmp_path: Path) -> None:
    # a native build records the CPU it was built on; another CPU (or a stamp without one) builds again
    _fake_cache_install(tmp_path / "other", cpu="0123456789ab")
    assert inst.read_stamp(tmp_path / "other") is None
    _fake_cache_install(tmp_path / "here")
    assert inst.read_stamp(tmp_path / "here") is not None


def test_lookup_order_config_env_path_cache(tmp_path: Path) -> None:
    base = tmp_path / "cache"
    cache_bin = _fake_cache_install(base)
    path_dir = tmp_path / "onpath"
    _exe(path_dir / "llama-server")
    env_bin = _exe(tmp_path / "env" / "llama-server")
    cfg_bin = _exe(tmp_path / "cfg" / "llama-server")
    env = {"PATH": str(path_dir), inst.ENV_VAR: str(env_bin)}

    r = inst.resolve_binary(configured=cfg_bin, env=env, base=base)
    assert (r.path, [c.status for c in r.candidates]) == (cfg_bin, ["used", "shadowed", "shadowed", "shadowed"])
    assert "config" in r.why

    r = inst.resolve_binary(env=env, base=base)
    assert r.path == env_bin and "FITEVICT_LLAMA_SERVER" in r.why

    r = inst.resolve_binary(env={"PATH": str(path_dir)}, base=base)
    assert r.path == path_dir / "llama-server" and "PATH" in r.why

    r = inst.resolve_binary(env={"PATH": str(tmp_path / "empty")}, base=base)
    assert r.path == cache_bin / "llama-server" and inst.SDIST_VERSION in r.why


def test_companion_binaries_are_looked_up_beside_each_candidate(tmp_path: Path) -> None:
    base = tmp_path / "cache"
    cache_bin = _fake_cache_install(base)
    # The env's llama-server has no llama-fit-params beside it: the cache's is used, and the env step says why.
    env_bin = _exe(tmp_path / "env" / "llama-server")
    r = inst.resolve_binary("llama-fit-params", env={"PATH": "", inst.ENV_VAR: str(env_bin)}, base=base)
    assert r.path == cache_bin / "llama-fit-params"
    assert [(c.source, c.status) for c in r.candidates][1] == ("env", "missing")


def test_nothing_found_explains_every_step(tmp_path: Path) -> None:
    r = inst.resolve_binary(env={"PATH": str(tmp_path)}, base=tmp_path / "cache")
    assert r.path is None
    for step in ("config", "env", "PATH", "cache"):
        assert step in r.why
    assert "fitevict engine install llama.cpp" in r.why


def test_non_executable_configured_binary_is_skipped(tmp_path: Path) -> None:
    f = tmp_path / "llama-server"
    f.write_text("not a program")
    r = inst.resolve_binary(configured=f, env={"PATH": ""}, base=tmp_path / "cache")
    assert r.path is None and r.candidates[0].status == "not executable"


def test_stamp_for_another_version_is_not_an_install(tmp_path: Path) -> None:
    bin_dir = _fake_cache_install(tmp_path)
    (bin_dir / inst.STAMP).write_text('{"version": "0.0.1"}')
    assert inst.read_stamp(tmp_path) is None


def test_missing_tools_error_names_the_debian_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(inst.EngineInstallError) as e:
        inst.install(base=tmp_path)
    msg = str(e.value)
    assert "apt-get install -y" in msg and "cmake" in msg and "g++" in msg
    assert not inst.installed_bin_dir(tmp_path).exists()


def test_failed_build_leaves_no_binary(tmp_path: Path) -> None:
    """A real cmake run over a source tree that fails to configure installs nothing."""
    root = inst.engine_root(tmp_path)
    root.mkdir(parents=True)
    sdist = root / f"llama_cpp_python-{inst.SDIST_VERSION}.tar.gz"
    cmakelists = b"cmake_minimum_required(VERSION 3.14)\nproject(broken C)\nmessage(FATAL_ERROR \"deliberately broken\")\n"
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo(f"llama_cpp_python-{inst.SDIST_VERSION}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(cmakelists)
        tar.addfile(info, io.BytesIO(cmakelists))
    seen: list[str] = []
    with pytest.raises(inst.EngineInstallError) as e:
        inst.install(base=tmp_path, progress=lambda m, f: seen.append(m))
    assert "deliberately broken" in str(e.value) and "nothing was installed" in str(e.value)
    assert not inst.installed_bin_dir(tmp_path).exists()
    assert inst.read_stamp(tmp_path) is None
    assert any("cmake" in m for m in seen)  # progress was reported before the failure
    assert (root / "build.log").read_text().count("deliberately broken") >= 1


@pytest.mark.e2e
def test_installed_engine_is_found_and_reinstall_is_a_no_op(llama_server: Path) -> None:
    """The README's setup built the engine; a second install finds it and the binary runs."""
    cli = [sys.executable, "-m", "fitevict.cli"]
    out = subprocess.run([*cli, "engine", "install", "llama.cpp"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "already installed" in out.stdout
    listed = subprocess.run([*cli, "engine", "list", "--json"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    import json

    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == set(inst.BINARIES)
    server = Path(rows["llama-server"]["path"])
    assert server == llama_server
    v = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and "version" in (v.stdout + v.stderr)


def test_cache_prefers_an_installed_cuda_build(tmp_path: Path) -> None:
    base = tmp_path / "cache"
    cpu = _fake_cache_install(base)
    r = inst.resolve_binary(env={"PATH": ""}, base=base)
    assert r.path == cpu / "llama-server" and "CUDA" not in r.why
    cuda = inst.installed_bin_dir(base, "cuda")
    for b in inst.BINARIES:
        _exe(cuda / b)
    (cuda / inst.STAMP).write_text(f'{{"version": "{inst.SDIST_VERSION}", "variant": "cuda", "cpu": "{this_cpu().fingerprint}"}}')
    r = inst.resolve_binary(env={"PATH": ""}, base=base)
    assert r.path == cuda / "llama-server" and "CUDA build" in r.why
    # a stamp written for another variant does not count as this one
    assert inst.read_stamp(base, "cpu") is not None and inst.read_stamp(base, "cuda") is not None
    (cuda / inst.STAMP).write_text(f'{{"version": "{inst.SDIST_VERSION}", "variant": "cpu"}}')
    assert inst.read_stamp(base, "cuda") is None


def test_cuda_build_flags_and_missing_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flags = inst.cmake_flags("cuda", cuda_arch="89;90", nvcc="/opt/cuda/bin/nvcc")
    assert flags[: len(inst.CMAKE_FLAGS)] == inst.CMAKE_FLAGS
    assert {"-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=89;90", "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc"} <= set(flags)
    assert inst.cmake_flags("cpu") == inst.CMAKE_FLAGS
    # only the C/C++ tools on PATH, and no CUDA toolkit where fitevict looks: the error names the package
    tools = tmp_path / "tools"
    for t in ("cmake", "c++", "cc", "make"):
        _exe(tools / t)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda-here"))
    with pytest.raises(inst.EngineInstallError) as e:
        inst.install(base=tmp_path / "c", variant="cuda")
    assert "nvidia-cuda-toolkit" in str(e.value) and "nvcc" in str(e.value)
    assert not inst.installed_bin_dir(tmp_path / "c", "cuda").exists()
    with pytest.raises(inst.EngineInstallError):
        inst.install(base=tmp_path / "c", variant="rocm")


def test_cuda_build_needs_cublas_headers_beside_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = tmp_path / "cuda"
    _exe(cuda / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.setenv("PATH", "")
    assert any("cuBLAS" in tool for tool, _ in inst.missing_build_tools("cuda"))
    (cuda / "include").mkdir()
    (cuda / "include" / "cublas_v2.h").write_text("")
    assert not any("CUDA" in tool or "cuBLAS" in tool for tool, _ in inst.missing_build_tools("cuda"))

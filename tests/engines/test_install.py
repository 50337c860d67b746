"""Engine provisioning: lookup order, missing tools, and atomic installs (real cmake, real files)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp import install as inst
from fitevict.engines.llama_cpp.machine import this_cpu


def _exe(path: Path, body: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)
    return path


def _fake_cache_install(base: Path, cpu: str | None = None, variant: str = "cpu",
                        server: str = "#!/bin/sh\necho fake\n") -> Path:
    bin_dir = inst.installed_bin_dir(base, variant)
    for b in inst.BINARIES:
        _exe(bin_dir / b, server if b == "llama-server" else "#!/bin/sh\necho fake\n")
    cpu = this_cpu().fingerprint if cpu is None else cpu
    (bin_dir / inst.STAMP).write_text(json.dumps({"version": inst.SDIST_VERSION, "cpu": cpu, "variant": variant,
                                                  "cmake_flags": list(inst.cmake_flags(variant))}))
    return bin_dir


def test_a_build_for_another_cpu_is_not_an_install_here(tmp_path: Path) -> None:
    # a native build records the CPU it was built on; another CPU (or a stamp without one) builds again
    _fake_cache_install(tmp_path / "other", cpu="0123456789ab")
    assert inst.read_stamp(tmp_path / "other") is None
    _fake_cache_install(tmp_path / "here")
    assert inst.read_stamp(tmp_path / "here") is not None


def test_a_cpu_with_amx_builds_without_the_engines_amx_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amx = frozenset({"avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"})
    for variant in ("cpu", "vulkan"):
        flags = inst.cmake_flags(variant, cpu_flags=amx)
        assert f"-DCMAKE_C_FLAGS={inst.NO_AMX}" in flags and f"-DCMAKE_CXX_FLAGS={inst.NO_AMX}" in flags
        assert "-mno-amx-int8" in inst.NO_AMX and set(inst.CMAKE_FLAGS) <= set(flags)
        assert not set(inst.cmake_flags(variant, cpu_flags=amx - {"amx_tile", "amx_int8"})) & set(inst.native_flags(amx))
    # a build this CPU would make with AMX (a stamp without the exclusion) is built again on an AMX CPU
    cpu = this_cpu()
    monkeypatch.setattr(inst, "this_cpu", lambda: type(cpu)(cpu.model, cpu.arch, amx))
    bin_dir = _fake_cache_install(tmp_path, cpu=inst.this_cpu().fingerprint)
    assert inst.read_stamp(tmp_path) is not None
    stamp = json.loads((bin_dir / inst.STAMP).read_text())
    stamp["cmake_flags"] = list(inst.CMAKE_FLAGS)
    (bin_dir / inst.STAMP).write_text(json.dumps(stamp))
    assert inst.read_stamp(tmp_path) is None


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
    cuda = _fake_cache_install(base, variant="cuda")
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
    assert inst.cmake_flags("cpu", cpu_flags=frozenset({"avx2"})) == inst.CMAKE_FLAGS
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


# A stand-in for a Vulkan build's llama-server at the engine's edge: it lists a Vulkan device only when
# GGML_VK_VISIBLE_DEVICES names one (ggml-vulkan's rule for CPU-type devices), and counts its runs in a file.
_VULKAN_SERVER = """#!/bin/sh
echo run >> "${0%/*}/runs"
echo "Available devices:"
if [ -n "$GGML_VK_VISIBLE_DEVICES" ]; then
  echo "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)"
fi
"""


def _runs(bin_dir: Path) -> int:
    runs = bin_dir / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_vulkan_build_has_its_own_folders_and_flags(tmp_path: Path) -> None:
    assert inst.cmake_flags("vulkan", cpu_flags=frozenset()) == (*inst.CMAKE_FLAGS, "-DGGML_VULKAN=ON")
    assert inst.installed_bin_dir(tmp_path, "vulkan") == inst.engine_root(tmp_path) / "bin-vulkan"
    assert inst.build_dir(tmp_path, "vulkan") == inst.engine_root(tmp_path) / "build-vulkan"
    assert inst.build_dir(tmp_path) == inst.engine_root(tmp_path) / "build"
    assert "vulkan" in inst.VARIANTS and "cuda" in inst.VARIANTS


def test_missing_vulkan_packages_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fitevict.engines.llama_cpp import vulkan

    # an empty system: each thing named with its Debian package
    got = dict((pkg, what) for what, pkg in vulkan.missing(root=tmp_path, env={"PATH": str(tmp_path)}))
    assert set(got) == set(vulkan.PACKAGES) == {"mesa-vulkan-drivers", "libvulkan-dev", "glslc", "spirv-headers"}
    assert "glslc" in got["glslc"] and "vulkan.h" in got["libvulkan-dev"]
    # the C/C++ tools but no shader compiler on PATH: the install refuses before anything is built, naming it
    tools = tmp_path / "tools"
    for t in ("cmake", "c++", "cc", "make"):
        _exe(tools / t)
    monkeypatch.setenv("PATH", str(tools))
    with pytest.raises(inst.EngineInstallError) as e:
        inst.install(base=tmp_path / "c", variant="vulkan")
    msg = str(e.value)
    assert "glslc" in msg and "apt-get install -y" in msg
    assert "mesa-vulkan-drivers libvulkan-dev glslc spirv-headers" in msg
    assert not inst.installed_bin_dir(tmp_path / "c", "vulkan").exists()


def _fake_sdist(root: Path, vulkan_source: str) -> None:
    """An sdist whose llama.cpp is a small real CMake project: each target writes its binary (a script that
    prints the cmake flags it was configured with), and the Vulkan source file the patch changes."""
    cmake = "cmake_minimum_required(VERSION 3.14)\nproject(fake NONE)\n" + "".join(
        f'file(WRITE ${{CMAKE_BINARY_DIR}}/staged/{b} "#!/bin/sh\\necho version: 1 fake vulkan=${{GGML_VULKAN}} '
        f'rpc=${{GGML_RPC}}\\n")\n'
        f'file(CHMOD ${{CMAKE_BINARY_DIR}}/staged/{b} PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)\n'
        f'add_custom_target({b} COMMAND ${{CMAKE_COMMAND}} -E copy ${{CMAKE_BINARY_DIR}}/staged/{b} '
        f'${{CMAKE_BINARY_DIR}}/bin/{b})\n' for b in inst.BINARIES)
    files = {"CMakeLists.txt": cmake, "ggml/src/ggml-vulkan/ggml-vulkan.cpp": vulkan_source}
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / f"llama_cpp_python-{inst.SDIST_VERSION}.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{inst.SDIST_VERSION}/vendor/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_vulkan_install_patches_builds_stamps_and_is_cached(tmp_path: Path) -> None:
    """A real cmake run over a small project: the variant's flags reach cmake, the needed patches are applied to
    the source before it is configured and named in the record, and a second install is a no-op."""
    from fitevict.engines.llama_cpp import patches

    if missing := inst.missing_build_tools("vulkan"):
        pytest.skip(f"the Vulkan build tools are missing here: {missing}")
    base = tmp_path / "cache"
    source = f"int before;\n{patches.VULKAN_LAYER_SETTINGS.old}int after;\n"
    _fake_sdist(inst.engine_root(base), source)
    result = inst.install(base=base, variant="vulkan")
    assert not result.already and result.bin_dir == inst.installed_bin_dir(base, "vulkan")
    needed = [p.name for p in patches.PATCHES["vulkan"] if p.needed()]
    assert result.stamp["patches"] == needed and result.stamp["variant"] == "vulkan"
    assert "-DGGML_VULKAN=ON" in result.stamp["cmake_flags"]
    assert "vulkan=ON rpc=ON" in result.stamp["version_output"]  # what cmake was configured with
    patched = (inst.source_dir(base) / "ggml/src/ggml-vulkan/ggml-vulkan.cpp").read_text()
    assert ("#ifdef VK_EXT_LAYER_SETTINGS_EXTENSION_NAME" in patched) == bool(needed)
    assert (inst.build_dir(base, "vulkan") / "CMakeCache.txt").is_file()
    assert inst.read_stamp(base, "vulkan") == result.stamp and inst.read_stamp(base, "cpu") is None
    again = inst.install(base=base, variant="vulkan")
    assert again.already and again.stamp == result.stamp


def test_lookup_chooses_the_vulkan_build_only_where_it_lists_a_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path / "store"))  # where the lookup's answers are kept
    base = tmp_path / "cache"
    cpu = _fake_cache_install(base)
    vk = _fake_cache_install(base, variant="vulkan", server=_VULKAN_SERVER)
    env = {"PATH": ""}

    r = inst.resolve_binary(env=env, base=base)
    assert r.path == cpu / "llama-server" and r.env == ()
    assert "CPU build" in r.why and "lists no Vulkan device" in r.why and "lavapipe" in r.why
    assert [(c.path.parent.name, c.status.split(":")[0]) for c in r.candidates if c.source == "cache"] == [
        ("bin-vulkan", "passed over"), ("bin", "used")]
    # the answer is kept per binary file: further lookups (every companion binary too) do not run the engine
    for b in inst.BINARIES:
        assert inst.resolve_binary(b, env=env, base=base).path == cpu / b
    assert _runs(vk) == 1

    # named by configuration: chosen, and the seats' environment carries the naming
    r = inst.resolve_binary(env=env, base=base, vulkan_devices=(0,))
    assert r.path == vk / "llama-server" and dict(r.env) == {"GGML_VK_VISIBLE_DEVICES": "0"}
    assert "Vulkan build" in r.why and "Vulkan0: llvmpipe" in r.why
    # or by the user's own variable, which the seats inherit as it is (the same naming: the same answer, kept)
    r = inst.resolve_binary(env={**env, "GGML_VK_VISIBLE_DEVICES": "0"}, base=base)
    assert r.path == vk / "llama-server" and r.env == ()
    assert _runs(vk) == 2

    # configuration and FITEVICT_LLAMA_SERVER come first, without asking the Vulkan build
    mine = _exe(tmp_path / "mine" / "llama-server")
    assert inst.resolve_binary(env={**env, inst.ENV_VAR: str(mine)}, base=base, vulkan_devices=(1,)).path == mine
    assert _runs(vk) == 2

    # another file in its place is asked again
    server = vk / "llama-server"
    stat = server.stat()
    import os

    os.utime(server, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert inst.resolve_binary(env=env, base=base).path == cpu / "llama-server"
    assert _runs(vk) == 3


def test_a_vulkan_build_that_cannot_list_is_passed_over_with_its_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path / "store"))
    base = tmp_path / "cache"
    cpu = _fake_cache_install(base)
    _fake_cache_install(base, variant="vulkan", server="#!/bin/sh\necho 'vk::createInstance: ErrorIncompatibleDriver' >&2\nexit 1\n")
    r = inst.resolve_binary(env={"PATH": ""}, base=base, vulkan_devices=(0,))
    assert r.path == cpu / "llama-server"
    assert "could not list its devices" in r.why and "ErrorIncompatibleDriver" in r.why

"""Provision the pinned llama.cpp engine, and find the binary fitevict will use.

``install()`` gets the PyPI sdist of llama-cpp-python (which vendors llama.cpp), builds
llama-server, llama-fit-params, llama-quantize and ggml-rpc-server with cmake, and installs them into a versioned
cache directory: ``bin`` for the CPU build, ``bin-vulkan`` and ``bin-cuda`` for the device builds beside it. The install is atomic: binaries land in a temporary directory, are checked with
``--version``, and only then renamed into place, so a failed build leaves nothing half-installed.

``resolve_binary()`` says which binary will be used and why. Lookup order:
1. the config file (``engine.llama_server``), 2. ``$FITEVICT_LLAMA_SERVER``, 3. ``PATH``, 4. the cache: a CUDA
build, else a Vulkan build that lists a Vulkan device as it would run (``engines/llama_cpp/vulkan.py``), else the CPU
build.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fitevict.engines.llama_cpp import patches, vulkan
from fitevict.host.cpu import this_cpu
from fitevict.paths import cache_dir

ENGINE = "llama.cpp"
SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e570"
# ggml-rpc-server serves this machine's CPU as a remote device to another machine's llama-server (``--rpc``).
SERVER = "llama-server"  # the engine's server binary (and the name of its engine)
BINARIES: tuple[str, ...] = (SERVER, "llama-fit-params", "llama-quantize", "ggml-rpc-server")
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DGGML_RPC=ON",  # every build can use rpc-server devices (--rpc HOST:PORT) and serve one
)
STAMP = "INSTALLED.json"
ENV_VAR = "FITEVICT_LLAMA_SERVER"

# The Debian package that provides each build tool, named in the error when it is missing.
_TOOL_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "cmake": (("cmake",), "cmake"),
    "C++ compiler": (("c++", "g++", "clang++"), "g++"),
    "C compiler": (("cc", "gcc", "clang"), "gcc"),
    "make": (("make", "ninja"), "make"),
}


class EngineInstallError(RuntimeError):
    """The engine could not be provisioned; the message says what is missing and what to do."""


@dataclass(frozen=True, slots=True)
class Candidate:
    source: str  # "config" | "env" | "PATH" | "cache"
    path: Path | None
    status: str  # "used", "not set", "missing", "not executable", "not installed", "shadowed"


@dataclass(frozen=True, slots=True)
class Resolution:
    name: str
    path: Path | None
    why: str
    candidates: tuple[Candidate, ...] = field(default=())
    # what the chosen binary runs with beyond the caller's environment: GGML_VK_VISIBLE_DEVICES from
    # engine.vulkan_devices (a seat's environment must carry it)
    env: tuple[tuple[str, str], ...] = ()


VARIANTS: tuple[str, ...] = ("cpu", "vulkan", "cuda")
# what a first build takes, for the progress line (measured on 2 busy cores; docs/engines.md)
BUILD_MINUTES = {"cpu": "about 5 minutes on 2 cores", "vulkan": "12 to 28 minutes on 2 cores, shaders included",
                 "cuda": "tens of minutes: one kernel set per CUDA architecture"}
VARIANT_NAMES = {"cpu": "CPU build", "vulkan": "Vulkan build", "cuda": "CUDA build"}


def engine_root(base: Path | None = None) -> Path:
    return (base or cache_dir()) / "engines" / f"{ENGINE}-{SDIST_VERSION}"


def source_dir(base: Path | None = None) -> Path:
    """The vendored llama.cpp source the engine is built from; its ``models/`` holds the engine's test
    vocabularies (``ggml-vocab-*.gguf``) and chat templates, which the life-size zoo copies."""
    return engine_root(base) / "src" / "vendor" / "llama.cpp"


def installed_bin_dir(base: Path | None = None, variant: str = "cpu") -> Path:
    """Where a build lives: ``bin`` (CPU), ``bin-vulkan`` or ``bin-cuda``; all share one source tree."""
    return engine_root(base) / ("bin" if variant == "cpu" else f"bin-{variant}")


def build_dir(base: Path | None = None, variant: str = "cpu") -> Path:
    """cmake's build folder for a variant: ``build``, ``build-vulkan``, ``build-cuda`` (kept: a rebuild is incremental)."""
    return engine_root(base) / ("build" if variant == "cpu" else f"build-{variant}")


# The native build compiles ggml's AMX backend on a CPU with AMX, and the pinned engine's AMX matrix product
# crashes (SIGSEGV in ggml_backend_amx_mul_mat, llama.cpp issue 20824, unfixed) on the first batch of any model
# whose weights it repacks (Q4_0, Q8_0, K-quants). The build leaves AMX out there; AVX-512 and the CPU's repacked
# layouts stay. The compiler's explicit -mno-* flags win over -march=native whatever their order.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
AMX_WHY = "AMX left out: the pinned engine's AMX matrix product crashes (llama.cpp issue 20824)"


def native_flags(cpu_flags: frozenset[str]) -> tuple[str, ...]:
    """What the native build must leave out on this CPU, as cmake flags (none on a CPU without AMX)."""
    if "amx_int8" not in cpu_flags and "amx_tile" not in cpu_flags:
        return ()
    return (f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")


def cmake_flags(variant: str = "cpu", *, cuda_arch: str = "native", nvcc: str | None = None,
                cpu_flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The pinned build's cmake flags on this CPU (or one with ``cpu_flags``); a Vulkan build adds GGML_VULKAN,
    a CUDA build GGML_CUDA and the GPU architectures to compile for."""
    base = (*CMAKE_FLAGS, *native_flags(this_cpu().flags if cpu_flags is None else cpu_flags))
    if variant == "cpu":
        return base
    if variant == "vulkan":
        return (*base, "-DGGML_VULKAN=ON")
    extra = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    if nvcc:
        extra.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    return (*base, *extra)


def find_nvcc() -> str | None:
    """nvcc on PATH, else in ``$CUDA_HOME`` / ``$CUDA_PATH`` / /usr/local/cuda."""
    home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    return shutil.which("nvcc") or (str(home / "bin" / "nvcc") if _is_executable(home / "bin" / "nvcc") else None)


def read_stamp(base: Path | None = None, variant: str = "cpu") -> dict | None:
    """The install record, or None when no complete install exists."""
    bin_dir = installed_bin_dir(base, variant)
    try:
        stamp = json.loads((bin_dir / STAMP).read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("version") != SDIST_VERSION or stamp.get("variant", "cpu") != variant:
        return None
    if stamp.get("cpu") != this_cpu().fingerprint:
        return None  # a native build for another CPU (or one that did not record its CPU): built again here
    if not all(_is_executable(bin_dir / b) for b in BINARIES):
        return None
    if not set(cmake_flags("cpu")) <= set(stamp.get("cmake_flags", ())):
        return None  # built with other flags (an older build without RPC, or with AMX, say): built again
    return stamp


def _is_executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def resolve_binary(
    name: str = "llama-server",
    *,
    configured: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    base: Path | None = None,
    vulkan_devices: tuple[int, ...] | None = None,
) -> Resolution:
    """Which ``name`` binary fitevict will use, and why.

    ``configured`` is the config file's ``engine.llama_server``, ``vulkan_devices`` its ``engine.vulkan_devices``
    (the Vulkan devices a seat may use, by index, CPU-type ones such as lavapipe included). For the companion
    binaries (llama-fit-params, llama-quantize, ggml-rpc-server) each step looks beside that step's llama-server.
    """
    env = os.environ if env is None else env
    cands: list[Candidate] = []
    chosen: tuple[Path, str] | None = None

    def consider(source: str, server: Path | None, unset: str) -> None:
        nonlocal chosen
        if server is None:
            cands.append(Candidate(source, None, unset))
            return
        target = server if name == "llama-server" else server.parent / name
        if chosen is not None:
            cands.append(Candidate(source, target, "shadowed"))
        elif not target.exists():
            cands.append(Candidate(source, target, "missing"))
        elif not _is_executable(target):
            cands.append(Candidate(source, target, "not executable"))
        else:
            cands.append(Candidate(source, target, "used"))
            chosen = (target, source)

    consider("config", Path(configured).expanduser() if configured else None, "not set (engine.llama_server)")
    env_value = env.get(ENV_VAR)
    consider("env", Path(env_value).expanduser() if env_value else None, f"not set (${ENV_VAR})")
    on_path = shutil.which("llama-server", path=env.get("PATH"))
    consider("PATH", Path(on_path) if on_path else None, "no llama-server on PATH")
    visible = vulkan.visible_setting(vulkan_devices, env)
    cache_words = ""
    installed = [v for v in ("cuda", "vulkan", "cpu") if read_stamp(base, v)]
    if not installed:
        consider("cache", None, f"not installed in {installed_bin_dir(base)} (run: fitevict engine install llama.cpp)")
    for variant in installed:
        server = installed_bin_dir(base, variant) / "llama-server"
        if variant == "vulkan" and chosen is None:
            choice = vulkan.lookup(server, env, visible)
            cache_words = cache_words or choice.words()
            if not choice.chosen:
                cands.append(Candidate("cache", server.parent / name, f"passed over: {choice.words()}"))
                continue
        was = chosen
        consider("cache", server, "")
        if chosen is not was and chosen is not None:
            cache_words = f", {VARIANT_NAMES[variant]}" + (f": {cache_words}" if cache_words else "")
    extra = ((vulkan.VISIBLE_ENV, visible),) if vulkan_devices else ()

    if chosen is None:
        tried = "; ".join(f"{c.source}: {c.status}" + (f" ({c.path})" if c.path else "") for c in cands)
        return Resolution(name, None, f"no usable {name} found ({tried})", tuple(cands), extra)
    path, source = chosen
    reason = {
        "config": "set in the config file (engine.llama_server)",
        "env": f"set by ${ENV_VAR}",
        "PATH": "found on PATH",
        "cache": f"built by fitevict from {SDIST_PACKAGE}=={SDIST_VERSION} (llama.cpp {LLAMA_CPP_COMMIT})" + cache_words,
    }[source]
    return Resolution(name, path, reason, tuple(cands), extra)


def missing_build_tools(variant: str = "cpu") -> list[tuple[str, str]]:
    """[(tool, debian package)] for each build tool that is not on PATH."""
    missing = []
    for tool, (names, package) in _TOOL_PACKAGES.items():
        if not any(shutil.which(n) for n in names):
            missing.append((tool, package))
    if variant == "vulkan":
        missing += vulkan.missing()
    if variant == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            missing.append(("CUDA compiler (nvcc)", "nvidia-cuda-toolkit"))
        else:  # llama.cpp's CUDA backend links cuBLAS: a toolkit with nvcc alone does not build it
            home = Path(nvcc).resolve().parent.parent
            heads = [home / "include", home / "targets" / "x86_64-linux" / "include", Path("/usr/include")]
            if not any((h / "cublas_v2.h").is_file() for h in heads):
                missing.append((f"cuBLAS headers (cublas_v2.h, beside {nvcc}; with NVIDIA's toolkit install "
                                f"its libcublas-dev for this CUDA version instead)", "nvidia-cuda-toolkit"))
    return missing


@dataclass(frozen=True, slots=True)
class InstallResult:
    bin_dir: Path
    already: bool
    seconds: float
    stamp: dict


Progress = Callable[[str, float | None], None]  # (message, fraction done or None)

_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def install(*, force: bool = False, base: Path | None = None, jobs: int | None = None,
            progress: Progress | None = None, variant: str = "cpu", cuda_arch: str = "native") -> InstallResult:
    """Build and install the pinned engine into the cache. Returns at once when already installed.

    ``variant="vulkan"`` builds with GGML_VULKAN (the source patched first where the system's Vulkan headers need
    it: ``engines/llama_cpp/patches.py``; the record names the patches applied) into ``bin-vulkan``.
    ``variant="cuda"`` builds with GGML_CUDA for ``cuda_arch`` (cmake's CMAKE_CUDA_ARCHITECTURES: "native"
    needs a visible GPU at build time; give e.g. "89;90" otherwise) into its own directory.
    """
    if variant not in VARIANTS:
        raise EngineInstallError(f"unknown build variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    t0 = time.monotonic()
    say = progress or (lambda msg, frac: None)
    root = engine_root(base)
    bin_dir = installed_bin_dir(base, variant)
    stamp = read_stamp(base, variant)
    if stamp and not force:
        return InstallResult(bin_dir, True, time.monotonic() - t0, stamp)

    missing = missing_build_tools(variant)
    if missing:
        pkgs = " ".join(sorted({p for _, p in missing}))
        whole = (f" (a Vulkan build and its devices need the Debian packages {' '.join(vulkan.PACKAGES)})"
                 if variant == "vulkan" else "")
        raise EngineInstallError(
            f"cannot build llama.cpp{' for Vulkan' if variant == 'vulkan' else ''}: missing "
            f"{', '.join(t for t, _ in missing)}. Install them with: apt-get install -y {pkgs}{whole}"
        )
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "build.log"
    with log_path.open("a") as log:
        log.write(f"\n=== install started {time.strftime('%Y-%m-%d %H:%M:%S')} ===\n")
        sdist = _fetch_sdist(root, say, log)
        src = _extract(sdist, root, say)
        try:
            applied = patches.apply(src, variant)
        except patches.PatchError as e:
            raise EngineInstallError(str(e)) from e
        log.write(f"patches applied: {', '.join(applied) or 'none'}\n")
        build = build_dir(base, variant)
        flags = cmake_flags(variant, cuda_arch=cuda_arch, nvcc=find_nvcc() if variant == "cuda" else None)
        say("configuring with cmake", 0.0)
        _run(["cmake", "-S", str(src), "-B", str(build), *flags], log, log_path)
        n = jobs or os.cpu_count() or 2
        say(f"building {', '.join(BINARIES)} with {n} jobs ({BUILD_MINUTES[variant]})", 0.0)
        _run(["cmake", "--build", str(build), "--target", *BINARIES, "-j", str(n)], log, log_path,
             on_line=lambda line: _report_percent(line, say))
        say("installing", 1.0)
        stamp = _install_atomically(build / "bin", bin_dir, time.monotonic() - t0, log, log_path,
                                    variant=variant, flags=flags, applied=applied)
    return InstallResult(bin_dir, False, time.monotonic() - t0, stamp)


def _report_percent(line: str, say: Progress) -> None:
    m = _PERCENT.match(line)
    if m:
        say(line.strip()[:120], int(m.group(1)) / 100)


def _run(argv: list[str], log, log_path: Path, on_line: Callable[[str], None] | None = None) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        log.write(line)
        tail.append(line)
        del tail[:-15]
        if on_line:
            on_line(line)
    rc = proc.wait()
    log.flush()
    if rc != 0:
        raise EngineInstallError(
            f"`{' '.join(argv[:3])} …` failed with exit code {rc}; nothing was installed. "
            f"Full log: {log_path}\n" + "".join(tail)
        )


def _fetch_sdist(root: Path, say: Progress, log) -> Path:
    dest = root / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if dest.is_file():
        return dest
    say(f"downloading the {SDIST_PACKAGE}=={SDIST_VERSION} sdist", None)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
              f"{SDIST_PACKAGE}=={SDIST_VERSION}", "-d", tmp], log, root / "build.log")
        got = list(Path(tmp).glob("*.tar.gz"))
        if len(got) != 1:
            raise EngineInstallError(f"pip download gave {len(got)} archives in {tmp}, expected one sdist")
        os.replace(got[0], dest)
    return dest


def _extract(sdist: Path, root: Path, say: Progress) -> Path:
    src = root / "src"
    llama = src / "vendor" / "llama.cpp"
    if (llama / "CMakeLists.txt").is_file():
        return llama
    say("unpacking the vendored llama.cpp", None)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        top = [p for p in Path(tmp).iterdir() if p.is_dir()]
        if len(top) != 1 or not (top[0] / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            raise EngineInstallError(f"{sdist} does not contain vendor/llama.cpp; delete it and retry")
        if src.exists():
            shutil.rmtree(src)
        os.replace(top[0], src)
    return llama


def _install_atomically(built: Path, bin_dir: Path, seconds: float, log, log_path: Path, *,
                        variant: str = "cpu", flags: tuple[str, ...] = CMAKE_FLAGS,
                        applied: tuple[str, ...] = ()) -> dict:
    for b in BINARIES:
        if not _is_executable(built / b):
            raise EngineInstallError(f"the build did not produce {built / b}; nothing was installed. Log: {log_path}")
    staging = Path(tempfile.mkdtemp(prefix="bin.", dir=bin_dir.parent))
    try:
        for b in BINARIES:
            shutil.copy2(built / b, staging / b)
        out = subprocess.run([str(staging / "llama-server"), "--version"], capture_output=True, text=True, timeout=60)
        version_text = (out.stdout + out.stderr).strip()
        if out.returncode != 0:
            raise EngineInstallError(f"the built llama-server --version exited {out.returncode}: {version_text[-500:]}")
        stamp = {
            "engine": ENGINE,
            "package": SDIST_PACKAGE,
            "version": SDIST_VERSION,
            "llama_cpp_commit": LLAMA_CPP_COMMIT,
            "variant": variant,
            "cpu": this_cpu().fingerprint,
            "cpu_model": this_cpu().model,
            "cmake_flags": list(flags),
            "patches": list(applied),  # the source patches in place when it was built (llama_cpp/patches.py)
            "binaries": list(BINARIES),
            "version_output": version_text[-400:],
            "build_seconds": round(seconds, 1),
            "installed_at": time.time(),
            # each binary as installed: a file put in its place later is another build (engines.machine)
            "files": {b: {"bytes": (staging / b).stat().st_size, "mtime_ns": (staging / b).stat().st_mtime_ns}
                      for b in BINARIES},
        }
        (staging / STAMP).write_text(json.dumps(stamp, indent=2))
        if bin_dir.exists():
            old = bin_dir.with_name(f"{bin_dir.name}.old.{os.getpid()}")
            os.replace(bin_dir, old)
            shutil.rmtree(old)
        os.replace(staging, bin_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.write(f"installed into {bin_dir}\n")
    return stamp

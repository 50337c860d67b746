"""The llama-server adapter: a LoadConfig becomes an argv, and the load log becomes a measured Footprint.

fitevict is the fit authority, so every seat starts with ``--fit off``; the placement comes from
the planner. The server's host prompt cache (``--cache-ram``, 8192 MiB by default in the pinned
build) would grow host memory past what was priced, so seats start with ``-cram 0`` unless the
model's extra args set it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from fitevict.engines.base import LaunchSpec
from fitevict.engines.dryrun import override_args, split_args
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig

_FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


@lru_cache(maxsize=8)
def _probe_flags(binary: str, mtime_ns: int) -> frozenset[str]:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    return frozenset(m.group(1) for m in _FLAG.finditer(text))


def supported_flags(binary: Path) -> frozenset[str]:
    """The flags ``binary --help`` lists, probed once per binary file."""
    return _probe_flags(str(binary), binary.stat().st_mtime_ns)


class LlamaServerEngine:
    name = "llama-server"

    def __init__(self, binary: Path) -> None:
        self.binary = Path(binary)
        self.flags = supported_flags(self.binary)

    def _has(self, flag: str) -> bool:
        return flag in self.flags

    def launch_spec(self, model_path: Path, config: LoadConfig, port: int, *,
                    extra_args: Sequence[str] = (), embeddings: bool = False,
                    mmproj: Path | None = None) -> LaunchSpec:
        c = config
        argv: list[str] = [
            str(self.binary), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(c.n_ctx), "-np", str(c.n_parallel if c.n_parallel is not None else 1),
            "-ngl", str(c.n_gpu_layers if c.devices else 0),
            "-ctk", c.cache_type_k, "-ctv", c.cache_type_v, "-fa", c.flash_attn,
            "-b", str(c.n_batch), "-ub", str(c.n_ubatch),
        ]
        notes: list[str] = []
        if c.n_cpu_moe:
            argv += ["--n-cpu-moe", str(c.n_cpu_moe)]
        argv += override_args(c)  # after --n-cpu-moe: llama.cpp checks its rules first
        argv += split_args(c)
        if self._has("--fit"):
            argv += ["--fit", "off"]
        if not c.mmap:
            argv += ["-lm", "none"] if self._has("--load-mode") else ["--no-mmap"]
        if c.swa_full:
            argv.append("--swa-full")
        if c.kv_unified is not None:
            argv.append("-kvu" if c.kv_unified else "-no-kvu")
        env = dict(os.environ)
        if c.devices:
            argv += ["-dev", ",".join(c.devices)]
        else:
            argv += ["-dev", "none"]
            env["CUDA_VISIBLE_DEVICES"] = ""  # RAM-only: no CUDA device may be touched
        if embeddings or c.embeddings:  # priced only when the LoadConfig says so (its output buffer)
            argv.append("--embeddings")
            if not c.embeddings:
                notes.append("--embeddings from the model's settings, but the LoadConfig was priced without it; "
                             "its output buffer is larger than priced")
        if self._has("--cache-ram") and not ({"-cram", "--cache-ram"} & set(extra_args)):
            argv += ["-cram", "0"]
            notes.append("host prompt cache disabled (-cram 0) so host memory stays as priced")
        if mmproj is not None:  # the catalog's projector: priced by pricing.projector
            argv += ["--mmproj", str(mmproj)]
            if not c.devices and self._has("--no-mmproj-offload"):
                argv.append("--no-mmproj-offload")  # a RAM-only seat keeps its projector in RAM too
        if self._has("--no-webui"):
            argv.append("--no-webui")
        if self._has("--log-verbosity"):
            # buffer sizes, KV cells and print_info lines are logged at level 4 only in the pinned build
            argv += ["-lv", "4"]
        argv += list(extra_args)
        return LaunchSpec(tuple(argv), env, port, "/health", tuple(notes))

    def measured_footprint(self, log_text: str) -> Footprint | None:
        from fitevict.pricing.logparse import parse_load_log

        return parse_load_log(log_text).to_footprint()

"""An engine that crashes while loading with its extra CPU buffer types on is loaded again without them.

The pinned llama-server dies by SIGSEGV during warm-up on Intel AMX with quantized weights and repacking on
(``ggml_backend_amx_mul_mat``); with ``-nr`` the same file loads and serves. A seat that dies by one of
``CRASH_SIGNALS`` before it is ready, started with repacking on, is retried once with ``-nr``: priced again for that
configuration, and the fact is kept with the load's history (``repack_crash``, the file and the machine), so the
next load of the file on this engine build and CPU starts with ``-nr`` at once. An exit by SIGKILL (the OOM killer,
or fitevict itself) or any other failure is not retried. Pure.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from fitevict.pricing.loadconfig import LoadConfig

CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGILL, signal.SIGBUS, signal.SIGABRT})


@dataclass(frozen=True, slots=True)
class RepackCrash:
    """The first attempt of a load that crashed with repacking on, as history keeps it."""

    signal: str  # "SIGSEGV"
    seconds: float  # from the start of the load to the crash, stop included
    log: str
    predicted_bytes: int  # the whole price the crashed configuration was planned at (``Footprint.whole_bytes``)
    freed_bytes: int | None
    host_buffers: str  # the extra buffer types that were on

    def to_json(self) -> dict:
        return {"signal": self.signal, "seconds": round(self.seconds, 3), "log": self.log,
                "predicted_bytes": self.predicted_bytes, "freed_bytes": self.freed_bytes,
                "host_buffers": self.host_buffers}

    def reason(self, key: str) -> str:
        return (f"{key} loaded without repacking (-nr): llama-server died by {self.signal} while loading with its "
                f"extra CPU buffer types on ({self.host_buffers}); the retry cost {self.seconds:.2f} s, and this "
                "file now loads with -nr on this engine build and CPU")


def crash_signal(returncode: int | None) -> str | None:
    """The crash signal's name when an engine process ended by one of ``CRASH_SIGNALS``, else None."""
    if returncode is None or returncode >= 0:
        return None
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return None
    return sig.name if sig in CRASH_SIGNALS else None


def retry_without_repack(repacks: bool, cfg: LoadConfig, returncode: int | None) -> str | None:
    """The signal that makes this failed load worth one retry with ``-nr``, or None: a llama-server seat, started
    with repacking on, that crashed (not one killed by SIGKILL or one that exited)."""
    if not repacks or not cfg.repack:
        return None
    return crash_signal(returncode)


def exit_cause(code: int | None, oom: str | None = None) -> str:
    """How a serving seat's process ended, in one word: ``oom-killer`` (SIGKILL, and the kernel said it was its OOM
    killer: ``oom``, from ``host.oomkill.oom_evidence``), ``killed`` (SIGKILL, sender unknown), ``signal`` (another
    signal) or ``exit`` (an exit code)."""
    if code is not None and code < 0:
        if -code == signal.SIGKILL:
            return "oom-killer" if oom else "killed"
        return "signal"
    return "exit"


def exit_words(engine: str, code: int | None, oom: str | None = None) -> str:
    """How an engine process ended, from its exit code, in words: a kill by the kernel's OOM killer (``oom``: what
    the kernel said), a kill by SIGKILL from an unknown sender (the OOM killer where the kernel cannot be asked, or
    another program; fitevict's own stops are expected and never reach here), a crash by another signal, or an
    exit."""
    cause = exit_cause(code, oom)
    if cause == "oom-killer":
        return f"{engine} was killed by the kernel's OOM killer (SIGKILL, exit code {code}): {oom}"
    if cause == "killed":
        return f"{engine} was killed (SIGKILL, exit code {code}: the kernel's OOM killer, or another program)"
    if cause == "signal":
        try:
            name = signal.Signals(-code).name  # type: ignore[operator]
        except ValueError:
            name = f"signal {-code}"  # type: ignore[operator]
        return f"{engine} died by {name} (exit code {code})"
    return f"{engine} exited unexpectedly with code {code}"


def exit_reason(engine: str, code: int | None, oom: str | None = None) -> str:
    """Why a serving seat's process ended (``exit_words``), and what follows."""
    return f"{exit_words(engine, code, oom)}; the next request reloads it"

"""Where each figure of a history row came from, read from the event's own data (never a fixed label).

The supervisor records a load's predicted footprint (``details.predicted``, every term with its source, host
with its own: ``predicted`` is its whole price, ``buffers_predicted`` its buffers alone), the engine's account of its
buffers (``details.measured``, the ``allocated`` figure; a string when there was none, saying why) and the process's
PSS (``details.host_pss``); a refusal its plan (``details.plan.footprint``); a stop its
release (``details.freed_source``, ``details.release_note``). A figure that is absent is labelled "n/a" when the
event has no such figure at all (a refusal frees nothing) and "unavailable: <why>" when it should have had one.
Pure.
"""

from __future__ import annotations

from typing import Any

NA = "n/a"


def footprint_sources(fp: Any) -> str | None:
    """The sources of a ``Footprint.to_json()`` (every device term and the host figure), joined with "+" in sorted
    order, e.g. "dry-run+formula" or "stored-measurement"; None when ``fp`` is not a footprint."""
    if not isinstance(fp, dict) or "devices" not in fp:
        return None
    found: set[str] = set()
    for dev in fp.get("devices") or []:
        for s in (dev.get("sources") or {}).values():
            found.update(str(s).split("+"))
    host = fp.get("host") or {}
    if host.get("source"):
        found.update(str(host["source"]).split("+"))
    return "+".join(sorted(found)) or None


ENGINE_REPORTED = "engine-reported: the engine's own buffers (its load log or allocator trace)"


def pss_bytes(d: dict) -> int | None:
    """A load's PSS reading of the seat's process tree (committed + mapped), or None when it was not read."""
    pss = d.get("host_pss")
    if not isinstance(pss, dict) or pss.get("committed_bytes") is None or pss.get("mapped_bytes") is None:
        return None
    return int(pss["committed_bytes"]) + int(pss["mapped_bytes"])


def _predicted(d: dict) -> str | None:
    src = footprint_sources(d.get("predicted"))
    if src is None and isinstance(d.get("plan"), dict):
        src = footprint_sources(d["plan"].get("footprint"))
    return src


def _buffers_predicted(d: dict) -> str | None:
    fp = d.get("predicted")
    if not isinstance(fp, dict):
        return None
    return footprint_sources({"devices": fp.get("devices") or []})


def _allocated(d: dict) -> str | None:
    m = d.get("measured")
    if isinstance(m, str):
        return f"unavailable: {m}"
    src = footprint_sources(m)
    if src is None:
        return None
    return ENGINE_REPORTED if src in ("engine-reported", "measured") else f"{src}: the engine's own buffers"


def _host(ev: Any, d: dict) -> str | None:
    if ev.host_bytes is None:
        return None
    if d.get("host_source"):
        return str(d["host_source"])
    pss = d.get("host_pss")
    pss_ok = isinstance(pss, dict) and pss.get("committed_bytes") is not None
    measured = isinstance(d.get("measured"), dict)
    if pss_ok and measured:
        return (f"planned: the larger of measured PSS ({pss.get('source')}) and the engine-reported buffers + "
                "engine overhead")
    if pss_ok:
        return f"measured: PSS ({pss.get('source')})"
    if measured:
        return "engine-reported: logged buffers + engine overhead"
    if isinstance(pss, dict) and pss.get("reason"):
        return f"unavailable: {pss['reason']}"
    pred = _predicted(d)
    if pred is not None:
        return f"predicted ({pred}): nothing measured"
    return None


def _vram(ev: Any, d: dict) -> str | None:
    if ev.vram_bytes is None:
        return None
    if d.get("vram_source"):
        return str(d["vram_source"])
    if isinstance(d.get("measured"), dict):
        return "measured: NVML per-process bytes, else the engine's logged GPU buffers"
    pred = _predicted(d)
    return None if pred is None else f"predicted ({pred}): nothing measured"


def _freed(ev: Any, d: dict) -> str | None:
    if ev.freed_bytes is not None:
        return d.get("freed_source") or None
    if "release_verified" in d:
        return f"unavailable: {d.get('release_note') or 'the release check gave no figure'}"
    return None


def history_sources(ev: Any) -> dict[str, str]:
    """Per figure of ``ev`` (a store Event): its source as the event's data says, "n/a" when the event has no such
    figure, "unavailable: <why>" when it should have one and could not say where it came from."""
    d = ev.details if isinstance(ev.details, dict) else {}
    found = {
        "predicted": _predicted(d),
        "buffers_predicted": _buffers_predicted(d),
        "allocated": _allocated(d),
        "host": _host(ev, d),
        "vram": _vram(ev, d),
        "freed": _freed(ev, d),
    }
    values = {"predicted": ev.predicted_bytes, "buffers_predicted": ev.buffers_predicted_bytes,
              "allocated": ev.engine_reported_bytes, "host": ev.host_bytes,
              "vram": ev.vram_bytes, "freed": ev.freed_bytes}
    out: dict[str, str] = {}
    for k, src in found.items():
        if src is not None:
            out[k] = src
        elif values[k] is None:
            out[k] = NA
        else:
            out[k] = "unavailable: the event does not record where this figure came from"
    return out


def prediction_error(predicted: int | None, measured: int | None) -> dict[str, float | int] | None:
    """Predicted minus measured, in bytes and as a fraction of measured; None unless both exist."""
    if predicted is None or measured is None:
        return None
    return {"bytes": predicted - measured, "fraction": (predicted - measured) / measured if measured else 0.0}

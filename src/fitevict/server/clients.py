"""Who a request is, for fairness (``schedule.fair.Share``): its client (the name of the API key it brought), its
priority class and its key's caps, from the configuration (``[fair]``, ``[fair.keys.<name>]``).

The class is, first that is given: the request's ``x-fitevict-priority`` header, the API's own field where one
exists (OpenAI's ``service_tier``: ``flex`` is ``batch``, ``priority`` the top class, a class's name that class),
the key's ``class``, then ``fair.default_class``. A request may ask for its key's class or any lower one; a higher
one only when the key lists it in ``classes``.
"""

from __future__ import annotations

import hmac
from typing import Any

from fitevict.config import Config
from fitevict.config.records import KeyConfig
from fitevict.schedule.fair import ANONYMOUS, BATCH, Share, ranked, share_of
from fitevict.server.errors import ApiError

PRIORITY_HEADER = "x-fitevict-priority"
TIERS = {"flex": BATCH}  # OpenAI's service_tier values that name a class here ("priority": the top class)


def client_of(config: Config, key: str) -> str:
    """The client a valid key names: its ``[fair.keys]`` name, else ``key-N`` / ``admin-N`` (its place in
    server.api_keys / admin_keys, never the secret); ``-`` when keys are off."""
    if not config.server.auth_enabled:
        return ANONYMOUS
    for k in config.fair.keys.values():
        if _same(key, k.key):
            return k.name
    for prefix, keys in (("admin", config.server.admin_keys), ("key", config.server.api_keys)):
        for i, k in enumerate(keys):
            if _same(key, k):
                return f"{prefix}-{i + 1}"
    return ANONYMOUS


def share_for(config: Config, client: str, header: str | None, body: Any = None) -> Share:
    """The share of a request of ``client`` that asked for ``header`` (x-fitevict-priority) or, in ``body``, OpenAI's
    ``service_tier``. Raises a 400 for an unknown class and a 403 for a class above the key's that it may not ask."""
    fair = config.fair
    key: KeyConfig | None = fair.keys.get(client)
    own = key.klass if key is not None and key.klass is not None else fair.default_class
    asked, where = (header.strip(), PRIORITY_HEADER) if header else (_tier(fair.classes, body), "service_tier")
    klass = asked or own
    names = [n for n, _w in ranked(fair.classes)]
    if klass not in names:
        raise ApiError(400, f"{where}: priority class {klass!r} is not one of {', '.join(names)} (fair.classes)",
                       param=where, code="unknown_priority")
    if names.index(klass) < names.index(own) and (key is None or klass not in key.classes):
        raise ApiError(403, f"{where}: the key {client!r} may ask for its class {own!r} or a lower one "
                            f"({', '.join(names[names.index(own):])}), not {klass!r}; list it in "
                            f"fair.keys.<name>.classes to allow it", type="permission_error",
                       param=where, code="priority_not_allowed")
    cap_in = key.max_in_flight if key is not None and key.max_in_flight is not None else fair.key_max_in_flight
    cap_q = key.max_queue if key is not None and key.max_queue is not None else fair.key_max_queue
    return share_of(fair.classes, klass, client, key_weight=key.weight if key is not None else 1.0,
                    max_in_flight=cap_in, max_queue=cap_q)


def _tier(classes: Any, body: Any) -> str | None:
    """The class OpenAI's ``service_tier`` names, if any (``auto`` and ``default``: none)."""
    tier = body.get("service_tier") if isinstance(body, dict) else None
    if not isinstance(tier, str) or tier in ("auto", "default"):
        return None
    if tier == "priority":
        return ranked(classes)[0][0]
    return TIERS.get(tier, tier) if TIERS.get(tier, tier) in classes else None


def _same(given: str, key: str) -> bool:
    """Constant-time comparison, so a key cannot be guessed from response timing."""
    return bool(given) and hmac.compare_digest(given.encode(), key.encode())


__all__ = ["PRIORITY_HEADER", "client_of", "share_for"]

"""``/metrics`` of the cluster's front door: every node door's own ``/metrics``, merged, each sample with a ``node``
label (the Ray node id), and the front door's own figures (``fitevict_cluster_*``).

The nodes' figures are merged rather than re-derived from their facts: each node's door already measures its
budget, residents, requests, loads, evictions and releases, and the merge keeps all of them, each where it was
measured. A metric family appears once, its samples from every node under it (Prometheus' text format wants a
family's lines together). A node that does not answer the scrape is missing from it;
``fitevict_cluster_node_routable`` still names it. Pure: the nodes' texts in, one text out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_META = re.compile(r"^# (HELP|TYPE) (\S+)")
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*")


def label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def with_node(line: str, node: str) -> str:
    """One sample line with ``node="<node>"`` as its first label."""
    m = _NAME.match(line)
    if m is None:
        return line
    name, rest, lab = m.group(), line[m.end():], f'node="{label_value(node)}"'
    if rest.startswith("{}"):
        return f"{name}{{{lab}}}{rest[2:]}"
    if rest.startswith("{"):
        return f"{name}{{{lab},{rest[1:]}"
    return f"{name}{{{lab}}}{rest}"


def merged(per_node: Mapping[str, str]) -> str:
    """The nodes' exposition texts as one: each family once (its first HELP and TYPE lines), with every node's
    samples under it, each labelled with its node."""
    families: dict[str, dict[str, Any]] = {}
    for node in sorted(per_node):
        current: str | None = None
        for line in per_node[node].splitlines():
            if not line.strip():
                continue
            meta = _META.match(line)
            if meta is not None:
                current = meta.group(2)
                fam = families.setdefault(current, {"HELP": None, "TYPE": None, "samples": []})
                fam[meta.group(1)] = fam[meta.group(1)] or line
            elif not line.startswith("#"):
                if current is None:  # a sample before any HELP or TYPE line: its own family
                    current = _NAME.match(line).group() if _NAME.match(line) else line
                    families.setdefault(current, {"HELP": None, "TYPE": None, "samples": []})
                families[current]["samples"].append(with_node(line, node))
    out: list[str] = []
    for fam in families.values():
        out += [line for line in (fam["HELP"], fam["TYPE"]) if line] + fam["samples"]
    return "\n".join(out) + "\n" if out else ""


def own(nodes: Iterable[Mapping[str, Any]], routed: Mapping[tuple[str, str], int]) -> str:
    """The front door's figures: each member node (``Fleet.rows``) routable or not, its facts' age, and the
    requests relayed to each node by route."""
    rows = sorted(nodes, key=lambda r: r["node"])
    lines = ["# HELP fitevict_cluster_node_routable 1 while the node takes requests (fresh facts, its door reached)",
             "# TYPE fitevict_cluster_node_routable gauge"]
    lines += [f'fitevict_cluster_node_routable{{node="{label_value(r["node"])}"}} {int(bool(r["routable"]))}'
              for r in rows]
    lines += ["# HELP fitevict_cluster_facts_age_seconds Age of the node's latest facts at this scrape",
              "# TYPE fitevict_cluster_facts_age_seconds gauge"]
    lines += [f'fitevict_cluster_facts_age_seconds{{node="{label_value(r["node"])}"}} {float(r["facts_age_s"])}'
              for r in rows if r.get("facts_age_s") is not None]
    lines += ["# HELP fitevict_cluster_routed_total Requests relayed to a node by this front door, by route "
              "(hit, load, evict, wait)", "# TYPE fitevict_cluster_routed_total counter"]
    lines += [f'fitevict_cluster_routed_total{{node="{label_value(n)}",route="{label_value(w)}"}} {c}'
              for (n, w), c in sorted(routed.items())]
    return "\n".join(lines) + "\n"


def text(per_node: Mapping[str, str], nodes: Iterable[Mapping[str, Any]],
         routed: Mapping[tuple[str, str], int]) -> str:
    """The whole ``/metrics`` answer: the front door's own figures, then the nodes'."""
    return own(nodes, routed) + merged(per_node)

"""The node agent's cluster key: the node's own config first."""

from __future__ import annotations

from pathlib import Path

from fitevict.cluster.agent import node_key


def test_the_node_key_is_the_nodes_own_config(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FITEVICT_CONFIG", "")
    monkeypatch.delenv("FITEVICT_CLUSTER_KEY", raising=False)
    assert node_key() is None
    monkeypatch.setenv("FITEVICT_CLUSTER_KEY", "ck-node")
    assert node_key() == "ck-node"
    monkeypatch.setenv("FITEVICT_CLUSTER_KEY", "two words")  # a config that does not load: the door says why
    assert node_key() is None

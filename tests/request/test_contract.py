"""The per-request load contract: keep_alive durations, the internal embeddings key, and what a contract fixes."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from fitevict import planner as pl
from fitevict.config import ModelConfig
from fitevict.request.ask import load_config_for
from fitevict.request.catalog import CatalogEntry
from fitevict.request.contract import (Contract, ContractError, fixed_fields, for_embeddings, parse_contract,
                                       parse_keep_alive)


@pytest.mark.parametrize("given,seconds", [
    (0, 0.0), (-1, math.inf), ("-1", math.inf), ("-1m", math.inf), (90, 90.0), (2.5, 2.5), ("90", 90.0),
    ("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), ("250ms", 0.25), ("1m30s", 90.0), (None, None),
])
def test_keep_alive_durations(given, seconds) -> None:
    assert parse_keep_alive(given, "keep_alive") == seconds


@pytest.mark.parametrize("given", ["5 parsecs", "m", "5x", "", True, [1], "1h30"])
def test_keep_alive_that_is_not_a_duration_is_refused_with_the_forms_allowed(given) -> None:
    with pytest.raises(ContractError) as e:
        parse_keep_alive(given, "fitevict.keep_alive")
    assert e.value.param == "fitevict.keep_alive" and "5m" in str(e.value)


def test_keep_alive_in_the_openai_contract() -> None:
    assert parse_contract({"keep_alive": "10m"}) == Contract(keep_alive=600.0)
    assert parse_contract({"keep_alive": -1}).keep_alive == math.inf


def test_keep_alive_fixes_nothing_on_the_seat() -> None:
    assert fixed_fields(Contract(keep_alive=0.0)) == frozenset()


def test_embeddings_is_internal_a_request_body_cannot_set_it() -> None:
    with pytest.raises(ContractError) as e:
        parse_contract({"embeddings": True})
    assert e.value.param == "fitevict.embeddings" and "unknown key" in str(e.value)


def _entry(tmp_path: Path, **settings) -> CatalogEntry:
    path = tmp_path / "m.gguf"
    return CatalogEntry(key="m", path=path, engine="llama-server", aliases=(), pinned=False, file_bytes=0,
                        settings=ModelConfig(key="m", **settings), mmproj=None, gguf_files=(), model_dir=tmp_path)


def test_an_embeddings_request_asks_for_an_embeddings_seat(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    plain, _, _ = load_config_for(entry, None, "max-gpu")
    emb, _, _ = load_config_for(entry, for_embeddings(None), "max-gpu")
    assert plain.embeddings is False and emb.embeddings is True
    assert fixed_fields(for_embeddings(None)) == frozenset({"embeddings"})
    assert for_embeddings(Contract(ctx=512)) == Contract(ctx=512, embeddings=True)
    # the model's own setting still gives an embeddings seat to every request
    configured, _, _ = load_config_for(_entry(tmp_path, embeddings=True), None, "max-gpu")
    assert configured.embeddings is True


def test_an_embeddings_seat_serves_chat_but_a_chat_seat_not_embeddings(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    chat_cfg, _, _ = load_config_for(entry, None, "max-gpu")
    emb_cfg = replace(chat_cfg, embeddings=True)

    def req(contract: Contract | None) -> pl.PlanRequest:
        cfg, mode, _ = load_config_for(entry, contract, "max-gpu")
        return pl.PlanRequest(key="m", config=cfg, alloc_mode=mode, n_layer=4, n_moe_layers=0, n_ctx_train=4096,
                              pinned=False, source="", fixed=fixed_fields(contract))

    assert pl.compatible(emb_cfg, req(None))  # measured: an --embeddings llama-server answers chat completions
    assert pl.compatible(emb_cfg, req(for_embeddings(None)))
    assert not pl.compatible(chat_cfg, req(for_embeddings(None)))

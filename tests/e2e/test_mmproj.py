"""A multimodal projector: found beside its model, passed as --mmproj, and priced (weights exactly from the file,
compute from the engine's own estimate) against the allocator's bytes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.dryrun import DryRun, capture_load_log, dry_run
from fitevict.engines.llama_cpp.server import LlamaServerEngine
from fitevict.pricing.buftrace import parse_exact_log, parse_trace
from fitevict.pricing.footprint import HOST
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.pricing.price import price
from fitevict.pricing.projector import price_projector, with_projector
from fitevict.request.catalog import Catalog
from fitevict.zoo import write_zoo
from fitevict.zoo.mmproj import write_mmproj
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

pytestmark = pytest.mark.e2e

CFG = LoadConfig(n_ctx=1000, n_parallel=1)


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("vision")
    (model,) = write_zoo(d, only=["llama-gqa"])
    n_embd = load_structure(model.path).n_embd  # the projection ends in the text model's width
    return model.path, write_mmproj(d / "mmproj-llama-gqa-f16.gguf", n_embd_text=n_embd)


def test_the_catalog_attaches_the_projector_and_the_seat_passes_it(vision: tuple[Path, Path], llama_server: Path,
                                                                     tmp_path: Path) -> None:
    model, proj = vision
    entry = Catalog.scan([model.parent]).resolve("llama-gqa")
    assert entry.mmproj == proj
    argv = LlamaServerEngine(llama_server).launch_spec(model, CFG, 8080, mmproj=entry.mmproj).argv
    assert argv[argv.index("--mmproj") + 1] == str(proj)


def test_projector_priced_against_the_allocator(vision: tuple[Path, Path], engine_bin_dir: Path) -> None:
    model, proj = vision
    dry = dry_run(engine_bin_dir, model, CFG, use_cache=False, mmproj=proj)
    assert isinstance(dry, DryRun) and dry.projector_estimate is not None
    pp = price_projector(load_structure(proj), dry.projector_estimate)
    cap = capture_load_log(engine_bin_dir, model, CFG, exact=True, wait_listening=True, mmproj=proj,
                           warmup=True)  # as a seat starts: the projector reserves its compute in its warm-up
    assert cap.ok, cap.reason
    text_model = parse_exact_log(cap.text)
    assert text_model.precision_bytes == 0, text_model.notes
    used = Counter(n for pairs in (text_model.model_buffers, text_model.kv_lines, text_model.output_buffers,
                                   text_model.compute_buffers) for _, n in pairs)
    left = Counter(b.bytes for b in parse_trace(cap.text).live if b.bytes) - used
    weights, compute = sorted(left.elements(), reverse=True)  # the projector's two buffers: weights, compute
    assert pp.weights.bytes == weights and pp.weights.source == "formula"
    assert pp.compute.source == "dry-run" and abs(pp.compute.value - compute) <= PRECISION_BYTES
    # the seat's footprint carries it as committed host memory
    base = price(load_structure(model), CFG, compute=dry.compute, host=HERE).footprint
    both = with_projector(base, pp)
    assert both.host_committed_bytes == base.host_committed_bytes + weights + pp.compute.value
    host = both.device(HOST)
    assert host is not None and host.model.bytes == base.device(HOST).model.bytes + weights  # type: ignore[union-attr]

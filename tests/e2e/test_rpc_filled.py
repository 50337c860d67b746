"""With the context filled, an RPC device's price holds against its rpc-server's measured memory.

A real ``ggml-rpc-server`` on loopback, a seat with every layer on its device RPC0, every slot's context filled (twice:
from the second fill on the server's heap keeps its largest input, as on a server that has served a while;
``engines/llama_cpp/rpcfilled.py``). The server's PSS growth over its idle baseline, read by the supervisor's own
reader (``host.devmem.RpcServerReader``), against RPC0's price as ``fitevict price`` makes it: the engine's buffers
there and the rpc-server's own parts (``pricing/rpcserver``). Target: within 2 % under and 10 % over."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.rpcfilled import fill_rpc_seat, predict_rpc
from fitevict.pricing.loadconfig import LoadConfig

pytestmark = pytest.mark.e2e

BELOW, ABOVE = 0.02, 0.10
SEAT = LoadConfig(n_ctx=2048, n_parallel=1, devices=("RPC0",), n_gpu_layers=99)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from fitevict.zoo import write_zoo

    return {m.name: m.path for m in write_zoo(tmp_path_factory.mktemp("rpc-fill"),
                                             only=("llama-medium", "llama-q4_0"))}


@pytest.mark.parametrize("model", ["llama-medium", "llama-q4_0"])  # 200 MB in F16; 9 MB in Q4_0
def test_the_rpc_devices_price_holds_against_the_servers_growth_through_a_filled_context(
        engine_bin_dir: Path, models: dict[str, Path], model: str, tmp_path: Path) -> None:
    priced = predict_rpc(engine_bin_dir, models[model], SEAT)
    got = fill_rpc_seat(engine_bin_dir, models[model], SEAT, tmp_path)
    assert all(p + g == 2048 for p, g in got.tokens), got.tokens  # the context was full
    err = (priced.total - got.filled) / got.filled
    detail = (f"RPC0 priced {priced.total:,} B (buffers {priced.buffers}, rpc-server "
              f"{[(t.name, t.bytes) for t in priced.terms]}), measured growth {got.filled:,} B ({err:+.2%}; first "
              f"fill {got.first:,} B, listening {got.loaded:,} B), traced buffers {got.traced}")
    print(detail)
    assert -BELOW <= err <= ABOVE, detail

"""The default split over several GPUs, against llama.cpp's own rule (llama-model.cpp, load_tensors, pinned build).

The oracle is llama.cpp's code itself: the split lines of ``llama_model::load_tensors`` (free memory as ``float``,
float32 running sums, ``std::upper_bound``) and ``-ts`` parsing (``std::stof``), compiled here. For each free-memory
vector it gives the device of every offloaded layer twice: by free memory (what an engine started without ``-ts``
does) and from the ``-ts`` string fitevict passes. Both must equal fitevict's ``layer_devices``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fitevict.engines.llama_cpp.server import split_args
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import default_split, layer_devices, layers_per_device
from fitevict.units import GiB, MiB

ORACLE = r"""
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
// argv: n_layer_all n_gpu_layers mode(free|ts) values...; prints the device index per layer 0..n_layer_all
// (-1 = CPU), the last one being the output layer. The split lines are llama-model.cpp's (load_tensors).
int main(int argc, char ** argv) {
    const int n_layer_all = atoi(argv[1]);
    const int n_gpu_layers = atoi(argv[2]);
    const std::string mode = argv[3];
    const size_t n = argc - 4;
    std::vector<float> splits(n);
    for (size_t i = 0; i < n; ++i) {
        if (mode == "free") {
            size_t free = strtoull(argv[4 + i], nullptr, 10);
            splits[i] = free;
        } else {
            splits[i] = std::stof(argv[4 + i]);  // common/arg.cpp, -ts
        }
    }
    float split_sum = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        split_sum += splits[i];
        splits[i] = split_sum;
    }
    for (size_t i = 0; i < n; ++i) {
        splits[i] /= split_sum;
    }
    const int i_gpu_start = std::max(n_layer_all + 1 - n_gpu_layers, 0);
    const int act_gpu_layers = std::min(n_gpu_layers, n_layer_all + 1);
    for (int il = 0; il <= n_layer_all; ++il) {
        if (il < i_gpu_start || (il - i_gpu_start) >= act_gpu_layers) {
            printf("-1\n");
            continue;
        }
        const int layer_gpu = std::upper_bound(splits.begin(), splits.begin() + n, float(il - i_gpu_start)/act_gpu_layers) - splits.begin();
        printf("%d\n", layer_gpu);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build llama.cpp's split rule")
    d = tmp_path_factory.mktemp("split-oracle")
    (d / "split.cpp").write_text(ORACLE)
    subprocess.run([cxx, "-O0", "-std=c++17", "-o", str(d / "split"), str(d / "split.cpp")], check=True)
    return d / "split"


def llama_cpp(oracle: Path, n_layer: int, ngl: int, mode: str, values: list[str],
              devices: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    out = subprocess.run([str(oracle), str(n_layer), str(ngl), mode, *values], check=True, capture_output=True,
                         text=True).stdout.split()
    devs = tuple(HOST if int(k) < 0 else devices[int(k)] for k in out)
    return devs[:-1], devs[-1]


def ts_values(cfg: LoadConfig) -> list[str]:
    args = split_args(cfg)
    return args[1].split(",")


CASES = [
    # (blocks, -ngl, free bytes per GPU)
    (32, 33, (int(70.1 * GiB), int(69.9 * GiB))),  # two nearly equal H200s: 17 and 16 layers
    (32, 33, (60 * GiB, 20 * GiB)),  # unequal: 25 and 8
    (32, 33, (10 * GiB, 10 * GiB, 20 * GiB)),  # three GPUs: 9, 8 and 16
    (32, 10, (3 * GiB, 1 * GiB)),  # partial offload: blocks 23..31 and the output, 8 and 2
    (7, 8, (GiB, GiB)),  # a split point that falls exactly on a layer: 4 and 4
    (40, 41, (23 * GiB + 417 * MiB, 512 * MiB)),  # a nearly full second GPU gets one layer
    (5, 6, (34359738367, 34359738369)),  # sizes that float32 rounds
]


@pytest.mark.parametrize(("n_layer", "ngl", "free"), CASES)
def test_layers_fall_where_llama_cpp_puts_them(oracle: Path, n_layer: int, ngl: int, free: tuple[int, ...]) -> None:
    devices = tuple(f"CUDA{i}" for i in range(len(free)))
    weights = default_split(devices, dict(zip(devices, free)))
    ours = layer_devices(n_layer, ngl, devices, weights)
    assert ours == llama_cpp(oracle, n_layer, ngl, "free", [str(f) for f in free], devices)
    # the -ts fitevict passes (layers per device) makes the engine place every layer the same way
    counts = layers_per_device(n_layer, ngl, devices, weights)
    assert sum(counts) == min(ngl, n_layer + 1)
    cfg = LoadConfig(devices=devices, n_gpu_layers=ngl, tensor_split=counts)
    assert llama_cpp(oracle, n_layer, ngl, "ts", ts_values(cfg), devices) == ours
    assert layer_devices(n_layer, ngl, devices, counts) == ours


def test_the_known_splits() -> None:
    """The layer counts of the cases above, worked by hand from the rule (split point = free share; layer j of act
    goes to the first device whose split point exceeds j/act)."""
    two, three = ("CUDA0", "CUDA1"), ("CUDA0", "CUDA1", "CUDA2")
    assert layers_per_device(32, 33, two, default_split(two, {"CUDA0": int(70.1 * GiB), "CUDA1": int(69.9 * GiB)})) \
        == (17.0, 16.0)
    assert layers_per_device(32, 33, two, (60.0 * GiB, 20.0 * GiB)) == (25.0, 8.0)
    assert layers_per_device(32, 33, three, (10.0 * GiB, 10.0 * GiB, 20.0 * GiB)) == (9.0, 8.0, 16.0)
    assert layers_per_device(32, 10, two, (3.0, 1.0)) == (8.0, 2.0)
    assert layers_per_device(7, 8, two, (1.0, 1.0)) == (4.0, 4.0)
    assert layers_per_device(7, 0, two, (1.0, 1.0)) == ()


@settings(max_examples=60, deadline=None)
@given(n_layer=st.integers(1, 80), data=st.data(),
       free=st.lists(st.integers(0, 200 * GiB), min_size=2, max_size=4).filter(any))
def test_layer_counts_reproduce_any_free_memory_split(n_layer: int, data: st.DataObject, free: list[int]) -> None:
    """Passing the layers per device as -ts places every layer where the free-memory split put it."""
    ngl = data.draw(st.integers(1, n_layer + 1))
    devices = tuple(f"CUDA{i}" for i in range(len(free)))
    weights = default_split(devices, dict(zip(devices, free)))
    counts = layers_per_device(n_layer, ngl, devices, weights)
    assert layer_devices(n_layer, ngl, devices, counts) == layer_devices(n_layer, ngl, devices, weights)

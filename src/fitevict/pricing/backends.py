"""What a device backend does with the weights and buffers it is given: one record per backend, read by placement.

llama.cpp (0c1e570) asks each device, not a table, and the answers differ per backend and per device:

- **its buffers' names**: ``ggml_backend_dev_buffer_type(dev)``'s name is the device's own for CUDA and Vulkan
  (``CUDA0``, ``Vulkan0``), but ``RPC<i>[HOST:PORT]`` for an RPC device, ``i`` the device's index on its own
  rpc-server (ggml-rpc.cpp ``ggml_backend_rpc_buffer_type``), so two rpc-servers' devices RPC0 and RPC1 both
  allocate buffers named ``RPC0[...]``, told apart by their endpoints;
- **its host buffer type** (``get_host_buffer_type``): ``CUDA_Host``, ``Vulkan_Host``; RPC has none. The host
  weights of a placement try the first device's host buffer first (``make_cpu_buft_list``); with none they try the
  CPU's extra buffer types (``CPU_REPACK``, ...) as a CPU-only load does. ``Vulkan_Host`` adds 32 bytes to every
  allocation ("behave like the CPU buffer type"): a host-buffer output or weight buffer is that much larger;
- **its alignment** (``get_alignment``: CUDA 128; Vulkan the device's ``minStorageBufferOffsetAlignment``; RPC the
  remote backend's) and **padding** (``get_alloc_size``: CUDA pads quantized rows to 512 elements; Vulkan and RPC to
  a CPU server allocate ``ggml_nbytes``);
- **what it can run** (``supports_op`` for each weight's op, asked by ``select_weight_buft``): a weight whose op the
  device rejects falls to the host buffer list. The answer depends on the op, the type and the shape, and on the
  model's own dimensions the loader builds the op's other inputs from (``weight_buft_supported`` in
  llama-model-loader.cpp: a mamba2 ``ssm_a`` of shape ``{1, n_head}`` is tested in an SSM_SCAN of the model's
  ``ssm_d_state`` and ``ssm_d_inner / n_head``; Vulkan runs it for a state of 128 or 256 only), so it is kept per
  weight kind: the name within its block, the ggml type, the shape and those dimensions (``op_context``).

A probe of the engine learns these per engine build and device (``engines/llama_cpp/devprobe.py``, source
``probe``); a device never probed gets its family's rule below, labelled ``rule-table``. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from fitevict.pricing.ggml_types import is_quantized, pad, row_size

# (name within its block, ggml type name, shape, the model's op context): what supports_op sees
Kind = tuple[str, str, tuple[int, ...], tuple[int, ...]]
_BLOCK = re.compile(r"^blk\.\d+\.")


class _Dims(Protocol):
    n_embd: int
    n_head: tuple[int, ...]
    value_length: int
    expert_used_count: int
    ssm_d_inner: int
    ssm_d_state: int
    ssm_n_group: int


def op_context(s: _Dims) -> tuple[int, ...]:
    """The model's dimensions the loader's op test (``weight_buft_supported``) reads beside the weight itself:
    SSM_SCAN's ``ssm_d_state``, ``ssm_d_inner`` and ``ssm_n_group``; MUL_MAT_ID's and ADD_ID's experts used; ROPE's
    head size and head count; IM2COL's ``n_embd``. Two models that agree on these and on a weight's type and shape
    get the same answer from a device."""
    return (s.ssm_d_state, s.ssm_d_inner, s.ssm_n_group, s.expert_used_count, s.value_length,
            next((h for h in s.n_head if h), 0), s.n_embd)


def weight_kind(name: str, ggml_type: str, shape: tuple[int, ...], context: tuple[int, ...]) -> Kind:
    """A weight's kind: its name without the ``blk.N.`` prefix, its type, its shape (ne, first dimension first) and
    its model's ``op_context``."""
    return _BLOCK.sub("", name), ggml_type, tuple(int(x) for x in shape), tuple(int(x) for x in context)


@dataclass(frozen=True, slots=True)
class BackendRules:
    """One device's answers to what placement asks of it."""

    family: str  # the device name without its index: "CUDA", "Vulkan", "RPC", "Metal", ...
    alignment: int  # the device buffer type's alignment: every tensor is padded to it
    row_padding: int = 0  # quantized rows padded to this many elements (CUDA: 512); 0: none
    host_buffer: str | None = None  # the device's host buffer type ("CUDA_Host", "Vulkan_Host"); None: it has none
    host_alignment: int = 32  # the host buffer type's alignment
    host_extra: int = 0  # bytes each host-buffer allocation adds beyond its tensors (Vulkan_Host: 32)
    rejects: tuple[Kind, ...] = ()  # weight kinds the device cannot run: they stay in host memory
    accepts: tuple[Kind, ...] = ()  # weight kinds the probe saw the device take (the rest is not known)
    source: str = "rule-table"  # "probe" (the engine's answer, ``detail`` names the build and device) or "rule-table"
    detail: str = ""

    def runs(self, kind: Kind) -> bool:
        return kind not in self.rejects

    def alloc(self, ggml_type: object, shape: tuple[int, ...], nbytes: int) -> int:
        """Bytes a device buffer gives one weight: its alloc size (quantized row padding) padded to the alignment."""
        size = nbytes
        if self.row_padding and is_quantized(ggml_type) and shape and shape[0] % self.row_padding:  # type: ignore[arg-type]
            size += row_size(ggml_type, self.row_padding - shape[0] % self.row_padding)  # type: ignore[arg-type]
        return pad(size, self.alignment)

    def label(self) -> str:
        return f"{self.family}: {self.source}{' (' + self.detail + ')' if self.detail else ''}"

    def to_json(self) -> dict:
        return {"family": self.family, "alignment": self.alignment, "row_padding": self.row_padding,
                "host_buffer": self.host_buffer, "host_alignment": self.host_alignment,
                "host_extra": self.host_extra, "rejects": [_kind_json(k) for k in self.rejects],
                "accepts": [_kind_json(k) for k in self.accepts],
                "source": self.source, "detail": self.detail}

    @staticmethod
    def from_json(d: Mapping) -> "BackendRules":
        def kinds(v: object) -> tuple[Kind, ...]:
            return tuple((str(k[0]), str(k[1]), tuple(int(x) for x in k[2]),
                          tuple(int(x) for x in (k[3] if len(k) > 3 else ()))) for k in v)  # type: ignore[union-attr]

        return BackendRules(str(d["family"]), int(d["alignment"]), int(d.get("row_padding", 0)),
                            None if d.get("host_buffer") is None else str(d["host_buffer"]),
                            int(d.get("host_alignment", 32)), int(d.get("host_extra", 0)),
                            kinds(d.get("rejects", ())), kinds(d.get("accepts", ())), str(d.get("source", "probe")),
                            str(d.get("detail", "")))


def _kind_json(k: Kind) -> list:
    return [k[0], k[1], list(k[2]), list(k[3])]


def family(device: str) -> str:
    return device.rstrip("0123456789")


def rule_for(device: str) -> BackendRules:
    """The pinned build's rule for a device never probed, from its backend's source, labelled ``rule-table``. Where
    the source leaves a figure to the device (Vulkan's alignment), the rule takes a common one and says so."""
    fam = family(device)
    if fam in ("CUDA", "ROCm"):  # ggml-cuda: 128-byte alignment, quantized rows padded to MATRIX_ROW_PADDING
        return BackendRules(fam, 128, 512, f"{fam}_Host", source="rule-table", detail="ggml-cuda's source")
    if fam == "Vulkan":  # the alignment is the device's minStorageBufferOffsetAlignment: unknown until probed
        return BackendRules(fam, 64, 0, "Vulkan_Host", 64, 32, source="rule-table",
                            detail="ggml-vulkan's source; alignment 64 assumed (the device's "
                                   "minStorageBufferOffsetAlignment, not probed)")
    if fam == "RPC":  # the remote backend's alignment (a CPU rpc-server: 32); no host buffer type
        return BackendRules(fam, 32, 0, None, source="rule-table",
                            detail="ggml-rpc's source; a CPU rpc-server's alignment 32 assumed (not probed)")
    if fam == "Metal":
        return BackendRules(fam, 32, 0, None, source="rule-table", detail="ggml-metal's source")
    return BackendRules(fam, 128, 0, f"{fam}_Host", source="rule-table",
                        detail=f"no rule for {fam}: CUDA-like alignment 128 and a {fam}_Host buffer assumed")


@dataclass(frozen=True, slots=True)
class DeviceBackend:
    """One device of a placement: its name, the name of its buffers, and its backend's rules."""

    device: str  # "Vulkan0", "RPC1", "CUDA0"
    buffer: str  # "Vulkan0", "RPC0[127.0.0.1:50053]", "CUDA0"
    rules: BackendRules


def rpc_buffer_name(device: str, rpc: tuple[str, ...]) -> str:
    """``RPC<k>``'s buffer type name when each rpc-server serves one device (its default: the first accelerator,
    else its CPU): the k-th endpoint's device 0."""
    k = int(device[3:]) if device[3:].isdigit() else 0
    return f"RPC0[{rpc[k]}]" if k < len(rpc) else device


def device_backends(devices: tuple[str, ...], rpc: tuple[str, ...] = (),
                    learned: Mapping[str, BackendRules] | None = None,
                    buffers: Mapping[str, str] | None = None) -> tuple[DeviceBackend, ...]:
    """Each device of a placement with its buffer name (``buffers`` as the engine listed them, else the one-device-
    per-server rule for RPC) and its rules (``learned`` by the probe, else ``rule_for``)."""
    out = []
    for d in devices:
        buf = (buffers or {}).get(d) or (rpc_buffer_name(d, rpc) if family(d) == "RPC" else d)
        out.append(DeviceBackend(d, buf, (learned or {}).get(d) or rule_for(d)))
    return tuple(out)

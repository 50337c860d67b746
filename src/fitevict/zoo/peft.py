"""Demo PEFT adapters for the HF demo base: small, deterministic LoRA folders that a transformers seat really applies.

An adapter ``X`` of the HF zoo folder ``<base>`` is written with peft (``LoraConfig(init_lora_weights=False)``, so
that it changes the output from the first token: rank 4 on the attention q and v projections of every layer,
weights scaled up so greedy decoding follows each adapter) and saved with ``save_pretrained`` to
``<base>.adapters/X/`` beside the base folder; its ``base_model_name_or_path`` is the base's folder name, so the
catalog serves it as ``<base>:X`` wherever the two folders are copied together. Building needs torch and peft, so
it runs in a child process (``python -m fitevict.zoo.peft BASE_DIR NAME...``): importing this module imports
neither.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fitevict.paths import fresh_folder
from fitevict.zoo import ZooError

DEMO_PEFT_ADAPTERS: tuple[str, ...] = ("sql", "poem")
DEMO_PEFT_BASE = "hf-llama-gqa"
RANK = 4
TARGETS: tuple[str, ...] = ("q_proj", "v_proj")
_GAIN = 3.0  # LoRA weights multiplied by this after a random init: greedy tokens follow the adapter


@dataclass(frozen=True, slots=True)
class PeftZooAdapter:
    """One written adapter folder. ``file_bytes``: its weights file's size (a file-size figure, not a price)."""

    base: str
    name: str
    path: Path
    file_bytes: int


def adapters_dir(base_dir: Path) -> Path:
    """Where the PEFT adapters of the HF folder ``base_dir`` are written: ``<base>.adapters/`` beside it."""
    return base_dir.with_name(base_dir.name + ".adapters")


def write_peft_adapters(base_dir: Path, names: Iterable[str] = DEMO_PEFT_ADAPTERS) -> list[PeftZooAdapter]:
    """Write the demo PEFT adapters ``names`` of the HF folder ``base_dir`` (rewritten each time) in a child
    process."""
    base_dir = Path(base_dir)
    names = list(names)
    if not (base_dir / "config.json").is_file():
        raise ZooError(f"{base_dir}: not an HF model folder (no config.json); write it first "
                       f"(fitevict demo-models DIR --only {DEMO_PEFT_BASE})")
    with tempfile.TemporaryFile("w+") as errf:  # a file, not a pipe: a full stderr pipe would stall the child
        proc = subprocess.run([sys.executable, "-m", "fitevict.zoo.peft", str(base_dir), *names],
                              stdout=subprocess.DEVNULL, stderr=errf, text=True,
                              env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        if proc.returncode != 0:
            errf.seek(0)
            raise ZooError(f"writing the PEFT adapters of {base_dir} failed (exit {proc.returncode}): "
                           f"{errf.read().strip()[-800:]}")
    out = []
    for n in names:
        folder = adapters_dir(base_dir) / n
        out.append(PeftZooAdapter(base_dir.name, n, folder, (folder / "adapter_model.safetensors").stat().st_size))
    return out


# ----------------------------------------------------------------------------- the child process (imports torch)


def build(base_dir: Path, name: str) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    dest = adapters_dir(base_dir) / name
    torch.manual_seed(zlib.crc32(f"{base_dir.name}:{name}".encode()))
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    cfg = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=list(TARGETS), init_lora_weights=False)
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if ".lora_" in n:
                p.mul_(_GAIN)
    with fresh_folder(dest) as tmp:
        peft_model.save_pretrained(str(tmp))
        doc = json.loads((tmp / "adapter_config.json").read_text())
        doc["base_model_name_or_path"] = base_dir.name  # the catalog finds the base by its folder name
        (tmp / "adapter_config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (tmp / "README.md").unlink(missing_ok=True)
    return dest


def main(argv: list[str]) -> int:
    base_dir, names = Path(argv[0]), argv[1:] or list(DEMO_PEFT_ADAPTERS)
    adapters_dir(base_dir).mkdir(parents=True, exist_ok=True)
    for n in names:
        print(f"writing {base_dir.name}:{n}", flush=True)
        build(base_dir, n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The demo zoo's Hugging Face part: tiny random-weight transformers folders and a diffusers pipeline.

Each folder is built locally, with no downloads: ``from_config`` with a fixed seed, ``save_pretrained`` to
safetensors, a ~300-token BPE tokenizer trained with ``tokenizers`` on a built-in corpus, and a ChatML chat
template. Building needs torch, so it runs in a child process (``python -m fitevict.zoo.hf DEST``): importing this
module imports no torch. A folder whose recipe stamp matches is not rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from fitevict.paths import fresh_folder
from fitevict.zoo import CHAT_TEMPLATE, ZooError

HF_GENERATOR_VERSION = 1
STAMP = "fitevict-zoo.json"
SPECIALS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
VOCAB = 300
_WORDS = ("the model fits in memory and the planner evicts only what it must while the seat serves requests "
          "every byte has a source measured formula declared a cache holds keys and values for each layer "
          "hello world how are you today tell me a story about a small robot that learned to count tokens").split()


@dataclass(frozen=True, slots=True)
class HfRecipe:
    name: str
    family: str  # llama | qwen2 | mixtral | ddpm
    description: str
    config: tuple[tuple[str, object], ...]  # config keyword arguments
    seed: int


def _cfg(**kw: object) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(kw.items()))


# realistic shapes: 64-wide heads, hidden and FFN sizes multiples of 64 (the kernels' blocks, bitsandbytes' 64)
_BASE = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)
HF_ZOO: tuple[HfRecipe, ...] = (
    HfRecipe("hf-llama-gqa", "llama", "Llama, GQA (4 heads, 2 KV heads)",
             _cfg(**_BASE, num_key_value_heads=2, tie_word_embeddings=False), 11),
    HfRecipe("hf-qwen2-swa", "qwen2", "Qwen2, sliding window 64 on layers 1-2 (use_sliding_window, max_window_layers)",
             _cfg(**{**_BASE, "num_hidden_layers": 3}, num_key_value_heads=1, use_sliding_window=True,
                  sliding_window=64, max_window_layers=1, tie_word_embeddings=False), 12),
    HfRecipe("hf-mixtral-moe", "mixtral", "Mixtral MoE, 4 experts, 2 per token",
             _cfg(**{**_BASE, "intermediate_size": 256}, num_key_value_heads=2, num_local_experts=4,
                  num_experts_per_tok=2, sliding_window=None, tie_word_embeddings=False), 13),
    HfRecipe("hf-llama-tied", "llama", "Llama with tied input/output embeddings",
             _cfg(**_BASE, num_key_value_heads=4, tie_word_embeddings=True), 14),
    HfRecipe("hf-ddpm", "ddpm", "diffusers DDPM pipeline: a tiny UNet2D and a DDPM scheduler (100 steps)",
             _cfg(sample_size=8, block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4,
                  num_train_timesteps=100), 15),
)
HF_ZOO_NAMES: tuple[str, ...] = tuple(r.name for r in HF_ZOO)
_BY_NAME = {r.name: r for r in HF_ZOO}


@dataclass(frozen=True, slots=True)
class HfZooModel:
    name: str
    path: Path
    arch: str
    description: str
    file_bytes: int  # the safetensors files' size (a file-size figure, not a memory price)


def fingerprint(r: HfRecipe) -> str:
    blob = json.dumps({"recipe": asdict(r), "generator": HF_GENERATOR_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _is_current(folder: Path, r: HfRecipe) -> bool:
    try:
        return json.loads((folder / STAMP).read_text()).get("fingerprint") == fingerprint(r)
    except (OSError, ValueError):
        return False


def _listed(folder: Path, r: HfRecipe) -> HfZooModel:
    size = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    arch = json.loads((folder / STAMP).read_text()).get("arch", r.family)
    return HfZooModel(r.name, folder, arch, r.description, size)


def resolve_hf_names(only: Iterable[str] | None) -> list[str]:
    if only is None:
        return list(HF_ZOO_NAMES)
    wanted = set(only)
    unknown = sorted(wanted - set(HF_ZOO_NAMES))
    if unknown:
        raise ZooError(f"unknown HF zoo model {', '.join(unknown)}; allowed: {', '.join(HF_ZOO_NAMES)}")
    return [n for n in HF_ZOO_NAMES if n in wanted]


def torch_available() -> bool:
    """Whether the torch extra is installed (found without importing it)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "tokenizers"))


def write_hf_zoo(dest: Path, *, only: Iterable[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> list[HfZooModel]:
    """Build the HF zoo (all, or ``only``) under ``dest`` in a child process; up-to-date folders are kept."""
    dest = Path(dest)
    names = resolve_hf_names(only)
    todo = [n for n in names if not _is_current(dest / n, _BY_NAME[n])]
    for n in names:
        if progress and n not in todo:
            progress(f"up to date {n}")
    if todo:
        if not torch_available():
            raise ZooError("building the HF demo models needs the torch extra: pip install 'fitevict[torch]'")
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile("w+") as errf:  # a file, not a pipe: a full stderr pipe would stall the child
            proc = subprocess.Popen([sys.executable, "-m", "fitevict.zoo.hf", str(dest), *todo],
                                    stdout=subprocess.PIPE, stderr=errf, text=True,
                                    env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            assert proc.stdout is not None
            for line in proc.stdout:
                if progress:
                    progress(line.strip())
            if proc.wait() != 0:
                errf.seek(0)
                raise ZooError(f"building the HF demo models failed (exit {proc.returncode}): "
                               f"{errf.read().strip()[-800:]}")
    return [_listed(dest / n, _BY_NAME[n]) for n in names]


# ----------------------------------------------------------------------------- the child process (imports torch)


def _corpus() -> list[str]:
    lines = []
    for i in range(400):
        k = (i * 7) % len(_WORDS)
        lines.append(" ".join(_WORDS[(k + j * 3) % len(_WORDS)] for j in range(12)))
    return lines


def build_tokenizer(folder: Path) -> None:
    """A byte-level BPE of VOCAB tokens trained on the built-in corpus, saved with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def _build_causal(r: HfRecipe, folder: Path) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(r.config)
    im_end = SPECIALS.index("<|im_end|>")
    kw["eos_token_id"] = [2, im_end]
    cfg = AutoConfig.for_model(r.family, **kw)
    torch.manual_seed(r.seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = [2, im_end]
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return type(model).__name__


def _build_ddpm(r: HfRecipe, folder: Path) -> str:
    import torch
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    c = dict(r.config)
    torch.manual_seed(r.seed)
    unet = UNet2DModel(sample_size=c["sample_size"], in_channels=3, out_channels=3,
                       block_out_channels=tuple(c["block_out_channels"]), layers_per_block=c["layers_per_block"],
                       norm_num_groups=c["norm_num_groups"], down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"))
    pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=c["num_train_timesteps"]))
    pipe.save_pretrained(folder)
    return "DDPMPipeline"


def build(r: HfRecipe, dest: Path) -> Path:
    """Build one recipe into ``dest/<name>`` (written beside, then renamed into place)."""
    folder = dest / r.name
    with fresh_folder(folder) as tmp:
        arch = _build_ddpm(r, tmp) if r.family == "ddpm" else _build_causal(r, tmp)
        (tmp / STAMP).write_text(json.dumps({"fingerprint": fingerprint(r), "arch": arch}) + "\n")
    return folder


def main(argv: list[str]) -> int:
    dest, names = Path(argv[0]), argv[1:] or list(HF_ZOO_NAMES)
    for n in resolve_hf_names(names):
        print(f"writing {n}", flush=True)
        build(_BY_NAME[n], dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

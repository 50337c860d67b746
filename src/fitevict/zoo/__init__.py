"""The demo model zoo: small, valid, deterministic GGUF files for tests and demos.

Every model has random weights (fixed seeds, ``normal * 0.02`` so inference stays numerically sane), a tiny
SentencePiece-style ("llama") vocabulary with byte tokens, and a ChatML chat template, so llama-server loads it
and answers ``/v1/chat/completions``. Zoo v2 (the default) has the shapes real models have: 64-wide heads, FFN
and state widths that are multiples of 64, since CPU kernels choose their paths by shape; the vocabulary (1003)
stays uneven so that pricing code cannot lean on round numbers, and ``llama-odd`` keeps the uneven shapes of zoo
v1 (n_embd 96, n_ff 250). Zoo v1 (``version=1``) writes the first zoo's files byte for byte: known answers
measured on other machines were made with them.

Same code, same bytes: a file depends only on its recipe, ``GENERATOR_VERSION`` and the ``gguf`` package
version. ``write_zoo`` records each file's sha256 in a manifest next to the files and skips a model whose file
on disk still matches it. Files are written to a temporary name and renamed, so a crash never leaves half a file.

    recipes.py  the recipes and layouts (zoo v1 frozen, v2 realistic)
    tensors.py  vocabulary, tensor shapes and data
    write.py    GGUF writing, the manifest, ``write_zoo`` and ``rewrite_arch``
    hybrid.py   the recurrent and hybrid architectures' metadata and tensors
    lora.py     LoRA adapters (GGUF) for a zoo model
    mmproj.py   a projector (mmproj) for a zoo text model
    hf.py       Hugging Face folders (needs the torch extra)
    peft.py     PEFT adapters for an HF folder (needs the torch extra)

The life-size zoo (``fitevict demo-models DIR --life-size``) has models at the shapes of public models, 0.07 to
4.5 GB, with the real vocabularies the engine's source ships:

    lifesize.py          writing and caching them (``write_life_size``)
    lifesize_recipes.py  their recipes
    lifesize_data.py     their tensors and bytes (quantized blocks written directly)
    gguf_stream.py       a GGUF written as a stream, with key-values copied byte for byte from another GGUF
"""

from fitevict.zoo.recipes import (BY_NAME, RECIPES, CHAT_TEMPLATE, GENERATOR_VERSION, MANIFEST_NAME, ZOO_NAMES,
                                  ZOO_VERSION, ZooError, ZooModel, recipe, recipes)
from fitevict.zoo.tensors import tensor_shapes
from fitevict.zoo.write import write_gguf, resolve_names, rewrite_arch, write_zoo

__all__ = ["CHAT_TEMPLATE", "GENERATOR_VERSION", "MANIFEST_NAME", "ZOO_NAMES", "ZOO_VERSION", "ZooError", "ZooModel",
           "BY_NAME", "RECIPES", "tensor_shapes", "write_gguf", "recipe", "recipes", "resolve_names", "rewrite_arch",
           "write_zoo"]

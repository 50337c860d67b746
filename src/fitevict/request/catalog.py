"""Discover models on disk and give each a key: GGUF files (with their mmproj projectors), HF dirs.

Keys (matched case-insensitively, spelled as found):
- a GGUF directly in a models dir: its file stem (``Qwen3-8B-Q4_K_M``);
- the only GGUF model in ``owner/repo/``: ``repo``, or ``owner~repo`` when two repos share a name;
- several GGUF models in one folder (quantizations): each file's stem, qualified the same way on collision;
- split GGUFs ``name-00001-of-0000N.gguf`` are one model keyed ``name``; an incomplete split is skipped with a note;
- files with ``mmproj`` in the name are projectors: attached to the models beside them, never listed;
- a folder with ``config.json`` and ``*.safetensors`` is a Hugging Face model (engine ``transformers``),
  listed but not servable by llama-server; any folder a registered family's pricer says is one model of its kind
  (``PricerBase.model_folder``) is listed whole, keyed as a repo is, the engine that loads its kind serving it;
- a Hugging Face hub cache's repository (``models--org--name/``) is read as the store reader reads it
  (fitevict.sources.hfcache): ``refs/main``'s snapshot, named ``org/name`` (``org/name:<QUANT>`` for several
  quantizations), with the older keys ``name`` / ``org~name`` (a file's stem, ``org~name~stem``) as aliases;
- LoRA adapters (``<stem>.adapters/*.gguf`` beside a base, PEFT folders) are ``<base key>:<name>`` (lora.py).

The stores other tools keep (Ollama, the Hugging Face cache, LM Studio; fitevict.sources) follow the models dirs,
under the names those tools use (``qwen2.5:7b``, ``org/name``, ``org/name:Q4_K_M``); what their stores say is used
(store_settings.py), and a name one source already holds is reported in the notes. The naming rule for ``/`` and
``:``, and what an unknown or ambiguous name answers, are in names.py.

``[models.<key>]`` config entries add models (``path``) or adjust discovered ones (by key); a discovered
model that a config entry points at keeps its discovered key as an alias.
"""

from __future__ import annotations

import dataclasses

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fitevict.config import Config, ConfigError, ModelConfig
from fitevict.engines import (REGISTRY, PricerBase, Traits, UnknownEngine, engine_for_kind, folder_pricer, kind_words,
                              traits)
from fitevict.request.lora import add_adapters, adapter_entries, is_adapter_folder, is_peft_folder
from fitevict.request.names import AmbiguousModel, UnknownModel, candidates
from fitevict.request.store_settings import (adapter_models, digest_key, drop_clashing_aliases, store_settings,
                                             with_store_fields)
from fitevict.sources import StoreModel, StoreScan, hfcache, read_stores
from fitevict.sources.files import (HF_CACHE_RE, SPLIT_RE, GgufFileError, attach_in_flat_dir, gguf_models,
                                   is_mmproj, pick_projector, resolve_gguf_file)

@dataclass(frozen=True, slots=True)
class CatalogEntry:
    key: str
    path: Path  # the GGUF file (a split's first shard) or the HF model directory
    engine: str  # "llama-server", "transformers", ...
    aliases: tuple[str, ...]
    pinned: bool
    file_bytes: int  # all of the model's weight files (every shard), projector not included
    settings: ModelConfig  # the [models.<key>] entry, or an empty one
    mmproj: Path | None  # the projector passed as --mmproj
    gguf_files: tuple[str, ...]  # model GGUFs a request may pick (gguf_file), relative to model_dir
    model_dir: Path  # the folder gguf_file names are resolved in
    kind: str = "gguf"  # "gguf" | "hf" | "lora" (a GGUF LoRA adapter) | "peft" (a PEFT adapter folder)
    files: tuple[Path, ...] = ()  # every weight file: split shards, or the HF dir's *.safetensors
    base: str | None = None  # an adapter's base model key: the seat that serves it
    base_path: Path | None = None  # an adapter's base model file (what the seat loads)
    loras: tuple[Path, ...] = ()  # a base (and its adapters): every adapter its seat starts with (GGUF or PEFT)
    store: str = "models-dir"  # where it was found: "models-dir", "ollama", "hf-cache", "lmstudio"
    system: str | None = None  # a default system message (Ollama's system layer), for requests that bring none

    @property
    def llama_servable(self) -> bool:
        """True when llama-server can load it (a GGUF model, or a GGUF adapter on its GGUF base)."""
        return self.kind in ("gguf", "lora")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases)


# ----------------------------------------------------------------------------- discovery


@dataclass(slots=True)
class _Found:
    kind: str
    path: Path
    model_dir: Path
    files: tuple[Path, ...]
    stem: str
    chain: tuple[str, ...]  # key candidates, most preferred first
    mmproj: Path | None = None
    gguf_files: tuple[str, ...] = ()
    level: int = 0
    implicit_aliases: list[str] = field(default_factory=list)
    store: str = "models-dir"
    record: StoreModel | None = None  # a store's model: what its store says about it

    @property
    def key(self) -> str:
        return self.chain[self.level]


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _repo_names(root: Path, folder: Path) -> list[str]:
    """Name parts of a folder below a models dir, most specific last."""
    parts = list(folder.relative_to(root).parts)
    if not parts:
        return [root.name]
    return parts


def _chain(names: list[str], stem: str | None) -> tuple[str, ...]:
    """Key candidates from least to most qualified: repo, owner~repo, ... (then ~stem when several)."""
    tail = [stem] if stem is not None else []
    out: list[str] = []
    for n in range(1, len(names) + 1):
        out.append("~".join(names[len(names) - n :] + tail))
    if stem is not None:
        out.insert(0, stem)
    return tuple(dict.fromkeys(out))


def _folder_found(family: PricerBase, folder: Path, names: Sequence[str], chain: tuple[str, ...]) -> _Found:
    """A folder that is one model of ``family``'s kind, whole (an HF folder, ...): as its family lists its files."""
    return _Found(family.kind, folder, folder, family.model_files(folder, names), folder.name, chain)


def _record_found(r: StoreModel, store: str) -> _Found:
    """A model a store reader found (its name the key, its older names implicit aliases), listed as ``store``'s."""
    return _Found(r.kind, r.path, r.model_dir, r.files, r.path.stem, (r.name,), r.mmproj, r.gguf_files,
                  implicit_aliases=list(r.aliases), store=store, record=r)


def _scan_dir(root: Path, notes: list[str], peft: list[Path]) -> list[_Found]:
    """Every model under ``root``. Symlinked folders and files are followed; a folder reached twice (a symlink
    loop, or a second link to it) is read once, and the second path is named in the notes."""
    found: list[_Found] = []
    visited: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        folder = Path(dirpath)
        real = os.path.realpath(folder)
        if real in visited:
            loop = real == os.path.commonpath([real, os.path.realpath(folder.parent)])
            notes.append(f"{folder}: {'a symlink loop back to' if loop else 'a second link to'} {visited[real]} "
                         f"({real}); not read again")
            dirnames.clear()
            continue
        visited[real] = folder
        dirnames[:] = sorted(d for d in dirnames if not _hidden(d) and not is_adapter_folder(folder / d, filenames))
        if is_peft_folder(filenames):  # an adapter, listed on its base (lora.py)
            peft.append(folder)
            dirnames.clear()
            continue
        flat = folder == root
        names = _repo_names(root, folder)
        if HF_CACHE_RE.match(folder.name) and "snapshots" in dirnames:  # a hub cache's repository: as the store
            found.extend(_record_found(r, "models-dir") for r in hfcache.read_repo(folder, notes, "models-dir"))
            dirnames.clear()
            continue
        if (family := folder_pricer(filenames)) is not None:  # a folder that is one model (HF, ...), by its family
            found.append(_folder_found(family, folder, filenames, _chain(names, None)))
            dirnames[:] = []  # its subfolders belong to it
        models, projectors = gguf_models(folder, filenames, notes)
        if not models:
            if projectors:
                notes.append(f"{folder}: projector(s) {', '.join(p.name for p in projectors)} without a model beside them")
            continue
        if flat:
            attached = attach_in_flat_dir(models, projectors)
            for m in models:
                found.append(
                    _Found("gguf", m.files[0], folder, m.files, m.stem, (m.stem,), attached.get(m.stem),
                           (m.files[0].name,))
                )
            continue
        proj = pick_projector(projectors)
        listed = tuple(m.files[0].name for m in models)
        for m in models:
            chain = _chain(names, None) if len(models) == 1 else _chain(names, m.stem)
            found.append(_Found("gguf", m.files[0], folder, m.files, m.stem, chain, proj, listed))
    return found


def _one_per_file(found: list[_Found], notes: list[str]) -> list[_Found]:
    """Two keys for the same file (a symlink beside its target, two links to one file) are one model: the first
    key found, with the others as its aliases."""
    first: dict[str, _Found] = {}
    out: list[_Found] = []
    for f in found:
        real = os.path.realpath(f.path)
        if real in first:
            first[real].implicit_aliases.append(f.key)
            notes.append(f"{f.path}: the same file as {first[real].path}; served as {first[real].key!r}, "
                         f"with {f.key!r} as an alias")
            continue
        first[real] = f
        out.append(f)
    return out


def _settle_keys(found: list[_Found], notes: list[str]) -> list[_Found]:
    """Qualify colliding keys step by step (repo -> owner~repo -> ...); then the first found wins."""
    while True:
        groups: dict[str, list[_Found]] = {}
        for f in found:
            groups.setdefault(f.key.lower(), []).append(f)
        bumped = False
        for group in groups.values():
            if len(group) > 1:
                for f in group:
                    if f.level + 1 < len(f.chain):
                        f.level += 1
                        bumped = True
        if not bumped:
            break
    kept: dict[str, _Found] = {}
    for f in found:
        if (first := kept.get(f.key.lower())) is not None:
            notes.append(f"{f.path}: key {f.key!r} is already taken by {first.path}; set [models.<key>] path to list it")
            continue
        kept[f.key.lower()] = f
    return list(kept.values())


def _with_stores(found: list[_Found], scans: Sequence[StoreScan], notes: list[str]) -> tuple[list[_Found],
                                                                                             list[StoreModel]]:
    """The stores' models after the models directories' (stores in order): a name already taken is reported and
    not listed. Models that are adapters on a blob (Ollama) come back apart."""
    taken = {f.key.lower(): f for f in found}
    adapters: list[StoreModel] = []
    for scan in scans:
        notes.extend(scan.notes)
        for r in scan.models:
            if r.adapters:
                adapters.append(r)
                continue
            if (first := taken.get(r.name.lower())) is not None:
                notes.append(f"{r.store} model {r.name!r} ({r.path}) is shadowed by the {first.store} model of that "
                             f"name ({first.path}); not listed. Name it with [models.<key>] path to serve it too")
                continue
            f = _record_found(r, r.store)
            taken[r.name.lower()] = f
            found.append(f)
    return found, adapters


def _adapter_bases(adapters: Sequence[StoreModel], found: list[_Found]) -> list[_Found]:
    """A base for each store adapter whose model file no listed model serves: keyed by the blob's digest."""
    served = {os.path.realpath(f.path) for f in found}
    out = []
    for r in adapters:
        if (real := os.path.realpath(r.path)) not in served:
            served.add(real)
            out.append(_Found("gguf", r.path, r.model_dir, r.files, r.path.name, (digest_key(r.path),), r.mmproj,
                              store=r.store))
    return out


# ----------------------------------------------------------------------------- config entries


def _model_from_path(m: ModelConfig, roots: Sequence[Path], notes: list[str]) -> _Found:
    assert m.path is not None
    where = f"models.{m.key}.path = '{m.path}'"
    p = m.path
    if p.is_dir():
        names = os.listdir(p)
        if (family := folder_pricer(names)) is not None:
            return _folder_found(family, p, names, (m.key,))
        models, projectors = gguf_models(p, names, notes)
        if len(models) != 1:
            what = "no GGUF model" if not models else f"{len(models)} GGUF models ({', '.join(x.files[0].name for x in models)})"
            raise ConfigError(f"{where}: the folder holds {what}; point path at one .gguf file or a folder with one model")
        g = models[0]
        return _Found("gguf", g.files[0], p, g.files, g.stem, (m.key,), pick_projector(projectors), (g.files[0].name,))
    if not p.is_file():
        raise ConfigError(f"{where}: no such file or folder; fix the path or remove the entry")
    if not p.name.lower().endswith(".gguf"):
        raise ConfigError(f"{where}: not a .gguf file; give a GGUF file or a model folder")
    if is_mmproj(p.name):
        raise ConfigError(f"{where}: this is a projector (mmproj); set it as models.{m.key}.mmproj and path to the model")
    folder = p.parent
    models, projectors = gguf_models(folder, os.listdir(folder), notes)
    split = SPLIT_RE.match(p.name)
    own = next((g for g in models if g.files[0] == p), None)
    if split and own is None:
        raise ConfigError(f"{where}: give the first part of the split (…-00001-of-{split['n']}.gguf), with every part present")
    files = own.files if own else (p,)
    in_root = any(folder.resolve() == r.resolve() for r in roots)
    if in_root:
        proj = attach_in_flat_dir(models, projectors).get(own.stem if own else p.stem)
        listed: tuple[str, ...] = (p.name,)
    else:
        proj = pick_projector(projectors)
        listed = tuple(g.files[0].name for g in models)
    return _Found("gguf", p, folder, files, p.stem, (m.key,), proj, listed)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _engine_traits(where: str, engine: str) -> Traits:
    """What the engine a model names can do; a name no engine has is a configuration error naming the ones there are."""
    try:
        return traits(engine)
    except UnknownEngine as e:
        raise ConfigError(f"{where}.engine = {engine!r}: {e}") from None


def _entry(f: _Found, settings: ModelConfig, engine_args: tuple[str, ...] = ()) -> CatalogEntry:
    """The catalog entry of a found model under its settings (``[models.<key>]``, or an empty one)."""
    where = f"models.{settings.key}"
    engine = settings.engine or engine_for_kind(f.kind)
    can = _engine_traits(where, engine)
    if f.kind not in can.file_kinds:
        others = [n for n in REGISTRY if f.kind in traits(n).file_kinds]
        raise ConfigError(
            f"{where}.engine = {engine!r}: {f.path} is a {kind_words(f.kind)}, which {engine} cannot "
            f"load (it loads {' and '.join(kind_words(k) + 's' for k in can.file_kinds)}); use engine "
            f"{' or '.join(repr(n) for n in others) or 'another'}, or convert the model"
        )
    if can.engine_args and engine_args:
        settings = dataclasses.replace(settings, extra_args=(*engine_args, *settings.extra_args))
    mmproj = f.mmproj
    if settings.mmproj is not None:
        if not settings.mmproj.is_file():
            raise ConfigError(f"{where}.mmproj = '{settings.mmproj}': no such file")
        mmproj = settings.mmproj
    aliases = tuple(dict.fromkeys([*settings.aliases, *f.implicit_aliases]))
    return CatalogEntry(
        key=f.key,
        path=f.path,
        engine=engine,
        aliases=aliases,
        pinned=settings.pin,
        file_bytes=sum(p.stat().st_size for p in f.files),
        settings=settings,
        mmproj=mmproj if f.kind == "gguf" else None,
        gguf_files=f.gguf_files,
        model_dir=f.model_dir,
        kind=f.kind,
        files=f.files,
        store=f.store,
        system=f.record.system if f.record is not None else None,
    )


def _apply_config(by_key: dict[str, _Found], models: Mapping[str, ModelConfig], adapter_settings: Mapping[str, object],
                  models_dirs: Sequence[Path], notes: list[str]) -> dict[int, ModelConfig]:
    """Apply the ``[models.<key>]`` entries that are no adapters to the found models (``by_key``, changed in
    place): an entry with ``path`` adds a model (or takes over the found one of that file), one without adjusts the
    found model of its key. Returns the settings by ``id`` of the found model."""
    settings: dict[int, ModelConfig] = {}
    for m in models.values():
        if m.key in adapter_settings:
            continue
        if m.path is not None:
            f = _model_from_path(m, models_dirs, notes)
            for other in [o for o in by_key.values() if id(o) not in settings and _same_file(o.path, f.path)]:
                del by_key[other.key.lower()]
                if other.key.lower() != m.key.lower():
                    f.implicit_aliases.append(other.key)
            if (shadowed := by_key.pop(m.key.lower(), None)) is not None:
                notes.append(f"{shadowed.path}: key {shadowed.key!r} is taken by models.{m.key}; not listed")
            by_key[m.key.lower()] = f
        else:
            f = by_key.get(m.key.lower())
            if f is None:
                close = difflib.get_close_matches(m.key.lower(), list(by_key), n=3, cutoff=0.5)
                hint = f"; did you mean {', '.join(by_key[c].key for c in close)}?" if close else ""
                dirs = ", ".join(str(d) for d in models_dirs) or "(no models_dirs set)"
                raise ConfigError(
                    f"models.{m.key}: no path given and no model with that key in models_dirs {dirs} or the "
                    f"stores{hint} Set models.{m.key}.path or use a discovered key"
                )
        f.chain, f.level = (m.key,), 0
        settings[id(f)] = m
    return settings


# ----------------------------------------------------------------------------- the catalog


class Catalog:
    """The models fitevict can serve, by key and alias (case-insensitive)."""

    __slots__ = ("_entries", "_index", "notes")

    def __init__(self, entries: Sequence[CatalogEntry], notes: Sequence[str] = ()) -> None:
        index: dict[str, CatalogEntry] = {}
        entries = sorted(entries, key=lambda e: e.key.lower())
        for e in entries:
            for name in e.names:
                other = index.get(name.lower())
                if other is not None and other is not e:
                    what = "the key" if other.key.lower() == name.lower() else "an alias"
                    raise ConfigError(
                        f"models.{e.key}: name {name!r} is already {what} of model {other.key!r} ({other.path}); "
                        f"rename one of them (models.<key>.aliases or the file)"
                    )
                index[name.lower()] = e
        self._entries = tuple(entries)
        self._index = index
        self.notes: tuple[str, ...] = tuple(notes)

    @classmethod
    def scan(cls, models_dirs: Sequence[Path], models: Mapping[str, ModelConfig] | None = None,
             engine_args: Sequence[str] = (), stores: Sequence[StoreScan] = ()) -> "Catalog":
        """Walk ``models_dirs`` (in order; the first wins a tie), add the ``stores``' models (fitevict.sources) and
        apply ``[models.<key>]`` entries. ``engine_args`` (``engine.extra_args``) go on every llama-server model's
        command line, before its own."""
        notes: list[str] = []
        found: list[_Found] = []
        peft: list[Path] = []
        for root in models_dirs:
            if not root.is_dir():
                raise ConfigError(f"models_dirs: {str(root)!r} is not a folder; create it or remove it from models_dirs")
            found.extend(_scan_dir(root, notes, peft))
        found, store_adapters = _with_stores(_settle_keys(found, notes), stores, notes)
        found = _one_per_file(found, notes)
        found += _adapter_bases(store_adapters, found)
        by_key = {f.key.lower(): f for f in found}
        user = dict(models or {})
        base_key_of = {os.path.realpath(f.path): f.key for f in found}
        from_stores = adapter_models(store_adapters, base_key_of, user, notes)
        adapter_settings = adapter_entries(user | from_stores, by_key)
        settings = _apply_config(by_key, user | from_stores, adapter_settings, models_dirs, notes)
        entries = [_entry(f, store_settings(f.record, f.key, settings.get(id(f)), notes) if f.record is not None
                          else settings.get(id(f)) or ModelConfig(key=f.key), tuple(engine_args))
                   for f in by_key.values()]
        entries = add_adapters(entries, peft, adapter_settings, notes)
        entries = with_store_fields(entries, store_adapters, from_stores)
        return cls(drop_clashing_aliases(entries, notes), notes)

    @classmethod
    def from_config(cls, config: Config) -> "Catalog":
        return cls.scan(config.models_dirs, config.models, config.engine.extra_args, read_stores(config.stores))

    def entries(self) -> tuple[CatalogEntry, ...]:
        return self._entries

    def replace_with(self, other: "Catalog") -> tuple[list[str], list[str]]:
        """Take ``other``'s models in place (all holders see the rescan); returns the keys (added, removed)."""
        before, after = {e.key for e in self._entries}, {e.key for e in other._entries}
        self._entries, self._index, self.notes = other._entries, other._index, other.notes
        return sorted(after - before), sorted(before - after)

    def get(self, name: str) -> CatalogEntry | None:
        return self._index.get(name.lower())

    def resolve(self, name: str) -> CatalogEntry:
        """The model with this key or alias (case-insensitive); none: ``AmbiguousModel`` when the name shortens
        several models' names (names.py), else ``UnknownModel`` with close matches."""
        entry = self._index.get(name.lower())
        if entry is None:
            shortened = candidates(name, ((e.key, e.names) for e in self._entries))
            if len(shortened) > 1:
                raise AmbiguousModel(name, shortened)
            spelled = {n.lower(): n for e in self._entries for n in e.names}
            close = difflib.get_close_matches(name.lower(), list(spelled), n=3, cutoff=0.5)
            raise UnknownModel(name, list(dict.fromkeys([*shortened, *(spelled[c] for c in close)]))[:3])
        return entry

    def names(self) -> tuple[str, ...]:
        """Every key and alias, as spelled."""
        return tuple(n for e in self._entries for n in e.names)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)


__all__ = ["AmbiguousModel", "Catalog", "CatalogEntry", "GgufFileError", "UnknownModel", "resolve_gguf_file"]

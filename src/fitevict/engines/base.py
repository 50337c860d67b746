"""The engine protocol: how the supervisor starts, checks and reads one kind of engine process."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one engine process."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    health_path: str = "/health"
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Unavailable:
    """An engine figure that could not be produced, and why."""

    reason: str


NO_WEIGHTS = "no-weights"  # an exit code's word: the seat's walk found no weights to load (``exit_meaning``)


@dataclass(frozen=True, slots=True)
class Traits:
    """What an engine can do and how fitevict treats it: every rule outside ``engines/`` that differs by engine asks
    these, never the engine's name. Each engine class declares its own as ``traits``."""

    file_kinds: tuple[str, ...]  # the model files it loads: "gguf" (one file), "hf" (a Hugging Face folder)
    dry_run: bool = False  # the engine's own dry run prices its compute buffers (run before a GPU placement's load)
    repacks: bool = False  # it may repack weights into extra host buffers; a crash while repacking is retried without
    keeps_prompts: bool = False  # its slots' KV can be saved to disk before a stop and restored after (kvkeep)
    memory_flags_priced: bool = False  # memory flags among its extra arguments (-nr, -ctk, ...) are priced as config
    flags_set_price: bool = False  # its own extra arguments (dtype, quantization) change what it costs
    engine_args: bool = False  # ``engine.extra_args`` (the configured llama-server's) go on its command line
    overhead: str = "own-process"  # "calibrated": the engine build's calibrated overhead; "own-process": learned
    # LoRA adapters on a seat: "scale-0": each request sends every adapter's scale (0 for the base itself), the engine
    # applies them inside the request; "switched": the seat switches its active adapter and times the switch; "none"
    adapters: str = "none"
    adapter_kinds: tuple[str, ...] = ()  # the adapter files it applies on a seat of its base: "lora" (GGUF), "peft"
    reports_teardown: bool = False  # the seat reports a leak check on its way out (``teardown``)
    # its load log reports the buffers it allocated (``measured_footprint``); one that reports none is measured by its
    # process: the PSS of its tree right after its load is its host footprint (source: measured)
    reports_buffers: bool = True
    process_marks: tuple[str, ...] = ()  # words in argv[0:4] that mark a process as one of this engine's seats


class Engine(Protocol):
    """One kind of engine process: how it starts, what its log says it holds, how it fails and ends."""

    name: str
    traits: Traits

    def launch_spec(self, model_path: Path, config: LoadConfig, port: int, *,
                    extra_args: Sequence[str] = (), embeddings: bool = False,
                    mmproj: Path | None = None, slot_save_path: Path | None = None) -> LaunchSpec:
        """The argv and environment that start ``model_path`` under ``config`` on ``port``."""
        ...

    def measured_footprint(self, log_text: str) -> Footprint | None:
        """The engine's own account of its buffers, parsed from its load log (source: engine-reported)."""
        ...

    @classmethod
    def document(cls, log_text: str) -> dict | None:
        """The seat's own account of its load beyond its buffers (a torch seat's object walk), or None."""
        ...

    @classmethod
    def failure(cls, log_text: str) -> str | None:
        """A failed load's reason as the engine logged it, or None (then the exit code and log tail say it)."""
        ...

    @classmethod
    def teardown(cls, log_text: str) -> dict | None:
        """What the seat reported on its way out (a leak check), or None when the engine reports nothing."""
        ...

    @classmethod
    def shutting_down(cls, log_text: str) -> str | None:
        """The engine's own line saying it began to shut down (as it does on a SIGTERM or SIGINT), or None."""
        ...

    @classmethod
    def adapter_seconds(cls, log_text: str) -> float | None:
        """Seconds the seat's start spent loading its LoRA adapters, by its own account, or None."""
        ...

    @classmethod
    def reranks(cls, extra_args: Sequence[str], pooling: Callable[[], int | None]) -> bool:
        """Whether a model serves rerank requests on this engine: its extra arguments ask for it, or its file
        declares it (``pooling()`` reads the file's pooling type, only when the engine's rule needs it)."""
        ...

    @classmethod
    def model_of(cls, argv: Sequence[str]) -> Path | None:
        """The model file a running seat's command line loads (an orphan is adopted by it), or None when the engine
        does not say (its orphans are then stopped, never adopted)."""
        ...

    @classmethod
    def bind_failed(cls, log_text: str) -> bool:
        """Whether the seat's log says it could not bind its port (another program took it): started once more."""
        ...

    @classmethod
    def saved_prompt(cls, path: Path) -> list[int]:
        """The tokens of the prompt a slot file this engine saved holds (``traits.keeps_prompts``); raises OSError
        or ValueError for a file it cannot read."""
        ...

    @classmethod
    def adapter_kind(cls, path: Path) -> str | None:
        """The kind of adapter ``path`` is, among ``traits.adapter_kinds`` ("lora", "peft"), or None."""
        ...

    @classmethod
    def exit_meaning(cls, code: int | None) -> str | None:
        """What an exit code means for this engine, in the protocol's words (``NO_WEIGHTS``), or None."""
        ...


class EngineBase:
    """Defaults for what an engine does not report: subclasses override what they have."""

    name: str
    traits: Traits
    pricer: str = ""  # "module:attribute" of its family's pricer (a ``PricerBase``); "" when another family's prices

    @classmethod
    def for_binary(cls, binary: Path) -> "EngineBase":
        """The engine as this fitevict runs it; ``binary`` is the configured llama-server build (used by an engine
        that runs it; another ignores it)."""
        return cls()

    @classmethod
    def document(cls, log_text: str) -> dict | None:
        return None

    @classmethod
    def failure(cls, log_text: str) -> str | None:
        return None

    @classmethod
    def teardown(cls, log_text: str) -> dict | None:
        return None

    @classmethod
    def shutting_down(cls, log_text: str) -> str | None:
        return None

    @classmethod
    def adapter_seconds(cls, log_text: str) -> float | None:
        return None

    @classmethod
    def reranks(cls, extra_args: Sequence[str], pooling: Callable[[], int | None]) -> bool:
        return False

    @classmethod
    def model_of(cls, argv: Sequence[str]) -> Path | None:
        return None

    @classmethod
    def bind_failed(cls, log_text: str) -> bool:
        return False

    @classmethod
    def exit_meaning(cls, code: int | None) -> str | None:
        return None

    @classmethod
    def adapter_kind(cls, path: Path) -> str | None:
        return None

    @classmethod
    def saved_prompt(cls, path: Path) -> list[int]:
        raise ValueError(f"{path}: {cls.name} saves no prompts")


class PricerBase:
    """How one family prices a model file of its kind (``kind``): its structure, its shape and context as the planner
    sees them, its price sheet's own parts and its price, its dry run, and, for a family whose builds fitevict
    installs and calibrates, its build key, host buffer table and process overhead calibration. ``prices/`` asks the
    registry for a file's pricer (``fitevict.engines.pricer_for``) and imports no family module."""

    kind: str = ""
    words: str = ""  # a model of this kind, in words ("GGUF model"), for messages
    builds: bool = False  # the engine directory holds this family's build: it keys the machine and is calibrated
    # its price holds the seat's own process as measured on this machine's earlier seats (a torch seat's:
    # ``PriceBook.torch_overhead_for``), which a seat priced before it was learned did not count
    own_overhead: bool = False

    def claims(self, path: Path) -> bool:
        """Whether ``path`` is a model of this family's file kind."""
        return False

    def model_folder(self, names: Sequence[str]) -> bool:
        """Whether a folder holding ``names`` is, whole, one model of this family's kind (its subfolders its own):
        how the catalog discovers such a model without naming the family."""
        return False

    def model_files(self, folder: Path, names: Sequence[str]) -> tuple[Path, ...]:
        """The files of a model folder (``model_folder``) whose bytes are the model's on disk."""
        return ()

    def structure(self, path: Path) -> Any:
        """The model's parsed structure (cached)."""
        raise NotImplementedError

    def shape(self, structure: Any) -> Any:
        """What the planner needs of the model's shape: offloadable layers, MoE or not, training context."""
        return structure

    def context(self, structure: Any, cfg: LoadConfig) -> int:
        """The context a seat of ``cfg`` starts with."""
        raise NotImplementedError

    def quantization(self, structure: Any) -> str:
        """The model's quantization as a stored measurement's signature names it."""
        raise NotImplementedError

    def sheet_parts(self, structure: Any, *, ident: tuple[str, int, int], loras: tuple[str, ...],
                    extra_args: tuple[str, ...], learned: Mapping, host: Any, mmproj: Path | None) -> dict[str, Any]:
        """The price sheet's fields this family reads from disk (blocking I/O): its correction, projector and
        adapters (``prices.sheet.read_sheet``)."""
        return {}

    def price(self, sheet: Any, cfg: LoadConfig) -> tuple[Footprint, tuple | None]:
        """The price of ``cfg`` on ``sheet`` (computation only), and the process terms that scale with the model for
        the engine overhead to join, or None when the price holds the seat's process already."""
        raise NotImplementedError

    def dry_run(self, engine_dir: Path, path: Path, cfg: LoadConfig, *, extra_args: tuple[str, ...] = (),
                mmproj: Path | str | None = None) -> Any:
        """The engine's own dry run of ``cfg`` (compute and caches it sized), or why not."""
        return Unavailable(f"{self.kind} models have no dry run")

    def build_key(self, engine_dir: Path, cpu: Any) -> str:
        """``<engine build>@<cpu fingerprint>``: the key every figure learned on this machine is stored under."""
        raise NotImplementedError

    def build_id(self, binary: Path) -> str:
        """The identity of the engine build at ``binary`` ("missing:..." when there is none): a change means another
        build was put in its place."""
        raise NotImplementedError

    def build_change(self, binary: Path) -> str | None:
        """How ``binary`` differs from the build its install stamp names, or None."""
        return None

    def host_buffers(self, engine_dir: Path) -> Any:
        """The extra host buffer table pricing uses on this machine for the build in ``engine_dir``."""
        raise NotImplementedError

    def work_facts(self) -> tuple[int, bool]:
        """What a seat's work buffer depends on here: its threads, and whether the tiled K-quant path runs."""
        return (0, False)

    def overhead_key(self, binary: Path, cpu: Any) -> str:
        """The store key of what loads have shown of ``binary``'s process overhead on this machine."""
        raise NotImplementedError

    def calibratable(self, binary: Path) -> bool:
        return False

    def calibrated_overhead(self, binary: Path) -> dict[str, int] | None:
        return None

    def calibrate_overhead(self, binary: Path, *, timeout_s: float) -> Any:
        return Unavailable(f"{self.kind} builds are not calibrated")

    def shared_pages(self, binary: Path) -> Any:
        """The file pages every seat of ``binary`` shares (a ``pricing.pages.SharedPages``), or None: this family
        keeps none apart."""
        return None

    def resolve_build(self, configured: str | None) -> tuple[Path | None, str, Path]:
        """Which build of this family's server the door runs: (the binary or None, why, where an install would put
        it), from the configured path, the environment, PATH and fitevict's cache."""
        raise NotImplementedError

    def census(self, binary: Path, *, rpc: Sequence[str], declared: Mapping[str, bool]) -> Any:
        """The devices ``binary`` can use (with ``rpc`` endpoints), each with whether its memory is host memory and
        who said so (``declared`` names override); an empty census saying why where it cannot list them."""
        raise NotImplementedError

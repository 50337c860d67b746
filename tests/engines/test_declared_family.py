"""The declared family (``engines/declared/``) is one package and one registry line: the catalog finds its model
folders through the registry, its pricer prices what a manifest declares, and no module outside the package names
it. The end-to-end proof through a real door is ``tests/e2e/test_fourth_family.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fitevict
import fitevict.engines as engines
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.engines.declared.manifest import MANIFEST, ManifestError, read_manifest
from fitevict.engines.declared.pricer import PRICER, declared_footprint
from fitevict.pricing.footprint import HOST
from fitevict.config import ConfigError, ModelConfig
from fitevict.request.catalog import Catalog

SRC = Path(fitevict.__file__).parent
PACKAGE = SRC / "engines" / "declared"
MiB = 1024 ** 2
GOOD = """model = "tiny"
command = ["{python}", "{folder}/server.py", "--port", "{port}", "--ctx", "{ctx}"]
context = 1024
[memory]
bytes = "64MiB"
per_context_token = "2KiB"
"""


def _folder(root: Path, text: str = GOOD, name: str = "tiny") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(text)
    (folder / "server.py").write_text("print('a server')\n")
    return folder


def test_nothing_outside_its_package_names_the_family_but_its_registry_line() -> None:
    names = re.compile(r"engines\.declared|engines/declared|Declared(Engine|Pricer)|" + re.escape(MANIFEST))
    outside = {str(p.relative_to(SRC)): [ln.strip() for ln in p.read_text().splitlines() if names.search(ln)]
               for p in SRC.rglob("*.py") if PACKAGE not in p.parents}
    outside = {p: lines for p, lines in outside.items() if lines}
    assert outside == {"engines/__init__.py": ['"declared": "fitevict.engines.declared.engine:DeclaredEngine",']}


def test_a_folder_with_a_manifest_is_a_model_of_the_family_the_registry_names(tmp_path: Path,
                                                                               monkeypatch) -> None:
    folder = _folder(tmp_path / "models", name="chat-server")
    [entry] = Catalog.scan([tmp_path / "models"]).entries()
    assert (entry.key, entry.engine, entry.kind, entry.path) == ("chat-server", "declared", "declared", folder)
    assert entry.file_bytes == sum(p.stat().st_size for p in folder.iterdir())
    assert engines.pricer_for(folder) is PRICER  # not the transformers pricer, though it is a folder
    monkeypatch.delitem(engines.REGISTRY, "declared")  # without its registry line, the folder is no model
    assert Catalog.scan([tmp_path / "models"]).entries() == ()


def test_an_engine_that_cannot_load_it_is_refused_in_its_familys_words(tmp_path: Path) -> None:
    _folder(tmp_path / "models", name="chat-server")
    wrong = {"chat-server": ModelConfig(key="chat-server", engine="llama-server")}
    with pytest.raises(ConfigError, match=r"is a declared server \(a folder with fitevict-engine\.toml\), which "
                                          r"llama-server cannot load \(it loads GGUF models\); use engine 'declared'"):
        Catalog.scan([tmp_path / "models"], wrong)


def test_the_price_is_the_declared_footprint_labelled_declared(tmp_path: Path) -> None:
    m = read_manifest(_folder(tmp_path))
    fp = declared_footprint(m, 4096)
    host = fp.device(HOST)
    assert (host.model.bytes, host.context.bytes) == (64 * MiB, 2048 * 4096)
    assert {host.model.source, host.context.source, fp.host_source} == {"declared"}
    assert fp.bytes_on(HOST) == fp.whole_bytes == 64 * MiB + 2048 * 4096  # the whole process: no overhead joins it
    assert m.argv(8080, 4096)[1:] == (f"{m.folder}/server.py", "--port", "8080", "--ctx", "4096")
    assert PRICER.context(m, LoadConfig(n_ctx=0)) == 1024  # its own, for a ctx of 0


@pytest.mark.parametrize(("text", "says"), [
    ('command = ["srv", "--port", "{port}"]\n', "no [memory] table"),
    ('command = ["srv"]\n[memory]\nbytes = 1\n', "names no {port}"),
    ('command = ["srv", "{port}", "{gpu}"]\n[memory]\nbytes = 1\n', "placeholder fitevict does not fill"),
    ('command = ["srv", "{port}"]\n[memory]\nbytes = "lots"\n', "is not a size"),
    ('command = ["srv", "{port}"]\n[memory]\nper_context_token = 1\n', "[memory] bytes is missing"),
])
def test_a_manifest_that_cannot_be_used_says_which_file_field_and_remedy(tmp_path: Path, text: str,
                                                                          says: str) -> None:
    folder = _folder(tmp_path, text)
    with pytest.raises(ManifestError, match=re.escape(says)) as e:
        read_manifest(folder)
    assert str(folder / MANIFEST) in str(e.value)

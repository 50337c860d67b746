"""The typed config: layers, precedence, validation messages, redaction. Real TOML files in tmp dirs."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from fitevict.config import (
    ConfigError,
    ModelConfig,
    default_config_path,
    env_variables,
    load_config,
)
from fitevict.units import GiB, MiB


def write(tmp_path: Path, text: str, name: str = "fitevict.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """An environment with no FITEVICT_* variables and an empty config home."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg-empty")}


def test_defaults_without_file(clean_env: dict[str, str]) -> None:
    c = load_config(env=clean_env)
    assert c.config_path is None
    assert (c.server.host, c.server.port) == ("127.0.0.1", 8080)
    assert c.server.api_keys == () and not c.server.auth_enabled
    assert c.server.cors_origins == ()
    assert c.server.max_body_bytes == 16 * MiB
    assert c.budget.ram_reserve == 1 * GiB and c.budget.gpu_reserve == 512 * MiB
    assert c.budget.ram_limit is None and c.budget.gpu_limit is None
    assert c.policy.idle_unload_seconds == 1800 and c.policy.exclusive_fraction == 1.0
    assert c.policy.default_alloc_mode == "max-gpu"
    assert c.engine.orphans == "stop" and c.engine.llama_server is None
    assert c.models == {} and c.models_dirs == ()
    assert c.store_url == f"sqlite:///{c.data_dir / 'fitevict.db'}"


def test_config_is_frozen(clean_env: dict[str, str]) -> None:
    c = load_config(env=clean_env)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.server.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.models["x"] = ModelConfig(key="x")  # type: ignore[index]


# (dotted key, file TOML, env var + text, override value, value from each layer)
PRECEDENCE = [
    ("server.port", "[server]\nport = 8001", ("FITEVICT_PORT", "8002"), 8003, (8001, 8002, 8003)),
    ("server.host", '[server]\nhost = "0.0.0.0"', ("FITEVICT_HOST", "::1"), "localhost", ("0.0.0.0", "::1", "localhost")),
    (
        "budget.ram_limit",
        '[budget]\nram_limit = "2GiB"',
        ("FITEVICT_RAM_LIMIT", "600MiB"),
        "1GiB",
        (2 * GiB, 600 * MiB, 1 * GiB),
    ),
    (
        "policy.idle_unload_seconds",
        "[policy]\nidle_unload_seconds = 60",
        ("FITEVICT_IDLE_UNLOAD_SECONDS", "0"),
        5,
        (60.0, 0.0, 5.0),
    ),
    (
        "server.api_keys",
        '[server]\napi_keys = ["f1"]',
        ("FITEVICT_API_KEYS", "e1, e2"),
        ["o1"],
        (("f1",), ("e1", "e2"), ("o1",)),
    ),
]


def _get(c, dotted: str):
    obj = c
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize(("key", "toml", "env_var", "override", "want"), PRECEDENCE, ids=[p[0] for p in PRECEDENCE])
def test_precedence_default_file_env_override(tmp_path, clean_env, key, toml, env_var, override, want) -> None:
    f = write(tmp_path, toml)
    default = _get(load_config(env=clean_env), key)
    from_file = load_config(f, env=clean_env)
    assert _get(from_file, key) == want[0] != default
    assert from_file.origins[key] == f"config file {f}"
    env = {**clean_env, env_var[0]: env_var[1]}
    from_env = load_config(f, env=env)
    assert _get(from_env, key) == want[1]
    assert from_env.origins[key] == f"environment variable {env_var[0]}"
    from_override = load_config(f, env=env, overrides={key: override})
    assert _get(from_override, key) == want[2]
    assert from_override.origins[key] == "override"


def test_every_env_variable_reaches_its_key(tmp_path, clean_env) -> None:
    d1, d2 = tmp_path / "a", tmp_path / "b"
    env = {
        **clean_env,
        "FITEVICT_MODELS_DIRS": f"{d1}{os.pathsep}{d2}{os.pathsep}",
        "FITEVICT_DATA_DIR": str(tmp_path / "data"),
        "FITEVICT_STORE_URL": "postgresql://u:pw@db/fe",
        "FITEVICT_GPU_LIMIT": "8GiB",
        "FITEVICT_ADMIN_KEYS": "root",
        "FITEVICT_LLAMA_SERVER": str(tmp_path / "bin" / "llama-server"),
    }
    c = load_config(env=env)
    assert c.models_dirs == (d1, d2)
    assert c.data_dir == tmp_path / "data"
    assert c.store_url == "postgresql://u:pw@db/fe"
    assert c.budget.gpu_limit == 8 * GiB
    assert c.server.admin_keys == ("root",) and c.server.auth_enabled
    # the variable is lookup step 2, kept apart from the file's engine.llama_server (step 1)
    assert c.engine.llama_server_env == tmp_path / "bin" / "llama-server"
    assert c.engine.llama_server is None
    assert set(env_variables()) >= {k for k in env if k.startswith("FITEVICT_")}


def test_llama_server_file_and_env_are_separate(tmp_path, clean_env) -> None:
    f = write(tmp_path, '[engine]\nllama_server = "bin/llama-server"')
    c = load_config(f, env={**clean_env, "FITEVICT_LLAMA_SERVER": "/opt/ls"})
    assert c.engine.llama_server == tmp_path / "bin" / "llama-server"  # relative to the file's folder
    assert c.engine.llama_server_env == Path("/opt/ls")
    bad = write(tmp_path, '[engine]\nllama_server_env = "/x"', "bad.toml")
    with pytest.raises(ConfigError, match=r"engine\.llama_server_env: unknown key.*did you mean llama_server"):
        load_config(bad, env=clean_env)


def test_data_dir_from_file_moves_the_default_store(tmp_path, clean_env) -> None:
    f = write(tmp_path, 'data_dir = "state"\nmodels_dirs = ["models", "/abs/models"]')
    c = load_config(f, env=clean_env)
    assert c.data_dir == tmp_path / "state"
    assert c.store_url == f"sqlite:///{tmp_path / 'state' / 'fitevict.db'}"
    assert c.models_dirs == (tmp_path / "models", Path("/abs/models"))


def test_which_file_is_read(tmp_path) -> None:
    xdg = tmp_path / "xdg"
    env = {"XDG_CONFIG_HOME": str(xdg)}
    assert default_config_path(env) == xdg / "fitevict" / "config.toml"
    assert load_config(env=env).config_path is None  # absent default: defaults only
    default = default_config_path(env)
    default.parent.mkdir(parents=True)
    default.write_text("[server]\nport = 1111")
    assert load_config(env=env).server.port == 1111
    named = write(tmp_path, "[server]\nport = 2222", "named.toml")
    assert load_config(env={**env, "FITEVICT_CONFIG": str(named)}).server.port == 2222
    given = write(tmp_path, "[server]\nport = 3333", "given.toml")
    assert load_config(given, env={**env, "FITEVICT_CONFIG": str(named)}).server.port == 3333
    with pytest.raises(ConfigError, match=r"nope\.toml \(from FITEVICT_CONFIG\) does not exist"):
        load_config(env={**env, "FITEVICT_CONFIG": str(tmp_path / "nope.toml")})


def test_invalid_toml_names_the_file(tmp_path, clean_env) -> None:
    f = write(tmp_path, "[server\nport = 1")
    with pytest.raises(ConfigError, match=rf"{f}.*not valid TOML"):
        load_config(f, env=clean_env)


# (TOML text, dotted key, value as shown, words of the allowed form)
INVALID_FILE = [
    ('[server]\nport = "8080"', "server.port", "'8080'", "an integer from 0 to 65535"),
    ("[server]\nport = 70000", "server.port", "70000", "an integer from 0 to 65535"),
    ('[server]\nhost = ""', "server.host", "''", "a non-empty string"),
    ('[server]\napi_keys = "k"', "server.api_keys", "'k'", "a list of keys"),
    ('[server]\napi_keys = ["a b"]', "server.api_keys", "['a b']", "without whitespace"),
    ('[server]\ncors_origins = ["localhost"]', "server.cors_origins", "['localhost']", "scheme://host"),
    ('[server]\ndebug_log_prompts = "yes"', "server.debug_log_prompts", "'yes'", "true or false"),
    ('[server]\nmax_body_bytes = "0"', "server.max_body_bytes", "'0'", "a size > 0"),
    ("[budget]\nram_reserve = -1", "budget.ram_reserve", "-1", "must not be negative"),
    ('[budget]\ngpu_reserve = "lots"', "budget.gpu_reserve", "'lots'", "a size like 600MiB"),
    ('[budget]\nram_limit = "-5GiB"', "budget.ram_limit", "'-5GiB'", "a size like 600MiB"),
    ("[policy]\nexclusive_fraction = 0", "policy.exclusive_fraction", "0", "a number in (0, 1]"),
    ("[policy]\nexclusive_fraction = 1.5", "policy.exclusive_fraction", "1.5", "a number in (0, 1]"),
    ('[policy]\ndefault_alloc_mode = "gpu"', "policy.default_alloc_mode", "'gpu'", "gpu-only, max-gpu, max-ram, ram-only, explicit"),
    ("[policy]\nmax_queue = 0", "policy.max_queue", "0", "an integer >= 1"),
    ("[policy]\nidle_unload_seconds = -1", "policy.idle_unload_seconds", "-1", "seconds >= 0"),
    ("[policy]\nqueue_timeout_seconds = 0", "policy.queue_timeout_seconds", "0", "seconds > 0"),
    ('[engine]\norphans = "kill"', "engine.orphans", "'kill'", "one of stop, adopt"),
    ('[engine]\nextra_args = "--threads 8"', "engine.extra_args", "'--threads 8'", "one argument each"),
    ("[engine]\nhealth_timeout_seconds = 0", "engine.health_timeout_seconds", "0", "seconds > 0"),
    ('store_url = "mysql://x/y"', "store_url", "'mysql://x/y'", "sqlite:////abs/path"),
    ('models_dirs = "/models"', "models_dirs", "'/models'", "a list of directory paths"),
    ("[models.qwen]\nctx = -1", "models.qwen.ctx", "-1", "an integer >= 0"),
    ("[models.qwen]\nparallel = 0", "models.qwen.parallel", "0", "an integer >= 1"),
    ('[models.qwen]\ncache_type_k = "q3"', "models.qwen.cache_type_k", "'q3'", "q8_0"),
    ('[models.qwen]\nkv_cache_type = "int8"', "models.qwen.kv_cache_type", "'int8'", "q4_0"),
    ('[models.qwen]\nflash_attn = "yes"', "models.qwen.flash_attn", "'yes'", "one of on, off, auto"),
    ('[models.qwen]\naliases = ["a b"]', "models.qwen.aliases", "['a b']", "names without whitespace"),
    ('[models.qwen]\npin = "true"', "models.qwen.pin", "'true'", "true or false"),
    ('[models.qwen]\nrequest_defaults = { model = "x" }', "models.qwen.request_defaults", "{'model': 'x'}", "'model' cannot have a default"),
    ("[models.qwen]\nrequest_defaults = { seed = 1979-05-27 }", "models.qwen.request_defaults", "{'seed': datetime.date(1979, 5, 27)}", "only JSON values"),
    ("[models.qwen]\nn_gpu_layers = -2", "models.qwen.n_gpu_layers", "-2", "an integer >= -1"),
]


@pytest.mark.parametrize(("toml", "key", "shown", "form"), INVALID_FILE, ids=[f"{i}-{t[1]}" for i, t in enumerate(INVALID_FILE)])
def test_invalid_file_value_names_key_value_and_form(tmp_path, clean_env, toml, key, shown, form) -> None:
    f = write(tmp_path, toml)
    with pytest.raises(ConfigError) as err:
        load_config(f, env=clean_env)
    msg = str(err.value)
    assert msg.startswith(f"{key} = {shown} (from config file {f}): expected ")
    assert form in msg


# (variable, text, dotted key, words of the allowed form)
INVALID_ENV = [
    ("FITEVICT_PORT", "http", "server.port", "an integer from 0 to 65535"),
    ("FITEVICT_RAM_LIMIT", "lots", "budget.ram_limit", "or none for no limit"),
    ("FITEVICT_GPU_LIMIT", "-1G", "budget.gpu_limit", "a size like"),
    ("FITEVICT_IDLE_UNLOAD_SECONDS", "soon", "policy.idle_unload_seconds", "seconds >= 0"),
    ("FITEVICT_STORE_URL", "fitevict.db", "store_url", "sqlite:////"),
]


@pytest.mark.parametrize(("var", "text", "key", "form"), INVALID_ENV, ids=[t[0] for t in INVALID_ENV])
def test_invalid_env_value_names_the_variable(clean_env, var, text, key, form) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env={**clean_env, var: text})
    msg = str(err.value)
    assert msg.startswith(f"{key} = {text!r} (from environment variable {var}): expected ")
    assert form in msg


def test_invalid_override_names_the_key(clean_env) -> None:
    with pytest.raises(ConfigError, match=r"^budget\.ram_limit = '600Mb!' \(from override\): expected a size"):
        load_config(env=clean_env, overrides={"budget.ram_limit": "600Mb!"})


def test_env_limit_none_clears_a_file_limit(tmp_path, clean_env) -> None:
    f = write(tmp_path, '[budget]\nram_limit = "4GiB"')
    assert load_config(f, env={**clean_env, "FITEVICT_RAM_LIMIT": "none"}).budget.ram_limit is None
    assert load_config(f, env={**clean_env, "FITEVICT_RAM_LIMIT": ""}).budget.ram_limit == 4 * GiB  # empty = unset


# (TOML text or override key, where, what the message must suggest)
UNKNOWN = [
    ("[server]\nprot = 1", "file", "server.prot: unknown key", "did you mean port"),
    ("[servr]\nport = 1", "file", "servr: unknown key", "did you mean server"),
    ("model_dirs = []", "file", "model_dirs: unknown key", "did you mean models_dirs"),
    ("[models.q]\nctxx = 1", "file", "models.q.ctxx: unknown key", "did you mean ctx"),
    ("[budget]\nram_reserv = 1", "file", "budget.ram_reserv: unknown key", "did you mean ram_reserve"),
    ("server.prot", "override", "server.prot: unknown key in override", "did you mean server.port"),
    ("models.q.aliasses", "override", "models.q.aliasses: unknown key in override", "did you mean aliases"),
]


@pytest.mark.parametrize(("text", "where", "names", "hint"), UNKNOWN, ids=[u[2].split(":")[0] for u in UNKNOWN])
def test_unknown_keys_list_close_matches(tmp_path, clean_env, text, where, names, hint) -> None:
    with pytest.raises(ConfigError) as err:
        if where == "file":
            load_config(write(tmp_path, text), env=clean_env)
        else:
            load_config(env=clean_env, overrides={text: 1})
    assert names in str(err.value) and hint in str(err.value)


def test_unknown_fitevict_variable_is_a_note_not_an_error(clean_env) -> None:
    c = load_config(env={**clean_env, "FITEVICT_PROT": "1", "FITEVICT_CACHE_DIR": "/c"})
    assert c.notes == ("environment variable FITEVICT_PROT is not a fitevict setting (did you mean FITEVICT_PORT?); ignored",)


def test_model_entries(tmp_path, clean_env) -> None:
    f = write(
        tmp_path,
        """
[models.qwen]
path = "models/qwen.gguf"
ctx = 8192
parallel = 2
kv_cache_type = "q8_0"
cache_type_v = "q4_0"
flash_attn = true
aliases = ["gpt-4o", "Qwen3"]
pin = true
extra_args = ["--jinja"]
request_defaults = { temperature = 0.2, stop = ["</s>"] }

[models."qwen2.5-emb"]
embeddings = true
alloc_mode = "explicit"
n_gpu_layers = -1
""",
    )
    c = load_config(f, env=clean_env, overrides={"models.qwen2.5-emb.ctx": "512"})
    q = c.models["qwen"]
    assert q.path == tmp_path / "models" / "qwen.gguf"
    assert (q.ctx, q.parallel, q.flash_attn, q.pin) == (8192, 2, "on", True)
    assert (q.cache_type_k, q.cache_type_v) == ("q8_0", "q4_0")  # the specific key wins over kv_cache_type
    assert q.aliases == ("gpt-4o", "Qwen3") and q.extra_args == ("--jinja",)
    assert dict(q.request_defaults) == {"temperature": 0.2, "stop": ["</s>"]}
    e = c.models["qwen2.5-emb"]  # a dotted key survives the dotted override
    assert (e.embeddings, e.alloc_mode, e.n_gpu_layers, e.ctx, e.path, e.engine) == (True, "explicit", -1, 512, None, None)
    assert list(c.models) == ["qwen", "qwen2.5-emb"]


def test_explicit_alloc_needs_layers(tmp_path, clean_env) -> None:
    f = write(tmp_path, '[models.m]\nalloc_mode = "explicit"')
    with pytest.raises(ConfigError, match=r"models\.m\.alloc_mode = 'explicit' needs models\.m\.n_gpu_layers"):
        load_config(f, env=clean_env)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[models.a]\naliases = ["b"]\n[models.b]\nctx = 1', "models.a.aliases: alias 'b' is already the key of models.b"),
        ('[models.a]\naliases = ["x"]\n[models.b]\naliases = ["X"]', "models.b.aliases: alias 'X' is already an alias of models.a"),
        ('[models.Qwen]\nctx = 1\n[models.qwen]\nctx = 2', "models.qwen: the same key as models.Qwen up to case"),
    ],
)
def test_alias_collisions_name_both(tmp_path, clean_env, toml, message) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, toml), env=clean_env)
    assert message in str(err.value)


def test_bad_model_key(tmp_path, clean_env) -> None:
    with pytest.raises(ConfigError, match=r"models\.'a b'.*without whitespace or backslashes"):
        load_config(write(tmp_path, '[models."a b"]\nctx = 1'), env=clean_env)
    # a store's names have slashes (org/name): such a key adjusts that model
    assert load_config(write(tmp_path, '[models."Qwen/Qwen3-0.6B:Q8_0"]\nctx = 1'), env=clean_env).models


def test_stores_are_on_by_default_and_set_by_file_or_variable(tmp_path, clean_env) -> None:
    from fitevict.config import StoresConfig

    assert load_config(env=clean_env).stores == StoresConfig(True, True, True)
    c = load_config(write(tmp_path, '[stores]\nollama = false\nhf_cache = "hub"'),
                    env={**clean_env, "FITEVICT_LMSTUDIO": "off"})
    assert c.stores == StoresConfig(False, tmp_path / "hub", False)
    assert load_config(env={**clean_env, "FITEVICT_HF_CACHE": "/x/hub"}).stores.hf_cache == Path("/x/hub")
    with pytest.raises(ConfigError, match=r"stores\.ollama = 3 .*true .*false .*folder path"):
        load_config(write(tmp_path, "[stores]\nollama = 3"), env=clean_env)


def test_to_json_redacts_secrets(tmp_path, clean_env) -> None:
    f = write(
        tmp_path,
        'store_url = "postgresql+psycopg://fe:hunter2@db:5432/fe"\n'
        '[server]\napi_keys = ["sk-user-123"]\nadmin_keys = ["sk-admin-456"]\ncluster_key = "ck-789"\n'
        '[models.m]\npath = "m.gguf"',
    )
    c = load_config(f, env=clean_env)
    text = json.dumps(c.to_json())
    for secret in ("sk-user-123", "sk-admin-456", "hunter2", "ck-789"):
        assert secret not in text
    j = c.to_json()
    assert j["server"]["api_keys"] == ["<redacted>"] and j["server"]["admin_keys"] == ["<redacted>"]
    assert j["store_url"] == "postgresql+psycopg://fe:<redacted>@db:5432/fe"
    assert j["models"]["m"]["path"] == str(tmp_path / "m.gguf")
    assert c.server.api_keys == ("sk-user-123",)  # the object itself keeps them
    assert c.server.cluster_key == "ck-789"


def test_the_cluster_key_comes_from_the_file_or_its_variable(tmp_path, clean_env) -> None:
    assert load_config(env=clean_env).server.cluster_key is None
    assert load_config(env={**clean_env, "FITEVICT_CLUSTER_KEY": "ck-env"}).server.cluster_key == "ck-env"
    with pytest.raises(ConfigError, match="cluster_key"):
        load_config(write(tmp_path, '[server]\ncluster_key = "two words"\n'), env=clean_env)


ROOT = Path(__file__).resolve().parents[1]


def test_the_example_file_loads(clean_env) -> None:
    c = load_config(ROOT / "examples" / "fitevict.toml", env=clean_env)
    assert c.models["Qwen3-8B-Q4_K_M"].cache_type_k == "q8_0"
    assert c.models["gemma-3-12b"].n_gpu_layers == 20
    assert c.models["embed"].pin and c.models_dirs[0] == Path("~/models").expanduser()


def test_the_reference_documents_every_key_and_variable() -> None:
    from fitevict.config import config_keys

    doc = (ROOT / "docs" / "config.md").read_text()
    for dotted in config_keys():
        assert f"`{dotted.rsplit('.', 1)[-1]}`" in doc, dotted
    for var in env_variables():
        assert f"`{var}`" in doc, var


def test_one_default_per_knob() -> None:
    # the planner's and the scheduler's policies and the budget take their defaults from the config's records
    from dataclasses import fields

    from fitevict import planner as pl
    from fitevict.config.records import ALLOC_MODES, BudgetConfig, PolicyConfig
    from fitevict.host.budget import DEFAULT_GPU_RESERVE, DEFAULT_RAM_RESERVE
    from fitevict.schedule.scheduler import SchedPolicy

    cfg, sched, plan = PolicyConfig(), SchedPolicy(), pl.Policy()
    for f in fields(SchedPolicy):
        assert getattr(sched, f.name) == getattr(cfg, f.name), f.name
    assert (plan.eviction, plan.exclusive_fraction) == (cfg.eviction, cfg.exclusive_fraction)
    assert (DEFAULT_RAM_RESERVE, DEFAULT_GPU_RESERVE) == (BudgetConfig().ram_reserve, BudgetConfig().gpu_reserve)
    assert pl.ALLOC_MODES is ALLOC_MODES


def test_devices_and_limits_per_device_from_file_and_environment(tmp_path: Path, clean_env: dict[str, str]) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[devices]\nrpc = ["127.0.0.1:50052", "10.0.0.2:50052"]\numa = { Vulkan0 = true }\n'
                 '[budget]\ngpu_limit = { Vulkan0 = "100MiB", RPC0 = "1GiB" }\ngpu_reserve = "256MiB"\n')
    c = load_config(f, env=clean_env)
    assert c.devices.rpc == ("127.0.0.1:50052", "10.0.0.2:50052") and dict(c.devices.uma) == {"Vulkan0": True}
    assert dict(c.budget.gpu_limit) == {"Vulkan0": 100 * MiB, "RPC0": GiB} and c.budget.gpu_reserve == 256 * MiB
    env = {**clean_env, "FITEVICT_GPU_LIMIT": "Vulkan0=200MiB,RPC1=2GiB", "FITEVICT_RPC": "127.0.0.1:6000",
           "FITEVICT_UMA": "Vulkan0=false"}
    c = load_config(env=env)
    assert dict(c.budget.gpu_limit) == {"Vulkan0": 200 * MiB, "RPC1": 2 * GiB}
    assert c.devices.rpc == ("127.0.0.1:6000",) and dict(c.devices.uma) == {"Vulkan0": False}
    assert load_config(env={**clean_env, "FITEVICT_GPU_LIMIT": "8GiB"}).budget.gpu_limit == 8 * GiB
    assert c.to_json()["budget"]["gpu_limit"] == {"Vulkan0": 200 * MiB, "RPC1": 2 * GiB}
    with pytest.raises(ConfigError, match="devices.rpc"):
        load_config(env={**clean_env, "FITEVICT_RPC": "localhost"})
    with pytest.raises(ConfigError, match="budget.gpu_limit"):
        load_config(env={**clean_env, "FITEVICT_GPU_LIMIT": "Vulkan0=lots"})

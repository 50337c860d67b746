"""One typed, frozen configuration, built once and validated with errors that name the key.

Layers, later wins: built-in defaults < TOML file < ``FITEVICT_*`` environment variables < explicit
overrides (a dict of dotted keys the CLI builds from its flags). Every value is checked against its
form; an error names the dotted key (``budget.ram_reserve``, ``models.qwen.ctx``), the value, where
it came from (file, variable, override) and what is allowed. Unknown keys are errors with close
matches. docs/config.md is the reference of every key.

    records.py  the frozen records (Config and its sections) and the vocabularies of their fields
    parsers.py  one parser per form of value
    schema.py   the table of dotted keys: parser, environment variable, file or not
    load.py     the layers, merged into one Config
"""

from fitevict.config.load import default_config_path, load_config
from fitevict.config.records import (ALLOC_MODES, EVICTION_POLICIES, FLASH_ATTN, ORPHAN_POLICIES, REDACTED,
                                     STORE_SCHEMES, BudgetConfig, Config, ConfigError, EngineConfig, LogsConfig,
                                     ModelConfig, PolicyConfig, ServerConfig, StoresConfig, redact_url)
from fitevict.config.schema import OTHER_ENV, config_keys, env_variables

__all__ = ["ALLOC_MODES", "EVICTION_POLICIES", "FLASH_ATTN", "ORPHAN_POLICIES", "OTHER_ENV", "REDACTED",
           "STORE_SCHEMES", "BudgetConfig", "Config", "ConfigError", "EngineConfig", "LogsConfig", "ModelConfig", "PolicyConfig",
           "ServerConfig", "StoresConfig", "config_keys", "default_config_path", "env_variables", "load_config",
           "redact_url"]

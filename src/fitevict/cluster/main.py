"""The serving process of ``fitevict serve --ray ADDRESS``: connect to Ray, start (or find) a node agent on every
node, and serve the cluster's front door.

``serve`` checks the options with the CLI's libraries, then execs this entry point with what it checked, as one
JSON argument (the Ray address, the config file, the overrides by dotted key, the log level):

    python -m fitevict.cluster.main '{"ray": "auto", "config": null, "overrides": {"server.port": 8080}, "log_level": "info"}'
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path


def argv_for(address: str, config: Path | None, overrides: dict, log_level: str) -> list[str]:
    """The command line that runs this entry point (what ``serve --ray`` execs)."""
    spec = {"ray": address, "config": str(config) if config is not None else None, "overrides": overrides,
            "log_level": log_level}
    return [sys.executable, "-m", "fitevict.cluster.main", json.dumps(spec)]


def main(args: list[str] | None = None) -> int:
    spec = json.loads((args if args is not None else sys.argv[1:])[0])
    from fitevict.config import ConfigError, load_config

    config = Path(spec["config"]) if spec.get("config") else None
    try:
        cfg = load_config(config, overrides=spec.get("overrides") or {})
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr, flush=True)
        return 2
    level = str(spec.get("log_level") or "info")
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")

    from fitevict.cluster.fleet import NAMESPACE, Fleet, gcs_reconnect_env

    # read by Ray's core worker when it starts (in ray.init): how long this driver waits for an unreachable GCS
    os.environ.update(gcs_reconnect_env(cfg.server.ray_gcs_reconnect_seconds))
    import ray
    import uvicorn

    from fitevict.cluster.front import ClusterDoor

    ray.init(address=spec["ray"], namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    print(f"fitevict: Ray cluster at {spec['ray']}: {len(nodes)} node(s) alive", file=sys.stderr, flush=True)
    app = ClusterDoor(cfg, Fleet(key=cfg.server.cluster_key, gcs_reconnect_s=cfg.server.ray_gcs_reconnect_seconds))
    from fitevict.server.runner import CleanExitServer

    # SIGTERM or SIGINT: a clean shutdown that exits 0 (uvicorn.run raises the signal again, an exit by it)
    CleanExitServer(uvicorn.Config(app, host=cfg.server.host, port=cfg.server.port, log_level=level.lower(),
                                   access_log=False, lifespan="on")).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Entry point of the seat process: bind, load, log the footprint, serve until /unload or SIGTERM, tear down."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback

from fitevict.engines.transformers.seat import (EXIT_NO_WEIGHTS, FAILED_LINE, FOOTPRINT_LINE, STOPPING_LINE,
                                         TEARDOWN_LINE, parse_seat_argv)


def main(argv: list[str]) -> int:
    args = parse_seat_argv(argv)
    stop = threading.Event()
    signalled: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:  # only enqueues; teardown runs on the main thread
        signalled.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    from fitevict.engines.transformers.seat.http import make_server, serve_in_thread
    from fitevict.engines.transformers.seat.seat import HfSeat

    seat = HfSeat(args.model, args.cfg, test_keep=args.test_keep)
    srv = make_server(seat, args.port, args.name, stop.set)
    serve_in_thread(srv)  # /health answers 503 "loading" while the model loads
    print(f"seat listening on 127.0.0.1:{args.port}, loading {args.model}", file=sys.stderr, flush=True)
    try:
        seat.load()
    except Exception as e:  # noqa: BLE001 - a failed load is reported with its reason, then the seat exits
        seat.state, seat.reason = "failed", f"{type(e).__name__}: {e}"
        traceback.print_exc()
    if seat.state == "failed":
        print(FAILED_LINE + json.dumps({"reason": seat.reason}), file=sys.stderr, flush=True)
        srv.shutdown()
        return EXIT_NO_WEIGHTS if seat.reason.startswith("no weights") else 1
    print(FOOTPRINT_LINE + json.dumps(seat.footprint), file=sys.stderr, flush=True)
    stop.wait()
    why = f"{signalled[0]} received" if signalled else "/unload asked"
    print(STOPPING_LINE + why, file=sys.stderr, flush=True)
    report = seat.unload()
    print(TEARDOWN_LINE + json.dumps(report), file=sys.stderr, flush=True)
    srv.shutdown()
    # the teardown has been measured and reported: exit now, without the interpreter's own teardown of torch
    # (seconds on a busy machine), so the release the supervisor verifies comes sooner
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

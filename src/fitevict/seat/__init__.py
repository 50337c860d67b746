"""A seat's life, from its price to its end: one engine process spawned, loaded, made ready, read, watched, stopped
and released, and its load and end recorded. The supervisor (``fitevict.supervisor``) builds these collaborators
with the parts of the residents as a whole that they work with (``parts``), and hands them the scheduler's
commands.

    running.py    one seat's process: its running state, spawn, the wait until it answers its health check
    processes.py  which engine runs an entry, its argv, port and log
    price.py      what a new seat is priced at
    launching.py  an engine process from spawn to healthy, with its retries (a taken port, a repack crash)
    crash.py      a crash while repacking, retried without
    readiness.py  what a healthy seat starts with
    loading.py    a load, from its price to its record (a failed or cancelled one recorded too)
    measure.py    reading a seat after its load; the engine overhead it showed
    learning.py   what a load teaches: overheads, the guarded measurement stored
    loadrecord.py a load's record
    timings.py    the engine's own timings of a seat's answers, summed
    watching.py   a serving seat's exit no stop asked for: a crash (a draining seat's: the stop it drained for)
    frozen.py     a seat stopped by a signal or stuck while it serves
    stopping.py   a stop the scheduler asked for, recorded
    ending.py     every stop's end: the process group stopped, the release verified, the seat forgotten
    release.py    the one stop path and its release verification
    storing.py    the store's record of each live seat; measurements stored and read
    accounts.py   what a seat's events say beyond its figures (strategy, timings, leak check, failures)
    parts.py      the residents' parts a seat works with (history, planning, saved prompts), as protocols
"""

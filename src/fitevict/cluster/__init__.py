"""One endpoint for several machines, on Ray (the ``ray`` extra): a node agent per Ray node runs that node's own
door, and the cluster's front door routes each request to the node where its model is, or fits best.

    route.py   PURE: the routing rule over the nodes' facts and dry runs
    facts.py   PURE: a node's answers (JSON) as routing records
    merge.py   PURE: the nodes' lists, residents and history as one view
    agent.py   the node agent: runs the node's door, reports its facts and dry runs
    fleet.py   Ray's membership, an agent per node, the facts polled with their age
    membership.py PURE: whether Ray's node list answers, and what was missed while it did not
    stop.py    ``fitevict cluster stop``: every agent stopped, those that had ended listed as gone
    front.py   the cluster's front door (ASGI): relays inference to the chosen node, merges the views
    admin.py   load, unload, plan and rescan, each sent to the nodes it concerns
    metrics.py PURE: the nodes' /metrics as one, each sample with its node
    page.py    /metrics and the dashboard over every node
    wire.py    the front door's ASGI plumbing
    main.py    ``fitevict serve --ray ADDRESS``'s serving process

Ray is imported only by ``fleet``, ``stop`` and ``main``: the rest runs, and is tested, without it.
"""

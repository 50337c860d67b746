"""The request's spine: which model a name means, on what terms it is loaded, and what loading it cost.

    catalog.py         the models on disk and in other tools' stores, each with a key
    names.py           how a name a client sends finds a model, and what is said when it finds none or several
    lora.py            LoRA adapters in the catalog: ``<base key>:<adapter>``, served on their base's seat
    store_settings.py  what the stores say about their models, as catalog settings
    contract.py        the per-request load contract: parsed and validated, and what it fixes on a seat
    ask.py             what a request asks of a seat (``Ask``), built once at the door: its LoadConfig, the file
                       it loads, the planner's request
    loadreport.py      what serving one request cost in loading (it reads the supervisor's state, so the layers
                       test puts it on the supervisor's stage)

A folder's GGUF files (models, splits, projectors) are read by ``fitevict.sources.files``, which the stores'
readers share with the catalog.
"""

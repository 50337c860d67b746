"""The declared family: any OpenAI-compatible server process fitevict does not know, described by a folder that
holds its manifest (``fitevict-engine.toml``): the command line that starts it, the memory it declares it holds,
the name it serves and its health path. Its price is the declared footprint (source: declared); the door measures
the real process (PSS) like any seat, and what it measured prices the next load of the same manifest."""

"""The transformers family: the torch engine (``engine``) and its seat process (``seat``)."""

"""What a model costs on this machine: the price book (stored measurements, corrections learned from loads and
outgrowths, dry runs, the engine's overhead), read ahead into one immutable price sheet per file, so a plan does no
I/O. Below the supervisor, above the pure rules of ``fitevict.pricing``."""

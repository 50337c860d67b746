"""Pure pricing: GGUF files -> structure -> Footprint. No processes, no clocks, no logging."""

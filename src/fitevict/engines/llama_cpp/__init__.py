"""The llama.cpp engine family: what is true of llama.cpp's builds, devices and backends alone."""

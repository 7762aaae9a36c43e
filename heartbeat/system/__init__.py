"""The edges to the operating system: safe file reads and writes, the state dir's layout, clocks,
logging, systemd, signals at start, running the operator's commands, the world's fingerprints."""

"""Presets for the agent CLIs: one module per CLI and what they share."""

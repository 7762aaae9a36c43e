"""The TOML config: its shape, its loading and its checks."""

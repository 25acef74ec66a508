"""twinspark components: one module per capability, plus the config schema (config.py)."""

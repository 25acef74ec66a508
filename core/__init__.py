"""The rules and facts every layer shares, free of Pulumi: the on-node contract (`contract`), host
keys, the platform gate, the recipes, vLLM's flags and the memory budget. Nothing here imports
the rest of the project (tests/test_layers.py)."""

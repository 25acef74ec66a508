"""twinspark: two (or more) DGX Sparks as one self-healing vLLM endpoint. The Pulumi program is the
repository's __main__.py; this package is the installed `twinspark` command (cli.py) and the version."""

__version__ = "0.1.0"

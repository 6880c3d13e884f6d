"""TurboProm server: HTTP API, CLI, config and wiring (the only package that imports every stage)."""
__version__ = "0.1.0"

"""Prometheus-style scraper: config (config.py), target discovery and labels (targets.py),
per-target loops (loop.py), and the manager wired as ctx.components.scraper (manager.py)."""

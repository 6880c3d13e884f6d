"""HTTP route modules. Each exposes ``setup(app, ctx)``; ``turboprom.server`` calls them all."""

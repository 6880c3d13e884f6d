"""Discrete-event cluster simulator and trace replay for comparing the bundled schedulers."""

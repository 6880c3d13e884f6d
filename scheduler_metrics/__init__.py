"""scheduler_metrics stage (see ../shared/DESIGN.md)."""

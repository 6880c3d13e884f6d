"""planner stage (see ../shared/DESIGN.md)."""

"""Live queue-backlog and congestion signals computed from ingested worker metrics."""
from scheduler_metrics.congestion.config import CongestionConfig
from scheduler_metrics.congestion.tracker import CongestionSnapshot, CongestionTracker

__all__ = ["CongestionConfig", "CongestionSnapshot", "CongestionTracker"]

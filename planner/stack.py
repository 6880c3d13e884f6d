"""Builds the planner's parts from config and connects them (used by turboprom/wiring.py and tests)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.canary import Canary, Foreground
from planner.persist import SDSPersistence
from planner.planned_engine import PlannedEngine
from planner.planner import Planner, PlannerConfig
from planner.query_log import QueryLog
from planner.rewrite import RewriteHook
from planner.rewrite_rules import RewriteContext
from planner.step_answers import StepAnswers, WriteFrontier
from planner.summarizer import Summarizer


@dataclass
class PlannerStack:
    config: PlannerConfig
    summarizer: Summarizer
    query_log: QueryLog
    planner: Planner
    hook: RewriteHook
    canary: Canary
    engine: PlannedEngine | None
    persistence: SDSPersistence | None


def build(storage: Any, engine: Any, data_dir: str | Path | None, raw_config: dict[str, Any] | None,
          step_frontier: WriteFrontier | None = None, late_window_ms: int = 0) -> PlannerStack:
    """``step_frontier``: the write log step answers rely on when the writes are seen elsewhere (a
    cluster querier's, turboprom/cluster/cluster_frontier.py); step answers are then kept even with
    the planner's summaries off. ``late_window_ms``: how old a sample storage still accepts (its
    out-of-order window): after a restart, panes that recent are rebuilt from raw storage
    (``SDSPersistence.recover``)."""
    cfg = PlannerConfig.from_raw(raw_config)
    root = Path(data_dir) / "planner" if data_dir else None
    qlog = QueryLog(root / "planner.duckdb" if root else None)
    persistence = SDSPersistence(root, qlog.con, qlog.db_lock) if root else None
    summ = Summarizer(storage, WriteFrontier(cfg.seal_delay_ms))
    planner = Planner(cfg, summ, qlog, persistence, storage)
    foreground = Foreground()
    canary = Canary(cfg.canary_fraction, foreground=foreground)
    hook = RewriteHook(RewriteContext(planner.find_sds, canary, cost_based=cfg.cost_based, find_group=planner.find_group_sds,
                                      on_trial=canary.trial, measure_first=cfg.measure_first,
                                      trial_busy=canary.busy))
    frontier = step_frontier if step_frontier is not None else summ.frontier
    steps = (StepAnswers(frontier, cfg.step_cache_bytes, measured=cfg.cost_based)
             if cfg.step_cache_bytes > 0 and (cfg.enabled or step_frontier is not None) else None)
    planned = (PlannedEngine(engine, hook, qlog, planner, step_answers=steps, foreground=foreground)
               if engine is not None else None)
    if persistence is not None:
        # restore SDSs and rebuild their open panes from raw storage before ingestion starts
        newest = None
        for sds in persistence.load():
            sds.seal_delay_ms = cfg.seal_delay_ms
            n = persistence.recover(sds, storage, late_window_ms) if storage is not None else None
            if n is not None:
                newest = n if newest is None else max(newest, n)
            summ.add(sds)
        if newest is not None:
            summ.note_time(newest)
    planner.pin_from_config()
    return PlannerStack(cfg, summ, qlog, planner, hook, canary, planned, persistence)

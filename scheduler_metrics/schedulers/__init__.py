"""Bundled schedulers: Vesta (holder/executor with congestion pricing), SMetric, router baselines
(round-robin, least-queue, prefix affinity, llm-d-style weighted scorer, Dynamo-style cost), and
AgentWeave's flow-decomposition chunk policy. They consume TurboProm's congestion signals."""

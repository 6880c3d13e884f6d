"""KedgeFlow-style action control: an approved action is bound to a signed grant for that exact
action; a gateway atomically consumes a single-use allowance, rechecks authority, dispatches; an
uncertain outcome never restores the allowance; every step lands in a tamper-evident audit log.

Modules: action (canonical bytes), grant (Ed25519 grants), ledger (embedded SQLite ledger),
ledger_etcd (etcd v3 JSON-gateway ledger), policy (approval decisions), audit (hash-chained log
with signed heads), gateway (verify -> consume -> recheck -> dispatch), targets (conditional commit).
"""

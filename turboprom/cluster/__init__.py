"""TurboProm as a cluster: the ``--role`` processes of ``turboprom serve`` (docs/cluster.md).

The roles are wiring of the existing stages around two existing distributed engines, never
replication or consensus written here:

- ``distributor``: the Prometheus write API of turboprom/routes/ingest_api.py (decode, validation,
  tenancy, limits) over an ingest pipeline whose storage is the JetStream log (``log_publisher``);
  a write is acknowledged only after JetStream acknowledged every partition's message.
- ``ingester``: an ordinary TSDB (storage/) fed from the partitions it owns (``ingester``), with
  membership and ownership in etcd (``membership``, ``assignment``), serving partition reads
  (``read_api``).
- ``querier``: the whole query API of the single node over ``fanout_storage``, which reads each
  partition from exactly one live owner.

``all`` is the embedded single node, unchanged.
"""

"""Storage stage (leaf): series identity and index, WAL, head, Parquet blocks, compaction,
retention, SDS summary store and the DuckDB catalog. Imports nothing from other stages."""

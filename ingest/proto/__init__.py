"""Remote-write protobuf messages (see remote.proto; descriptors built in messages.py)."""

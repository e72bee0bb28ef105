"""The node's own data dir: paths, skulk.yaml, the event log and snapshots, the master lease,
intent records, secret files and file locks. Nothing here knows about models."""

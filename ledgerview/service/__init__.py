"""The ledgerview service: one process that keeps topics ingested, compacted, cleaned and retained, and reports
on them over HTTP. ``ledgerview serve --config conf/ledgerview.toml``; see ledgerview/service/run.py."""

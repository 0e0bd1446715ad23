"""Stores: the only room that knows the on-disk formats (and imports pyarrow). ``files`` (manifests, atomic
writes, resume rules), ``inputs`` (input records), ``jsonl`` and ``parquet`` (the two results formats),
``formats`` (which one a store has or gets), ``samples`` (the sample store's schema and its one reader)."""

"""Connectors: the ``Source`` and ``Sink`` interfaces, the Parquet sink, the log's topics as
source and sink, and the Delta Lake table sink."""

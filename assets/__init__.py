"""Dagster side of dkvstream: jobs as assets, checkpoints as materializations.

``dkvstream.assets.definitions.dkvstream_definitions`` makes the ``Definitions`` of stream jobs;
``dkvstream.examples.definitions.defs`` are the demo ones ``dagster dev`` loads (workspace.yaml).
"""

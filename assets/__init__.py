"""Dagster side of dkvstream: jobs as assets, checkpoints as materializations.

``assets.definitions.defs`` is the single ``Definitions`` loaded by ``dagster dev``
(see workspace.yaml).
"""

"""Command-line tools: ``python -m operators.tools.run_job`` runs a job;
``python -m operators.tools.state_reader`` reads an operator's state at a checkpoint."""

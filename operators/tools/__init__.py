"""Command-line tools: ``python -m dkvstream.operators.tools.run_job`` runs a job;
``python -m dkvstream.operators.tools.state_reader`` reads an operator's state at a checkpoint."""

"""Example jobs shipped with dkvstream (importable by Spark workers)."""

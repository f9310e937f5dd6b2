"""dkvstream storage."""

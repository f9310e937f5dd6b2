"""The runtime: the driver (``driver.JobRunner``) plans, runs and commits epochs; a task
(``task.run_task``) runs one operator over one key-group range with its DKV state.
Checkpoints, recovery, retention (cleanup), the control objects, timers and dead letters
live beside them. Spark is only the transport (``dkvstream.operators.spark``)."""

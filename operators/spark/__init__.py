"""PySpark plumbing: the session and its configuration (``session``), one operator as a
Spark stage (``stage``) and the Python worker daemon that preloads the task modules
(``daemon``)."""

"""The Spark session jobs run on, configured for Arrow transfer and one task per range.

Configuration, later wins: ``SPARK_CONF_DIR``'s ``spark-defaults.conf``
(``platform/conf/`` in the launch scripts), the defaults below, the master from the
environment variable ``DKVSTREAM_SPARK_MASTER`` (default ``local[2]``), and the
``conf`` argument (Dagster's ``PySparkResource`` passes its ``spark_config``). So the
same job runs on ``local[2]`` or a cluster.

Python workers are forked from ``dkvstream.operators.spark.daemon``, which imports the task
modules once per executor instead of once per worker.

On a cluster (any master that is not ``local...``), executors share nothing with the
driver but the Spark configuration: the object-store variables set in the driver's
environment (``OBJECT_STORE_ENV``: S3 endpoint, region, credentials, retries) are passed
to them as ``spark.executorEnv.<NAME>``, so tasks reopen an ``s3://`` store exactly as
the driver does. Spark redacts the secret ones in its UI and logs
(``spark.redaction.regex``).

The driver's JVM (PySpark's Py4J gateway, ``spark-submit`` started by this process) runs
in a session of its own, so a signal to this process's group (``kill -TERM -<pgid>``,
Ctrl-C in a terminal, ``systemctl stop`` with ``KillMode=mixed``) reaches only the
Python driver, which decides when the JVM stops: ``stop_spark`` ends it after the session.
The JVM still never outlives this process: it exits when its stdin, a pipe from this
process, closes (PySpark's ``PythonGatewayServer``), so also on ``kill -9``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"

# How long ``stop_spark`` waits for the JVM to exit once told to (its shutdown hooks stop
# the SparkContext's leftovers: a second or two), before killing it.
JVM_EXIT_TIMEOUT_S = 60.0

DEFAULT_CONF: dict[str, str] = {
    "spark.app.name": "dkvstream",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # One shuffle partition per key-group range: coalescing would run two ranges in one
    # task, one after the other, halving parallelism.
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The web UI (jobs, stages, tasks, executors) on a free port chosen at start, not
    # 4040: several drivers on one machine never collide. run_job and the Dagster run
    # log print its URL (``SparkContext.uiWebUrl``); ``spark.ui.enabled=false`` turns it off.
    "spark.ui.enabled": "true",
    "spark.ui.port": "0",
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
    # An epoch's tasks read shuffle blocks from every executor: waiting for a "local"
    # slot (3 s by default) only delays them.
    "spark.locality.wait": "0s",
    "spark.sql.session.timeZone": "UTC",
    # Workers forked from a daemon that imported the task modules once (see
    # operators/spark/daemon.py).
    "spark.python.daemon.module": "dkvstream.operators.spark.daemon",
}

# The Python daemon's environment (``spark.executorEnv.*``): keeps its imports thread-free,
# so forking workers from it is safe (operators/spark/daemon.py). A task runs on one core,
# so one BLAS thread is what it should use anyway.
DAEMON_ENV: dict[str, str] = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
DEFAULT_CONF.update({f"spark.executorEnv.{name}": value for name, value in DAEMON_ENV.items()})


# Read by storage/objectstore/s3.py (and botocore) in every process that opens the store.
OBJECT_STORE_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
                    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                    "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE")


def ensure_python_workers_use_this_interpreter() -> None:
    """Spark's Python workers run ``python3`` from PATH, not this venv: point them here
    before a session starts (else pyarrow is "missing" in tasks)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def executor_env_conf(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``spark.executorEnv.<NAME>`` for each ``OBJECT_STORE_ENV`` variable set in
    ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return {f"spark.executorEnv.{name}": environ[name] for name in OBJECT_STORE_ENV if environ.get(name)}


def spark_conf(conf: dict[str, str] | None = None) -> dict[str, str]:
    """The effective configuration: defaults, env master, the object-store variables for
    executors when the master is a cluster, then ``conf``."""
    merged = dict(DEFAULT_CONF)
    merged["spark.master"] = os.environ.get("DKVSTREAM_SPARK_MASTER", DEFAULT_MASTER)
    master = (conf or {}).get("spark.master", merged["spark.master"])
    if not master.startswith("local"):
        merged.update(executor_env_conf())
    merged.update(conf or {})
    return merged


def get_spark(conf: dict[str, str] | None = None):
    """Get or create the process's SparkSession (a local one takes 10-20 s to start).

    The first call starts the driver's JVM in a session of its own (module docstring).

    Args:
        conf: Spark settings overriding the defaults (``spark.master`` included).

    Returns:
        ``pyspark.sql.SparkSession``.

    Raises:
        JavaNotFoundError: no Java to start Spark's JVM with (``check_java``).
    """
    ensure_python_workers_use_this_interpreter()
    from pyspark.sql import SparkSession

    merged = spark_conf(conf)
    _launch_jvm(merged)
    builder = SparkSession.builder
    for k, v in merged.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def describe_session(spark) -> str:
    """One line for a log once ``spark`` is up: ``Spark up: master local[2], application
    local-1700000000000, UI at http://host:port`` (``UI off`` when ``spark.ui.enabled`` is
    false)."""
    sc = spark.sparkContext
    ui = f"UI at {sc.uiWebUrl}" if sc.uiWebUrl else "UI off (spark.ui.enabled=false)"
    return f"Spark up: master {sc.master}, application {sc.applicationId}, {ui}"


INSTALL_JAVA = ("install Java 17 or newer: `bash platform/install-java.sh` (Debian/Ubuntu), or "
                "`sudo apt-get install openjdk-17-jre-headless`; `run_job --in-process` runs without Spark")


def check_java(environ: dict[str, str] | None = None) -> str:
    """The ``java`` Spark's launcher will run (``spark-class``: ``$JAVA_HOME/bin/java``
    when ``JAVA_HOME`` is set, else ``java`` on ``PATH``), checked before PySpark starts
    it, whose own error is only "Java gateway process exited before sending its port
    number".

    Args:
        environ: the environment (default ``os.environ``).

    Returns:
        The path of the ``java`` executable.

    Raises:
        JavaNotFoundError: ``JAVA_HOME`` has no ``bin/java``, or no ``java`` on ``PATH``;
            the message says how to install it.
    """
    from dkvstream.operators.errors import JavaNotFoundError

    environ = os.environ if environ is None else environ
    home = environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            raise JavaNotFoundError(f"Spark cannot start: JAVA_HOME={home} has no bin/java; point JAVA_HOME "
                                    f"at a Java installation, unset it to use `java` on PATH, or {INSTALL_JAVA}")
        return java
    java = shutil.which("java", path=environ.get("PATH", os.defpath))
    if java is None:
        raise JavaNotFoundError(f"Spark cannot start: no `java` on PATH and JAVA_HOME is not set; {INSTALL_JAVA}")
    return java


def _launch_jvm(conf: dict[str, str]) -> None:
    """Starts the process's Py4J gateway JVM, as PySpark would on the first SparkContext
    (same ``spark-submit`` command, same ``--conf`` settings), but in a new session
    (``setsid``): signals sent to this process's group do not kill it under the driver.
    Checks for Java first (``check_java``). Does nothing when the gateway already exists
    (a session started or stopped earlier, or ``spark-submit`` running this process:
    ``PYSPARK_GATEWAY_PORT``)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    # PySpark has no public way to pass Popen arguments to the gateway it launches, but
    # SparkContext adopts a gateway already set here (SparkContext._ensure_initialized).
    with SparkContext._lock:
        if SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
            check_java()
            gateway = launch_gateway(SparkConf().setAll(conf.items()),
                                     popen_kwargs={"start_new_session": True})
            SparkContext._gateway = gateway
            SparkContext._jvm = gateway.jvm


def stop_spark(spark) -> None:
    """Stops ``spark`` (``SparkSession.stop``) and ends the process's driver JVM, waiting
    for it to exit, so no Spark process outlives the caller. A JVM that already died (an
    out-of-memory kill, a signal sent to it alone) is logged, not raised: its death is
    reported by whatever Spark call failed first. For the end of a process (``run_job``
    calls it last): nothing of Spark is usable after it.

    Args:
        spark: a ``pyspark.sql.SparkSession`` from ``get_spark``.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)  # None: a gateway this process did not start
    if jvm is not None and jvm.poll() is not None:
        log.warning("Spark's driver JVM (pid %d) exited with status %s before the session was stopped",
                    jvm.pid, jvm.returncode)
    else:
        spark.stop()
    if jvm is None:
        return
    with contextlib.suppress(Exception):
        gateway.shutdown()  # Py4J's client side: no more calls to the JVM
    SparkContext._gateway = SparkContext._jvm = None
    with contextlib.suppress(OSError):
        jvm.stdin.close()  # PythonGatewayServer exits at the end of its stdin
    try:
        jvm.wait(JVM_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("Spark's driver JVM (pid %d) did not exit %.0f s after its stdin closed: killing it",
                    jvm.pid, JVM_EXIT_TIMEOUT_S)
        jvm.kill()
        jvm.wait()

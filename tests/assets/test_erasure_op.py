"""The Dagster ``erasure`` job on a stopped in-process job: the key's state is erased, the
report materializes the ``erasure/<job>`` asset, and the state scan finds nothing."""
from __future__ import annotations

from dagster import DagsterInstance

from dkvstream.assets.erasure import erasure_asset_key, erasure_job
from dkvstream.assets.resources import ObjectStoreResource
from dkvstream.operators.runtime.erasure_scan import scan_store
from tests.operators import small_keyed_count as skc


def test_erasure_job_materializes_the_report(tmp_path):
    with skc.runner(str(tmp_path)) as r:
        r.run(max_epochs=3)
        store = r.store
    assert scan_store(store, b"k199", "jobs/small_count/state/").holding
    config = {"job": "small_count", "key": "k199", "offline": True, "key_column": "key",
              "job_spec": "tests.operators.small_keyed_count:job", "scan_prefix": "jobs/small_count/state/"}
    with DagsterInstance.ephemeral() as instance:
        result = erasure_job.execute_in_process(run_config={"ops": {"erase_key": {"config": config}}},
                                                resources={"object_store": ObjectStoreResource(root_uri=str(tmp_path))},
                                                instance=instance)
        assert result.success
        [event] = instance.fetch_materializations(erasure_asset_key("small_count"), limit=1).records
        metadata = event.asset_materialization.metadata
    assert metadata["status"].value == "complete" and metadata["applied_epoch"].value == 4
    assert metadata["scan_holding"].value == [] and metadata["objects_that_held"].value
    assert scan_store(store, b"k199", "jobs/small_count/state/").holding == []

"""The tests' Ray cluster (tests/ray_cluster.py) cleans up after itself, also when it fails to start."""
import os
import subprocess
import sys

import pytest
from ray.cluster_utils import Cluster
from ray_cluster import start_loopback_cluster


def test_a_cluster_whose_node_fails_to_start_leaves_no_process_behind(monkeypatch):
    """As on a loaded CI machine: the head node's processes start, then Ray's wait for its raylet to register runs
    out and add_node raises before the cluster knows the node."""
    started = []

    def add_node(self, **settings):
        log_dir = f"--log_dir={os.environ['RAY_TMPDIR']}/t/session_latest/logs"  # as Ray's gcs_server is started
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", log_dir]))
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(Cluster, "add_node", add_node)
    try:
        with pytest.raises(Exception, match="timed out during startup"):
            start_loopback_cluster()
        assert started and all(process.poll() is not None for process in started), "the failed node's process runs on"
    finally:
        for process in started:
            process.kill()

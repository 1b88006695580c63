"""A multi-node Ray cluster on this machine, listening on 127.0.0.1 only, without telemetry: for tests.

    cluster, env = start_loopback_cluster(nodes=2, cpus_per_node=1)
    connect(cluster)        # this process becomes a driver; subprocesses join with `env` (RAY_ADDRESS, ...)
    ...
    stop_loopback_cluster(cluster)     # also disconnects this process

Each node is a separate raylet with its own node id and resources (ray.cluster_utils.Cluster, what Ray's
own tests use), so placement across "nodes" is real; they all live on 127.0.0.1.

What keeps it on loopback and quiet (Ray 2.60, read from its source):
- node_ip_address=127.0.0.1: every Ray server binds to the node address.
- RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: otherwise ray.init(address="127.0.0.1:PORT") and the nodes'
  own lookups replace 127.0.0.1 by the host's external IP (services.resolve_ip_for_localhost), which
  nothing listens on.
- Everything Ray writes lives in one scratch folder of this cluster, removed at the end: the nodes'
  temp_dir, and the head's address file, which ray.cluster_utils writes to RAY_TMPDIR/ray/ray_current_cluster
  (default $TMPDIR/ray or /tmp/ray, a folder it does not create: on a machine where Ray never ran that was
  a FileNotFoundError). So a plain ray.init() elsewhere on the machine starts its own Ray instead of
  joining this cluster, and leftovers of an earlier Ray cannot make the tests pass or fail.
- RAY_USAGE_STATS_ENABLED=0: no usage report. Still, a cluster not started by ray.init() posts a
  "usage stats disabled" notice to usage-stats.ray.io from its dashboard process;
  RAY_USAGE_STATS_REPORT_URL sends that to a closed local port instead.
- The dashboard process (started even with include_dashboard=False, for UsageStatsHead) asks the
  Azure/GCP/AWS metadata addresses (169.254.169.254, metadata.google.internal) which cloud it runs on,
  unless ~/ray_bootstrap_config.yaml exists (usage_lib.get_cluster_config_to_report). The head node's
  processes therefore run with HOME set to a scratch folder that holds an empty one.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

QUIET_LOOPBACK_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",  # the discard port: nothing listens
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_raylet_start_wait_time_s": "180",  # a loaded 2-core CI machine registers nodes slowly (default 60)
    # Ray runs its workers at nice 15 (RayConfig worker_niceness), so that its own servers come first on a busy node.
    # Beside the suite's other streams (notebooks, ranks, all at nice 0) such a worker got 6 % of a core (top): a
    # recipe's ResNet-50 still building its model after 8 minutes, and the test timed out (CI of 2026-12-07).
    "RAY_worker_niceness": "0",
}


@contextlib.contextmanager
def _environment(**values):
    """While inside: os.environ with `values` set (None: unset)."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _loopback_addresses():
    """While inside: this process resolves 127.0.0.1 as 127.0.0.1 (see the module's docstring)."""
    import ray._private.ray_constants as ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # what RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 sets at import
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def start_loopback_cluster(nodes: int = 2, cpus_per_node: int = 1):
    """Start `nodes` Ray nodes on 127.0.0.1; return (cluster, env for subprocesses that should join it).

    This process's environment is left as it was: only the nodes' processes get the settings. One cluster runs on
    the machine at a time (test files on other pytest-xdist workers wait for it): two would share 2 cores."""
    from ray.cluster_utils import Cluster

    one_at_a_time = open(os.path.join(tempfile.gettempdir(), "cookbook-ray-cluster.lock"), "w")
    fcntl.flock(one_at_a_time, fcntl.LOCK_EX)

    scratch = tempfile.mkdtemp(prefix="rayt-", dir="/tmp")  # short: Ray's unix socket paths must fit 107 bytes
    home = os.path.join(scratch, "home")
    os.makedirs(home)
    os.makedirs(os.path.join(scratch, "ray"))  # RAY_TMPDIR/ray: where the head's address file goes
    with open(os.path.join(home, "ray_bootstrap_config.yaml"), "w") as f:
        f.write("{}\n")
    common = dict(num_cpus=cpus_per_node, node_ip_address="127.0.0.1", object_store_memory=80 * 2**20)
    cluster = Cluster(shutdown_at_exit=True)
    cluster.scratch, cluster.one_at_a_time = scratch, one_at_a_time
    try:
        # An MLflow store an earlier test chose in this process (mlflow.set_tracking_uri sets MLFLOW_TRACKING_URI)
        # must not reach the nodes or the processes that join them: the recipes track into their project's store.
        with _environment(**QUIET_LOOPBACK_ENV, RAY_TMPDIR=scratch, MLFLOW_TRACKING_URI=None), _loopback_addresses():
            with _environment(HOME=home):
                cluster.add_node(include_dashboard=False, temp_dir=os.path.join(scratch, "t"), **common)
            for _ in range(nodes - 1):
                cluster.add_node(**common)
            cluster.wait_for_nodes(timeout=180)
    except BaseException:
        stop_loopback_cluster(cluster)
        raise
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, **QUIET_LOOPBACK_ENV,
           "RAY_ADDRESS": cluster.address}
    return cluster, env


def connect(cluster) -> None:
    """Attach this process to the cluster as a driver (rank output reaches it only through @distributed)."""
    import ray

    with _loopback_addresses():
        ray.init(address=cluster.address, log_to_driver=False)


def stop_loopback_cluster(cluster) -> None:
    import psutil
    import ray

    ray.shutdown()
    cluster.shutdown()
    # A node whose start failed is not in the cluster's list, so cluster.shutdown() leaves the processes it had started
    # (seen on a loaded CI machine: Ray's wait for the head's raylet to register ran out, and its gcs_server, raylet and
    # workers then counted as processes left behind by every later test of that pytest worker). Each Ray process names
    # the scratch folder in its command line.
    left = [process for process in psutil.process_iter(["cmdline"])
            if any(cluster.scratch + os.sep in arg for arg in process.info["cmdline"] or [])]
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=30)  # reaped, where they are this process's children
    shutil.rmtree(cluster.scratch, ignore_errors=True)
    cluster.one_at_a_time.close()  # the next cluster may start


if __name__ == "__main__":  # a cluster to experiment with: prints its address, runs until Ctrl-C
    import time

    cluster, _ = start_loopback_cluster()
    print(f"RAY_ADDRESS={cluster.address}  (and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 to connect)", flush=True)
    try:
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        stop_loopback_cluster(cluster)

import os

# No hub, no telemetry, no cloud probes: set before anything imports transformers, trl, axolotl or ray,
# and inherited by the notebook kernels and ranks the tests start.
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "DO_NOT_TRACK": "1",
    "MPLBACKEND": "Agg",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(key, value)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """standin(NAME) -> folder of a tiny offline stand-in model (built once per test session)."""
    root = tmp_path_factory.mktemp("standins")
    built = {}

    def build(name: str):
        if name not in built:
            from nbhelpers import standins

            built[name] = standins.make(name, size="tiny", out=root / name)
        return built[name]

    return build


@pytest.fixture(scope="session")
def ray_cluster():
    """A 2-node Ray cluster on 127.0.0.1 (one CPU each; see tests/ray_cluster.py), started once for every
    Ray test. This process is attached to it; yields the environment for subprocesses that should join
    it (RAY_ADDRESS and the loopback/no-telemetry settings)."""
    import ray
    from ray_cluster import start_loopback_cluster, stop_loopback_cluster

    cluster, env = start_loopback_cluster(nodes=2, cpus_per_node=1)
    ray.init(address=cluster.address, log_to_driver=False)  # rank output reaches a test only through @distributed
    try:
        yield env
    finally:
        stop_loopback_cluster(cluster)

"""`@ray_launch`: run a function that drives Ray (Ray Data, Ray Train, actors of its own) on a Ray cluster over GPUs.

    from nbhelpers import ray_launch

    @ray_launch(gpus=4, gpu_type="A10", remote=True)    # serverless_gpu.ray's and databricks.air's signature
    def embed():
        ds = ray.data.read_parquet(...)                 # Ray is up when the function starts
        return ds.map_batches(Embedder, num_gpus=1, concurrency=4).count()
    count = embed.distributed()                         # the function's return value

On Databricks the decorator provisions the GPUs, starts Ray on them and runs the function on the first one as
Ray's driver. Here nothing is provisioned: with remote=True the function runs as a driver of the Ray cluster
this process is attached to (`ray.init(address=...)` or RAY_ADDRESS), which must have `gpus` GPUs of
`gpu_type`; with remote=False it starts a Ray of its own on this machine (`gpus` of its GPUs, leased as
@distributed leases them; CPUs only where there is no GPU), runs the function and shuts that Ray down. The
function runs in this process, so its output and that of its Ray tasks appear in the cell.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys

from nbhelpers.launch.databricks import one_of, say_what_pools_mean_here
from nbhelpers.launch.errors import import_ray
from nbhelpers.launch.gpu_lease import GpuLease
from nbhelpers.launch.gpus import check_count, check_driver_cluster, check_gpu_type, visible_gpus, world_size

__all__ = ["ray_launch"]


def ray_launch(fn=None, *, gpus: int | None = None, gpu_type=None, remote: bool = False,
               num_accelerators: int | None = None, accelerator_type: str | None = None):
    """Decorate a function so that `fn.distributed(*args, **kwargs)` runs it as the driver of a Ray cluster
    with `gpus` GPUs (databricks.air: num_accelerators) of `gpu_type` (accelerator_type), and returns its value.

    Ray is imported when it runs: it needs the cookbook's `ray` extra (`pip install ".[ray]"`), and says so without it.
    """
    gpus = one_of("gpus", gpus, "num_accelerators", num_accelerators)
    gpu_type = one_of("gpu_type", gpu_type, "accelerator_type", accelerator_type)
    if gpus is not None:
        check_count(gpus)
    say_what_pools_mean_here()

    def decorate(f):
        return RayLaunchFunction(f, gpus=gpus, gpu_type=gpu_type, remote=remote)

    return decorate(fn) if fn is not None else decorate


class RayLaunchFunction:
    def __init__(self, fn, *, gpus, gpu_type, remote):
        functools.update_wrapper(self, fn)
        self.fn, self.gpus, self.gpu_type, self.remote = fn, gpus, gpu_type, remote

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def distributed(self, *args, **kwargs):
        """Run the function as the Ray driver (Ray up, with the GPUs asked for); return its value."""
        ray = import_ray("@ray_launch")

        if self.remote:
            if not ray.is_initialized():
                if not os.environ.get("RAY_ADDRESS"):
                    raise RuntimeError(
                        "@ray_launch(remote=True) runs the function as a driver of the Ray cluster this process is "
                        'attached to, and it is attached to none. Call ray.init(address="HEAD_IP:6379") (or set '
                        "RAY_ADDRESS) first, or use remote=False to start a Ray on this machine's GPUs.")
                ray.init()
            check_driver_cluster(ray.cluster_resources(), self.gpus, self.gpu_type, self.__name__)
            return self.fn(*args, **kwargs)
        if ray.is_initialized():
            raise RuntimeError(
                "@ray_launch(remote=False) starts a Ray of its own on this machine's GPUs, and this process is "
                "attached to a Ray cluster already: use remote=True to run on that cluster, or ray.shutdown() first.")
        with self._local_ray(ray):
            return self.fn(*args, **kwargs)

    @contextlib.contextmanager
    def _local_ray(self, ray):
        count = world_size(self.gpus)
        visible = visible_gpus()
        check_gpu_type(self.gpu_type)
        lease = GpuLease(visible, count, holder=self.__name__) if visible else contextlib.nullcontext([])
        with lease as leased:
            saved = os.environ.get("CUDA_VISIBLE_DEVICES")
            if leased:
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(leased)  # what the Ray started here sees
            try:
                ray.init(address="local", num_gpus=len(leased), num_cpus=None if leased else count,
                         include_dashboard=False, _node_ip_address="127.0.0.1")
            finally:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
            print(f"@ray_launch: a Ray on this machine with {ray.cluster_resources().get('GPU', 0):.0f} GPU(s), "
                  f"{ray.cluster_resources().get('CPU', 0):.0f} CPU(s) for {self.__name__}()", file=sys.stderr)
            try:
                yield
            finally:
                ray.shutdown()

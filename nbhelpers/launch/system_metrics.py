"""System metrics of a launch's ranks, sampled from the launching process while they run.

    sampler = RankSampler(pids, gpus=["2", "3"], mlflow_run_id=run_id)   # a GPU per rank, or None each
    sampler.start()
    ...
    summary = sampler.stop()   # {"gpu_utilization_percent_mean": [91.0, 93.5], ...}: one value per rank

Each rank counts with everything it started (DataLoader workers, compilers): CPU use (psutil; 100 = one
core busy) and resident host memory of its process tree; its GPU's utilisation, memory, SM clock, temperature and
what holds its clock down (NVML's clock event reasons: thermal, power) through NVML (nvidia-ml-py) when there are
GPUs. The GPU a rank leased is its own for the launch, so the device's figures are the rank's. When an MLflow run was
active at the launch, the samples go to it as MLflow system metrics (`system/...`, the names MLflow's own monitor
uses, per rank). The clocks tell the straggler report (nbhelpers.launch.stragglers) whether a slow rank's GPU ran
slower.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time

SAMPLE_INTERVAL_S = 1.0
MLFLOW_BATCH = 10  # samples per rank logged at once
BUSY_PERCENT = 50  # a GPU's clocks count where its utilisation is at least this (an idle GPU clocks down)


class RankSampler:
    def __init__(self, pids: list[int], gpus: list[str | None], mlflow_run_id: str | None = None,
                 interval_s: float = SAMPLE_INTERVAL_S):
        self.pids, self.gpus, self.mlflow_run_id, self.interval_s = pids, gpus, mlflow_run_id, interval_s
        self.samples = [[] for _ in pids]  # per rank: (time, cpu %, host bytes, GPU %, GPU bytes, SM MHz, °C, held by)
        self.pending = []  # MLflow metrics not logged yet
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="nbhelpers-system-metrics")
        self.processes = {}  # pid -> psutil.Process, kept so that cpu_percent measures since the last sample

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> dict:
        """End the sampling; per rank: mean CPU and GPU utilisation, peak host and GPU memory."""
        self.stopping.set()
        self.thread.join()
        return self.summary()

    def summary(self) -> dict:
        def per_rank(column, reduce, busy=False):
            values = [[s[column] for s in samples if s[column] is not None and (not busy or (s[3] or 0) >= BUSY_PERCENT)]
                      for samples in self.samples]
            return [reduce(v) if v else None for v in values]

        def any_rank(values):
            return values if any(v is not None for v in values) else None

        mean = lambda v: sum(v) / len(v)  # noqa: E731
        median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        gpu_util, gpu_memory = per_rank(3, mean), per_rank(4, max)
        return {
            "samples_per_rank": [len(s) for s in self.samples],
            "interval_s": self.interval_s,
            "cpu_utilization_percent_mean": per_rank(1, mean),
            "host_memory_peak_bytes": per_rank(2, max),
            "gpu_utilization_percent_mean": gpu_util if any(v is not None for v in gpu_util) else None,
            "gpu_memory_peak_bytes": gpu_memory if any(v is not None for v in gpu_memory) else None,
            # while busy (utilisation >= BUSY_PERCENT): the clock it computed at, and what held it down ("thermal", "power")
            "gpu_sm_clock_mhz_median": any_rank(per_rank(5, median, busy=True)),
            "gpu_temperature_celsius_max": any_rank(per_rank(6, max)),
            "gpu_clock_limited_by": any_rank(per_rank(7, lambda v: sorted(set().union(*v)), busy=True)),
        }

    def _run(self):
        nvml = _Nvml() if any(self.gpus) else None
        try:
            while True:
                self._sample(nvml)
                if len(self.pending) >= MLFLOW_BATCH * len(self.pids):
                    self._log_to_mlflow()
                if self.stopping.wait(self.interval_s):
                    break
        finally:
            self._log_to_mlflow()
            if nvml is not None:
                nvml.close()

    def _sample(self, nvml):
        import psutil

        now = time.time()
        for rank, pid in enumerate(self.pids):
            cpu = host = None
            with contextlib.suppress(psutil.Error):
                root = self._process(pid)
                tree = [root, *root.children(recursive=True)]
                read = []  # the processes still there to read: a rank that ends mid-sample is not a 0 MB sample
                for p in tree:
                    with contextlib.suppress(psutil.Error):
                        if p.status() == psutil.STATUS_ZOMBIE:  # exited, not reaped yet: psutil reads 0 bytes
                            continue
                        read.append((self._process(p.pid).cpu_percent(), p.memory_info().rss))
                if read:
                    cpu, host = sum(c for c, _ in read), sum(m for _, m in read)
            gpu = nvml.read(self.gpus[rank]) if nvml is not None and self.gpus[rank] else (None,) * 5
            if cpu is None and gpu[0] is None:
                continue  # the rank has ended
            self.samples[rank].append((now, cpu, host, *gpu))
            self._queue(now, rank, cpu, host, *gpu[:4])

    def _process(self, pid):
        import psutil

        if pid not in self.processes:
            self.processes[pid] = psutil.Process(pid)
            self.processes[pid].cpu_percent()  # the first call only starts the measurement
        return self.processes[pid]

    def _queue(self, now, rank, cpu, host, gpu_util, gpu_bytes, sm_clock=None, temperature=None):
        if self.mlflow_run_id is None:
            return
        step = len(self.samples[rank]) - 1
        for key, value in ((f"system/rank_{rank}_cpu_utilization_percentage", cpu),
                           (f"system/rank_{rank}_memory_usage_megabytes", None if host is None else host / 2**20),
                           (f"system/gpu_{rank}_utilization_percentage", gpu_util),
                           (f"system/gpu_{rank}_memory_usage_megabytes", None if gpu_bytes is None else gpu_bytes / 2**20),
                           (f"system/gpu_{rank}_sm_clock_mhz", sm_clock),
                           (f"system/gpu_{rank}_temperature_celsius", temperature)):
            if value is not None:
                self.pending.append((key, float(value), int(now * 1000), step))

    def _log_to_mlflow(self):
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient

            MlflowClient().log_batch(self.mlflow_run_id, metrics=[Metric(k, v, t, s) for k, v, t, s in batch])
        except Exception as exc:  # the launch goes on; its summary still comes back
            print(f"nbhelpers: system metrics not logged to MLflow run {self.mlflow_run_id}: {exc}", file=sys.stderr)
            self.mlflow_run_id = None


# NVML's clock event reasons (nvmlClocksEventReason*: bits of nvmlDeviceGetCurrentClocksEventReasons) by what they mean
_HELD_BY = {"thermal": 0x20 | 0x40, "power": 0x04 | 0x80}  # SW/HW thermal slowdown; SW power cap, HW power brake


class _Nvml:
    """GPU utilisation, memory, SM clock (MHz), temperature (°C) and what holds the clock down ({"thermal", "power"})
    by the name CUDA_VISIBLE_DEVICES uses (an index or a UUID)."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
        except Exception:  # no nvidia-ml-py, or no driver (GPUs simulated in tests): no GPU figures
            self.pynvml = None

    def read(self, gpu: str):
        if self.pynvml is None:
            return (None,) * 5
        nvml = self.pynvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu) if not gpu.isdigit() else nvml.nvmlDeviceGetHandleByIndex(int(gpu))
            use = nvml.nvmlDeviceGetUtilizationRates(handle).gpu, nvml.nvmlDeviceGetMemoryInfo(handle).used
        except nvml.NVMLError:
            return (None,) * 5
        return (*use, *self._clock(handle))

    def _clock(self, handle):
        """SM clock, temperature, and what holds the clock down: each None where this GPU or driver does not say."""
        nvml, found = self.pynvml, []
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        for read in (lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                     lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                     lambda: frozenset(name for name, bits in _HELD_BY.items() if reasons(handle) & bits)):
            try:
                found.append(read())
            except nvml.NVMLError:
                found.append(None)
        return found

    def close(self):
        if self.pynvml is not None:
            with contextlib.suppress(Exception):
                self.pynvml.nvmlShutdown()

"""verl's `cpu` platform: run the trainer's workers on CPU cores, selected only by `VERL_PLATFORM=cpu`.

verl resolves its platform once per process (`verl.plugin.platform.get_platform`) and asks it for the
torch device name, the device module it calls `torch.cuda` functions on, the collective backend and
the Ray resource that workers request. Auto-detection never picks this platform
(`is_platform_available` is False), so a GPU install behaves exactly as without the plugin.
"""

from __future__ import annotations

import contextlib
import platform as _host
import resource
from types import ModuleType
from typing import Any

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase

from verl_memagent.cpu import PLATFORM

NAME = PLATFORM


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class CPUDeviceModule(ModuleType):
    """`torch.cpu` plus the `torch.cuda` calls verl makes on its device module, with their CPU meaning.

    Memory queries report this process's resident memory (allocated = reserved = RSS, peaks = peak
    RSS) and the host's available memory; cache and IPC calls have nothing to release on CPU.
    """

    def __init__(self) -> None:
        super().__init__("verl_memagent.cpu.device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        """The CPU allocator keeps no cache of its own."""

    @staticmethod
    def ipc_collect() -> None:
        """No inter-process device memory on CPU."""

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        """The host's memory is not partitioned between processes."""

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        """Peak RSS cannot be reset; peaks stay process-wide."""

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return _rss()

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return _rss()

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return _peak_rss()

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return _peak_rss()

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return _host.processor() or _host.machine()


class PlatformCPU(PlatformBase):
    """CPU cores as verl's device: torch device "cpu", gloo collectives, Ray's logical "GPU" resource.

    verl's resource pools always request an accelerator resource and count only "GPU"/"NPU" when they
    check the cluster (single_controller/ray/base.py:146,210,229), so workers ask Ray for logical GPUs,
    which `ray_kwargs.ray_init.num_gpus` creates; nothing ever touches CUDA.
    """

    _device_module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        """Never auto-detected: only `VERL_PLATFORM=cpu` selects this platform."""
        return False

    def current_device(self) -> str:  # type: ignore[override]
        """verl passes this to `.to()` and FSDP's `device_id`: "cpu", not an index (which means cuda:N)."""
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        """There is one CPU device."""

    def synchronize(self, device_index: int | None = None) -> None:
        """CPU kernels complete before they return."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """The CPU allocator has no expandable segments to configure."""

    def empty_cache(self) -> None:
        """The CPU allocator keeps no cache of its own."""

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPUs the workers hold

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        """No device profiler on CPU."""

    def profiler_stop(self) -> None:
        """No device profiler on CPU."""

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None

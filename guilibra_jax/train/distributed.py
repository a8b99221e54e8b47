"""Multi-host start-up (explicit coordinator, SLURM, or a Cloud TPU slice) and the XLA flags
we use on GPUs and TPUs, kept in one place."""

from __future__ import annotations

import glob
import importlib.util
import logging
import os

# Flags for H100/H200 pods: overlap collectives with compute. Set before jax starts
# its backend (launch/train.py calls apply_gpu_xla_flags first thing).
GPU_XLA_FLAGS = (
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_command_buffer=",
    "--xla_gpu_enable_highest_priority_async_stream=true",
    "--xla_gpu_all_reduce_combine_threshold_bytes=134217728",
    "--xla_gpu_all_gather_combine_threshold_bytes=134217728",
    "--xla_gpu_reduce_scatter_combine_threshold_bytes=134217728",
)


def apply_gpu_xla_flags() -> None:
    """Append :data:`GPU_XLA_FLAGS` to XLA_FLAGS unless GUILIBRA_NO_XLA_FLAGS is set.
    Harmless on CPU (the flags are read by the GPU backend only)."""
    if os.environ.get("GUILIBRA_NO_XLA_FLAGS"):
        return
    current = os.environ.get("XLA_FLAGS", "")
    extra = [f for f in GPU_XLA_FLAGS if f.split("=")[0] not in current]
    if extra and _has_gpu_hint():
        os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()


# Flags for Cloud TPU slices (read by libtpu from LIBTPU_INIT_ARGS, not XLA_FLAGS): overlap
# FSDP's all-gathers and reduce-scatters with compute, as MaxText does on v4/v5e/v5p/v6e.
# Each is checked against our libtpu by tests/train/test_tpu_plan.py (an unknown flag aborts libtpu).
TPU_XLA_FLAGS = (
    "--xla_tpu_enable_async_collective_fusion=true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
    "--xla_tpu_overlap_compute_collective_tc=true",
    "--xla_enable_async_all_gather=true",
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
    "--xla_tpu_data_parallel_opt_different_sized_ops=true",
)


def apply_tpu_xla_flags(force: bool = False) -> None:
    """Append :data:`TPU_XLA_FLAGS` to LIBTPU_INIT_ARGS on a Cloud TPU VM (``force``: anywhere,
    e.g. to compile for a topology) unless GUILIBRA_NO_XLA_FLAGS is set; flags already there win."""
    if os.environ.get("GUILIBRA_NO_XLA_FLAGS") or not (force or on_tpu_vm()):
        return
    current = os.environ.get("LIBTPU_INIT_ARGS", "")
    extra = [f for f in TPU_XLA_FLAGS if f.split("=")[0] not in current]
    if extra:
        os.environ["LIBTPU_INIT_ARGS"] = " ".join([current, *extra]).strip()


# glibc's tunable that advises transparent huge pages for malloc's large buffers. XLA's CPU
# runtime takes a step's temporaries (the demo's ASFT step: ~0.27 GiB) fresh from malloc at
# every execution; in 4 KiB pages that is ~70,000 page faults a step, a third of the step's
# CPU time spent in the kernel. Measured on the demo (150 steps, 2-core EPYC, the machine
# shared with another run): minor faults 11.7 M -> 0.39 M, system time 30.8 s -> 18.4 s.
HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def hugepage_environ(environ: dict, glibc: str) -> dict | None:
    """The environment to re-exec with so that malloc uses huge pages, or None: when
    GUILIBRA_NO_HUGEPAGES is set, when GLIBC_TUNABLES already sets glibc.malloc.hugetlb (the
    user's choice wins), or when the C library is not glibc >= 2.35 (``glibc``: its
    ``os.confstr("CS_GNU_LIBC_VERSION")``, e.g. "glibc 2.36")."""
    if environ.get("GUILIBRA_NO_HUGEPAGES") or "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", ""):
        return None
    name, _, version = (glibc or "").partition(" ")
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return None
    if name != "glibc" or (major, minor) < (2, 35):
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    return {**environ, "GLIBC_TUNABLES": f"{current}:{HUGEPAGE_TUNABLE}" if current else HUGEPAGE_TUNABLE}


def reexec_with_hugepages() -> None:
    """Re-execute this process (same pid, same command line) with :data:`HUGEPAGE_TUNABLE`
    unless :func:`hugepage_environ` says not to: glibc reads tunables only at start-up. The
    launchers call it first thing under ``__main__``."""
    import sys
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):   # not glibc / not Linux
        return
    env = hugepage_environ(dict(os.environ), glibc)
    if env is None or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def on_tpu_vm() -> bool:
    """A Cloud TPU VM: libtpu installed, TPU chips attached (/dev/accel* on v2-v4, /dev/vfio/N
    on v5e and later) and JAX not told to use another platform."""
    if os.environ.get("JAX_PLATFORMS", "") not in ("", "tpu"):
        return False
    if importlib.util.find_spec("libtpu") is None:
        return False
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def _has_gpu_hint() -> bool:
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES") or os.path.exists("/dev/nvidiactl")) \
        and os.environ.get("JAX_PLATFORMS", "") in ("", "cuda", "gpu")


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
               local_device_ids: str = "") -> bool:
    """Start multi-process JAX when asked to. Explicit arguments win; otherwise
    SLURM (SLURM_NTASKS > 1) and the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    JAX_PROCESS_ID environment variables are detected, and on a Cloud TPU VM (:func:`on_tpu_vm`)
    JAX's own TPU detection finds the slice's workers, this one's id and the coordinator (worker
    0) from the VM's metadata: start the same command on every worker
    (``gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...``), no flags needed.
    Returns True if initialised."""
    import jax

    env = os.environ
    coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS", "")
    num_processes = num_processes or int(env.get("JAX_NUM_PROCESSES", "0") or 0)
    if process_id < 0 and env.get("JAX_PROCESS_ID"):
        process_id = int(env["JAX_PROCESS_ID"])
    kwargs = {}
    if local_device_ids:
        kwargs["local_device_ids"] = [int(i) for i in local_device_ids.split(",")]
    if coordinator_address and num_processes > 1:
        if process_id < 0:
            raise ValueError("distributed: coordinator_address and num_processes are set but process_id is not "
                             "(set --config.distributed.process_id or JAX_PROCESS_ID)")
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id, **kwargs)
    elif int(env.get("SLURM_NTASKS", "1") or 1) > 1:
        jax.distributed.initialize(**kwargs)  # JAX's SLURM cluster detection
    elif on_tpu_vm():
        jax.distributed.initialize(**kwargs)  # JAX's Cloud TPU detection (GCE metadata / TPU_WORKER_*)
    else:
        return False
    logging.info("jax.distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())
    return True

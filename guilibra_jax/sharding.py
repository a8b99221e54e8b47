"""One mesh with three axes (data, fsdp, tensor) and the rules that map the model's
logical axis names onto it.

Parameters carry logical axis names (``embed``, ``mlp``, ``heads`` ...; see
``models/layers.py``). :data:`DEFAULT_RULES` maps each name to mesh axes; a
dimension that a mesh axis does not divide is replicated along that axis instead
(tiny models on 8 devices, GQA with few kv heads), and :func:`param_shardings`
reports what it replicated.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis name -> mesh axes (tuple: shard over their product), None: replicate.
DEFAULT_RULES: dict[str, tuple[str, ...] | None] = {
    "embed": ("fsdp",),
    "vocab": ("tensor",),
    "mlp": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": None,
    "layers": None,
    "norm": None,
    "vision_embed": ("fsdp",),
    "vision_mlp": ("tensor",),
    "vision_heads": ("tensor",),
    "vision_head_dim": None,
    "vision_patch": None,
}


def make_mesh(shape: Mapping[str, int] | Sequence[int], devices: Sequence[Any] | None = None) -> Mesh:
    """Mesh over ``devices`` (default: all) with axes (data, fsdp, tensor).

    ``shape`` maps axis -> size or is a 3-sequence; one size may be -1 ("the rest").
    """
    if isinstance(shape, Mapping):
        unknown = set(shape) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"unknown mesh axes {sorted(unknown)}; expected {MESH_AXES}")
        sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
    else:
        sizes = [int(s) for s in shape]
        if len(sizes) != 3:
            raise ValueError(f"mesh shape must have 3 sizes (data, fsdp, tensor), got {sizes}")
    devices = list(jax.devices() if devices is None else devices)
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {sizes}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not divide into mesh {dict(zip(MESH_AXES, sizes))}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                         f"found {len(devices)}")
    try:
        from jax.experimental import mesh_utils
        arr = mesh_utils.create_device_mesh(sizes, devices=devices, allow_split_physical_axes=True)
    except Exception:  # CPU fake devices and odd shapes: plain order is fine
        arr = np.asarray(devices).reshape(sizes)
    return Mesh(arr, MESH_AXES)


def logical_to_mesh_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                         rules: Mapping[str, Any] = DEFAULT_RULES) -> tuple[P, list[str]]:
    """Mesh PartitionSpec for an array of ``shape`` with logical axis names; returns
    (spec, notes) where notes list dimensions replicated for divisibility."""
    out, used, notes = [], set(), []
    for dim, name in zip(shape, tuple(logical) + (None,) * (len(shape) - len(logical))):
        axes = None
        if name is not None:
            if name not in rules:
                raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
            axes = rules[name]
        if axes:
            axes = tuple(a for a in axes if a not in used and mesh.shape.get(a, 1) > 1)
            size = math.prod(mesh.shape[a] for a in axes) if axes else 1
            if axes and dim % size:
                notes.append(f"{name}={dim} not divisible by {axes}={size}: replicated")
                axes = ()
            used.update(axes)
        out.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
    return P(*out), notes


def param_shardings(state: nnx.State, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES,
                    log: bool = True) -> Any:
    """NamedShardings for every array of an ``nnx.State`` (abstract or concrete),
    from the logical names in its variables' metadata."""
    logical = nnx.get_partition_spec(state)
    notes: list[str] = []

    def one(spec, x):
        spec = getattr(spec, "value", spec)
        names = tuple(spec) if isinstance(spec, P) else ()
        mesh_spec, n = logical_to_mesh_spec(names, x.shape, mesh, rules)
        notes.extend(n)
        return NamedSharding(mesh, mesh_spec)

    shardings = jax.tree.map(one, nnx.to_pure_dict(logical), nnx.to_pure_dict(state),
                             is_leaf=lambda x: isinstance(x, P))
    if log and notes:
        logging.info("sharding: %d dimensions replicated for divisibility (e.g. %s)", len(notes), notes[0])
    return shardings


def opt_state_shardings(tx: optax.GradientTransformation, params: Any, param_sh: Any, mesh: Mesh) -> Any:
    """Optimizer-state shardings that follow the parameters (adam's mu / nu), and
    replicate the rest (counts, schedules)."""
    replicated = NamedSharding(mesh, P())
    abstract = jax.eval_shape(tx.init, params)
    return optax.tree_map_params(tx, lambda _, s: s, abstract, param_sh,
                                 transform_non_params=lambda _: replicated)


def batch_sharding(mesh: Mesh, ndim: int = 2, batch_dim: int = 0) -> NamedSharding:
    """Shard dimension ``batch_dim`` over (data, fsdp); replicate the others."""
    spec = [None] * ndim
    spec[batch_dim] = BATCH_AXES
    return NamedSharding(mesh, P(*spec))


def mesh_context(mesh: Mesh):
    """Context under which jitted functions are traced so that the models' activation
    constraints (:func:`constrain_batch`) know the mesh: its abstract mesh (shapes and axis
    names only, so a TPU topology's devices serve as well as real ones)."""
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)


def traced_on(mesh: Mesh, fn):
    """``fn`` traced under :func:`mesh_context` (wrap it before ``jax.jit``)."""
    def traced(*args, **kwargs):
        with mesh_context(mesh):
            return fn(*args, **kwargs)
    return traced


def constrain_batch(x, dim: int = 0):
    """``x`` sharded over the batch axes (data, fsdp) along ``dim``, the rest replicated,
    while tracing under :func:`mesh_context`. Without that pin GSPMD may resolve the
    conflict between FSDP weights (``embed`` over fsdp) and batch-sharded rows by
    replicating the rows' activations on every device (measured: a 3B step on 8 fake
    devices computed all 8 rows on each). A no-op without a mesh in context, or when the
    dimension does not divide over the batch devices."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
    if not axes or x.shape[dim] % math.prod(mesh.shape[a] for a in axes):
        return x
    spec = [None] * x.ndim
    spec[dim] = axes
    return jax.lax.with_sharding_constraint(x, P(*spec))


def tree_nbytes(tree: Any) -> int:
    """Bytes of a pytree's arrays (global shapes; quantized kernels count codes and scales)."""
    return int(sum(x.size * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def put_host(x, sharding: NamedSharding):
    """A host array (the same on every process) placed in ``sharding``: each device takes
    its slice, and nothing crosses processes (``jax.device_put`` of host data checks that
    every process passed equal values, an all-gather of the whole array)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

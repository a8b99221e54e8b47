"""Process-level agreement and row exchange for multi-process runs (one process per host).

Every function here is a collective when ``jax.process_count() > 1``: all processes call
it together, in the same order. With one process each is a cheap local identity.

Rows. A row-sharded global array (rows over the mesh's (data, fsdp) axes, see
:func:`batching.put_batch`) holds process p's rows as one contiguous block; this process's
block is ``[first_row, first_row + local_rows)``.
"""

from __future__ import annotations

import jax
import numpy as np

from guilibra_jax import sharding as S
from guilibra_jax.errors import ConfigError, UserError
from guilibra_jax.train.batching import first_global_row


def run_mesh(config):
    """The run's mesh (config.mesh over every device of every process); a ConfigError naming
    the key when the axes do not divide the devices."""
    try:
        return S.make_mesh(dict(config.mesh))
    except ValueError as e:
        raise ConfigError(f"config key mesh = {dict(config.mesh)} is invalid for the {jax.device_count()} devices "
                          f"of this run ({jax.process_count()} processes): {e}") from None


def _allgather(x: np.ndarray) -> np.ndarray:
    """[process_count, *x.shape]: x of every process, in process order."""
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def agree_max(value: int) -> int:
    """The largest ``value`` over processes (shapes all processes must share)."""
    if jax.process_count() == 1:
        return int(value)
    return int(_allgather(np.asarray([value], np.int64)).max())


def gather_counts(value: int) -> np.ndarray:
    """[process_count] int64: ``value`` of every process."""
    if jax.process_count() == 1:
        return np.asarray([value], np.int64)
    return _allgather(np.asarray([value], np.int64))[:, 0]


def gather_rows(x: np.ndarray) -> np.ndarray:
    """Every process's rows concatenated in process order ([sum of rows, ...]); the
    processes' arrays must agree on all but the first dimension."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x
    counts = gather_counts(len(x))
    n = int(counts.max())
    padded = np.zeros((n,) + x.shape[1:], x.dtype)
    padded[:len(x)] = x
    every = _allgather(padded)
    return np.concatenate([every[p, :counts[p]] for p in range(len(counts))])


def gather_strings(values: list[str], width: int = 64) -> list[str]:
    """Every process's strings concatenated in process order (each cut to ``width`` bytes)."""
    raw = np.zeros((len(values), width), np.uint8)
    for i, v in enumerate(values):
        b = (v or "").encode()[:width]
        raw[i, :len(b)] = np.frombuffer(b, np.uint8)
    return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in gather_rows(raw)]


def first_row(mesh, local_rows: int) -> int:
    """Index in a row-sharded global array of this process's first row."""
    return first_global_row(mesh, local_rows)


def local_rows(x: jax.Array, mesh) -> np.ndarray:
    """This process's block of rows of a global array whose leading axis is the row axis
    (however XLA sharded it): a host numpy array ``[local rows, ...]``."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    x = jax.device_put(x, S.batch_sharding(mesh, x.ndim, 0))   # rows over (data, fsdp), rest replicated
    n_local = x.shape[0] // jax.process_count()
    start = first_row(mesh, n_local)
    out = np.empty((n_local,) + x.shape[1:], x.dtype)
    seen = np.zeros(n_local, bool)
    for shard in x.addressable_shards:
        rows = shard.index[0]
        lo, hi = (rows.start or 0), (x.shape[0] if rows.stop is None else rows.stop)
        out[lo - start:hi - start] = np.asarray(shard.data)
        seen[lo - start:hi - start] = True
    if not seen.all():
        raise RuntimeError(f"process {jax.process_index()}: its devices hold rows other than its block "
                           f"[{start}, {start + n_local})")
    return out


def gather_json(obj) -> list:
    """Every process's JSON-able ``obj``, in process order."""
    import json
    raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    lengths = gather_counts(len(raw))
    rows = gather_rows(np.pad(raw, (0, int(lengths.max()) - len(raw)))[None])
    return [json.loads(bytes(r[:n]).decode()) for r, n in zip(rows, lengths)]


def process_states(local_state):
    """What a checkpoint stores for a per-process state (a data iterator's): the state
    itself with one process, else ``{"per_process": [state of process 0, 1, ...]}``."""
    if jax.process_count() == 1:
        return local_state
    return {"per_process": gather_json(local_state)}


def own_state(saved):
    """This process's entry of :func:`process_states`' output."""
    if isinstance(saved, dict) and set(saved) == {"per_process"}:
        states = saved["per_process"]
        if len(states) != jax.process_count():
            raise UserError(f"the checkpoint holds the data iterator states of {len(states)} processes but this run "
                            f"has {jax.process_count()}: resume with {len(states)} processes (the data order "
                            f"depends on it)")
        return states[jax.process_index()]
    if jax.process_count() > 1:
        raise UserError(f"the checkpoint was written by one process but this run has {jax.process_count()}: "
                        f"resume with one process (the data order depends on it)")
    return saved


def host_params(params):
    """The whole parameter tree as host numpy arrays on every process (a collective with
    several processes: each leaf is all-gathered in turn, so a host holds one extra copy
    of the model, not one per leaf in flight)."""
    if jax.process_count() == 1:
        return jax.device_get(params)
    from jax.experimental import multihost_utils
    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), params)

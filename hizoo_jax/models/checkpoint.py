"""Orbax checkpoints of a zeroth-order training run: params, optimizer state, step.

The optimizer state of the ZO transforms is a plain pytree of arrays: the step count, the
raw ``uint32`` PRNG key the next step draws its noise from, the Hessian (dense or factored)
and the last losses. Saving it with the params is all it takes for a resumed run to draw
the same noise and continue bit for bit like the uninterrupted one::

    ckpt = checkpoint.Checkpointer(directory)
    ckpt.save(step, {"params": params, "opt_state": opt_state})
    ...
    restored = ckpt.restore({"params": params, "opt_state": opt_state})   # a template
    params, opt_state = restored["params"], restored["opt_state"]

Any pytree of arrays works (``nnx.State``, optax ``NamedTuple`` states, dicts); the
template given to :meth:`Checkpointer.restore` fixes the structure, shapes and dtypes.
"""

from __future__ import annotations

import os
from typing import Any

import jax


def _ocp():
  try:
    import orbax.checkpoint as ocp
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('checkpointing needs orbax-checkpoint: pip install "hizoo-jax[flax]"') from e
  return ocp


class Checkpointer:
  """A directory of numbered Orbax checkpoints (``<directory>/<step>/``).

  Args:
    directory: where checkpoints live (created if needed).
    max_to_keep: keep only the newest this many (None: all).
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = None):
    ocp = _ocp()
    self.directory = os.path.abspath(os.fspath(directory))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_handlers=ocp.StandardCheckpointHandler())

  def save(self, step: int, tree: Any) -> None:
    """Saves ``tree`` as checkpoint ``step`` and waits until it is on disk."""
    ocp = _ocp()
    self._manager.save(int(step), args=ocp.args.StandardSave(tree), force=True)
    self._manager.wait_until_finished()

  def latest_step(self) -> int | None:
    """The newest saved step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Saved steps, oldest first."""
    return sorted(self._manager.all_steps())

  def shapes(self, step: int | None = None) -> Any:
    """The saved tree of checkpoint ``step`` (default: the newest) as
    ``jax.ShapeDtypeStruct`` leaves, without reading its arrays."""
    step = self._step(step)
    meta = self._manager.item_metadata(step)
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype),
                        getattr(meta, "tree", meta))

  def _step(self, step: int | None) -> int:
    step = self.latest_step() if step is None else int(step)
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory!r}")
    return step

  def restore(self, template: Any, step: int | None = None) -> Any:
    """Checkpoint ``step`` (default: the newest) in the structure of ``template``.

    ``template`` is a pytree like the saved one (arrays or ``jax.ShapeDtypeStruct``); its
    shapes and dtypes are checked and kept.
    """
    ocp = _ocp()
    step = self._step(step)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def close(self) -> None:
    """Releases the manager's background resources."""
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

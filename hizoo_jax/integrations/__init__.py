"""Integrations of the zeroth-order optimizers with other JAX training stacks.

Each submodule needs its own extra and is imported on its own, so that ``import hizoo_jax``
never pulls a training framework:

* :mod:`hizoo_jax.integrations.tunix` (extra ``tunix``): :class:`ZOPeftTrainer`, Tunix's
  ``PeftTrainer`` with the library's lean zeroth-order step.
"""

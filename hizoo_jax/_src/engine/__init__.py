"""The lean step engine behind :func:`hizoo_jax.make_train_step`, by job.

* :mod:`.locate`: finding the zeroth-order transform inside any optimizer.
* :mod:`.passes`: the step's passes over the params and the losses they measure.
* :mod:`.update`: the final ``tx.update`` with those losses, its writes ordered.
* :mod:`.order`: the exact zeros that order them.

``hizoo_jax._src.train_step`` builds, jits and caches the step from these.
"""

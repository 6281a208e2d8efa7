"""The zeroth-order methods, one file each: a method's maths (a :class:`hizoo_jax.method.Method`),
its ``scale_by_*`` transform and its optimizer alias (see :mod:`hizoo_jax._src.method`)."""

from hizoo_jax._src.methods.forward_gradient import forward_gradient
from hizoo_jax._src.methods.fzoo import fzoo
from hizoo_jax._src.methods.hizoo import hizoo, hizoo_l
from hizoo_jax._src.methods.lozo import lozo
from hizoo_jax._src.methods.sparse_mezo import sparse_mezo
from hizoo_jax._src.methods.spsa import mezo
from hizoo_jax._src.methods.subzero import subzero
from hizoo_jax._src.methods.zo_muon import zo_muon

ALIASES = {f.__name__: f for f in (mezo, hizoo, hizoo_l, fzoo, forward_gradient, sparse_mezo,
                                   lozo, subzero, zo_muon)}
"""The optimizers by name: ``learning_rate, *, weight_decay, weight_decay_mask, **options``."""

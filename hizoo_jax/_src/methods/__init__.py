"""The zeroth-order methods, one file each: a method's maths (a :class:`hizoo_jax.method.Method`),
its ``scale_by_*`` transform and its optimizer alias (see :mod:`hizoo_jax._src.method`)."""

# Imported as modules, so that ``hizoo_jax._src.methods.fzoo`` stays the module and not the
# alias of the same name.
from hizoo_jax._src.methods import forward_gradient as _forward_gradient
from hizoo_jax._src.methods import fzoo as _fzoo
from hizoo_jax._src.methods import hizoo as _hizoo
from hizoo_jax._src.methods import lozo as _lozo
from hizoo_jax._src.methods import sparse_mezo as _sparse_mezo
from hizoo_jax._src.methods import spsa as _spsa
from hizoo_jax._src.methods import subzero as _subzero
from hizoo_jax._src.methods import zo_muon as _zo_muon

ALIASES = {f.__name__: f for f in (
    _spsa.mezo, _hizoo.hizoo, _hizoo.hizoo_l, _fzoo.fzoo, _forward_gradient.forward_gradient,
    _sparse_mezo.sparse_mezo, _lozo.lozo, _subzero.subzero, _zo_muon.zo_muon)}
"""The optimizers by name: ``learning_rate, *, weight_decay, weight_decay_mask, **options``."""

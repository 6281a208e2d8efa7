"""hizoo-jax: Hessian-informed zeroth-order optimizers as Optax transformations.

    import hizoo_jax as hz
    tx = hz.hizoo(1e-3, mu=1e-3)
    state = tx.init(params)
    updates, state = tx.update(None, state, params, value_fn=loss_of_params)
    params = optax.apply_updates(params, updates)
"""

from hizoo_jax import method, presets
from hizoo_jax._src.accumulate import AccumulateState, accumulate
from hizoo_jax._src.curvature import FactoredHessian
from hizoo_jax._src.global_rms import GlobalRMSState, scale_by_global_rms
from hizoo_jax._src.methods.forward_gradient import forward_gradient, scale_by_forward_gradient
from hizoo_jax._src.methods.fzoo import fzoo, scale_by_fzoo
from hizoo_jax._src.methods.hizoo import HiZOOState, hizoo, hizoo_l, scale_by_hizoo
from hizoo_jax._src.methods.lozo import lozo, scale_by_lozo
from hizoo_jax._src.methods.sparse_mezo import scale_by_sparse_mezo, sparse_mezo
from hizoo_jax._src.methods.spsa import mezo, scale_by_zo
from hizoo_jax._src.methods.subzero import scale_by_subzero, subzero
from hizoo_jax._src.methods.zo_muon import scale_by_zo_muon, zo_muon
from hizoo_jax._src.sampling import (
    Sampler,
    fast_gaussian,
    fast_rademacher,
    gaussian,
    rademacher,
)
from hizoo_jax._src.sharding import shard_state, state_shardings
from hizoo_jax._src.train_step import RESTORE_MODES, make_train_step
from hizoo_jax._src.transform import ZOState, forward_passes, get_hessian, zo_states

__version__ = "0.4.1"

__all__ = [
    "RESTORE_MODES",
    "AccumulateState",
    "FactoredHessian",
    "GlobalRMSState",
    "HiZOOState",
    "Sampler",
    "ZOState",
    "accumulate",
    "fast_gaussian",
    "fast_rademacher",
    "forward_gradient",
    "forward_passes",
    "fzoo",
    "gaussian",
    "get_hessian",
    "hizoo",
    "hizoo_l",
    "lozo",
    "make_train_step",
    "method",
    "mezo",
    "presets",
    "rademacher",
    "scale_by_forward_gradient",
    "scale_by_fzoo",
    "scale_by_global_rms",
    "scale_by_hizoo",
    "scale_by_lozo",
    "scale_by_sparse_mezo",
    "scale_by_subzero",
    "scale_by_zo",
    "scale_by_zo_muon",
    "zo_states",
    "shard_state",
    "sparse_mezo",
    "state_shardings",
    "subzero",
    "zo_muon",
]

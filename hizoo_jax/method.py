"""Write your own zeroth-order method: the interface every method of the library uses.

A method is a frozen dataclass deriving from :class:`Method`; :func:`zo_transform` makes it
an Optax transformation that ``tx.update`` and :func:`hizoo_jax.make_train_step` both run.
See the "Methods and how to add one" guide for the data path and a worked example.
"""

from hizoo_jax._src.method import (
    Measured,
    Method,
    StepNoise,
    ZOCall,
    noise_zeros,
    one_sided,
    probe_values,
    scale_leaf,
    tangents,
    two_sided,
)
from hizoo_jax._src.methods.spsa import mu_in_effect
from hizoo_jax._src.numerics import computed_once
from hizoo_jax._src.transform import zo_transform

__all__ = [
    "Measured",
    "Method",
    "StepNoise",
    "ZOCall",
    "computed_once",
    "mu_in_effect",
    "noise_zeros",
    "one_sided",
    "probe_values",
    "scale_leaf",
    "tangents",
    "two_sided",
    "zo_transform",
]

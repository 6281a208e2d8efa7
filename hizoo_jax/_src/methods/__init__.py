"""The zeroth-order methods, one file each (see :mod:`hizoo_jax._src.method`)."""

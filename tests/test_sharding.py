"""Runs tests/multidevice (test_mesh.py and test_lowrank_mesh.py) on 8 virtual CPU devices, in
one subprocess (XLA_FLAGS must be set before JAX is imported, and this process already
imported it with one device), and checks the state shardings on one device."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hizoo_jax as hz
from tests.helpers import xla_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_multidevice_suite_on_8_virtual_devices():
  env = xla_env("--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  # both files in one process: one start of Python, JAX and pytest, and the lowrank file
  # reuses the mesh file's module (its problem, its helpers) as imported
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/multidevice/test_mesh.py",
                        "tests/multidevice/test_lowrank_mesh.py"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1500)
  assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
  assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout[-2000:]


def test_state_shardings_follow_the_params():
  mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
  params = {"w": jax.numpy.zeros((256, 128)), "b": jax.numpy.zeros((128,))}
  sh = {"w": NamedSharding(mesh, P("fsdp", None)), "b": NamedSharding(mesh, P())}
  state = hz.hizoo_l(1e-3).init(params)
  out = hz.state_shardings(state, params, sh)
  h = out[0].method.hessian
  assert h["w"].row.spec == P("fsdp") and h["w"].col.spec == P(None)
  assert h["b"].spec == P()
  assert out[0].key.spec == P() and out[0].count.spec == P()
  dense = hz.state_shardings(hz.hizoo(1e-3).init(params), params, sh)[0].method.hessian
  assert dense["w"].spec == P("fsdp", None)
  # a chain with params-shaped moments after the ZO estimate
  import optax

  zo_adam = optax.chain(hz.scale_by_zo(), optax.scale_by_adam())
  st = hz.state_shardings(zo_adam.init(params), params, sh)
  assert st[1].mu["w"].spec == P("fsdp", None)
  with pytest.raises(TypeError, match="NamedSharding"):
    hz.state_shardings(state, params, jax.sharding.SingleDeviceSharding(jax.devices()[0]))

"""Sanity check of the per-tensor curvature estimator on a quadratic with known blocks.

f(x) = 1/2 sum_b a_b ||x_b||^2 with 4 blocks of different sizes and curvatures spanning 1e3;
the learned h_b (bias-corrected EMA) should approach a_b within its reported standard error,
and the preconditioned optimizer should beat MeZO at its best lr.
    python experiments/sst2/check_blockh.py
"""

import blockh
import jax
import jax.numpy as jnp
import optax

import hizoo_jax as hz

A = {"a": 100.0, "b": 10.0, "c": 1.0, "d": 0.1}
N = {"a": 50, "b": 500, "c": 2000, "d": 5000}


def f(p):
  return 0.5 * sum(A[k] * jnp.sum(p[k] ** 2) for k in p)


def run(tx, steps, params):
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    up, state = tx.update(None, state, params, value_fn=f)
    return optax.apply_updates(params, up), state

  for _ in range(steps):
    params, state = step(params, state)
  return params, state


def main():
  p0 = {k: jnp.ones((n,), jnp.float32) for k, n in N.items()}
  steps = 3000
  _, st = run(blockh.block_curvature(0.0, mu=1e-1, beta=0.01, warmup=10**9), steps, p0)
  rep = blockh.curvature_report(st[0], 0.01)
  print("learned h (lr 0, 3000 probes):")
  for k, h, se in zip(A, rep["h"], rep["rel_se"], strict=True):
    print(f"  block {k}: true {A[k]:g}  learned {h:.3g}  rel. s.e. {se:.2f}")
  print(f"f(p0) = {float(f(p0)):.1f}; final f after {steps} steps:")
  for lr in (1e-5, 3e-5, 1e-4, 3e-4):
    pm, _ = run(hz.mezo(lr, mu=1e-2), steps, p0)
    pb, _ = run(blockh.block_curvature(lr, mu=1e-2, warmup=100), steps, p0)
    ph, _ = run(blockh.block_curvature(lr, mu=1e-2, warmup=100, power=0.5), steps, p0)
    print(f"  lr {lr:g}: MeZO {float(f(pm)):.4g}  per-tensor curvature {float(f(pb)):.4g}"
          f"  (power 0.5: {float(f(ph)):.4g})")


if __name__ == "__main__":
  main()

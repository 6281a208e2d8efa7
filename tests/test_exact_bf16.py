"""The default step for bfloat16 params: the plain update bit for bit, at inference memory.

The exact step never writes a perturbed value into theta: each measuring pass forms
``theta + c mu D`` leaf by leaf where the forward pass reads it, so the params' buffers
hold theta until the update and no perturbed copy of all the params exists.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

import hizoo_jax as hz
from tests.helpers import lean_step_extra, tanh_mlp, tanh_mlp_loss

METHODS = {
    "mezo": lambda: hz.mezo(1e-2, weight_decay=0.1),
    "hizoo": lambda: hz.hizoo(1e-2, hessian_smoothing=0.1),
    "hizoo_l": lambda: hz.hizoo_l(1e-2, hessian_smoothing=0.1, min_dim_size_to_factor=4),
    "fzoo": lambda: hz.fzoo(1e-2),
    "sparse_mezo": lambda: hz.sparse_mezo(1e-2),
    "lozo": lambda: hz.lozo(1e-2, rank=2),
    "subzero": lambda: hz.subzero(1e-2, rank=2),
    "zo_muon": lambda: hz.zo_muon(1e-2, rank=2),
    "forward_gradient": lambda: hz.forward_gradient(1e-2),
}

X = jax.random.normal(jax.random.key(1), (32, 8)).astype(jnp.bfloat16)
Y = jax.random.normal(jax.random.key(2), (32, 4)).astype(jnp.float32)


def loss_fn(p, x, y):
  return tanh_mlp_loss(p, x, y).astype(jnp.float32)


# One linear layer: a matrix leaf and a vector leaf, each kind of leaf the methods treat
# apart (HiZOO-L's factored H, the low-rank methods' factors, ZO-Muon's vectors). Equal bits
# do not depend on the number or the width of the leaves; each more leaf is one more pass of
# the engine's loop to compile.
SIZES = [8, 4]


def run(tx, step, steps=3):
  params = tanh_mlp(SIZES, jnp.bfloat16, 0)
  state = tx.init(params)
  losses = []
  for _ in range(steps):
    params, state, loss = step(params, state, X, Y)
    losses.append(loss)
  return params, state, losses


# the traced step is one function for every method: inside a user's jit, one method of each
# kind of pass (HiZOO's three with a Hessian state, FZOO's several probes, LOZO's low-rank
# directions from a held factor)
IN_A_USER_JIT = ("hizoo", "fzoo", "lozo")


def assert_plain_update_bit_for_bit(name):
  """Three steps of the default step (top level, and for the methods of ``IN_A_USER_JIT``
  inside a user's donating jit) leave the params, the optimizer state and the losses of
  the plain ``tx.update`` step, every bit: the same perturbed params (each rounded to
  bfloat16 once, from theta), hence the same losses and the same update."""
  tx = METHODS[name]()
  plain = run(tx, hz.make_train_step(tx, loss_fn, lean=False))
  step = hz.make_train_step(tx, loss_fn)
  chex.assert_trees_all_equal(run(tx, step), plain)
  if name in IN_A_USER_JIT:
    user = jax.jit(lambda p, s, x, y: step(p, s, x, y), donate_argnums=(0, 1))
    chex.assert_trees_all_equal(run(tx, user), plain)


@pytest.mark.slow
def test_bfloat16_default_step_is_the_plain_update_bit_for_bit():
  """Checked in a process with XLA's default code generation, the programs a user
  compiles: under the suite's cheaper code generation (conftest.py) two different
  programs of the same float32 operations may round HiZOO's Hessian EMA differently in the
  last bit (measured: one ulp in H, params and losses equal). One process for all the
  methods, paying its imports and its random draws' compiles once; a failure names the
  method it stopped at (the child prints each name before checking it)."""
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import jax; jax.config.update('jax_enable_x64', True); "
          "from tests.test_exact_bf16 import METHODS, assert_plain_update_bit_for_bit as f\n"
          "for name in METHODS:\n"
          "  print(name, flush=True); f(name)\n"
          "print('ok')")
  env = dict(os.environ, JAX_PLATFORMS="cpu", HIZOO_TEST_FULL_XLA_OPT="1")
  flags = os.environ.get("XLA_FLAGS", "")
  from tests.xla_flags import TEST_XLA_FLAGS
  env["XLA_FLAGS"] = flags.replace(TEST_XLA_FLAGS, "").strip()
  out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                       text=True, timeout=1200)
  failed = out.stdout.split()[-1] if out.stdout.split() else next(iter(METHODS))
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (failed,
                                                                     out.stderr[-3000:])


def test_hizoo_steps_compile_no_rsqrt():
  """HiZOO's ``H^{-1/2}`` is built from correctly rounded ops (a divide and a square root in
  the perturbation and in the aliases' update, multiplies and adds in ``scale_by_hizoo``'s
  update), never XLA's ``rsqrt``, which broke
  the bit-identity of the test above on an AMD EPYC: correctly rounded ops give the lean step
  and the plain update the same bits on any CPU."""
  params = tanh_mlp(SIZES, jnp.bfloat16, 0)
  for name in ("hizoo", "hizoo_l"):
    tx = METHODS[name]()
    for restore in ("auto", "inplace"):
      step = hz.make_train_step(tx, loss_fn, restore=restore, donate=False)
      hlo = jax.jit(lambda p, s, x, y, step=step: step(p, s, x, y)).lower(
          params, tx.init(params), X, Y).compile().as_text()
      assert " rsqrt(" not in hlo, (name, restore)


def test_bfloat16_default_step_does_not_drift():
  """At learning rate 0 the default step leaves bfloat16 params unchanged, every bit, over
  20 steps; the in-place restore moves them by rounding."""
  params0 = tanh_mlp(SIZES, jnp.bfloat16, 0)
  tx = hz.mezo(0.0, mu=1e-2)
  out = {}
  for restore in ("auto", "inplace"):
    step = hz.make_train_step(tx, loss_fn, restore=restore, donate=False)
    p, s = params0, tx.init(params0)
    for _ in range(20):
      p, s, _ = step(p, s, X, Y)
    out[restore] = p
  chex.assert_trees_all_equal(out["auto"], params0)
  assert any(bool(jnp.any(a != b)) for a, b in
             zip(jax.tree.leaves(out["inplace"]), jax.tree.leaves(params0), strict=True))


# --- compiled memory on a bfloat16 decoder --------------------------------------------------

LEAN = {
    "mezo": lambda: hz.mezo(1e-3),
    "hizoo": lambda: hz.hizoo(1e-3),
    "fzoo": lambda: hz.fzoo(1e-3),
    "zo_muon": lambda: hz.zo_muon(1e-3),
}


@functools.cache
def _decoder(mode):
  from flax import nnx

  from hizoo_jax.models import llama, peft

  def next_token_loss(model, ids):
    logits = model.logits(model(ids))[:, :-1].astype(jnp.float32)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]))

  # Full fine-tuning on one decoder layer (12 leaves, 200 KiB: a second layer adds leaves
  # to compile and no kind of buffer): a perturbed copy of the params is 1.0 params-worth,
  # the measured steps 0.03-0.15 against bounds of 0.42 (HiZOO 0.11: its H is donated
  # state). LoRA on
  # two layers: the slack its bound allows for the activations' layouts (5% of the forward
  # pass's temporaries) is measured at 2% with two layers and 4.3% (FZOO's) with one.
  layers = 1 if mode == "ft" else 2
  model = llama.LlamaForCausalLM(llama.tiny_config(num_hidden_layers=layers),
                                 param_dtype=jnp.bfloat16, dtype=jnp.bfloat16,
                                 rngs=nnx.Rngs(0))
  if mode == "lora":
    peft.apply_lora(model, rank=8, rngs=nnx.Rngs(1))
  graphdef, params, frozen = peft.split_trainable(model, mode)
  return peft.make_loss_fn(graphdef, next_token_loss), params, frozen


# every method with full fine-tuning (where a params-sized copy shows); LoRA (where a
# hoisted frozen projection shows, the step's loop at stake) with MeZO's, HiZOO's and FZOO's
# passes; each of these three methods, and each mode, at top level and inside a user's
# donating jit (one function traced into either program)
DECODER_CASES = [("mezo", "ft", "top level"), ("mezo", "lora", "in a user's jit"),
                 ("hizoo", "ft", "in a user's jit"), ("hizoo", "lora", "top level"),
                 ("fzoo", "ft", "top level"), ("fzoo", "lora", "in a user's jit")]
ZO_MUON_CASE = ("zo_muon", "ft", "in a user's jit")


@pytest.mark.slow
@pytest.mark.parametrize("name,mode,where", DECODER_CASES,
                         ids=[f"{n}-{m}-{'top' if w == 'top level' else 'user_jit'}"
                              for n, m, w in DECODER_CASES])
def test_bfloat16_default_step_holds_no_perturbed_copy(name, mode, where):
  """The default step on the tiny bfloat16 Llama (full fine-tuning and LoRA) allocates at
  most 0.1 params-worth plus its largest trainable leaf beyond the forward pass's
  temporaries (a perturbed leaf, or the few leaves XLA forms ahead of their reader), HiZOO
  too (its float32 H is donated state, updated in place); top level or inside a user's
  donating jit. The exact step that
  perturbed a separate buffer held 1.0 params-worth more (the perturbed copy).

  LoRA's trainable params (7 KiB here) are smaller than the difference between two
  layouts of the forward pass's activations (the step's loop body lays them out a little
  differently from the jitted forward pass: 18 KiB, 2% of its 0.9 MiB, measured), so for
  LoRA the bound also allows 5% of the forward pass's temporaries. What it rules out is a
  copy of anything the forward pass computes from the batch alone (LoRA's frozen
  projections, hoisted out of the step's loop: 18% of them, measured before the batch was
  tied to the loop index)."""
  assert_lean_on_the_decoder(name, mode, where)


@pytest.mark.slow
def test_bfloat16_default_step_holds_no_perturbed_copy_zo_muon():
  """ZO-Muon's products are matmuls, a leaf-sized buffer each: XLA:CPU's default scheduler
  (concurrency-optimised) forms every leaf's product before the forward pass reads any
  (1.64 params-worth measured), its memory-minimising one each where it is read (0.14).
  The flag reaches only a fresh process (tests/test_lowrank.py says why). Full fine-tuning
  only: under LoRA all the products together are 1-2 LoRA-params-worth, well inside the
  LoRA bound (its 5% of the forward pass's temporaries is several), and what that bound
  rules out, a frozen projection hoisted out of the step's loop, is the loop's, checked
  with MeZO's, HiZOO's and FZOO's passes."""
  import os
  import subprocess
  import sys

  from tests.helpers import xla_env

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import jax; jax.config.update('jax_enable_x64', True); "
          "from tests.test_exact_bf16 import ZO_MUON_CASE, assert_lean_on_the_decoder as f; "
          "f(*ZO_MUON_CASE); print('ok')")
  env = xla_env("--xla_cpu_enable_concurrency_optimized_scheduler=false", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                       text=True, timeout=1200)
  assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def assert_lean_on_the_decoder(name, mode, where):
  """The compiled default step's memory beyond a forward pass, in param bytes
  (``tests.helpers.lean_step_extra``), at top level or traced into a user's donating jit,
  within the bound."""
  loss, params, frozen = _decoder(mode)
  leaves = jax.tree.leaves(params)
  assert {a.dtype for a in leaves} == {jnp.dtype(jnp.bfloat16)}
  nbytes = sum(a.nbytes for a in leaves)
  tx = LEAN[name]()
  # HiZOO's H (float32: 2.0 params-worth of bfloat16 params) is optimizer state, updated in
  # its donated buffer: no allowance, so a perturbed copy (1.0) shows for every method
  bound = 0.1 + max(a.nbytes for a in leaves) / nbytes
  ids = jnp.zeros((2, 64), jnp.int32)
  if mode == "lora":
    forward = jax.jit(loss).lower(params, frozen, ids).compile().memory_analysis()
    bound += 0.05 * forward.temp_size_in_bytes / nbytes
  (value,) = lean_step_extra(tx, loss, params, frozen, ids, top_level=where == "top level",
                             in_a_user_jit=where != "top level").values()
  assert value <= bound, (where, value, bound)

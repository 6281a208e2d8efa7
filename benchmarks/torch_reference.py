"""The HiZOO step of the reference PyTorch trainer, on the benchmark MLP (for timing).

Written after ``trainer.py`` of the paper's code (github.com/Yanjun-Zhao/HiZOO): params are
perturbed in place through ``param.data``, the noise is regenerated with
``torch.manual_seed(seed)`` and ``torch.normal`` per leaf for every pass, and the Hessian
is kept per leaf in float32. Two departures, both cost-neutral: the algebra is the paper's
(perturb with ``H^{-1/2}``, estimate ``|l+ + l- - 2 l0| / (2 mu^2) H z^2``), whereas the
reference perturbs with ``sqrt(M)`` and feeds ``M`` the estimate of ``M^{-1}``; and the
SGD step is written out instead of going through ``optimizer.step()``. The reference
evaluates the loss once more after the update (``loss_out``), a fourth forward pass:
``with_final_forward`` keeps or drops it.
"""

from __future__ import annotations

import numpy as np
import torch


class MLP(torch.nn.Module):
  def __init__(self, sizes):
    super().__init__()
    self.layers = torch.nn.ModuleList(
        torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))

  def forward(self, x):
    for i, layer in enumerate(self.layers):
      x = layer(x)
      if i < len(self.layers) - 1:
        x = torch.relu(x)
    return x


class ReferenceHiZOO:
  """In-place HiZOO step as in the reference trainer."""

  def __init__(self, model, *, lr=1e-6, mu=1e-3, alpha=1e-8, weight_decay=0.0, seed=0):
    self.model, self.lr, self.mu, self.alpha, self.wd = model, lr, mu, alpha, weight_decay
    self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    self.hessian = {n: torch.ones_like(p, dtype=torch.float32) for n, p in self.params}
    self.rng = np.random.default_rng(seed)

  @torch.no_grad()
  def loss(self, x, y):
    return torch.mean((self.model(x) - y) ** 2).item()

  @torch.no_grad()
  def perturb(self, seed, scale):
    torch.manual_seed(seed)
    for n, p in self.params:
      z = torch.normal(mean=0, std=1, size=p.data.size(), dtype=p.data.dtype)
      p.data = p.data + scale * torch.rsqrt(self.hessian[n]) * z * self.mu

  @torch.no_grad()
  def step(self, x, y, with_final_forward=True):
    seed = int(self.rng.integers(1_000_000_000))
    l0 = self.loss(x, y)
    self.perturb(seed, 1)
    lp = self.loss(x, y)
    self.perturb(seed, -2)
    lm = self.loss(x, y)
    self.perturb(seed, 1)
    torch.manual_seed(seed)
    c = abs(lp + lm - 2 * l0) / (2 * self.mu**2)
    proj = (lp - lm) / (2 * self.mu)
    for n, p in self.params:
      z = torch.normal(mean=0, std=1, size=p.data.size(), dtype=p.data.dtype)
      est = c * self.hessian[n] * z * z
      self.hessian[n] = (1 - self.alpha) * self.hessian[n] + self.alpha * est
      grad = proj * z * torch.rsqrt(self.hessian[n])
      p.data = p.data - self.lr * (grad + self.wd * p.data)
    return self.loss(x, y) if with_final_forward else l0


class ReferenceMeZO(ReferenceHiZOO):
  """In-place MeZO step as in the reference (MeZO) trainer."""

  @torch.no_grad()
  def perturb(self, seed, scale):
    torch.manual_seed(seed)
    for _, p in self.params:
      z = torch.normal(mean=0, std=1, size=p.data.size(), dtype=p.data.dtype)
      p.data = p.data + scale * z * self.mu

  @torch.no_grad()
  def step(self, x, y, with_final_forward=False):
    seed = int(self.rng.integers(1_000_000_000))
    self.perturb(seed, 1)
    lp = self.loss(x, y)
    self.perturb(seed, -2)
    lm = self.loss(x, y)
    self.perturb(seed, 1)
    torch.manual_seed(seed)
    proj = (lp - lm) / (2 * self.mu)
    for _, p in self.params:
      z = torch.normal(mean=0, std=1, size=p.data.size(), dtype=p.data.dtype)
      p.data = p.data - self.lr * (proj * z + self.wd * p.data)
    return lp

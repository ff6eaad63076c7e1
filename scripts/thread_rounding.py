"""md5 of a jitted two-layer MLP's gradient, to compare under different sets of cores (docs/pipeline.md,
Determinism). Run from the repository root: python scripts/thread_rounding.py, then
taskset -c 0 python scripts/thread_rounding.py."""
import hashlib

import jax
import jax.numpy as jnp
import numpy as np


def loss(weights, x):
    y = jax.nn.silu(x @ weights[0]) @ weights[1]
    return jnp.mean(jax.nn.log_softmax(y, -1) ** 2) + jnp.sum(jnp.tanh(y).sum(0) ** 2) * 1e-6


key_x, key_1, key_2 = jax.random.split(jax.random.PRNGKey(0), 3)
x = jax.random.normal(key_x, (3072, 384))
weights = (jax.random.normal(key_1, (384, 3072)) * 0.05, jax.random.normal(key_2, (3072, 384)) * 0.05)
grads = jax.jit(jax.grad(loss))(weights, x)
print(hashlib.md5(b"".join(np.asarray(g).tobytes() for g in grads)).hexdigest())

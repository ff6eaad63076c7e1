"""Layers the decoder and both families' vision towers share."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm: normalise in fp32, cast back, multiply by the weight (transformers' order)."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * y.astype(x.dtype)

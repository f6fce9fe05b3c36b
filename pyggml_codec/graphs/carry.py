"""A streamed graph's carry: the state inputs it reads and the outputs it writes for the next
chunk (``ops.Carry``); the host side that keeps it per stream is ``stream_state.py``."""

from __future__ import annotations

import numpy as np

from ..backend.binding import lib
from .ops import Builder, Tensor


def carry_input(g: Builder, ne: tuple[int, ...], stream_dim: int | None = None) -> tuple[str, Tensor]:
    """The next carried-state input of a streamed graph, ggml shape ``ne`` (zeros at build);
    ``stream_dim``: the ggml dimension indexing the streams of a batched graph."""
    name = f"carry.{len(g.stream.inputs)}"
    t = g.input(name, np.zeros(tuple(reversed(ne)), np.float32))
    g.stream.inputs[name] = t
    if stream_dim is not None:
        g.stream.batch_axes[name] = len(ne) - 1 - stream_dim
    return name, t


def emit_carry(g: Builder, name: str, t: Tensor) -> None:
    """Make (a copy of) ``t`` the output holding state ``name`` for the next chunk."""
    g.stream.outputs[name] = lib.ggml_cont(g.ctx, t)


def batched(g: Builder) -> bool:
    """Whether ``g`` builds one step of several streams packed along time (``ops.Carry.batch``)."""
    return g.stream is not None and g.stream.batch > 1

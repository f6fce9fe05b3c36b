"""Ops written over their input (Snake before a conv, the fused bias passes after one): the values
of the same ops with outputs of their own, in every path."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from parity import random_codes, signal
from pyggml_codec.backend.binding import lib
from pyggml_codec.graphs import ops


def _in_place_nodes(graph) -> int:
    """The nodes that compute (not views) and write over their source."""
    views = (lib.GGML_OP_VIEW, lib.GGML_OP_RESHAPE, lib.GGML_OP_PERMUTE, lib.GGML_OP_TRANSPOSE)
    nodes = (lib.ggml_graph_node(graph.gf, i) for i in range(lib.ggml_graph_n_nodes(graph.gf)))
    return sum(1 for t in nodes if t.contents.view_src and int(t.contents.op) not in views)


def _run_all(path, precision: str, codes: np.ndarray, x: np.ndarray) -> tuple[dict, dict]:
    with pyggml_codec.load(path, backend="cpu", precision=precision, n_threads=2) as codec:
        out = {"encode": codec.encode(x), "decode": codec.decode(codes)}
        codec.decode_chunk_frames = None
        out["decode_one_graph"] = codec.decode(codes)
        sizes = {key[0]: (graph.compute_bytes, _in_place_nodes(graph)) for key, graph in codec.engine.cached_graphs().items()}
        audio, stages = codec.decode_stages(codes)
        out["decode_stages_audio"] = audio
        out.update({f"dec:{k}": v for k, v in stages.items()})
        out.update({f"enc:{k}": v for k, v in codec.encode_stages(x).stages.items()})
        with codec.stream_decoder() as sd:
            out["stream_3"] = np.concatenate([sd.push(codes[:, i:i + 3]) for i in range(0, codes.shape[1], 3)])
        out["batch_2"] = np.concatenate(codec.decode_batch([codes[:, :12], codes[:, 5:]]))
        return out, sizes


@pytest.mark.parametrize("precision", ["f32", "s2cpp"])
def test_in_place_ops_give_the_values_of_fresh_outputs(tiny_model, precision, monkeypatch):
    """Bit for bit against the same graphs built with no op written over its input, including the
    kept stages (a stage tensor is a graph output: never written over)."""
    codes = random_codes((64,) + (32,) * 9, 20, seed=31)
    x = signal(2 * 44100, seed=32)
    path = tiny_model.f32_path if precision == "f32" else tiny_model.f16_path
    got, sizes = _run_all(path, precision, codes, x)
    monkeypatch.setattr(ops, "may_overwrite", lambda t: False)
    want, fresh_sizes = _run_all(path, precision, codes, x)
    assert got.keys() == want.keys()
    differ = {k: int(np.count_nonzero(got[k] != want[k])) for k in want}
    print(f"{precision}: values that differ, per result: {differ}")
    print(f"{precision}: one-shot graphs' (compute buffer bytes, nodes in place): {sizes}; "
          f"with fresh outputs {fresh_sizes}")
    assert not any(differ.values())
    # f32: each residual unit's two bias passes, the Snakes before the strided and transposed convs
    # and the last one; s2cpp, whose bias Snake casts to F16, the Snakes alone
    assert sizes["wave"][1] > 0 and sizes["enc"][1] > 0 and fresh_sizes["wave"][1] == fresh_sizes["enc"][1] == 0


@pytest.fixture
def ctx():
    """A ggml context for tensor descriptions alone (no data)."""
    context = lib.ggml_init(lib.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
    yield context
    lib.ggml_free(context)


def test_may_overwrite_refuses_leaves_views_and_graph_outputs(ctx):
    leaf = lib.ggml_new_tensor_2d(ctx, 0, 8, 4)
    computed = lib.ggml_scale(ctx, leaf, 2.0)
    view = lib.ggml_view_2d(ctx, computed, 4, 4, computed.contents.nb[1], 0)
    output = lib.ggml_scale(ctx, leaf, 3.0)
    lib.ggml_set_output(output)
    given = lib.ggml_scale(ctx, leaf, 4.0)
    lib.ggml_set_input(given)
    assert ops.may_overwrite(computed)
    assert not any(ops.may_overwrite(t) for t in (leaf, view, lib.ggml_reshape_1d(ctx, computed, 32),
                                                  lib.ggml_transpose(ctx, computed), output, given))


def test_kernels_refuse_to_write_over_a_strided_input_or_another_type(ctx):
    from pyggml_codec.backend import kernels

    x = lib.ggml_scale(ctx, lib.ggml_new_tensor_2d(ctx, 0, 8, 4), 1.0)
    strided = lib.ggml_view_2d(ctx, x, 4, 4, x.contents.nb[1], 0)
    alpha = lib.ggml_new_tensor_2d(ctx, 0, 1, 4)
    with pytest.raises(ValueError, match="snake in place needs a contiguous input"):
        kernels.snake(ctx, strided, alpha, in_place=True)
    with pytest.raises(ValueError, match="bias_snake in place needs a contiguous input of its output's type"):
        kernels.bias_snake(ctx, x, alpha, alpha, 1, in_place=True)  # F16 out over F32
    with pytest.raises(ValueError, match="add_bias_residual in place needs a contiguous input"):
        kernels.add_bias_residual(ctx, strided, alpha, strided, in_place=True)

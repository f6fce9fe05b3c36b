"""The converter against torch itself: names, ne order, weight-norm folding, metadata, layouts."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

import models
import oracle
from pyggml_codec.model import convert
from pyggml_codec.errors import ConfigError, ModelFileError, TensorError

PREFIX = "fish_speech.codec."
# f16 file vs torch's fold rounded to f16: one f16 rounding of values that may differ by an f32
# ulp, so at most one f16 ulp (2^-10 relative, 2^-24 absolute near zero).
F16_RTOL, F16_ATOL = 2.0**-10, 2.0**-24


def _tensors(path: Path) -> dict[str, object]:
    return {t.name: t for t in GGUFReader(str(path)).tensors}


def _fields(path: Path) -> dict[str, object]:
    return dict(GGUFReader(str(path)).fields)


def _values(t) -> np.ndarray:
    """Tensor data of a GGUFReader tensor in torch order (numpy shape = ne reversed)."""
    return np.asarray(t.data).reshape(tuple(int(n) for n in t.shape[::-1]))


@pytest.fixture(scope="module")
def folded(tiny_model) -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return models.torch_folded_state(tiny_model.model)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_every_tensor_present_with_ne_reversed(tiny_model, folded, dtype):
    tensors = _tensors(tiny_model.path(dtype))
    assert sorted(tensors) == sorted(folded), (
        f"missing {sorted(set(folded) - set(tensors))}, "
        f"unexpected {sorted(set(tensors) - set(folded))}"
    )
    want_type = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16}[dtype]
    for name, t in tensors.items():
        assert [int(n) for n in t.shape] == list(folded[name].shape)[::-1], name
        assert t.tensor_type == want_type, f"{name}: {t.tensor_type.name}"


def test_f32_weight_norm_fold_equals_torch(tiny_model, folded):
    tensors = _tensors(tiny_model.f32_path)
    worst = max(
        (float(np.abs(_values(tensors[n]) - v.numpy()).max() / (np.abs(v.numpy()).max())), n)
        for n, v in folded.items()
    )
    conv = "encoder.block.1.block.4.conv.weight"
    print(f"max rel diff f32 vs torch fold: {worst[0]:.3g} at {worst[1]}; "
          f"{conv}: max abs {np.abs(_values(tensors[conv]) - folded[conv].numpy()).max():.3g}")
    assert worst[0] <= 1e-6, worst  # same torch op; allow one f32 ulp of the largest entry


def test_f32_fold_is_not_the_raw_v(tiny_model):
    """The stored conv weight must be g * v / ||v||, not v: its per-row norms are g."""
    state = oracle.export_state_dict(tiny_model.model)
    name = "decoder.model.1.block.1.conv"  # conv-transpose: weight-norm dim 0 = input channels
    g = state[f"{name}.parametrizations.weight.original0"].numpy()
    w = _values(_tensors(tiny_model.f32_path)[f"{name}.weight"])
    norms = np.sqrt((w.astype(np.float64) ** 2).sum(axis=(1, 2)))
    print(f"{name}: max |row norm - g| = {np.abs(norms - g.ravel()).max():.3g}")
    np.testing.assert_allclose(norms, g.ravel(), rtol=1e-5)


def test_f16_file_is_torch_fold_rounded(tiny_model, folded):
    tensors = _tensors(tiny_model.f16_path)
    for name, v in folded.items():
        got = _values(tensors[name]).astype(np.float32)
        want = v.half().float().numpy()
        np.testing.assert_allclose(got, want, rtol=F16_RTOL, atol=F16_ATOL, err_msg=name)


def _expected_types(key: str, value: object) -> list[GGUFValueType]:
    if isinstance(value, list):
        return [GGUFValueType.ARRAY, GGUFValueType.INT32]
    if isinstance(value, float):
        return [GGUFValueType.FLOAT32]
    return [GGUFValueType.UINT32]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_metadata_equals_config(tiny_model, dtype):
    fields = _fields(tiny_model.path(dtype))
    assert fields["general.architecture"].contents() == "fish-speech-codec"
    expected = {**oracle.TINY.gguf_metadata(), "frame_length": 512,
                "transformer.block_size": oracle.TINY.block_size,
                "rvq_transformer.block_size": oracle.TINY.rvq_block_size,
                "decoder_transformer_layers": [0, 0, 0, 0]}
    for key, value in expected.items():
        field = fields[PREFIX + key]
        assert field.contents() == pytest.approx(value), key
        assert [GGUFValueType(t) for t in field.types] == _expected_types(key, value), key
    for key in ("transformer.n_local_heads", "rvq_transformer.n_local_heads"):
        assert fields[PREFIX + key].contents() == -1
        assert [GGUFValueType(t) for t in fields[PREFIX + key].types] == [GGUFValueType.INT32]
    qtype = fields[PREFIX + "quantizer_type"]
    assert qtype.contents() == "downsample_residual_vector_quantize"
    assert [GGUFValueType(t) for t in qtype.types] == [GGUFValueType.STRING]


def _to_legacy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rename = {
        ".parametrizations.weight.original0": ".weight_g",
        ".parametrizations.weight.original1": ".weight_v",
    }
    out = {}
    for key, value in state.items():
        for old, new in rename.items():
            key = key.replace(old, new)
        out[key] = value
    return out


def _same_tensors(a: Path, b: Path) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert list(ta) == list(tb)
    for name in ta:
        assert ta[name].tensor_type == tb[name].tensor_type, name
        assert np.array_equal(np.asarray(ta[name].data), np.asarray(tb[name].data)), name


def test_legacy_weight_g_v_converts_the_same(tiny_model, tmp_path):
    state = oracle.export_state_dict(tiny_model.model)
    legacy = _to_legacy(state)
    assert not any("parametrizations" in k for k in legacy)
    config = models.converter_config(oracle.TINY)
    out = convert.convert_checkpoint(legacy, tmp_path / "legacy.gguf", "f32", config)
    _same_tensors(out, tiny_model.f32_path)


def test_generator_prefix_and_state_dict_wrapping(tiny_model, tmp_path):
    state = oracle.export_state_dict(tiny_model.model)
    wrapped = {"state_dict": {f"generator.{k}": v for k, v in state.items()}}
    wrapped["state_dict"]["discriminator.conv.weight"] = torch.ones(3, 3)
    wrapped["state_dict"]["generator.quantizer.pre_module.freqs_cis"] = torch.ones(4, 32, 2)
    torch.save(wrapped, tmp_path / "codec.pth")
    out = convert.convert_checkpoint(tmp_path / "codec.pth", tmp_path / "wrapped.gguf", "f16",
                                     models.converter_config(oracle.TINY))
    _same_tensors(out, tiny_model.f16_path)


def test_extract_codec_of_merged_fixture(tiny_model, tmp_path):
    merged = convert.write_merged_fixture(tiny_model.f16_path, tmp_path / "merged.gguf")
    merged_fields, merged_tensors = _fields(merged), _tensors(merged)
    assert merged_fields["general.architecture"].contents() == "fish-speech"
    assert "token_embd.weight" in merged_tensors
    assert "c.encoder.block.0.conv.weight" in merged_tensors
    assert any(not k.startswith((PREFIX, "general.", "GGUF.")) for k in merged_fields)
    out = convert.extract_codec(merged, tmp_path / "extracted.gguf")
    _same_tensors(out, tiny_model.f16_path)
    original = _tensors(tiny_model.f16_path)
    for name, t in _tensors(out).items():
        assert list(t.shape) == list(original[name].shape), name
    got, want = _fields(out), _fields(tiny_model.f16_path)
    codec_keys = sorted(k for k in want if k.startswith(PREFIX))
    assert sorted(k for k in got if k.startswith(PREFIX)) == codec_keys
    for key in codec_keys:
        assert got[key].contents() == want[key].contents(), key
        assert list(got[key].types) == list(want[key].types), key
    assert got["general.architecture"].contents() == "fish-speech-codec"


def test_missing_tensor_is_named(tiny_model, tmp_path):
    state = oracle.export_state_dict(tiny_model.model)
    del state["quantizer.upsample.1.1.gamma"]
    with pytest.raises(TensorError, match="quantizer.upsample.1.1.gamma"):
        convert.convert_checkpoint(state, tmp_path / "x.gguf", "f32")


def test_unexpected_tensor_is_named(tiny_model, tmp_path):
    state = oracle.export_state_dict(tiny_model.model)
    state["quantizer.pre_module.input_proj.weight"] = torch.zeros(64, 64)
    with pytest.raises(TensorError, match="input_proj"):
        convert.convert_checkpoint(state, tmp_path / "x.gguf", "f32")


def test_half_a_weight_norm_pair_is_an_error(tiny_model, tmp_path):
    state = oracle.export_state_dict(tiny_model.model)
    del state["encoder.block.0.conv.parametrizations.weight.original0"]
    with pytest.raises(TensorError, match="encoder.block.0.conv.weight"):
        convert.convert_checkpoint(state, tmp_path / "x.gguf", "f32")


@pytest.mark.parametrize(
    ("config", "match"),
    [({"encoder_dim": 8}, "encoder_dim"), ({"no_such_key": 1}, "no_such_key"),
     ({"rvq_transformer.head_dim": 48}, "head_dim")],
)
def test_bad_config_is_a_config_error(tiny_model, tmp_path, config, match):
    state = oracle.export_state_dict(tiny_model.model)
    with pytest.raises(ConfigError, match=match):
        convert.convert_checkpoint(state, tmp_path / "x.gguf", "f32", config)


def test_config_sets_what_shapes_cannot(tiny_model, tmp_path):
    state = oracle.export_state_dict(tiny_model.model)
    config = {f"{PREFIX}rvq_transformer.window_size": 5}
    out = convert.convert_checkpoint(state, tmp_path / "x.gguf", "f32", config)
    assert _fields(out)[PREFIX + "rvq_transformer.window_size"].contents() == 5
    default = convert.convert_checkpoint(state, tmp_path / "d.gguf", "f32")
    assert _fields(default)[PREFIX + "rvq_transformer.window_size"].contents() == 128


def test_extract_rejects_a_codec_only_file(tiny_model, tmp_path):
    with pytest.raises(ModelFileError, match="fish-speech"):
        convert.extract_codec(tiny_model.f32_path, tmp_path / "x.gguf")


def test_bad_dtype_and_non_codec_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        convert.convert_checkpoint({}, tmp_path / "x.gguf", "q8_0")
    with pytest.raises(ModelFileError, match="no codec tensors"):
        convert.convert_checkpoint({"discriminator.w": torch.ones(1)}, tmp_path / "x.gguf", "f32")


def test_cli_convert_and_extract(tiny_model, tmp_path, capsys):
    torch.save(oracle.export_state_dict(tiny_model.model), tmp_path / "codec.pth")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(models.converter_config(oracle.TINY)))
    argv = [str(tmp_path / "codec.pth"), str(tmp_path / "a.gguf"), "--dtype", "f32"]
    assert convert.main([*argv, "--config", str(cfg)]) == 0
    _same_tensors(tmp_path / "a.gguf", tiny_model.f32_path)
    merged = convert.write_merged_fixture(tiny_model.f32_path, tmp_path / "m.gguf")
    assert convert.main([str(merged), str(tmp_path / "b.gguf"), "--extract"]) == 0
    _same_tensors(tmp_path / "b.gguf", tiny_model.f32_path)
    with pytest.raises(SystemExit) as exc:
        convert.main([str(tmp_path / "missing.pth"), str(tmp_path / "c.gguf")])
    assert exc.value.code == 2 and "missing.pth" in capsys.readouterr().err


def test_module_imports_without_torch(tmp_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import pyggml_codec.model.convert as c\n"
        "try:\n    c.convert_checkpoint({'encoder.x': 0}, 'x.gguf')\n"
        "except ImportError as e:\n    print(e)\n"
    )
    root = Path(convert.__file__).resolve().parents[2]  # the directory holding the package
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env={"PYTHONPATH": str(root)}, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install pyggml_codec[convert]" in done.stdout


@pytest.mark.slow
def test_full_model_converts(full_model):
    fields, tensors = _fields(full_model.f16_path), _tensors(full_model.f16_path)
    for key, value in oracle.FULL.gguf_metadata().items():
        assert fields[PREFIX + key].contents() == pytest.approx(value), key
    n_params = sum(int(np.prod(t.shape)) for t in tensors.values())
    print(f"full model: {len(tensors)} tensors, {n_params / 1e6:.1f} M parameters")
    assert abs(n_params / 1e6 - 391.4) < 0.1
    assert all(t.tensor_type == GGMLQuantizationType.F16 for t in tensors.values())

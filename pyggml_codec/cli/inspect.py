"""The inspection commands of the CLI: ``info`` (what a GGUF holds), ``backends`` and ``doctor``.

Neither loads weights onto a backend: ``info`` reads the metadata and tensor table only. Both
print the plan ``load(backend="cpu")`` decides in each precision (``plan.decide_plan``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..model.config import CodecConfig
from ..errors import ModelFileError
from ..model.gguf_file import ModelFile
from ..model.loader import codec_prefix
from ..model.quantize import TYPE_KEY as QUANT_KEY
from ..backend.buildinfo import build_info, exact_word, format_build_info
from ..backend.runtime import available_backends, devices, start_backend
from ..model.weights import PARTS, check_tensors, expected_tensors, ffn_width_reader
from ..plan import Precision, decide_plan


def model_info(path: Path) -> dict[str, Any]:
    """Architecture, configuration, tensor counts and bytes per part of a codec GGUF."""
    mf = ModelFile.open(path)
    prefix = codec_prefix(mf)
    cfg = CodecConfig.from_metadata(mf.metadata)
    specs = expected_tensors(cfg, ffn_width_reader(mf, prefix))
    codec_tensors = {name: t for name, t in mf.tensors.items() if name.startswith(prefix)}
    part_bytes = {part: 0 for part in PARTS}
    for spec in specs:
        info = mf.tensors.get(prefix + spec.name)
        if info is None:
            continue
        part_bytes["all"] += info.nbytes
        for part in spec.parts:
            part_bytes[part] += info.nbytes
    groups: dict[str, Counter] = {}
    for name, t in codec_tensors.items():
        groups.setdefault(_group(name[len(prefix):]), Counter())[t.type_name] += 1
    types = Counter(t.type_name for t in codec_tensors.values())
    type_bytes = Counter()
    for t in codec_tensors.values():
        type_bytes[t.type_name] += t.nbytes
    try:
        check_tensors(mf, specs, prefix)
        problem = None
    except ModelFileError as exc:
        problem = str(exc)
    return {
        "path": str(path),
        "file_bytes": path.stat().st_size,
        "architecture": mf.architecture,
        "tensor_prefix": prefix,
        "config": _config_dict(cfg),
        "tensors": {"in_file": len(mf.tensors), "codec": len(codec_tensors), "expected": len(specs)},
        "bytes_per_part": part_bytes,
        "dtypes": {name: {"tensors": n, "bytes": type_bytes[name]} for name, n in sorted(types.items())},
        "dtypes_per_group": {g: dict(sorted(c.items())) for g, c in sorted(groups.items())},
        "quantization": mf.metadata[QUANT_KEY].value if QUANT_KEY in mf.metadata else None,
        "loadable": problem is None,
        "problem": problem,
    }


def _group(name: str) -> str:
    """A tensor's group for ``info``: "quantizer.post_module", "encoder", "decoder", ..."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "quantizer" else parts[0]


def _config_dict(cfg: CodecConfig) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    out["derived"] = {
        "n_codebooks": cfg.n_codebooks,
        "codebook_sizes": list(cfg.quantizer.codebook_sizes),
        "samples_per_frame": cfg.samples_per_frame,
        "frames_per_second": cfg.sample_rate / cfg.samples_per_frame,
        "streaming_history_frames": cfg.streaming_history_frames,
    }
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def format_info(info: dict[str, Any]) -> str:
    cfg = info["config"]
    d, q, rvq = cfg["derived"], cfg["quantizer"], cfg["rvq_transformer"]
    lines = [
        f"{info['path']}: {_mb(info['file_bytes'])}, architecture {info['architecture']}"
        + (f" (codec tensors under {info['tensor_prefix']!r})" if info["tensor_prefix"] else ""),
        f"  sample rate      {cfg['sample_rate']} Hz, hop {cfg['hop_length']}, frame_length {cfg['frame_length']}",
        f"  code frames      {d['samples_per_frame']} samples ({d['frames_per_second']:.2f} frames/s)",
        f"  codebooks        {d['n_codebooks']} (1 semantic + {q['n_residual']} residual), sizes {d['codebook_sizes']}",
        (f"  encoder          dim {cfg['encoder']['dim']}, rates {cfg['encoder']['rates']}, "
         f"transformer layers {cfg['encoder']['transformer_layers']}, latent {cfg['encoder']['latent_dim']}"),
        f"  decoder          dim {cfg['decoder']['dim']}, rates {cfg['decoder']['rates']}",
        f"  rvq transformer  {rvq['n_layer']} layers, dim {rvq['dim']}, {rvq['n_head']} heads, window {rvq['window']}",
        (f"  tensors          {info['tensors']['codec']} codec ({info['tensors']['in_file']} in file, "
         f"{info['tensors']['expected']} expected)"),
        "  bytes            " + ", ".join(f"{p} {_mb(n)}" for p, n in info["bytes_per_part"].items()),
        "  dtypes           " + ", ".join(f"{t}: {v['tensors']} tensors, {_mb(v['bytes'])}" for t, v in info["dtypes"].items()),
        *[f"    {g:<22} " + ", ".join(f"{t} x{n}" for t, n in c.items()) for g, c in info["dtypes_per_group"].items()],
        *([f"  quantization     {info['quantization']} (pyggml-codec quantize)"] if info["quantization"] else []),
        "  loadable         " + ("yes" if info["loadable"] else f"NO: {info['problem']}"),
    ]
    return "\n".join(lines)


def cpu_plans() -> dict[str, dict[str, Any]]:
    """The plan ``load(backend="cpu")`` decides in each precision (no model needed: the plan
    depends on the backend and the options), as dicts."""
    backend = start_backend("cpu")
    try:
        return {p.value: decide_plan(backend, p).as_dict() for p in Precision}
    finally:
        backend.free()


def format_plans(plans: dict[str, dict[str, Any]]) -> str:
    fields = list(next(iter(plans.values())))
    rows = [("plan on the CPU", list(plans))] + [(f, [plan[f] for plan in plans.values()])
                                                  for f in fields if f != "precision"]
    return "\n".join(f"  {name:<21}" + "".join(f"{str(v):<15}" for v in values).rstrip() for name, values in rows)


def cmd_info(args: argparse.Namespace) -> int:
    from .codec_commands import check_model_path

    check_model_path(args.model_file)
    info = model_info(args.model_file)
    plans = cpu_plans()
    print(json.dumps({**info, "cpu_plans": plans}, indent=2) if args.json else
          format_info(info) + "\n" + format_plans(plans))
    return 0 if info["loadable"] else 1


def cmd_backends(args: argparse.Namespace) -> int:
    devs = [dataclasses.asdict(d) for d in devices()]
    names = available_backends()
    build = build_info()
    if args.json:
        print(json.dumps({"backends": names, "devices": devs, "build": build}, indent=2))
        return 0
    print(f"ggml {build['ggml']} (ggml-python {build['ggml_python']}): llamafile "
          f"{'on' if build['llamafile'] else 'off'}, CPU kernels {'on' if build['kernels']['compiled'] else 'OFF'}, "
          f"BLAS {'on' if 'path' in build['blas'] else 'OFF'} (details: pyggml-codec doctor)")
    exact = build["s2cpp_exact"]
    print(f"s2cpp precision vs s2.cpp: {exact_word(exact)} ({exact['reason']})")
    print("backends: " + ", ".join(names))
    for d in devs:
        memory = f"{d['memory_free'] / 2**30:.1f} GiB free of {d['memory_total'] / 2**30:.1f} GiB"
        print(f"  [{d['index']}] {d['backend']:<7} {d['kind']:<5} {d['name']}: {d['description']} ({memory})")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """``doctor``: what this install runs (ggml build, kernels, BLAS); 1 when it warns."""
    info = build_info()
    plans = cpu_plans()
    print(json.dumps({**info, "cpu_plans": plans}, indent=2) if args.json else
          format_build_info(info) + "\n" + format_plans(plans))
    return 1 if info["warnings"] else 0

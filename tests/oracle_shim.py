"""Import shim for the upstream codec wheels (see the design notes on the reference, ORACLE.md).

- stub modules for names the codec files import at module level but never use (hydra, librosa,
  soundfile, omegaconf, tqdm, audiotools, audiotools.ml) are put in ``sys.modules`` only while
  the upstream modules are imported, then the previous entries are restored, so the real
  ``soundfile`` (or anything else) is untouched for the rest of the process;
- ``dac``, ``dac.nn``, ``dac.model``, ``fish_speech``, ``fish_speech.models`` are registered as
  bare packages whose ``__path__`` points inside the wheels (skips their heavy ``__init__``);
- the wheels are APPENDED to ``sys.path`` (fish-speech ships a top-level ``tools`` package).

Wheels folder: env var ``PYGGML_ORACLE_WHEELS``, default ``<repo>/.oracle_wheels``.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
WHEEL_GLOBS = {
    "fish_speech": "fish_speech-0.1.0-*.whl",
    "dac": "descript_audio_codec-1.0.0-*.whl",
}
FETCH_HINT = (
    "pip download --no-deps -d {dir} fish-speech==0.1.0 descript-audio-codec==1.0.0 "
    "descript-audiotools==0.7.2"
)
STUB_NAMES = ("hydra", "librosa", "soundfile", "omegaconf", "tqdm", "audiotools", "audiotools.ml")


def wheels_dir() -> Path:
    return Path(os.environ.get("PYGGML_ORACLE_WHEELS", REPO / ".oracle_wheels"))


def _find_wheels(folder: Path) -> dict[str, Path]:
    found = {}
    for package, pattern in WHEEL_GLOBS.items():
        matches = sorted(folder.glob(pattern)) if folder.is_dir() else []
        if not matches:
            raise FileNotFoundError(
                f"upstream wheel {pattern!r} not found in {folder} (set PYGGML_ORACLE_WHEELS "
                f"or fetch them with: {FETCH_HINT.format(dir=folder)})"
            )
        found[package] = matches[-1]
    return found


def _stub_modules() -> dict[str, types.ModuleType]:
    stubs = {name: types.ModuleType(name) for name in STUB_NAMES}
    stubs["omegaconf"].OmegaConf = type("OmegaConf", (), {})
    stubs["audiotools"].AudioSignal = type("AudioSignal", (), {})
    stubs["audiotools.ml"].BaseModel = type("BaseModel", (torch.nn.Module,), {})
    stubs["audiotools"].ml = stubs["audiotools.ml"]
    return stubs


def _register_package(name: str, path: str) -> None:
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module


def _restore_modules(saved: dict[str, types.ModuleType | None]) -> None:
    """Put back the sys.modules entries the stubs replaced (or remove the stubs)."""
    for name, previous in saved.items():
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous


@functools.cache
def upstream() -> types.SimpleNamespace:
    """Import and return the upstream modules: ``modded_dac``, ``rvq``, ``quantize``, ``layers``."""
    wheels = _find_wheels(wheels_dir())
    for wheel in wheels.values():
        if str(wheel) not in sys.path:
            sys.path.append(str(wheel))
    for name, sub in [("fish_speech", "fish_speech"), ("fish_speech.models", "fish_speech/models")]:
        _register_package(name, f"{wheels['fish_speech']}/{sub}")
    for name, sub in [("dac", "dac"), ("dac.nn", "dac/nn"), ("dac.model", "dac/model")]:
        _register_package(name, f"{wheels['dac']}/{sub}")
    saved = {name: sys.modules.get(name) for name in STUB_NAMES}
    sys.modules.update(_stub_modules())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # dac.nn.layers: torch.jit.script
            from dac.nn import layers, quantize
            from fish_speech.models.dac import modded_dac, rvq
    finally:
        _restore_modules(saved)
    return types.SimpleNamespace(modded_dac=modded_dac, rvq=rvq, quantize=quantize, layers=layers)

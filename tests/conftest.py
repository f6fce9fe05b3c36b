"""Shared fixtures: random-weight upstream models converted to GGUF, and the ``slow`` marker.

Slow tests (marked ``@pytest.mark.slow``, e.g. everything using ``full_model``) run only with
``--run-slow`` or ``PYGGML_RUN_SLOW=1``.

``PYGGML_REQUIRE`` (comma-separated, e.g. ``kernels,blas,rowdot,ray,vulkan``; CI sets it per step)
names the parts of an install that must be present: a test that would skip for want of one of
them fails instead (``require`` below). Unset, a missing part skips its tests, with the reason.
"""

from __future__ import annotations

import os

import pytest

# What PYGGML_REQUIRE may name: the compiled CPU kernels, a CBLAS sgemm for them, the row-product
# kernel (a native AVX2+FMA+F16C or AVX-512 build with a BLAS), ggml's F16 product in blocks (the
# exact build's, where ggml sums as it reproduces: native AVX2, AVX-512 and AVX512-FP16 builds without
# LLAMAFILE), libm's sinf in vectors (the exact
# build's, where it reproduces this libm), the [ray] extra, a Vulkan device.
REQUIREMENTS = ("kernels", "blas", "rowdot", "f16dot", "sinf", "ray", "vulkan")


def required() -> set[str]:
    """The parts PYGGML_REQUIRE names (a pytest.UsageError for a name not in REQUIREMENTS)."""
    names = {n.strip() for n in os.environ.get("PYGGML_REQUIRE", "").split(",") if n.strip()}
    unknown = names - set(REQUIREMENTS)
    if unknown:
        raise pytest.UsageError(f"PYGGML_REQUIRE names {sorted(unknown)}; known: {', '.join(REQUIREMENTS)}")
    return names


def require(what: str, present: bool, reason: str) -> None:
    """Skip the calling test when ``present`` is false, saying ``reason``; fail instead when
    PYGGML_REQUIRE names ``what``, since the run was meant to exercise it."""
    if what not in REQUIREMENTS:
        raise ValueError(f"unknown requirement {what!r}; known: {', '.join(REQUIREMENTS)}")
    if present:
        return
    if what in required():
        pytest.fail(f"PYGGML_REQUIRE names {what!r}, but it is missing: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session", name="require")
def require_fixture():
    """``require(what, present, reason)`` for tests and module fixtures (see ``require``)."""
    return require


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--gpu-backend", default=None,
                     help="backend for the tests marked gpu (tests/vulkan; default PYGGML_TEST_BACKEND or vulkan)")


def pytest_configure(config: pytest.Config) -> None:
    required()  # a misspelt PYGGML_REQUIRE is a usage error, not a requirement silently dropped
    config.addinivalue_line("markers", "slow: needs the full-size S2 model or minutes of CPU")
    config.addinivalue_line("markers", "gpu: runs on a GPU backend (--gpu-backend); skips where this build has none")


def _run_slow(config: pytest.Config) -> bool:
    return config.getoption("--run-slow") or os.environ.get("PYGGML_RUN_SLOW") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _run_slow(config):
        return
    skip = pytest.mark.skip(reason="slow: use --run-slow or PYGGML_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):
    """models.ConvertedModel of oracle.TINY, seed 0: ``.model``, ``.f32_path``, ``.f16_path``."""
    import models
    import oracle

    return models.make_converted(oracle.TINY, tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def full_model(tmp_path_factory: pytest.TempPathFactory):
    """models.ConvertedModel of oracle.FULL (S2 Pro size, 391 M params), seed 0. Slow."""
    import models
    import oracle

    return models.make_converted(oracle.FULL, tmp_path_factory.mktemp("full"), seed=0)

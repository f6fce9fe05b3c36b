"""Shared fixtures: random-weight upstream models converted to GGUF, and the ``slow`` marker.

Slow tests (marked ``@pytest.mark.slow``, e.g. everything using ``full_model``) run only with
``--run-slow`` or ``PYGGML_RUN_SLOW=1``.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--gpu-backend", default=None,
                     help="backend for the tests marked gpu (tests/vulkan; default PYGGML_TEST_BACKEND or vulkan)")


def pytest_configure(config: pytest.Config) -> None:
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

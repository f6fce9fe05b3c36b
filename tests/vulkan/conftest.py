"""The GPU-backend tests: the backend under test, and its skip when this build lacks it.

The backend comes from ``--gpu-backend NAME`` or ``PYGGML_TEST_BACKEND`` (default
``vulkan``); every test here is marked ``gpu`` and skips, naming what this build has, when
the backend is absent, so the default CPU suite runs none of them. Under
``PYGGML_REQUIRE=vulkan`` (the CI's Vulkan step) an absent Vulkan device fails instead. On Mesa's software
driver set ``GGML_VK_VISIBLE_DEVICES=0`` (ggml skips CPU-type Vulkan devices otherwise);
``scripts/vulkan_setup.sh`` builds the binding and ``.ci/run`` runs this folder.
"""

from __future__ import annotations

import os

import pytest



@pytest.fixture(scope="session")
def gpu_backend(pytestconfig: pytest.Config, require) -> str:
    """The backend name under test, present in this build (else the test skips, or fails
    where PYGGML_REQUIRE names it)."""
    import pyggml_codec

    name = (pytestconfig.getoption("--gpu-backend") or os.environ.get("PYGGML_TEST_BACKEND") or "vulkan").lower()
    have = pyggml_codec.available_backends()
    if name not in have:
        hint = " (on a software Vulkan driver set GGML_VK_VISIBLE_DEVICES=0)" if name == "vulkan" else ""
        reason = f"this ggml build has no {name} device: available {have}{hint}"
        if name == "vulkan":
            require("vulkan", False, reason)
        pytest.skip(reason)
    # Start device 0 once in f32 precision, as the first start in this process: ggml-vulkan
    # fixes its F16 path per device at first start, and the tests here expect it off.
    from pyggml_codec.backend import runtime

    backend = runtime.start_backend(name, 0, strict=True, f32_products=True)
    products = backend.products
    backend.free()
    if name == "vulkan" and products != "f32":
        pytest.fail(f"{name} device 0 computes products as {products!r}: it was started before the tests "
                    f"with F16 on (GGML_VK_DISABLE_F16 unset)")
    return name

"""What each ggml backend needs that the others do not: one table, read by the runtime
(``runtime.py``: starting, freeing), the lowering choice (``lowerings.py``) and the engine
(its graph cache). A new backend, or a new finding about one, is a row or a field here.

Measured against ggml 0.15.3 (ggml-python); see README, "Backends".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quirks:
    """One backend's (or driver's) needs."""

    # ggml has no DIAG_MASK_INF, left padding or COL2IM_1D here: causal masks are explicit mask
    # tensors, as the C++ engine gives Metal (lowerings.choose_lowerings also probes the ops)
    explicit_masks: bool = False
    # buffers may be freed only once the backend's ggml context is gone (Backend.release,
    # Backend.restart): Mesa 22.3's lavapipe keeps bare pointers to freed buffers in reused
    # descriptor sets (heap corruption otherwise)
    parks_frees: bool = False
    # the environment variable that turns off F16 products for a device, read once when the
    # device first starts in the process (ggml-vulkan: GGML_VK_DISABLE_F16); None: no switch
    f16_switch: str | None = None
    # how products with F32 inputs are computed before anything is measured (runtime.PRODUCTS)
    products: str = "unmeasured"
    # the graph cache keeps its size per graph kind (distinct frame counts), not in all: a rule
    # from before Backend.release fixed the lavapipe abort, kept off the CPU
    cache_per_kind: bool = True


VK_DISABLE_F16 = "GGML_VK_DISABLE_F16"

QUIRKS: dict[str, Quirks] = {
    "cpu": Quirks(products="f32", cache_per_kind=False),
    "cuda": Quirks(),
    "metal": Quirks(explicit_masks=True),
    "vulkan": Quirks(f16_switch=VK_DISABLE_F16),
    "lavapipe": Quirks(f16_switch=VK_DISABLE_F16, parks_frees=True),  # Mesa's software Vulkan ("llvmpipe")
}


def quirks_of(name: str, device_description: str = "") -> Quirks:
    """The row of backend ``name`` ("cpu", "cuda", "metal", "vulkan"), on the device described
    as ``device_description`` (lavapipe's is "llvmpipe ..."); an unknown backend gets no quirks."""
    if name == "vulkan" and device_description.startswith("llvmpipe"):
        return QUIRKS["lavapipe"]
    return QUIRKS.get(name, Quirks())

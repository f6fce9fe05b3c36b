#!/usr/bin/env bash
# The Vulkan step of .ci/run: a Vulkan build of ggml-python in its own venv (scripts/vulkan_setup.sh),
# then tests/vulkan on Mesa's lavapipe (decode, encode, precisions, streaming, the CPU fallback's node
# placement, the remembered fused failure, bench-backends), with one Mesa shader cache for every
# process of the step. Any failure, apt and the build included, exits non-zero. Arguments go to
# pytest (.ci/run passes --junitxml). Under PYGGML_REQUIRE=vulkan (.ci/run sets it) a Vulkan
# device that is gone by the time the tests run fails them instead of skipping them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYGGML_VK_VENV="${PYGGML_VK_VENV:-.ci-vk-venv}"
rm -rf "$PYGGML_VK_VENV" .vk-cache
export MESA_SHADER_CACHE_DIR="$PWD/.vk-cache/mesa" GGML_VK_VISIBLE_DEVICES=0
mkdir -p "$MESA_SHADER_CACHE_DIR"
start=$(date +%s)
timeout 1200 bash scripts/vulkan_setup.sh
echo "-- vulkan setup took $(( $(date +%s) - start )) s"
. "$PYGGML_VK_VENV/bin/activate"
export PYGGML_ORACLE_WHEELS="$PWD/.oracle_wheels"
start=$(date +%s)
timeout 1800 python -m pytest -q -s -m gpu --gpu-backend vulkan -p no:cacheprovider "$@" tests/vulkan
echo "-- vulkan tests took $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# Build ggml-python with ggml's Vulkan backend into its own virtual environment, for the
# Vulkan tests on Mesa's software driver (lavapipe); no GPU needed.
#   bash scripts/vulkan_setup.sh          (as root, or with sudo, on Debian 12 x86-64)
# Environment: PYGGML_VK_VENV (default .vk-venv), PYGGML_VK_HEADERS (default .vk-headers).
#
# What it does, and why:
# * apt-get installs Mesa's Vulkan drivers, the loader, glslc and SPIR-V tools.
# * ggml 0.15.3 uses VK_EXT_layer_settings, which needs Vulkan headers >= 1.3.272; Debian 12
#   ships 1.3.239 ("'LayerSettingEXT' is not a member of 'vk'"). So trixie's libvulkan-dev is
#   downloaded with a private apt configuration (signatures checked with Debian's keyring)
#   and only its headers are unpacked into PYGGML_VK_HEADERS; nothing of trixie is installed
#   and the run time keeps the system loader.
# * ggml-python is compiled from its sdist with -DGGML_VULKAN=on against those headers
#   (--no-cache-dir: pip would otherwise reuse a CPU wheel without a word).
# * The result is checked: the build must report a Vulkan device (GGML_VK_VISIBLE_DEVICES=0
#   lets ggml use a CPU-type device such as llvmpipe). Every failure exits non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${PYGGML_VK_VENV:-.vk-venv}"
HEADERS="${PYGGML_VK_HEADERS:-$PWD/.vk-headers}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

step() { echo "-- vulkan setup: $* ($(date -u +%H:%M:%S))"; }

step "apt packages"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
    mesa-vulkan-drivers libvulkan1 libvulkan-dev glslc spirv-headers glslang-tools cmake g++ python3-venv

step "Vulkan headers from trixie's libvulkan-dev (unpacked, not installed)"
if [ ! -f "$HEADERS/usr/include/vulkan/vulkan.hpp" ]; then
    apt_dir="$(mktemp -d)"
    trap 'rm -rf "$apt_dir"' EXIT
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/sources.list.d"
    cat > "$apt_dir/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
SRC
    if id _apt > /dev/null 2>&1; then chown -R _apt "$apt_dir"; fi  # apt downloads as its own user
    apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
              -o "Dir::State::Status=/dev/null" -o "APT::Architecture=amd64" -o "Debug::NoLocking=1")
    apt-get "${apt_opts[@]}" update -q
    (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libvulkan-dev)
    rm -rf "$HEADERS"
    mkdir -p "$HEADERS"
    dpkg-deb -x "$apt_dir"/libvulkan-dev_*.deb "$HEADERS"
fi
grep -m1 "VK_HEADER_VERSION " "$HEADERS/usr/include/vulkan/vulkan_core.h"

step "virtual environment $VENV"
python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
# The binding first, so that installing the package finds it and builds no CPU-only one.
GGML_PY="ggml-python==$(sed -n 's/.*"ggml-python==\([0-9.]*\)".*/\1/p' pyproject.toml)"
step "$GGML_PY with -DGGML_VULKAN=on"
CMAKE_ARGS="-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$HEADERS/usr/include" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python -m pip install -q --no-cache-dir --force-reinstall --no-deps "$GGML_PY"
step "pyggml_codec with its test extra"
python -m pip install -q -e ".[test]"
python -m pip download -q --no-deps -d .oracle_wheels \
    fish-speech==0.1.0 descript-audio-codec==1.0.0 descript-audiotools==0.7.2

step "check: a Vulkan device"
GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}" python - <<'PY'
import sys
import pyggml_codec
devs = [d for d in pyggml_codec.devices() if d.backend == "vulkan"]
for d in pyggml_codec.devices():
    print(f"   {d.index}: {d.backend} {d.name} ({d.description}, {d.kind})")
if not devs:
    sys.exit("vulkan setup: this ggml-python build reports no Vulkan device")
PY
step "done"

"""Only for the cffi kernels; all other metadata is in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["pyggml_codec/backend/_kernels_build.py:ffibuilder",
                    "pyggml_codec/backend/_kernels_build.py:exact_builder"])

"""The ggml side: the binding (``binding``, the only importer of ggml-python), backends and
devices (``runtime``), graphs and buffers (``graph``), lowering choices (``lowerings``), the
compiled CPU kernels (``kernels``, ``blas``, ``winograd``, C sources in ``csrc/``) and what the
install runs (``buildinfo``)."""

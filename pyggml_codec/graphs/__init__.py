"""The codec as ggml graphs: the builder and ops (``ops``), convolutions (``convs``), the
windowed transformer (``transformer``), the SEANet stacks (``seanet``), the quantizer's graph
stages (``quantizer``), and ``build``: the one place that assembles the encode, decode and
streamed graphs."""

"""What a model file holds: GGUF parsing (``gguf_file``), the configuration (``config``), the
tensor table and strict checks (``weights``), the VQ codebooks on the host (``vq``), loading onto
a backend (``loader``), and the converter with its layout (``convert``, ``layout``, ``gguf_write``)."""

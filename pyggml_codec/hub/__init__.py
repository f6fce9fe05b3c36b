"""Models from the network: the codec of a published merged S2 Pro GGUF, fetched over HTTP range
requests (``fetch.py``), and the Hugging Face Hub's conventions it follows (``endpoint.py``: URLs,
token, mirror endpoint, cache folder)."""

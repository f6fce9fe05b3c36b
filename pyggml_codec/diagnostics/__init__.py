"""Diagnostics over the codec: comparing runs and dumps (``compare``), this library against the C++
engine (``s2cpp``, with its harness), and timing backends (``bench``)."""

"""File formats: audio (``audio``), code files (``codefiles``), stage dumps (``dumps``), and
atomic writes (``fileio``)."""

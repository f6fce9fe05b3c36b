"""The command line: ``main`` (parser and dispatch), the codec commands (``codec_commands``), the
inspection commands (``inspect``) and the diagnostics commands (``diagnostics``)."""

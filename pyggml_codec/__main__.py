"""``python -m pyggml_codec``: the command line (pyggml_codec.cli.main)."""

import sys

from .cli.main import get_parser, main  # noqa: F401  (the entry point; the parser for tests)

if __name__ == "__main__":
    sys.exit(main())

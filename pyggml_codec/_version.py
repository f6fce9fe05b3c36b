"""The library's version, in one place (the package face and the dump writer read it)."""

__version__ = "0.1.0"

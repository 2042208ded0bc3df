"""pgq_thin: the thin Python side of pgq. Every state change is one call of a pgq.* function."""

from pgq_thin.migrate import migrate

__all__ = ["migrate"]
__version__ = "0.1.0"

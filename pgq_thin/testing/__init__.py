"""pgq's test kit (filled in by a later commit)."""

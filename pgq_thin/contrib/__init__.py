"""Integrations of pgq_thin with frameworks (pgq_thin.contrib.django)."""

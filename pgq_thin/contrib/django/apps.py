"""The Django app: add "pgq_thin.contrib.django" to INSTALLED_APPS (docs/django.md)."""

from __future__ import annotations

from django.apps import AppConfig


class PgqConfig(AppConfig):
    name = "pgq_thin.contrib.django"
    label = "pgq"
    verbose_name = "pgq"
    default_auto_field = "django.db.models.BigAutoField"

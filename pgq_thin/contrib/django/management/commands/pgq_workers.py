"""manage.py pgq_workers: pgq-thin workers on Django's database (pgq_thin.contrib.django.commands)."""

from __future__ import annotations

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = "pgq-thin workers on Django's database: the running workers (--help: its options)"
    command = ("workers",)

"""manage.py pgq_job: pgq-thin job on Django's database (pgq_thin.contrib.django.commands)."""

from __future__ import annotations

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = "pgq-thin job on Django's database: one job: its row and history (--help: its options)"
    command = ("job",)

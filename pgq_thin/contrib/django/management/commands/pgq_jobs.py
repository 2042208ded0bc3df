"""manage.py pgq_jobs: pgq-thin jobs on Django's database (pgq_thin.contrib.django.commands)."""

from __future__ import annotations

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = "pgq-thin jobs on Django's database: list jobs, newest first (--help: its options)"
    command = ("jobs",)

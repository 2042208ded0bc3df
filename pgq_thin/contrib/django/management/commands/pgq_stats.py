"""manage.py pgq_stats: pgq-thin stats on Django's database (pgq_thin.contrib.django.commands)."""

from __future__ import annotations

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = "pgq-thin stats on Django's database: the queues' counts (--help: its options)"
    command = ("stats",)

"""manage.py pgq_migrate: pgq-thin migrate on Django's database (pgq_thin.contrib.django.commands)."""

from __future__ import annotations

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = "pgq-thin migrate on Django's database: apply pgq's migrations, then its functions (--help: its options)"
    command = ("migrate",)

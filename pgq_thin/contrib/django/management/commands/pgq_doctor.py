"""manage.py pgq_doctor: pgq-thin doctor on Django's database (pgq_thin.contrib.django.commands)."""

from __future__ import annotations

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = "pgq-thin doctor on Django's database: pgq's health findings (--help: its options)"
    command = ("doctor",)

"""manage.py pgq_cli COMMAND ...: any pgq-thin command on Django's database
(pgq_thin.contrib.django.commands): ``manage.py pgq_cli retry 42``, ``manage.py pgq_cli schedule list``."""

from __future__ import annotations

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = "any pgq-thin command, on Django's database (manage.py pgq_cli --help lists them)"

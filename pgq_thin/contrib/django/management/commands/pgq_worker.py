"""manage.py pgq_worker: pgq-thin worker inside the Django project (its settings loaded, so the
handlers may use the ORM), on Django's database; ``--app`` defaults to ``settings.PGQ_WORKER``."""

from __future__ import annotations

from collections.abc import Sequence

from pgq_thin.contrib.django.commands import PgqCommand


class Command(PgqCommand):
    help = ("pgq-thin worker, on Django's database: --app module:attribute of a pgq_thin Worker or AsyncWorker "
            "(default: settings.PGQ_WORKER); --help: its options")
    command = ("worker",)

    def pgq_argv(self, args: Sequence[str]) -> list[str]:
        from django.conf import settings

        app = getattr(settings, "PGQ_WORKER", None)
        given = any(arg == "--app" or arg.startswith("--app=") for arg in args)
        return [*self.command, *([] if given or not app else ["--app", str(app)]), *args]

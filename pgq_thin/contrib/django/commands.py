"""manage.py's pgq_... commands: each runs a pgq-thin command (pgq_thin.cli) on Django's database
(pgq_thin.contrib.django.dsn), with pgq-thin's own arguments, help and exit statuses.

``manage.py pgq_worker --app myapp.jobs:worker`` is ``pgq-thin worker --app myapp.jobs:worker`` run
inside the Django project (its settings loaded, so handlers may use the ORM); ``manage.py pgq_cli
COMMAND ...`` runs any pgq-thin command. From call_command, give pgq-thin's arguments after
``"--"``: ``call_command("pgq_jobs", "--", "--state", "failed")``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pgq_thin import cli

#: Options manage.py reads before it runs a command; they are not pgq-thin's.
_DJANGO_OPTIONS = ("--settings", "--pythonpath")


def _without_django_options(argv: Sequence[str]) -> list[str]:
    """``argv`` without manage.py's --settings and --pythonpath (already applied by manage.py)."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--":
            return out + list(argv[i:])
        elif arg in _DJANGO_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in _DJANGO_OPTIONS)):
            out.append(arg)
    return out


class PgqCommand(BaseCommand):
    """A pgq-thin command (``command``, e.g. ["stats"]; empty: the first argument names it)."""

    command: Sequence[str] = ()
    requires_system_checks: Any = []  # pgq's commands read no model: a project's own checks do not gate them

    def pgq_argv(self, args: Sequence[str]) -> list[str]:
        """The pgq-thin arguments for this command's ``args``."""
        return [*self.command, *args]

    def run_pgq(self, args: Sequence[str]) -> int:
        from pgq_thin.contrib.django import dsn

        return cli.main(self.pgq_argv(args), dsn=dsn())

    def run_from_argv(self, argv: list[str]) -> None:
        # manage.py has set the settings up; every argument after the command's name is pgq-thin's
        # (its --help too), so Django's parser is not used.
        sys.exit(self.run_pgq(_without_django_options(argv[2:])))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("args", nargs="*", help="pgq-thin's arguments (after -- from call_command)")

    def handle(self, *args: str, **options: Any) -> None:
        status = self.run_pgq(args)
        if status:
            raise CommandError(f"pgq-thin {' '.join(self.pgq_argv(args)[:1])} ended with exit status {status}",
                               returncode=status)

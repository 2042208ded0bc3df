"""A throwaway PostgreSQL server for the demo, the tests, the lab and the benchmark.

It is testing.postgresql with one addition: initdb refuses to run as root, so when this process
is root the server's programs run as an unprivileged account (``postgres`` by default, or
``PGQ_EMBEDDED_USER``) through ``setpriv``, and the data directory is handed to that account.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from typing import Any

import testing.postgresql

__all__ = ["ThrowawayPostgres", "start"]

_SERVER_SETTINGS = (
    "-h 127.0.0.1 -F -c logging_collector=off -c max_connections=200 "
    "-c shared_buffers=128MB"
)


def _unprivileged_prefix() -> list[str]:
    """The command prefix that drops root to an unprivileged account, or [] when not root."""
    if os.geteuid() != 0:
        return []
    user = os.environ.get("PGQ_EMBEDDED_USER", "postgres")
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(
            f"running as root, and initdb refuses root: create the unprivileged account {user!r} "
            "(e.g. install PostgreSQL's server package) or set PGQ_EMBEDDED_USER"
        ) from None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("running as root needs setpriv (util-linux) to start PostgreSQL")
    return [setpriv, f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]


class ThrowawayPostgres(testing.postgresql.Postgresql):  # type: ignore[misc]
    """testing.postgresql.Postgresql that also works when the caller is root."""

    def initialize_database(self) -> None:
        prefix = _unprivileged_prefix()
        if prefix:
            account = pwd.getpwnam(os.environ.get("PGQ_EMBEDDED_USER", "postgres"))
            for root, dirs, files in os.walk(self.base_dir):
                os.chown(root, account.pw_uid, account.pw_gid)
                for name in dirs + files:
                    os.chown(os.path.join(root, name), account.pw_uid, account.pw_gid)
        data = os.path.join(self.base_dir, "data")
        if os.path.exists(os.path.join(data, "PG_VERSION")):
            return
        args = prefix + [self.initdb, "-D", data, "--lc-messages=C", "-E", "UTF8"]
        args += self.settings["initdb_args"].split()
        proc = subprocess.run(args, capture_output=True, cwd="/")
        if proc.returncode != 0:
            raise RuntimeError(f"initdb failed: {proc.stderr.decode(errors='replace')}")

    def get_server_commandline(self) -> list[str]:
        command: list[str] = super().get_server_commandline()
        return _unprivileged_prefix() + command

    @property
    def url_psycopg(self) -> str:
        """The server's ``test`` database as a libpq URL."""
        return str(self.url())

    def dsn_for(self, database: str) -> str:
        return str(self.url(database=database))

    def crash(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster): no checkpoint, like a crash."""
        if self.child_process is not None:
            self.child_process.send_signal(signal.SIGQUIT)
            self.child_process.wait(timeout=60)
            self.child_process = None


def start(**settings: Any) -> ThrowawayPostgres:
    """Start a throwaway server; stop it with ``.stop()`` (its files are removed)."""
    settings.setdefault("postgres_args", _SERVER_SETTINGS)
    return ThrowawayPostgres(**settings)

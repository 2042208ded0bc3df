"""Production topologies for tests, from real parts started and stopped by the test itself:
a PgBouncer in front of a throwaway server, and a primary with a streaming standby that can be
failed over (the primary killed with -9, the standby promoted).

    with ReplicatedPair(synchronous=True) as pair:       # primary + pg_basebackup standby
        dsn = pair.dsn("test")                           # host=A,B ... target_session_attrs=read-write
        ...
        pair.fail_over()                                 # kill -9 the primary, pg_promote() the standby

    with ThrowawayPostgres() as server, PgBouncer(server.port) as bouncer:
        bouncer.dsn("test")                              # pool_mode = transaction

Everything listens on 127.0.0.1 only. As with ``server.ThrowawayPostgres``, when this process is
root the server programs (postgres, pg_basebackup, pgbouncer) run as the unprivileged account
through ``setpriv``. Every wait is for a condition (the standby streaming, its replay position, a
port accepting connections) and bounded by a timeout.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from pgq_thin import queries
from pgq_thin.testing.server import (
    SERVER_SETTINGS,
    ThrowawayPostgres,
    _free_port,
    _unprivileged_account,
    _unprivileged_prefix,
)

__all__ = ["PgBouncer", "ReplicatedPair", "Standby", "kill_server", "pgbouncer_program", "timeline", "wait_for"]

#: A primary that a standby can stream from (wal_level replica and wal senders are the defaults);
#: the standby reports its position every second, so pg_stat_replication is fresh.
REPLICATION_SETTINGS = (SERVER_SETTINGS + " -c wal_keep_size=256MB -c wal_receiver_status_interval=1"
                        " -c hot_standby_feedback=on -c wal_sender_timeout=10s")
TIMEOUT = 60.0


def wait_for(condition: Callable[[], Any], what: str, timeout: float = TIMEOUT, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something true (returned); RuntimeError naming ``what``
    after ``timeout`` seconds. Errors from the condition count as not yet."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except (psycopg.Error, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}"
                               + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


def kill_server(server: ThrowawayPostgres) -> None:
    """kill -9 the server: the postmaster and every one of its processes at once (a machine that
    died, not a shutdown: nothing is flushed, no client is told)."""
    proc = server.child_process
    if proc is None:
        return
    pids = [proc.pid]
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as children:
            pids += [int(p) for p in children.read().split()]
    except OSError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    server.child_process = None


def _program(postgres: str, name: str) -> str:
    path = os.path.join(os.path.dirname(os.path.realpath(postgres)), name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{name} is missing beside {postgres}: a standby needs it")
    return path


class Standby(ThrowawayPostgres):
    """A hot standby made with ``pg_basebackup -R`` from ``primary``, streaming from it under the
    application_name ``name`` (what synchronous_standby_names names; kept as ``application_name``).
    ``port`` keeps a fixed port (a replacement standby takes the old primary's, so a multi-host DSN
    stays valid)."""

    def __init__(self, primary: ThrowawayPostgres, *, name: str = "standby1", port: int | None = None) -> None:
        self.primary = primary
        self.application_name = name  # (``name`` is the library's: the class name, which names the log)
        super().__init__(postgres_args=primary.postgres_args, initdb=primary.initdb,
                         postgres=primary.postgres, port=port, initdb_once=False)

    def initialize_database(self) -> None:  # a base backup of the primary instead of initdb
        self._hand_over()
        command = _unprivileged_prefix() + [
            _program(self.postgres, "pg_basebackup"), "-D", self.data_dir, "-h", "127.0.0.1",
            "-p", str(self.primary.port), "-U", "postgres", "-X", "stream", "-R", "-c", "fast"]
        done = subprocess.run(command, capture_output=True, cwd="/", timeout=TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {done.stderr.decode(errors='replace')}")
        # -R wrote standby.signal and a primary_conninfo; this later line names the standby.
        with open(os.path.join(self.data_dir, "postgresql.auto.conf"), "a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={self.primary.port} user=postgres "
                       f"application_name={self.application_name}'\n")

    def replay_lsn(self) -> str:
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            row = conn.execute(queries.REPLAY_LSN).fetchone()
            assert row is not None
            return str(row[0])

    def cut_off(self) -> None:
        """Stop receiving WAL (primary_conninfo emptied, the walreceiver ends): what the primary
        writes from now on never reaches this standby, as when the network between them fails."""
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            conn.execute(queries.CLEAR_PRIMARY_CONNINFO)
            conn.execute(queries.RELOAD_CONF)
            wait_for(lambda: conn.execute(queries.WAL_RECEIVER_STOPPED).fetchone()[0],  # type: ignore[index]
                     "the standby's walreceiver to stop")

    def promote(self) -> None:
        """pg_promote(): the standby becomes a primary on a new timeline (waits until it is)."""
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True) as conn:
            conn.execute(queries.PROMOTE)
            wait_for(lambda: not conn.execute(queries.IN_RECOVERY).fetchone()[0],  # type: ignore[index]
                     "the promoted standby to leave recovery")


def timeline(dsn: str) -> int:
    """The timeline a primary writes WAL on now (from its current WAL file's name)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(queries.TIMELINE).fetchone()
        assert row is not None
        return int(row[0])


class ReplicatedPair:
    """A primary and a standby streaming from it (``synchronous``: the primary's
    synchronous_standby_names names the standby, so a commit is acknowledged only once the standby
    has flushed it; otherwise replication is asynchronous, the default of most deployments).

    ``dsn(database)`` is a multi-host libpq DSN over both ports with target_session_attrs=read-write:
    clients find whichever is the primary. ``fail_over()`` kills the primary with -9, promotes the
    standby and (unless ``rebuild=False``) makes a new standby of the new primary on the old
    primary's port, so the same DSN keeps working across any number of failovers."""

    def __init__(self, *, synchronous: bool = True, postgres_args: str = REPLICATION_SETTINGS) -> None:
        self.synchronous = synchronous
        self.failovers = 0
        self.ports: list[int] = []
        self.primary: ThrowawayPostgres = ThrowawayPostgres(postgres_args=postgres_args)
        self.standby: Standby | None = None
        try:
            self._attach_standby(port=None)
            assert self.standby is not None
            #: Both servers' ports, in a fixed order: a rebuilt standby takes the dead primary's port.
            self.ports = [self.primary.port, self.standby.port]
        except BaseException:
            self.close()
            raise

    def _attach_standby(self, port: int | None) -> None:
        self.standby = Standby(self.primary, port=port)
        with psycopg.connect(self.primary.dsn_for("postgres"), autocommit=True) as conn:
            name = {"name": self.standby.application_name}
            wait_for(lambda: conn.execute(queries.STANDBY_STREAMING, name).fetchone(), "the standby to stream")
            setting = self.standby.application_name if self.synchronous else ""
            conn.execute(sql.SQL(queries.SET_SYNCHRONOUS_STANDBY_NAMES).format(value=sql.Literal(setting)))
            conn.execute(queries.RELOAD_CONF)
            if self.synchronous:
                wait_for(lambda: conn.execute(queries.STANDBY_SYNCHRONOUS, name).fetchone()[0],  # type: ignore[index]
                         "the standby to become synchronous")

    def dsn(self, database: str = "test", **params: str) -> str:
        extra = "".join(f" {k}={v}" for k, v in params.items())
        return (f"host=127.0.0.1,127.0.0.1 port={self.ports[0]},{self.ports[1]} dbname={database} "
                f"user=postgres target_session_attrs=read-write connect_timeout=5{extra}")

    def wait_caught_up(self) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        assert self.standby is not None
        standby = self.standby
        with psycopg.connect(self.primary.dsn_for("postgres"), autocommit=True) as conn:
            row = conn.execute(queries.CURRENT_WAL_LSN).fetchone()
            assert row is not None
            target = row[0]
        with psycopg.connect(standby.dsn_for("postgres"), autocommit=True) as conn:
            wait_for(lambda: conn.execute(queries.REPLAYED_UP_TO, {"lsn": target}).fetchone()[0],  # type: ignore[index]
                     "the standby to catch up")

    def fail_over(self, *, rebuild: bool = True) -> None:
        """kill -9 the primary, promote the standby; with ``rebuild``, a new synchronous (or
        asynchronous) standby of the new primary on the dead primary's port."""
        assert self.standby is not None
        old = self.primary
        kill_server(old)
        self.standby.promote()
        self.primary, self.standby = self.standby, None
        self.failovers += 1
        old.stop()  # removes its files: the old primary never comes back (no split brain)
        if rebuild:
            self._attach_standby(port=old.port)

    def close(self) -> None:
        """Stop both servers, the standby first. A server that has not finished its fast shutdown
        within STOP_TIMEOUT (seen once, on a promoted primary of a loaded machine, after a soak whose
        checks had all passed) is killed by the library, which then raises: its boot log goes to
        stderr, its files are removed, and the other server is stopped all the same; the error is
        raised once both are down."""
        failure: RuntimeError | None = None
        for server in (self.standby, self.primary):
            if server is None:
                continue
            try:
                server.stop()
            except RuntimeError as exc:  # the library's "failed to shutdown postgres (timeout)"
                print(f"pgq_thin.testing: {exc}", file=sys.stderr, flush=True)
                server.cleanup()
                failure = failure or exc
        if failure is not None:
            raise failure

    def __enter__(self) -> ReplicatedPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pgbouncer_program() -> str | None:
    """Debian's pgbouncer (``/usr/sbin``), or one on PATH; None when it is not installed."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")


class PgBouncer:
    """A PgBouncer on a free port of 127.0.0.1 in front of the server on ``server_port`` (every
    database, user postgres, trust), in ``pool_mode`` (transaction by default)."""

    def __init__(self, server_port: int, *, pool_mode: str = "transaction", pool_size: int = 20,
                 server_host: str = "127.0.0.1") -> None:
        program = pgbouncer_program()
        if program is None:
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        self.pool_mode = pool_mode
        self.base_dir = tempfile.mkdtemp(prefix="pgq-bouncer-")
        self.port = _free_port()
        self.log_path = os.path.join(self.base_dir, "pgbouncer.log")
        ini = os.path.join(self.base_dir, "pgbouncer.ini")
        with open(os.path.join(self.base_dir, "users.txt"), "w") as users:
            users.write('"postgres" ""\n')
        with open(ini, "w") as conf:
            conf.write(f"""[databases]
* = host={server_host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.base_dir}/users.txt
admin_users = postgres
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 1000
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,options
logfile = {self.log_path}
""")
        account = _unprivileged_account()
        if account:
            entry = pwd.getpwnam(account)
            for name in ("", "pgbouncer.ini", "users.txt"):
                os.chown(os.path.join(self.base_dir, name), entry.pw_uid, entry.pw_gid)
        self.process = subprocess.Popen(_unprivileged_prefix() + [program, ini], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, cwd="/")
        try:
            wait_for(self._ready, "pgbouncer to accept connections", timeout=30)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited; its log:\n{self.read_log()}")
        psycopg.connect(self.dsn("pgbouncer"), connect_timeout=2, autocommit=True).close()
        return True

    def dsn(self, database: str = "test") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={database} user=postgres"

    def read_log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return log.read()
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

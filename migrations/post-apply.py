"""yoyo's post-apply hook: run after every `yoyo apply` that applied a migration, in a transaction of
its own, and not recorded as a migration. Once every migration of this directory is applied, it
installs pgq's function source (sql/all_functions.sql, the same as `pgq-thin migrate` installs after
the migrations); until then it only takes PUBLIC's EXECUTE from the pgq functions a migration
created. yoyo runs it only when it applied something: after an upgrade of pgq that changed only
functions, run `pgq-thin migrate` (or apply sql/all_functions.sql).

It needs yoyo and a database driver only, not pgq_thin (a Go or Node team applies the migrations
with yoyo's own command): the function source is read beside this directory, in a checkout
(migrations/ and sql/all_functions.sql) or in the installed package (pgq_thin/_migrations and
pgq_thin/_sql/all_functions.sql). It talks DB-API only, so yoyo's psycopg 3 backend
(postgresql+psycopg://) and its psycopg2 one (postgresql://) both run it."""

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Where the function source is, beside this directory: a checkout's sql/, the wheel's _sql/.
SOURCES = (HERE.parent / "sql" / "all_functions.sql", HERE.parent / "_sql" / "all_functions.sql")
#: yoyo's table of applied migrations, by its default name.
YOYO_TABLE = "SELECT to_regclass('_yoyo_migration') IS NOT NULL"
YOYO_APPLIED = "SELECT migration_id FROM _yoyo_migration"
#: What the hook does while some migrations are not applied: no function a migration created may
#: be reached by PUBLIC (what a created function gets by default).
REVOKE_PUBLIC_EXECUTE = "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgq FROM PUBLIC"


def function_source() -> str:
    """sql/all_functions.sql's text; SystemExit with one sentence saying what to run when this
    directory was copied without it."""
    for path in SOURCES:
        if path.is_file():
            return path.read_text()
    raise SystemExit(f"pgq's migrations were applied, but its functions were not: {HERE} has no "
                     "sql/all_functions.sql beside it; apply that file from the same pgq release "
                     "(psql -1 -v ON_ERROR_STOP=1 -f sql/all_functions.sql) or run `pgq-thin migrate`.")


def applied(cursor) -> set:
    """The ids of the migrations yoyo has applied (none before its table exists)."""
    cursor.execute(YOYO_TABLE)
    if not cursor.fetchone()[0]:
        return set()
    cursor.execute(YOYO_APPLIED)
    return {str(row[0]) for row in cursor.fetchall()}


def post_apply(conn) -> None:
    """Install the function source once every migration of this directory is applied, in one
    transaction with the check (``conn`` is in autocommit mode: the hook is not transactional)."""
    ids = {path.stem for path in HERE.glob("*.sql") if re.match(r"\d+_", path.name)}
    source = function_source()
    cursor = conn.cursor()
    cursor.execute("BEGIN")
    try:
        if ids <= applied(cursor):
            cursor.execute(source)  # no parameters: sent as it is, every statement of it
        else:
            cursor.execute(REVOKE_PUBLIC_EXECUTE)
    except BaseException:
        cursor.execute("ROLLBACK")
        raise
    cursor.execute("COMMIT")


# The hook opens its own transaction: yoyo would run the step in a savepoint, whose rows the
# source's last step (sql/functions/cleanup.sql) cannot tell from older ones.
__transactional__ = False
steps = [step(post_apply)]  # noqa: F821 (yoyo's)

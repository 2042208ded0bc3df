"""yoyo's post-apply hook: run after every `yoyo apply` that applied a migration, in a transaction of
its own, and not recorded as a migration. Once every migration of this directory is applied, it
installs pgq's function source (sql/functions/, the same as `pgq-thin migrate` installs after the
migrations); until then it only takes PUBLIC's EXECUTE from the pgq functions a migration created.
yoyo runs it only when it applied something: after an upgrade of pgq-thin that changed only
functions, run `pgq-thin migrate` (or apply sql/all_functions.sql). See pgq_thin.migrate."""

from pathlib import Path

from pgq_thin.migrate import yoyo_post_apply

# The hook opens its own transaction: yoyo would run the step in a savepoint, whose rows the
# source's last step (sql/functions/cleanup.sql) cannot tell from older ones.
__transactional__ = False
steps = [step(lambda conn: yoyo_post_apply(conn, str(Path(__file__).resolve().parent)))]  # noqa: F821 (yoyo's)

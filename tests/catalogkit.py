"""The migrations' checksums and the catalog comparison the schema and upgrade tests share."""

from __future__ import annotations

from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent


MIGRATIONS = ROOT / "migrations"


# Each query returns rows describing one kind of object in schema pgq. Role names are mapped by
# _role(): the owner of schema pgq becomes '<owner>', everything else keeps its name.
_ROLE = """CASE WHEN {r} = (SELECT nspowner FROM pg_namespace WHERE nspname = 'pgq') THEN '<owner>'
               WHEN {r} = 0 THEN 'PUBLIC' ELSE pg_get_userbyid({r})::text END"""


def _acl(column: str) -> str:
    """A normalized, sorted text rendering of an aclitem[] column (NULL stays NULL)."""
    return f"""(SELECT string_agg(s.item, ',' ORDER BY s.item)
                FROM (SELECT format('%s=%s/%s%s', {_ROLE.format(r='a.grantee')}, a.privilege_type,
                                    {_ROLE.format(r='a.grantor')},
                                    CASE WHEN a.is_grantable THEN '*' ELSE '' END) AS item
                      FROM aclexplode({column}) AS a) AS s)"""


CATALOG_QUERIES: dict[str, str] = {
    "schema": f"""
        SELECT n.nspname, {_acl('n.nspacl')}, obj_description(n.oid, 'pg_namespace')
        FROM pg_namespace AS n WHERE n.nspname = 'pgq'""",
    "functions": f"""
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               {_acl('p.proacl')}, p.prosecdef, p.proconfig, p.provolatile, p.proparallel,
               p.proisstrict, p.proleakproof, obj_description(p.oid, 'pg_proc')
        FROM pg_proc AS p WHERE p.pronamespace = 'pgq'::regnamespace
        ORDER BY 1, 2""",
    "relations": f"""
        SELECT c.relname, c.relkind, c.reloptions, c.relpersistence, {_acl('c.relacl')},
               obj_description(c.oid, 'pg_class')
        FROM pg_class AS c WHERE c.relnamespace = 'pgq'::regnamespace
        ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               col_description(c.oid, a.attnum)
        FROM pg_class AS c
        JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        LEFT JOIN pg_attrdef AS d ON d.adrelid = c.oid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'pgq'::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT c.relname, pg_get_indexdef(c.oid)
        FROM pg_class AS c WHERE c.relnamespace = 'pgq'::regnamespace AND c.relkind = 'i'
        ORDER BY 1""",
    "constraints": """
        SELECT conrelid::regclass::text, contypid::regtype::text, conname, contype,
               pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'pgq'::regnamespace
        ORDER BY 1, 2, 3""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'pgq'::regnamespace AND NOT t.tgisinternal
        ORDER BY 1""",
    "sequences": """
        SELECT s.seqrelid::regclass::text, s.seqtypid::regtype::text, s.seqstart, s.seqincrement,
               s.seqmax, s.seqmin, s.seqcache, s.seqcycle
        FROM pg_sequence AS s JOIN pg_class AS c ON c.oid = s.seqrelid
        WHERE c.relnamespace = 'pgq'::regnamespace
        ORDER BY 1""",
    "types": f"""
        SELECT t.typname, t.typtype, {_acl('t.typacl')}, obj_description(t.oid, 'pg_type'),
               ARRAY(SELECT e.enumlabel::text FROM pg_enum AS e WHERE e.enumtypid = t.oid
                     ORDER BY e.enumsortorder)
        FROM pg_type AS t WHERE t.typnamespace = 'pgq'::regnamespace
        ORDER BY 1""",
    "role_memberships": """
        SELECT r.rolname, m.rolname, r.rolcanlogin, r.rolinherit
        FROM pg_roles AS r
        LEFT JOIN pg_auth_members AS am ON am.member = r.oid
        LEFT JOIN pg_roles AS m ON m.oid = am.roleid
        WHERE r.rolname IN ('pgq_producer', 'pgq_worker', 'pgq_admin', 'pgq_monitor')
        ORDER BY 1, 2""",
}


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def catalog(dsn: str) -> dict[str, list[tuple]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: [tuple(_hashable(v) for v in row) for row in conn.execute(query).fetchall()]
                for name, query in CATALOG_QUERIES.items()}


def assert_same_catalog(expected: dict[str, list[tuple]], actual: dict[str, list[tuple]]) -> None:
    for kind in CATALOG_QUERIES:
        missing = sorted(set(expected[kind]) - set(actual[kind]), key=repr)
        extra = sorted(set(actual[kind]) - set(expected[kind]), key=repr)
        assert not missing and not extra, f"{kind} differ:\nonly in schema.sql: {missing}\nonly in migrations: {extra}"
        assert expected[kind] == actual[kind], f"{kind}: same rows, different order"


#: Every migration, with its SHA-256. A migration on main has been applied to users' databases,
#: which recorded its id: an edit would never reach them. A change is a new migration (and the
#: same change in sql/schema.sql) with its hash added here.
MIGRATION_SHA256 = {
    "0001_initial.sql": "6bb00e304d042f1795350dea4b6330bb8d0c6e9ed117ae428b19c3875c6b0966",
    "0002_cheaper_name_checks.sql": "e40c5560da4a1f1fc81c02d33afe62c74fd7cd7dd5a755a70b522b160fd0086c",
    "0004_schedules_timeouts_progress.sql": "1cfe0f5fe1f53dd95502dd4c34f8d6ff4bbd80c7137e0e9876c2bb5a461d6726",
    "0005_version.sql": "6fabb054b17a18a925555afe60edb2a640bb73da8cbb43017d8d76c7b84da496",
    "0006_operators_day.sql": "07ceb712c09bd7e17bc0638ea8093366bb9cbc7a9c8b7ecc28ed555bbd442c37",
    "0007_failover_fence.sql": "68dece3ca49b3aa294ca6666356e3f39c0de7f5959068a03ddb8f01162974825",
    "0008_security_access.sql": "33462f9928786fbdc87f92a865e69b1577bd268793e68c5e285dadd0241dd92a",
    "0009_security_limits.sql": "c06f8fe627f75ec6d5db32a94e8d52dc26154827923cac1127e5948bd47b5004",
    "0010_finished_counters.sql": "10dce466ad92a9480a2ed18d6553eefccbc77e0c06314f961d13de0ab205f51d",
    "0011_flow_control.sql": "0e1d9fb28e335f0a92ba25d6ec85e2680f15c413a5974fda38c7b454cb47c438",
    "0012_waiting_state.sql": "a3ab5da11411b8e6af38e12ddbd1268051cf839f9a1808d154bfd0e2f27f240d",
    "0013_job_dependencies.sql": "7406371bc135471de0e801758180b873787281245267914da4228fd911d545a1",
    "0014_catalog_comments.sql": "cb73194e6a28f5781d1d2443d68e7a4c499fd07636e4cc79ebc4e7992151e797",
    "0015_dependency_backlog.sql": "dc0a6724b570381b0c6ae7120a76ca715f0377e78cad45fc4583098f7de2c67b",
    "0016_per_key_claims.sql": "758b69c002eddc1bf02d5892421c03d90892d226bebd44936eb697f8782c9f31",
    "0017_workflows.sql": "31743646864a8e991c72dfc6ee4dddfb387ba8626bcca795e04040c81110e3f8",
    "0018_power_tools.sql": "371061133eef4452f30acd69b7ba520e1ff0693fa5ac4c37352d97592eaca9c1",
    "0019_no_shared_locks.sql": "0ed02b2e71be8d57e33618fe44cff8ad4ee8b6f0aa2efcc6e7c1fd39bb610f22",
    "0020_isolated_limits.sql": "5df91725e1940f7b87967f9af4aa5c08087962bfc1dfa265e7a057f4371099f2",
    "0021_graph_isolation.sql": "463f1b39236094d81bb602b7f2aa5a13764886596c8f2a1b6e4d95ad9fe43bf5",
    "0022_durable.sql": "c3129647f52b5ac6ff11a43563a35427d3c62d53a5f32cb9160b8940f3213a14",
    "0023_retention_by_state.sql": "8ee759cc379ca13edff365f61f700292effbd3af1e99bece099059a4018bc183",
    "0025_tags_unique_for.sql": "b0037e2a2ac2f046b97b3c20b7633f623519fd2821d5cf22d733d3bdd7553c0d",
    "0026_worker_registry.sql": "f847d5e53959bff878820baed3c44a2a604259cdb22dc594916f575e70e2eb01",
    "0027_pause_kind.sql": "f27aba9bd728828994da299e1a2de409ced6aeb76c5655cd577725d243254039",
    "0028_keep_done.sql": "8d342f85ab20bab33b97c6f4213b528ae20204df1d86f8a0b752b184edcf2157",
    "0029_max_wait.sql": "a4b1b5386d46d1e58e78bcba97cba13629e657bb87a25433bcc89563452e4948",
    "0030_key_sequence.sql": "c11367dd30c07603eac198ef09f7149d58385298bc945313d08454ca0eae6cf1",
    "0031_archive.sql": "82d5c66861f0466cd7a250584a12ee2ed506601f8d26d115618b377094d71ad4",
    "0032_archive_tags.sql": "2f499262227b6592fc0ad662f10d429d1b88d7dd0ac2ec5522b51907416facfd",
    "0033_lease_floor.sql": "99003d8caf6c11a252ebe331dfe12838d61211af23537d9eab06e6bd2ecbcd0c",
    "0034_claim_floors.sql": "23c7818f679a8d2c477880a49c5ae3cd380dd9f93370ee6f35f5a6fc640b3e5d",
}

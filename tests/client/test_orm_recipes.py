"""Enqueueing from an ORM's own transaction: the recipes of docs/orm.md (examples/orm_sqlalchemy.py
and examples/orm_django.py, shown there verbatim) against a real PostgreSQL. SQLAlchemy 2 on the
psycopg 3 driver (sync and asyncio) and Django on its psycopg 3 backend (settings configured in
this process for the test's throwaway database: no project): a rolled-back ORM transaction
enqueues nothing, a committed one exactly one job, in the very transaction of the ORM's row.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import djangokit
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgq_thin import AsyncClient, Client, InvalidArgument

from sqlhelpers import one

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOC = ROOT / "docs" / "orm.md"


class Boom(Exception):
    """Raised by the application after its enqueue, inside the ORM's transaction."""


def example(name: str) -> ModuleType:
    """examples/<name>.py, imported once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def jobs(conn: psycopg.Connection) -> list[tuple[str, str, Any]]:
    return conn.execute("SELECT queue, kind, payload FROM pgq.jobs ORDER BY id").fetchall()


def same_transaction(conn: psycopg.Connection, order_id: int, table: str = "orders") -> bool:
    """Whether the order's row (in ``table``) and its job were written by one transaction."""
    return bool(one(conn, f"SELECT (SELECT xmin::text FROM {table} WHERE id = %(id)s) = (SELECT xmin::text"
                          " FROM pgq.jobs WHERE payload = jsonb_build_object('order', %(id)s))", {"id": order_id}))


def url(dsn: str, driver: str = "postgresql+psycopg") -> str:
    """The test database as an SQLAlchemy URL (the psycopg 3 driver)."""
    from sqlalchemy import URL

    params = conninfo_to_dict(dsn)
    return URL.create(driver, username=params.get("user"), password=params.get("password"),
                      host=params.get("host"), port=int(params["port"]) if params.get("port") else None,
                      database=params["dbname"]).render_as_string(hide_password=False)


def test_the_docs_show_the_tested_recipes() -> None:
    doc = DOC.read_text(encoding="utf-8")
    for name in ("orm_sqlalchemy", "orm_django"):
        text = (EXAMPLES / f"{name}.py").read_text(encoding="utf-8")
        assert f"```python\n{text}```" in doc, f"{DOC.name} must show examples/{name}.py as it is"


# SQLAlchemy -------------------------------------------------------------------------------------


def test_sqlalchemy_a_rolled_back_session_enqueues_nothing_and_a_committed_one_one_job(
        dsn: str, conn: psycopg.Connection) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    recipe = example("orm_sqlalchemy")
    engine = create_engine(url(dsn))
    try:
        recipe.Base.metadata.create_all(engine)
        with Client(dsn) as client:
            with pytest.raises(Boom), Session(engine) as session, session.begin():
                recipe.place_order(session, client, "rolled back")
                raise Boom
            assert jobs(conn) == []
            assert one(conn, "SELECT count(*) FROM orders") == 0

            with Session(engine) as session, session.begin():
                order_id = recipe.place_order(session, client, "a book")
                assert jobs(conn) == []  # not before the commit
    finally:
        engine.dispose()
    assert jobs(conn) == [("emails", "order_placed", {"order": order_id})]
    assert one(conn, "SELECT item FROM orders WHERE id = %s", (order_id,)) == "a book"
    assert same_transaction(conn, order_id)


def test_sqlalchemy_asyncio_a_rolled_back_session_enqueues_nothing_and_a_committed_one_one_job(
        dsn: str, conn: psycopg.Connection) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    recipe = example("orm_sqlalchemy")
    Order = recipe.Order

    async def main() -> int:
        engine = create_async_engine(url(dsn))
        try:
            async with engine.begin() as ddl:
                await ddl.run_sync(recipe.Base.metadata.create_all)
            async with AsyncClient(dsn) as client:
                with pytest.raises(Boom):
                    async with AsyncSession(engine) as session, session.begin():
                        session.add(Order(item="rolled back"))
                        await recipe.aenqueue_in(session, client, "emails", "order_placed", {"order": 0})
                        raise Boom
                async with AsyncSession(engine) as session, session.begin():
                    order = Order(item="a book")
                    session.add(order)
                    await session.flush()
                    order_id = order.id
                    await recipe.aenqueue_in(session, client, "emails", "order_placed", {"order": order_id})
                return int(order_id)
        finally:
            await engine.dispose()

    order_id = asyncio.run(main())
    assert jobs(conn) == [("emails", "order_placed", {"order": order_id})]
    assert one(conn, "SELECT count(*) FROM orders") == 1
    assert same_transaction(conn, order_id)


def test_an_orm_connection_itself_is_refused_with_where_its_driver_connection_is(dsn: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(url(dsn))
    try:
        with Client(dsn) as client, engine.connect() as sa_conn:
            with pytest.raises(InvalidArgument, match="got Connection.*Connection.connection.driver_connection"):
                client.enqueue("emails", "order_placed", {}, conn=sa_conn)  # type: ignore[arg-type]
    finally:
        engine.dispose()


# Django -----------------------------------------------------------------------------------------


@pytest.fixture
def django_db(dsn: str) -> Iterator[None]:
    """Django configured in this process for the test's database (tests/djangokit.py: once per
    process, shared with tests/client/test_django_contrib.py; a later test points the default
    connection at its own database)."""
    djangokit.use(dsn)
    try:
        yield
    finally:
        djangokit.close()


def test_django_a_rolled_back_atomic_block_enqueues_nothing_and_a_committed_one_one_job(
        django_db: None, dsn: str, conn: psycopg.Connection) -> None:
    from django.db import connection, transaction

    recipe = example("orm_django")
    with connection.schema_editor() as editor:
        editor.create_model(recipe.Order)
    with Client(dsn) as client:
        with pytest.raises(Boom), transaction.atomic():
            recipe.place_order(client, "rolled back")  # its atomic block is a savepoint of this one
            raise Boom
        assert jobs(conn) == []
        assert one(conn, "SELECT count(*) FROM shop_order") == 0

        order_id = recipe.place_order(client, "a book")
    assert jobs(conn) == [("emails", "order_placed", {"order": order_id})]
    assert one(conn, "SELECT item FROM shop_order WHERE id = %s", (order_id,)) == "a book"
    assert same_transaction(conn, order_id, "shop_order")

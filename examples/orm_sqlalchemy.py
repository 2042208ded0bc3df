"""Enqueue a pgq job in the transaction of a SQLAlchemy 2 Session (the psycopg 3 driver: an
engine URL of postgresql+psycopg://). The order and its job commit together, or neither does.

    engine = create_engine("postgresql+psycopg://app@localhost/app")
    client = Client("postgresql://app@localhost/app")   # pgq's own pool, for everything else

    with Session(engine) as session, session.begin():    # commits on leaving, or rolls back
        place_order(session, client, "a book")
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from pgq_thin import AsyncClient, Client


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]


def enqueue_in(session: Session, client: Client, queue: str, kind: str, payload: Any, **options: Any) -> int:
    """client.enqueue in the session's transaction: over the psycopg connection under it."""
    driver = session.connection().connection.driver_connection
    return client.enqueue(queue, kind, payload, conn=driver, **options)


def place_order(session: Session, client: Client, item: str) -> int:
    order = Order(item=item)
    session.add(order)
    session.flush()  # the order's id, for the job's payload
    enqueue_in(session, client, "emails", "order_placed", {"order": order.id})
    return order.id


async def aenqueue_in(session: AsyncSession, client: AsyncClient, queue: str, kind: str, payload: Any,
                      **options: Any) -> int:
    """The same with asyncio (create_async_engine, AsyncSession and pgq's AsyncClient)."""
    raw = await (await session.connection()).get_raw_connection()
    return await client.enqueue(queue, kind, payload, conn=raw.driver_connection, **options)

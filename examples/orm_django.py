"""Enqueue a pgq job in the transaction of Django's ORM (Django 4.2+ on its psycopg 3 backend,
ENGINE django.db.backends.postgresql with psycopg installed). The order and its job commit
together, or neither does.

    client = Client()          # pgq's own pool ($DATABASE_URL), for everything else

    place_order(client, "a book")

Order stands for a model of your app (its models.py).
"""

from __future__ import annotations

from typing import Any

from django.db import connection, models, transaction

from pgq_thin import Client


class Order(models.Model):
    item = models.TextField()

    class Meta:
        app_label = "shop"


def enqueue_in_transaction(client: Client, queue: str, kind: str, payload: Any, **options: Any) -> int:
    """client.enqueue in the transaction Django's connection is in (transaction.atomic), over
    the psycopg connection under it."""
    connection.ensure_connection()
    return client.enqueue(queue, kind, payload, conn=connection.connection, **options)


def place_order(client: Client, item: str) -> int:
    with transaction.atomic():
        order = Order.objects.create(item=item)
        enqueue_in_transaction(client, "emails", "order_placed", {"order": order.pk})
    return int(order.pk)

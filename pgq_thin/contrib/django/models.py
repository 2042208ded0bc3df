"""pgq's jobs and queues as unmanaged models, for the admin's read-only pages (admin.py). Django
never creates, alters or queries these tables: pgq's migrations own them (manage.py pgq_migrate),
no role but the schema owner may read them (docs/security.md), and the admin pages read through
pgq's functions (pgq.list_jobs, pgq.stats) with the login's own rights."""

from __future__ import annotations

from django.db import models


class Job(models.Model):
    id = models.BigIntegerField(primary_key=True)
    queue = models.TextField()
    kind = models.TextField()
    state = models.TextField()
    priority = models.IntegerField()
    attempt = models.IntegerField()
    max_attempts = models.IntegerField()
    run_at = models.DateTimeField()
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)
    last_error = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = 'pgq"."jobs'
        ordering = ["-id"]
        verbose_name = "job"

    def __str__(self) -> str:
        return f"job {self.id}"


class Queue(models.Model):
    name = models.TextField(primary_key=True)
    paused = models.BooleanField()

    class Meta:
        managed = False
        db_table = 'pgq"."queues'
        ordering = ["name"]
        verbose_name = "queue"

    def __str__(self) -> str:
        return str(self.name)

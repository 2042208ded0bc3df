"""Django configured in the test process, once (Django's settings are per process): the apps
pgq_thin.contrib.django's admin needs, and this module as the URLconf (the admin). ``use(dsn)``
points the "default" database (and ``extra`` aliases) at a test's database; the ORM recipes of
tests/client/test_orm_recipes.py and the app of tests/client/test_django_contrib.py share it."""

from __future__ import annotations

from typing import Any

from psycopg.conninfo import conninfo_to_dict

APPS = ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
        "django.contrib.messages", "pgq_thin.contrib.django"]


def database(dsn: str, **changes: str) -> dict[str, Any]:
    """Django's DATABASES entry for ``dsn`` (``changes``: USER=... for another login)."""
    params = conninfo_to_dict(dsn)
    return {"ENGINE": "django.db.backends.postgresql", "NAME": params["dbname"],
            "USER": params.get("user", ""), "PASSWORD": params.get("password", ""),
            "HOST": params.get("host", ""), "PORT": params.get("port", ""), **changes}


def settings_for(databases: dict[str, Any]) -> dict[str, Any]:
    """The settings of a small project with the admin and pgq's app (also written out as a
    settings module for manage.py's commands run as processes)."""
    return {
        "DATABASES": databases, "INSTALLED_APPS": APPS, "USE_TZ": True, "SECRET_KEY": "pgq-tests-only",
        "ALLOWED_HOSTS": ["testserver"], "ROOT_URLCONF": "djangokit",
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "MIDDLEWARE": ["django.contrib.sessions.middleware.SessionMiddleware",
                       "django.contrib.auth.middleware.AuthenticationMiddleware",
                       "django.contrib.messages.middleware.MessageMiddleware"],
        "TEMPLATES": [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
                       "OPTIONS": {"context_processors": ["django.template.context_processors.request",
                                                          "django.contrib.auth.context_processors.auth",
                                                          "django.contrib.messages.context_processors.messages"]}}],
    }


def use(dsn: str, **extra: dict[str, Any]) -> None:
    """Django's "default" database is ``dsn`` from now on (``extra``: more aliases), whatever an
    earlier test pointed it at; Django is set up on the first call."""
    import django
    from django.conf import settings
    from django.db import connections

    databases = {"default": database(dsn), **extra}
    if not settings.configured:
        settings.configure(**settings_for(databases))
        django.setup()
        return
    connections.close_all()
    for alias in list(connections.settings):
        if alias not in databases:
            del connections.settings[alias]
    for alias, entry in connections.configure_settings(databases).items():
        connections.settings[alias] = entry
        if hasattr(connections._connections, alias):
            delattr(connections._connections, alias)
    settings.DATABASES = connections.settings


def close() -> None:
    from django.db import connections

    connections.close_all()


def _urls() -> list[Any]:
    from django.contrib import admin
    from django.urls import path

    return [path("admin/", admin.site.urls)]


def __getattr__(name: str) -> Any:  # urlpatterns, made when Django first resolves a URL
    if name == "urlpatterns":
        return _urls()
    raise AttributeError(name)

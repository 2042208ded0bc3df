"""Tasks: a job's kind as a typed Python function (issue 42).

    worker = Worker(queues=["emails"])

    @worker.task(max_attempts=5)
    def send_welcome(user_id: int, address: Address) -> None:   # the payload's fields
        ...

    job_id = send_welcome.enqueue(client, user_id=42, address=Address("a@example.org"))

``worker.task(...)`` registers a handler for the task's kind (the function's ``__qualname__``
unless ``kind=`` says otherwise) that calls the function with the payload's fields as its
arguments; ``Task.enqueue`` checks the arguments against the function's signature (a missing or
an unknown one is a BadArgumentType, a TypeError too, and nothing is sent) and enqueues
``{name: value}`` as the payload. A dataclass (or, when pydantic is installed, a pydantic model)
is sent as its fields and rebuilt from them for the handler, by the parameter's annotation (also
inside ``X | None`` and ``list[X]``). A parameter named ``ctx`` gets the JobContext and is not part
of the payload. The engine is untouched: a task is a handler ``(job, ctx)`` like any other.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

import psycopg

from pgq_thin import calls
from pgq_thin.async_client import AsyncClient
from pgq_thin.client import Client
from pgq_thin.errors import BadArgumentType, translated
from pgq_thin.models import Job

__all__ = ["CONTEXT", "Task", "default_kind"]

R = TypeVar("R")

log = logging.getLogger("pgq_thin.worker")

#: The name of the parameter that gets the JobContext instead of a payload field.
CONTEXT = "ctx"

#: What a task's defaults (and ``Task.options``) may set: Client.enqueue's keywords after
#: queue, kind and payload, but for ``conn`` (the target of ``enqueue`` is where it goes).
ENQUEUE_OPTIONS = frozenset(inspect.signature(calls.enqueue).parameters) - {"queue", "kind", "payload", "conn"}

#: Where a task can be enqueued: a Client or a caller's psycopg Connection (its transaction) return
#: the id; an AsyncClient or an AsyncConnection return an awaitable of it.
SyncTarget = Client | psycopg.Connection[Any]
AsyncTarget = AsyncClient | psycopg.AsyncConnection[Any]


def _pydantic_model(annotation: Any) -> bool:
    """Whether ``annotation`` is a pydantic model class (pydantic is never imported here: a model
    exists only if its user imported it)."""
    pydantic = sys.modules.get("pydantic")
    return (pydantic is not None and isinstance(annotation, type)
            and issubclass(annotation, pydantic.BaseModel))


def plain(value: Any) -> Any:
    """``value`` as JSON carries it: a dataclass as the object of its fields, a pydantic model as
    its ``model_dump(mode="json")``, in lists, tuples and dicts too; anything else as it is (the
    client refuses what JSON cannot carry, naming the payload)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if _pydantic_model(type(value)):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def rebuilt(annotation: Any, value: Any) -> Any:
    """``value`` read from a payload as ``annotation`` says: a dataclass or a pydantic model rebuilt
    from its fields (nested ones too), also inside ``X | None``, ``Optional[X]`` and ``list[X]``;
    anything else as it is."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return rebuilt(options[0], value) if len(options) == 1 else value
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(annotation) or (Any,)
        return [rebuilt(item, v) for v in value]
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) and isinstance(value, dict):
        hints = typing.get_type_hints(annotation)
        return annotation(**{k: rebuilt(hints.get(k, Any), v) for k, v in value.items()})
    if _pydantic_model(annotation) and isinstance(value, dict):
        return annotation.model_validate(value)
    return value


def _structured(annotation: Any) -> type | None:
    """The dataclass or pydantic model class ``annotation`` names (alone or ``X | None``), if any."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = options[0] if len(options) == 1 else None
    if isinstance(annotation, type) and (dataclasses.is_dataclass(annotation) or _pydantic_model(annotation)):
        return annotation
    return None


def type_hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The function's annotations, resolved (``from __future__ import annotations`` makes them
    text). One that cannot be resolved (a class defined in another function's body, a name imported
    only for type checkers) is left out, with a warning: its argument is handed over as JSON
    carried it, not rebuilt."""
    try:
        return typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - resolved one by one below
        pass
    hints: dict[str, Any] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        annotation = parameter.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, getattr(function, "__globals__", {}))  # noqa: S307 - as get_type_hints
            except Exception:  # noqa: BLE001 - any error: left out, said once
                log.warning("task %s: the annotation %r of %r cannot be resolved: that argument is not rebuilt "
                            "(a dataclass or model defined at module level is)", getattr(function, "__qualname__",
                            function), annotation, name)
                continue
        if annotation is not parameter.empty:
            hints[name] = annotation
    return hints


def default_kind(function: Callable[..., Any]) -> str:
    """A task's kind when ``kind=`` is not given: the function's ``__qualname__``, a function
    defined in another's body without its ``<locals>.`` parts (``make.<locals>.send`` is
    ``make.send``: a kind is a name of letters, digits and ``_ . : / -``). A lambda has no name
    to take: TypeError."""
    name = getattr(function, "__qualname__", None)
    name = name.replace("<locals>.", "") if isinstance(name, str) else None
    if not name or "<" in name:
        raise TypeError(f"task: {function!r} has no name a kind can be made of (a lambda?); give its kind=")
    return name


def _refused(task: str, message: str) -> BadArgumentType:
    return BadArgumentType(f"task {task}: {message}", "22023")


@dataclass(frozen=True)
class Task(Generic[R]):
    """A function registered as the handler of ``kind`` on ``queue``, with the enqueue options
    its jobs get (``defaults``: Client.enqueue's keywords). Call it as the function itself
    (``send_welcome(42)`` runs it here, nothing enqueued); ``enqueue`` sends a job."""

    function: Callable[..., R]
    queue: str
    kind: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    signature: inspect.Signature = field(init=False, repr=False, compare=False)
    hints: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        signature = inspect.signature(self.function)
        for p in signature.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
                raise TypeError(f"task {self.kind}: parameter {p.name!r} has no name a payload can carry "
                                "(a task's parameters are named: no positional-only ones, no *args)")
        unknown = sorted(set(self.defaults) - ENQUEUE_OPTIONS)
        if unknown:
            raise TypeError(f"task {self.kind}: {', '.join(map(repr, unknown))} "
                            f"{'is not an option' if len(unknown) == 1 else 'are not options'} of enqueue "
                            f"(options: {', '.join(sorted(ENQUEUE_OPTIONS))})")
        object.__setattr__(self, "signature", signature)
        object.__setattr__(self, "hints", type_hints(self.function))

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.function(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def options(self, **options: Any) -> Task[R]:
        """This task with other enqueue options for the jobs enqueued through it (``run_at``,
        ``priority``, ``unique_key``, ``depends_on``...: Client.enqueue's keywords), over its
        defaults: ``send_welcome.options(priority=9).enqueue(client, user_id=42)``."""
        return Task(self.function, self.queue, self.kind, {**self.defaults, **options})

    def payload(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The payload of a job of this task called with these arguments, checked against the
        function's signature (a missing or an unknown argument, a dataclass or a model of another
        class: BadArgumentType, naming it). Arguments left out keep the function's defaults (they
        are not sent)."""
        return {name: plain(value) for name, value in self._bound(args, kwargs).items()}

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The arguments by name (those of a ``**kwargs`` parameter among them), checked."""
        if CONTEXT in kwargs and CONTEXT in self.signature.parameters:
            raise _refused(self.kind, f'argument "{CONTEXT}" is the job\'s context, given by the worker, not sent')
        parameters = [p for p in self.signature.parameters.values() if p.name != CONTEXT]
        try:
            bound = self.signature.replace(parameters=parameters).bind(*args, **kwargs)
        except TypeError as exc:
            raise _refused(self.kind, str(exc)) from None
        named: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            parameter = self.signature.parameters[name]
            if parameter.kind == parameter.VAR_KEYWORD:
                named.update(value)
                continue
            wanted = _structured(self.hints.get(name))
            if wanted is not None and value is not None and not isinstance(value, (wanted, dict)):
                raise _refused(self.kind, f'argument "{name}" must be {wanted.__name__}, got {type(value).__name__}')
            named[name] = value
        return named

    def arguments(self, job: Job, ctx: Any) -> dict[str, Any]:
        """The function's keyword arguments for ``job``: its payload's fields, rebuilt by their
        annotations, and ``ctx``. A payload the signature cannot take (not an object, a required
        field missing, an unknown one) raises TypeError naming the field: the attempt fails."""
        if not isinstance(job.payload, dict):
            raise TypeError(f"task {self.kind}: job {job.id}'s payload is not a JSON object, "
                            f"got {type(job.payload).__name__}")
        parameters = self.signature.parameters
        takes_more = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
        unknown = sorted(set(job.payload) - set(parameters) - ({CONTEXT} if CONTEXT in parameters else set()))
        if unknown and not takes_more:
            raise TypeError(f"task {self.kind}: job {job.id}'s payload has fields the function does not take: "
                            f"{', '.join(map(repr, unknown))}")
        values = {name: rebuilt(self.hints.get(name, Any), value) for name, value in job.payload.items()
                  if name != CONTEXT}
        if CONTEXT in parameters:
            values[CONTEXT] = ctx
        missing = [p.name for p in parameters.values()
                   if p.default is p.empty and p.kind != p.VAR_KEYWORD and p.name not in values]
        if missing:
            raise TypeError(f"task {self.kind}: job {job.id}'s payload lacks {', '.join(map(repr, missing))}")
        return values

    def handler(self) -> Callable[[Job, Any], Any]:
        """The (job, ctx) handler the worker registers: a plain function for a plain task, an
        ``async def`` for an ``async def`` one; a dataclass or model it returns is stored as its
        fields."""
        function: Callable[..., Any] = self.function
        if self.is_async:
            async def run_async(job: Job, ctx: Any) -> Any:
                return plain(await function(**self.arguments(job, ctx)))
            run_async.__qualname__ = run_async.__name__ = f"task {self.kind}"
            return run_async

        def run(job: Job, ctx: Any) -> Any:
            return plain(function(**self.arguments(job, ctx)))
        run.__qualname__ = run.__name__ = f"task {self.kind}"
        return run

    @overload
    def enqueue(self, target: SyncTarget, /, *args: Any, **kwargs: Any) -> int: ...

    @overload
    def enqueue(self, target: AsyncTarget, /, *args: Any, **kwargs: Any) -> Awaitable[int]: ...

    def enqueue(self, target: SyncTarget | AsyncTarget, /, *args: Any, **kwargs: Any) -> int | Awaitable[int]:
        """Enqueue a job of this task with these arguments (the function's, checked before anything
        is sent) and return its id. ``target``: a Client, or a psycopg Connection (the job is part
        of its current transaction); an AsyncClient or an AsyncConnection make this return an
        awaitable of the id (``await send_welcome.enqueue(aclient, user_id=42)``); the
        arguments are checked at the call, before the await."""
        named = self._bound(args, kwargs)
        payload = {name: plain(value) for name, value in named.items()}
        options = dict(self.defaults)
        if callable(options.get("unique_key")):  # a function of the task's arguments, by name
            options["unique_key"] = options["unique_key"](**named)
        if isinstance(target, Client):
            return target.enqueue(self.queue, self.kind, payload, **options)
        if isinstance(target, AsyncClient):
            return target.enqueue(self.queue, self.kind, payload, **options)
        if isinstance(target, psycopg.Connection):
            return _send(target, calls.enqueue(self.queue, self.kind, payload, conn=target, **options))
        if isinstance(target, psycopg.AsyncConnection):
            return _asend(target, calls.enqueue(self.queue, self.kind, payload, conn=target, **options))
        raise BadArgumentType(f'argument "target" of {self.kind}.enqueue must be a Client, an AsyncClient, a '
                              f"psycopg Connection or AsyncConnection, got {type(target).__name__}", "22023")


def _send(conn: psycopg.Connection[Any], call: calls.Call[R]) -> R:
    """One call on the caller's connection, in its transaction (as Client.enqueue with ``conn=``;
    pgq_thin.contrib.django sends its calls on Django's connection this way)."""
    with translated():
        cur = conn.cursor()
        if call.rows is not None:
            cur.row_factory = call.rows
        cur.execute(call.query, call.params)
        return call.read(cur.fetchall())


async def _asend(conn: psycopg.AsyncConnection[Any], call: calls.Call[int]) -> int:
    with translated():
        cur = conn.cursor()
        if call.rows is not None:
            cur.row_factory = call.rows  # type: ignore[assignment]  # psycopg's factories serve both cursors
        await cur.execute(call.query, call.params)
        return call.read(await cur.fetchall())


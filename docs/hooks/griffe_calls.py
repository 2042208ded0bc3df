"""A griffe extension for the API reference (mkdocs.yml loads it for mkdocstrings): the clients'
methods are made at import from pgq_thin.calls' descriptions (``enqueue = Method(enqueue)`` in
PgqCalls), which griffe's static analysis sees as attributes. Here each becomes the method it is:
the description's parameters after ``self``, its docstring, and its result (``Call[int]`` is
``-> int``), and ``async`` on AsyncClient, whose calls are awaited. At run time Method gives
``inspect.signature`` and ``help()`` the same (pgq_thin.calls.Method)."""

from __future__ import annotations

from typing import Any

import griffe


def _result(returns: str | griffe.Expr | None) -> str | griffe.Expr | None:
    """``Call[T]`` as ``T``."""
    if isinstance(returns, griffe.ExprSubscript) and str(returns.left) == "Call":
        return returns.slice
    return returns


def _method(name: str, described: griffe.Function, where: griffe.Attribute, asynchronous: bool) -> griffe.Function:
    parameters = griffe.Parameters(
        griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword),
        *(griffe.Parameter(p.name, annotation=p.annotation, kind=p.kind, default=p.default)
          for p in described.parameters))
    method = griffe.Function(name, lineno=where.lineno, endlineno=where.endlineno, parameters=parameters,
                             returns=_result(described.returns))
    if described.docstring is not None:
        method.docstring = griffe.Docstring(described.docstring.value, lineno=described.docstring.lineno,
                                            endlineno=described.docstring.endlineno, parent=method)
    if asynchronous:
        method.labels.add("async")
    return method


class ClientMethods(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "pgq_thin":
            return
        calls = pkg["calls"]
        base = calls["PgqCalls"]
        made: dict[str, tuple[griffe.Function, griffe.Attribute]] = {}
        for name, member in list(base.members.items()):
            value = getattr(member, "value", None)
            if member.is_attribute and isinstance(value, griffe.ExprCall) and str(value.function) == "Method":
                made[name] = (calls[str(value.arguments[0])], member)
                base.set_member(name, _method(name, *made[name], asynchronous=False))
        # A client whose _send is awaited: each method is async (awaiting it gives the result).
        for module in pkg.modules.values():
            for cls in module.classes.values():
                send = cls.members.get("_send")
                if "PgqCalls" in {str(b) for b in cls.bases} and send is not None and "async" in send.labels:
                    for name, (described, where) in made.items():
                        cls.set_member(name, _method(name, described, where, asynchronous=True))

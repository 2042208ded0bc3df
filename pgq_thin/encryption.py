"""Encrypted payloads and results: the envelope (docs/encryption.md) and the key ring that makes
and opens it.

An envelope is the JSON object ``{"pgq_enc": 1, "kid": <key id>, "nonce": <base64 of 12 bytes>,
"ct": <base64 of the ciphertext and its 16-byte tag>}``: AES-256-GCM, under the key ``kid`` of
the ring, of the UTF-8 JSON text of the value, with no associated data, so that any language
with AES-GCM reads it (examples/node_decrypt.mjs). The database sees the envelope only.

``KeyRing(keys, encrypt_with)`` encrypts with ``keys[encrypt_with]`` and decrypts with any key of
``keys`` (rotation: add the new key, encrypt with it, keep the old ones while their jobs live;
erasure: drop a key, and what it encrypted cannot be read any more). A Client, AsyncClient,
Worker or AsyncWorker given ``keys=`` and ``encrypt_with=`` holds one (``keyring``): the calls
named in SEALED encrypt those arguments, the calls in OPENED decrypt what they read.

The ``cryptography`` package does the AES-GCM (the optional extra ``pgq-thin[encryption]``):
pgq_thin imports without it; a key ring needs it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from pgq_thin.errors import BadArgumentType, BadKey, Undecryptable, UnknownKey
from pgq_thin.models import UnreadableJson

if TYPE_CHECKING:
    from pgq_thin.calls import Call

__all__ = ["ENVELOPE_VERSION", "KEY_BYTES", "NONCE_BYTES", "OPENED", "SEALED", "KeyRing", "is_envelope",
           "key_ring", "sealed"]

#: The envelope's ``pgq_enc``: the version of its format (a reader refuses another).
ENVELOPE_VERSION = 1
#: AES-256: a key is 32 bytes.
KEY_BYTES = 32
#: The GCM nonce: 12 random bytes per envelope.
NONCE_BYTES = 12
#: The GCM tag, at the end of ``ct``.
TAG_BYTES = 16

#: The JSON text that is encrypted: compact, UTF-8, as the client sends any jsonb.
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))

MISSING_EXTRA = ("encrypted payloads need the cryptography package: pip install 'pgq-thin[encryption]' "
                 "(or pip install 'cryptography>=41')")


def is_envelope(value: Any) -> bool:
    """Whether ``value`` (a payload or result as read) is an envelope: an object with "pgq_enc"."""
    return type(value) is dict and "pgq_enc" in value


def envelope_label(value: Any) -> str | None:
    """How the CLI and the dashboard show an envelope: "[encrypted, key k2]" (its key id, never
    more); None for a value that is not one."""
    if not is_envelope(value):
        return None
    kid = value.get("kid")
    return f"[encrypted, key {kid if isinstance(kid, str) else json.dumps(kid)}]"


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise ImportError(MISSING_EXTRA) from exc
    return AESGCM


class KeyRing:
    """Keys by id (``keys``: id -> 32 bytes) and the id of the one that encrypts
    (``encrypt_with``). BadKey (a BadArgument and a ValueError, naming the argument) for a key that
    is not 32 bytes, an empty ring or an ``encrypt_with`` not in it; BadArgumentType for a key that
    is not bytes; ImportError, naming the extra, without the cryptography package."""

    def __init__(self, keys: Mapping[str, bytes], encrypt_with: str) -> None:
        if not isinstance(keys, Mapping):
            raise BadArgumentType(f'argument "keys" must be a dict of key id -> 32 bytes, got {type(keys).__name__}',
                                  "22023")
        if not keys:
            raise BadKey('argument "keys" is empty: give at least the key "encrypt_with" names', "22023")
        ring: dict[str, bytes] = {}
        for kid, key in keys.items():
            if type(kid) is not str or not kid or not kid.isprintable() or len(kid) > 64:
                raise BadKey(f'argument "keys" has the key id {kid!r}: an id is a str of 1 to 64 printable '
                             "characters", "22023")
            if not isinstance(key, (bytes, bytearray)):
                raise BadArgumentType(f'argument "keys[{kid!r}]" must be bytes (32 of them), got '
                                      f"{type(key).__name__}", "22023")
            if len(key) != KEY_BYTES:
                raise BadKey(f'argument "keys[{kid!r}]" must be {KEY_BYTES} bytes (AES-256), got {len(key)}',
                             "22023", "os.urandom(32) makes one; keep it in a secret store, not in the code")
            ring[kid] = bytes(key)
        if type(encrypt_with) is not str or encrypt_with not in ring:
            raise BadKey(f'argument "encrypt_with" must name a key of "keys" ({", ".join(map(repr, ring))}), '
                         f"got {encrypt_with!r}", "22023")
        aesgcm = _aesgcm()
        self._ciphers = {kid: aesgcm(key) for kid, key in ring.items()}
        self.encrypt_with = encrypt_with

    @property
    def kids(self) -> list[str]:
        """The key ids of the ring (never the keys)."""
        return list(self._ciphers)

    def __repr__(self) -> str:  # never the keys
        return f"KeyRing(kids={self.kids!r}, encrypt_with={self.encrypt_with!r})"

    def encrypt_text(self, data: bytes) -> dict[str, Any]:
        """The envelope of ``data``, the UTF-8 JSON text of a value."""
        nonce = os.urandom(NONCE_BYTES)
        ct = self._ciphers[self.encrypt_with].encrypt(nonce, data, None)
        return {"pgq_enc": ENVELOPE_VERSION, "kid": self.encrypt_with,
                "nonce": base64.b64encode(nonce).decode(), "ct": base64.b64encode(ct).decode()}

    def encrypt(self, value: Any) -> dict[str, Any]:
        """The envelope of ``value`` (anything JSON carries)."""
        return self.encrypt_text(_JSON.encode(value).encode())

    def decrypt(self, envelope: Mapping[str, Any]) -> Any:
        """The value ``envelope`` holds. UnknownKey (naming the kid) when its key is not in the ring;
        Undecryptable when it is not a well-formed envelope of version 1 or its ciphertext, nonce
        or tag was altered (or it was made with another key of that id)."""
        if not isinstance(envelope, Mapping) or envelope.get("pgq_enc") != ENVELOPE_VERSION:
            version = envelope.get("pgq_enc") if isinstance(envelope, Mapping) else None
            raise Undecryptable(f"not a pgq envelope of version {ENVELOPE_VERSION} (pgq_enc: {version!r})")
        kid = envelope.get("kid")
        cipher = self._ciphers.get(kid) if type(kid) is str else None
        if cipher is None:
            raise UnknownKey(kid, self.kids)
        try:
            nonce = base64.b64decode(envelope["nonce"], validate=True)
            ct = base64.b64decode(envelope["ct"], validate=True)
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise Undecryptable(f"the envelope of key {kid!r} is malformed: nonce and ct must be base64 "
                                "text") from None
        if len(nonce) != NONCE_BYTES or len(ct) < TAG_BYTES:
            raise Undecryptable(f"the envelope of key {kid!r} is malformed: a nonce of {NONCE_BYTES} bytes and a "
                                f"ct of at least {TAG_BYTES} bytes (the tag) are needed")
        from cryptography.exceptions import InvalidTag

        try:
            data = cipher.decrypt(nonce, ct, None)
        except InvalidTag:
            raise Undecryptable(f"the envelope of key {kid!r} does not authenticate: it was altered, or made with "
                                "another key of that id") from None
        try:
            return json.loads(data)
        except RecursionError:
            return UnreadableJson(data)
        except ValueError:
            raise Undecryptable(f"the envelope of key {kid!r} authenticates but does not hold UTF-8 JSON "
                                "text") from None

    def open(self, value: Any) -> Any:
        """``value`` decrypted if it is an envelope, else as it is (a value written in plaintext)."""
        return self.decrypt(value) if is_envelope(value) else value

    def seal_json(self, value: Jsonb) -> Jsonb:
        """A jsonb parameter (the client's serialised JSON text, checked) as its envelope."""
        data = value.obj if isinstance(value.obj, bytes) else _JSON.encode(value.obj).encode()
        return Jsonb(_JSON.encode(self.encrypt_text(data)).encode(), dumps=_as_is)


def _as_is(data: Any) -> Any:
    return data


def key_ring(keys: Mapping[str, bytes] | None, encrypt_with: str | None) -> KeyRing | None:
    """The key ring of a Client's or Worker's ``keys`` and ``encrypt_with`` (None: neither given);
    one without the other is a BadKey naming the missing one."""
    if keys is None and encrypt_with is None:
        return None
    if keys is None:
        raise BadKey('argument "keys" is required with "encrypt_with" (the ring the key is taken from)', "22023")
    if encrypt_with is None:
        raise BadKey('argument "encrypt_with" is required with "keys": the id of the key that encrypts '
                     f"(one of {', '.join(map(repr, keys))})", "22023")
    return KeyRing(keys, encrypt_with)


def _opened(ring: KeyRing, row: Any) -> Any:
    """A row with a ``result`` (JobResult, DependencyResult, JobOutcome), its envelope decrypted."""
    return dataclasses.replace(row, result=ring.decrypt(row.result)) if is_envelope(row.result) else row


def _all_opened(ring: KeyRing, rows: list[Any]) -> list[Any]:
    return [_opened(ring, row) for row in rows]


#: The calls whose arguments of these names a client with keys encrypts (a list: each element).
SEALED: dict[str, tuple[str, ...]] = {
    "enqueue": ("payload",),
    "enqueue_many": ("payloads",),
    "update_job": ("payload",),
    "spawn": ("payload",),
    "schedule": ("payload",),
    "batch_open": ("callback_payload",),
    "complete": ("result",),
}

#: The calls whose answer a client with keys decrypts: how.
OPENED: dict[str, Callable[[KeyRing, Any], Any]] = {
    "job_result": _opened,
    "dependency_results": _all_opened,
    "job_outcomes": _all_opened,
}


def sealed(ring: KeyRing, name: str, call: Call[Any]) -> Call[Any]:
    """``call`` (of the client method ``name``) with the arguments SEALED names encrypted, and its
    answer decrypted as OPENED says."""
    params, read = call.params, call.read
    names = SEALED.get(name)
    if names:
        params = dict(params)
        for param in names:
            value = params.get(param)
            if isinstance(value, list):
                params[param] = [ring.seal_json(v) for v in value]
            elif value is not None:
                params[param] = ring.seal_json(value)
    opener = OPENED.get(name)
    if opener is not None:
        inner = read

        def read(rows: list[Any]) -> Any:
            return opener(ring, inner(rows))

    return dataclasses.replace(call, params=params, read=read)

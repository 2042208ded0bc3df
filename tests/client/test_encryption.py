"""Issue 41, encrypted payloads, from the client's side: the envelope (docs/encryption.md) that
Client(keys=..., encrypt_with=...) and AsyncClient store in pgq.jobs instead of the payload, the
result it reads back decrypted, rotation, erasure by deleting a key, tampering, and the keys it
refuses (nothing enqueued). Against a real PostgreSQL."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgq_thin import BadKey, Client, Undecryptable, UnknownKey
from pgq_thin.encryption import KeyRing, is_envelope

from clientkit import clients
from sqlhelpers import job, one

NODE_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node_decrypt.mjs"
K1, K2 = os.urandom(32), os.urandom(32)
SECRET = {"card": "4111 1111 1111 1111", "name": "Zoë"}


def _stored(conn: psycopg.Connection, job_id: int, column: str = "payload") -> dict:
    value = job(conn, job_id)[column]
    assert is_envelope(value), value
    assert set(value) == {"pgq_enc", "kid", "nonce", "ct"}
    return value


def test_what_the_client_enqueues_is_stored_as_an_envelope_and_its_result_read_back_plain(
        dsn: str, conn: psycopg.Connection, client_kind: str) -> None:
    with clients(client_kind, dsn, keys={"k2": K2, "k1": K1}, encrypt_with="k2") as client:
        job_id = client.enqueue("q", "k", SECRET)
        [a, b] = client.enqueue_many("q", "k", [{"n": 1, **SECRET}, {"n": 2}])
        for jid in (job_id, a, b):
            assert _stored(conn, jid)["kid"] == "k2"
        # No field of the plaintext is visible in SQL.
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE payload::text LIKE '%%4111%%' "
                         "OR payload ? 'card' OR payload ? 'n'") == 0
        assert KeyRing({"k2": K2}, "k2").decrypt(_stored(conn, job_id)) == SECRET
        # An edit of the payload is encrypted too.
        assert client.update_job(b, payload={"n": 3}) is True
        assert KeyRing({"k2": K2}, "k2").decrypt(_stored(conn, b)) == {"n": 3}
        # A worker (here: the same client's owner calls) claims the envelope and completes with a
        # result that is stored encrypted; the client reads it back plain, by job_result and wait.
        [claimed] = client.claim("w", ["q"])
        assert claimed.id == job_id and is_envelope(claimed.payload)
        assert client.complete(claimed.id, claimed.attempt, {"charged": 12.5}) is True
        stored = _stored(conn, job_id, "result")
        assert stored["kid"] == "k2" and "charged" not in json.dumps(stored)
        assert client.job_result(job_id).result == {"charged": 12.5}
        assert client.wait(job_id, timeout=5).result == {"charged": 12.5}


def test_a_schedules_payload_and_a_batchs_callback_payload_are_stored_encrypted(
        dsn: str, conn: psycopg.Connection, client_kind: str) -> None:
    ring = KeyRing({"k1": K1}, "k1")
    with clients(client_kind, dsn, keys={"k1": K1}, encrypt_with="k1") as client:
        client.schedule("nightly", "q", "k", every=3600, payload=SECRET)
        batch = client.batch_open("q", "done", {"report": "secret"})
    scheduled = one(conn, "SELECT payload FROM pgq.schedules WHERE name = 'nightly'")
    callback = one(conn, "SELECT callback_payload FROM pgq.batches WHERE id = %s", (batch,))
    assert ring.decrypt(scheduled) == SECRET and ring.decrypt(callback) == {"report": "secret"}


def test_a_client_without_keys_reads_the_envelope_as_it_is(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as keyed, Client(dsn) as plain:
        job_id = keyed.enqueue("q", "k", SECRET)
        [claimed] = keyed.claim("w", ["q"])
        keyed.complete(claimed.id, claimed.attempt, {"ok": True})
        result = plain.job_result(job_id).result
        assert is_envelope(result) and result["kid"] == "k1"
        assert plain.get_job(job_id).payload == job(conn, job_id)["payload"]


def test_rotation_reads_with_any_key_of_the_ring_and_writes_with_encrypt_with(
        dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as old:
        job_id = old.enqueue("q", "k", SECRET)
    assert _stored(conn, job_id)["kid"] == "k1"
    with Client(dsn, keys={"k2": K2, "k1": K1}, encrypt_with="k2") as new:
        [claimed] = new.claim("w", ["q"])
        assert new.keyring is not None and new.keyring.decrypt(claimed.payload) == SECRET
        new.complete(claimed.id, claimed.attempt, {"ok": 1})
        assert _stored(conn, job_id, "result")["kid"] == "k2"
        assert new.job_result(job_id).result == {"ok": 1}
        assert _stored(conn, new.enqueue("q", "k", {}))["kid"] == "k2"


def test_erasure_deleting_a_key_makes_what_it_encrypted_unreadable(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as old:
        job_id = old.enqueue("q", "k", SECRET)
        [claimed] = old.claim("w", ["q"])
        old.complete(claimed.id, claimed.attempt, {"secret": "result"})
    with Client(dsn, keys={"k2": K2}, encrypt_with="k2") as new:
        with pytest.raises(UnknownKey, match="'k1'") as raised:
            new.job_result(job_id)
        assert raised.value.kid == "k1" and K2.hex() not in str(raised.value)
        with pytest.raises(UnknownKey, match="'k1'"):
            new.wait(job_id, timeout=1)
    # The rows are as they were: nothing was rewritten.
    assert _stored(conn, job_id)["kid"] == "k1"


def test_tampering_is_detected(dsn: str, conn: psycopg.Connection) -> None:
    ring = KeyRing({"k1": K1}, "k1")
    envelope = ring.encrypt(SECRET)
    ct = bytearray(base64.b64decode(envelope["ct"]))
    ct[0] ^= 1
    with pytest.raises(Undecryptable, match="does not authenticate"):
        ring.decrypt({**envelope, "ct": base64.b64encode(bytes(ct)).decode()})
    with pytest.raises(Undecryptable, match="does not authenticate"):
        KeyRing({"k1": os.urandom(32)}, "k1").decrypt(envelope)  # another key under the same id
    with pytest.raises(Undecryptable, match="malformed"):
        ring.decrypt({**envelope, "nonce": "not base64!"})
    with pytest.raises(Undecryptable, match="version 1"):
        ring.decrypt({**envelope, "pgq_enc": 2})
    # A result altered in the table: the client reading it says so.
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as client:
        job_id = client.enqueue("q", "k", {})
        [claimed] = client.claim("w", ["q"])
        client.complete(claimed.id, claimed.attempt, {"v": 1})
        conn.execute("UPDATE pgq.jobs SET result = jsonb_set(result, '{nonce}', to_jsonb(%s::text)) WHERE id = %s",
                     (base64.b64encode(os.urandom(12)).decode(), job_id))
        with pytest.raises(Undecryptable, match="does not authenticate"):
            client.job_result(job_id)


@pytest.mark.parametrize(("keys", "encrypt_with", "named"), [
    ({"k1": b"short"}, "k1", "keys['k1']"),
    ({"k1": os.urandom(64)}, "k1", "keys['k1']"),
    ({"k1": K1}, "k2", '"encrypt_with"'),
    ({"k1": K1}, None, '"encrypt_with"'),
    (None, "k1", '"keys"'),
    ({}, "k1", '"keys"'),
    ({"": K1}, "", '"keys"'),
])
def test_bad_keys_are_refused_naming_the_argument_and_nothing_is_enqueued(
        dsn: str, conn: psycopg.Connection, client_kind: str, keys: object, encrypt_with: object,
        named: str) -> None:
    with pytest.raises(BadKey, match=re.escape(named)) as raised, clients(client_kind, dsn, keys=keys,
                                                                   encrypt_with=encrypt_with) as client:
        client.enqueue("q", "k", SECRET)
    assert isinstance(raised.value, ValueError) and raised.value.sqlstate == "22023"
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_a_key_that_is_not_bytes_is_a_type_error_naming_it(dsn: str) -> None:
    with pytest.raises(TypeError, match=r"keys\['k1'\]"):
        Client(dsn, keys={"k1": K1.hex()}, encrypt_with="k1")  # type: ignore[dict-item]


def test_a_key_ring_never_shows_a_key() -> None:
    ring = KeyRing({"k1": K1, "k2": K2}, "k2")
    assert K1.hex() not in repr(ring) and repr(K1) not in repr(ring) and "k2" in repr(ring)


def test_pgq_thin_imports_without_cryptography_and_a_key_ring_names_the_extra() -> None:
    # A child interpreter where importing cryptography fails, as where it is not installed.
    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "cryptography" or name.startswith("cryptography."):
            raise ImportError("No module named 'cryptography'")
sys.meta_path.insert(0, Block())
import pgq_thin, pgq_thin.encryption
from pgq_thin.encryption import KeyRing
try:
    KeyRing({"k1": bytes(32)}, "k1")
except ImportError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert "pgq-thin[encryption]" in out.stdout


def _node(envelope_or_value: object, *args: str, keys: dict[str, bytes]) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: examples/node_decrypt.mjs cannot be run")
    env = {**os.environ, "PGQ_KEYS": json.dumps({kid: base64.b64encode(k).decode() for kid, k in keys.items()})}
    return subprocess.run([node, str(NODE_EXAMPLE), *args], input=json.dumps(envelope_or_value), env=env,
                          capture_output=True, text=True, timeout=60)


def test_node_reads_the_envelope_python_stored_and_python_reads_nodes(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn, keys={"k2": K2, "k1": K1}, encrypt_with="k2") as client:
        job_id = client.enqueue("q", "k", SECRET)
        stored = job(conn, job_id)["payload"]  # the envelope, as SQL reads it from pgq.jobs
        out = _node(stored, keys={"k1": K1, "k2": K2})
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == SECRET
        # Without its key, and altered: an error naming the kid / the failure, exit status 1.
        out = _node(stored, keys={"k1": K1})
        assert out.returncode == 1 and '"k2"' in out.stderr and "not in the key ring" in out.stderr
        altered = {**stored, "ct": base64.b64encode(bytes(len(base64.b64decode(stored["ct"])))).decode()}
        out = _node(altered, keys={"k2": K2})
        assert out.returncode == 1 and "node_decrypt:" in out.stderr
        # The other way: a result Node encrypted is read by the Python client.
        out = _node({"from": "node", "ü": [1, 2]}, "--encrypt", "k1", keys={"k1": K1})
        assert out.returncode == 0, out.stderr
        envelope = json.loads(out.stdout)
        [claimed] = client.claim("w", ["q"])
        conn.execute("SELECT pgq.complete(%s, %s, %s::jsonb)", (claimed.id, claimed.attempt, json.dumps(envelope)))
        assert _stored(conn, job_id, "result")["kid"] == "k1"
        assert client.job_result(job_id).result == {"from": "node", "ü": [1, 2]}

"""Issue 41, encrypted payloads, in the CLI: ``pgq-thin job`` shows an encrypted payload and result
as ``[encrypted, key <kid>]``, never the ciphertext or a key; ``pgq-thin wait`` prints the result's
envelope as it is stored (the CLI holds no keys; examples/node_decrypt.mjs or a KeyRing opens it)."""

from __future__ import annotations

import json
import os

import psycopg

from pgq_thin import Client
from pgq_thin.encryption import KeyRing

from clikit import pgq
from sqlhelpers import job

K2 = os.urandom(32)


def test_pgq_thin_job_shows_an_encrypted_payload_and_result_by_their_key_id(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn, keys={"k2": K2}, encrypt_with="k2") as client:
        job_id = client.enqueue("q", "k", {"card": "4111 1111 1111 1111"})
        [claimed] = client.claim("w", ["q"])
        client.complete(claimed.id, claimed.attempt, {"charged": "yes"})
    stored = job(conn, job_id)
    shown = pgq("job", str(job_id), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    lines = {line[:12].strip(): line[13:] for line in shown.stdout.splitlines()[1:]}
    assert lines["payload"] == lines["result"] == "[encrypted, key k2]", shown.stdout
    for hidden in ("4111", "charged", stored["payload"]["ct"], stored["result"]["ct"], K2.hex()):
        assert hidden not in shown.stdout
    waited = pgq("wait", str(job_id), dsn=dsn)
    assert waited.returncode == 0, waited.stderr
    assert KeyRing({"k2": K2}, "k2").decrypt(json.loads(waited.stdout)["result"]) == {"charged": "yes"}

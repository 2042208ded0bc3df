// Read (and write) pgq's encrypted envelope in Node.js with its built-in crypto: no npm package.
// The envelope (docs/encryption.md) is {"pgq_enc": 1, "kid": ..., "nonce": ..., "ct": ...}:
// AES-256-GCM, with the 32-byte key `kid` names, of the UTF-8 JSON text of the value; `nonce` is
// 12 bytes, `ct` the ciphertext followed by its 16-byte tag, both base64; no associated data.
//
//   PGQ_KEYS='{"k2": "<base64 of 32 bytes>", "k1": "..."}' node node_decrypt.mjs < envelope.json
//   PGQ_KEYS='...' node node_decrypt.mjs --encrypt k2 < value.json
//
// The first form prints the value an envelope holds (one line of JSON); the second prints the
// envelope of a value under key k2, which any pgq client with that key reads. An envelope read
// from pgq.jobs (SELECT payload FROM pgq.jobs WHERE id = ...) decrypts the same way. Exit
// status: 0, or 1 with a message on stderr (a key not in PGQ_KEYS, an envelope that was altered).
//
// import { decrypt, encrypt } from "./node_decrypt.mjs" gives the two functions to a program.

import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const TAG_BYTES = 16;
const NONCE_BYTES = 12;

// keys: {kid: Buffer of 32 bytes}. Returns the value; throws naming the kid when it is not there.
export function decrypt(envelope, keys) {
  if (envelope === null || typeof envelope !== "object" || envelope.pgq_enc !== 1) {
    throw new Error("not a pgq envelope of version 1");
  }
  const key = Object.hasOwn(keys, envelope.kid) ? keys[envelope.kid] : undefined;
  if (key === undefined) {
    throw new Error(`the envelope was encrypted with key ${JSON.stringify(envelope.kid)}, which is not in the key ring`);
  }
  const nonce = Buffer.from(envelope.nonce, "base64");
  const sealed = Buffer.from(envelope.ct, "base64");
  if (nonce.length !== NONCE_BYTES || sealed.length < TAG_BYTES) throw new Error("malformed envelope");
  const decipher = createDecipheriv("aes-256-gcm", key, nonce);
  decipher.setAuthTag(sealed.subarray(sealed.length - TAG_BYTES));
  // final() throws when the tag does not authenticate: the envelope was altered.
  const text = Buffer.concat([decipher.update(sealed.subarray(0, sealed.length - TAG_BYTES)), decipher.final()]);
  return JSON.parse(text.toString("utf8"));
}

export function encrypt(value, keys, kid) {
  if (!Object.hasOwn(keys, kid)) throw new Error(`key ${JSON.stringify(kid)} is not in the key ring`);
  const nonce = randomBytes(NONCE_BYTES);
  const cipher = createCipheriv("aes-256-gcm", keys[kid], nonce);
  const ct = Buffer.concat([cipher.update(JSON.stringify(value), "utf8"), cipher.final(), cipher.getAuthTag()]);
  return { pgq_enc: 1, kid, nonce: nonce.toString("base64"), ct: ct.toString("base64") };
}

function keysFromEnv() {
  const keys = {};
  for (const [kid, b64] of Object.entries(JSON.parse(process.env.PGQ_KEYS ?? "{}"))) {
    keys[kid] = Buffer.from(b64, "base64");
    if (keys[kid].length !== 32) throw new Error(`PGQ_KEYS: key ${JSON.stringify(kid)} is not 32 bytes`);
  }
  return keys;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  try {
    const input = JSON.parse(readFileSync(0, "utf8"));
    const keys = keysFromEnv();
    const at = process.argv.indexOf("--encrypt");
    const out = at >= 0 ? encrypt(input, keys, process.argv[at + 1]) : decrypt(input, keys);
    process.stdout.write(JSON.stringify(out) + "\n");
  } catch (err) {
    process.stderr.write(`node_decrypt: ${err.message}\n`);
    process.exit(1);
  }
}

// Tests of the TypeScript client against a real tokenguard server and
// sandbox provider. tools/cmd/e2e's TestApps/ClientsOwnTests starts them and
// runs
//   TOKENGUARD_URL=... TOKENGUARD_API_KEY=... SANDBOX_URL=... node --test test/
// with a connection "acme" whose tokens live 3 s and are handed out until
// 1 s before expiry.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Tokenguard, TokenguardError } from "../index.mjs";

const URL = process.env.TOKENGUARD_URL;
const KEY = process.env.TOKENGUARD_API_KEY;
const SANDBOX = process.env.SANDBOX_URL;
const skip = !(URL && KEY && SANDBOX) && "needs a tokenguard server: cd tools && go test ./cmd/e2e -run TestApps/ClientsOwnTests";

async function atAPI(tok) {
  const res = await fetch(`${SANDBOX}/resource`, { headers: { Authorization: `Bearer ${tok.accessToken}` } });
  await res.arrayBuffer();
  return res.status;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The server hands a token out until its expiry, so the one it has may be
// in its last moments; a test that counts cached calls first waits that
// token out, so that the next one has its whole lifetime ahead.
async function withTimeLeft(ms) {
  const t = await new Tokenguard(URL, KEY).token("acme");
  const left = t.expiry.getTime() - Date.now();
  if (left < ms) await sleep(left + 100);
}

test("a token valid at the API, without a refresh token", { skip }, async () => {
  const tg = new Tokenguard(URL, KEY);
  const tok = await tg.token("acme");
  assert.equal(tok.connection, "acme");
  assert.equal(tok.provider, "");
  assert.ok(tok.version >= 1);
  assert.ok(tok.expiry.getTime() > Date.now());
  assert.equal(tok.refreshToken, undefined);
  assert.ok(!String(tg).includes(KEY));
  assert.equal(await atAPI(tok), 200);
});

test("cached, and one fetch at a time", { skip }, async () => {
  await withTimeLeft(1500);
  const tg = new Tokenguard(URL, KEY);
  const real = globalThis.fetch;
  let fetches = 0;
  globalThis.fetch = (...a) => {
    fetches++;
    return real(...a);
  };
  try {
    const got = await Promise.all(Array.from({ length: 20 }, () => tg.token("acme")));
    assert.equal(new Set(got.map((t) => t.accessToken)).size, 1);
    assert.equal(fetches, 1, "20 calls on an empty cache");
    await tg.token("acme");
    assert.equal(fetches, 1, "a fresh cached token costs no call");
  } finally {
    globalThis.fetch = real;
  }
});

test("callers that arrive during a fetch share it, even for a token in its last moments", { skip }, async () => {
  // With an hour of skew no token is fresh to this client: only the sharing
  // of the running fetch keeps 20 calls at one.
  const tg = new Tokenguard(URL, KEY, { skewMs: 3600_000 });
  const real = globalThis.fetch;
  let fetches = 0;
  globalThis.fetch = (...a) => {
    fetches++;
    return real(...a);
  };
  try {
    const got = await Promise.all(Array.from({ length: 20 }, () => tg.token("acme")));
    assert.equal(new Set(got.map((t) => t.accessToken)).size, 1);
    assert.equal(fetches, 1, "20 calls during one fetch");
  } finally {
    globalThis.fetch = real;
  }
});

test("expiry minus skew is honoured", { skip }, async () => {
  const tg = new Tokenguard(URL, KEY);
  const first = await tg.token("acme");
  await sleep(Math.max(0, first.expiry.getTime() - Date.now()) + 100);
  const later = await tg.token("acme");
  assert.ok(later.version > first.version, `${later.version} after ${first.version}`);
  assert.equal(await atAPI(later), 200);
});

test("refreshAfter401", { skip }, async () => {
  const tg = new Tokenguard(URL, KEY);
  const tok = await tg.token("acme");
  const next = await tg.refreshAfter401("acme", tok.version);
  assert.ok(next.version > tok.version);
  assert.equal(await atAPI(next), 200);
  assert.equal(await atAPI(tok), 401, "a refresh revokes the previous access token");
  assert.equal(await tg.token("acme"), next);
  assert.equal(await tg.refreshAfter401("acme", tok.version), next, "a late report costs nothing");
  const other = await new Tokenguard(URL, KEY).refreshAfter401("acme", tok.version);
  assert.ok(other.version >= next.version);
  const ahead = await new Tokenguard(URL, KEY).refreshAfter401("acme", next.version + 100);
  assert.ok(ahead.version >= next.version, "a version this server never handed out: its current token");
});

test("request through the proxy", { skip }, async () => {
  const tg = new Tokenguard(URL, KEY);
  let res = await tg.request("acme", "GET", "/resource");
  assert.equal(res.status, 200);
  assert.equal((await res.json()).ok, true);
  res = await tg.request("acme", "GET", "/no-such-path");
  assert.equal(res.status, 404, "the API's answer, not an exception");
  await res.arrayBuffer();
});

test("tokenguard's own errors", { skip }, async () => {
  const tg = new Tokenguard(URL, KEY);
  await assert.rejects(tg.token("nobody"), (e) => e instanceof TokenguardError && e.status === 404 && e.code === "not_found");
  await assert.rejects(new Tokenguard(URL, "tgk_wrong").request("acme", "GET", "/resource"),
    (e) => e instanceof TokenguardError && e.status === 401 && e.code === "unauthorized");
  assert.throws(() => new Tokenguard("ftp://x", KEY), TypeError);
});

// The opt-in retry of tokenguard's 429 and 503, and authorization(), against
// a local HTTP server (no tokenguard needed): Retry-After honoured, the
// API's own 429 through the proxy left to the caller, no retry by default.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { Tokenguard, TokenguardError, authorization } from "../index.mjs";

const TOKEN = { access_token: "a", token_type: "Bearer", expiry: "2099-01-01T00:00:00Z", connection: "acme", provider: "", version: 1 };

// server answers each path's queued [status, headers] in turn, then 200.
async function server(plan) {
  const hits = [];
  const srv = http.createServer((req, res) => {
    hits.push([req.url, Date.now()]);
    const [status, headers] = plan[req.url]?.shift() ?? [200, {}];
    res.writeHead(status, { ...headers, "Content-Type": "application/json" });
    res.end(JSON.stringify(status === 200 ? TOKEN : { code: "rate_limited", error: "slow down" }));
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${srv.address().port}`, hits, close: () => new Promise((r) => srv.close(r)) };
}

test("a token is retried after Retry-After; authorization() is its header", async () => {
  const s = await server({ "/connections/acme/token": [[429, { "Retry-After": "1", "Tokenguard-Error": "rate_limited" }], [503, { "Tokenguard-Error": "provider_unavailable" }]] });
  try {
    const tok = await new Tokenguard(s.url, "k", { retries: 2 }).token("acme");
    assert.equal(tok.authorization(), "Bearer a");
    assert.equal(authorization(tok), "Bearer a");
    assert.equal(s.hits.length, 3);
    assert.ok(s.hits[1][1] - s.hits[0][1] >= 1000, "Retry-After: 1 honoured");
  } finally {
    await s.close();
  }
});

test("no retry by default, and retries bounded", async () => {
  const s = await server({ "/connections/acme/token": Array.from({ length: 5 }, () => [429, { "Retry-After": "0" }]) });
  try {
    await assert.rejects(new Tokenguard(s.url, "k").token("acme"), (e) => e instanceof TokenguardError && e.status === 429 && e.retryAfter === 0);
    await assert.rejects(new Tokenguard(s.url, "k", { retries: 2 }).token("acme"), TokenguardError);
    assert.equal(s.hits.length, 4);
  } finally {
    await s.close();
  }
});

test("the API's own 429 through the proxy is returned as it is", async () => {
  const s = await server({ "/connections/acme/proxy/v1/me": [[429, { "Retry-After": "0" }]] });
  try {
    const res = await new Tokenguard(s.url, "k", { retries: 3 }).request("acme", "GET", "/v1/me");
    assert.equal(res.status, 429);
    await res.arrayBuffer();
    assert.equal(s.hits.length, 1);
  } finally {
    await s.close();
  }
});

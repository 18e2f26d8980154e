// The hostile-path table (testdata/hostile_paths.json) the server's and
// the Python client's tests share: request() refuses each refused path
// before anything is sent (finding 7: fetch would resolve "../token" and
// reach the token route), and sends each accepted one to the proxy of a
// real server (the control), when TOKENGUARD_URL is set.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Tokenguard, TokenguardError, unsafePath } from "../index.mjs";

// TOKENGUARD_HOSTILE_PATHS names the table when the tests run from an
// installed copy, away from the repository.
const table = JSON.parse(readFileSync(
  process.env.TOKENGUARD_HOSTILE_PATHS ?? new URL("../../../testdata/hostile_paths.json", import.meta.url), "utf8"));
const URL_ = process.env.TOKENGUARD_URL;
const KEY = process.env.TOKENGUARD_API_KEY;
const skip = !(URL_ && KEY) && "needs a tokenguard server: cd tools && go test ./cmd/e2e -run TestApps/ClientsOwnTests";

test("unsafePath refuses the table's refused paths and accepts the rest", () => {
  for (const p of table.refused) assert.notEqual(unsafePath(p), "", `refused path ${JSON.stringify(p)} accepted`);
  for (const p of table.accepted) assert.equal(unsafePath(p), "", `accepted path ${JSON.stringify(p)} refused`);
});

test("request() refuses hostile paths before sending anything", async () => {
  // A server that is not there: a request that was sent would fail
  // otherwise than with bad_path.
  const tg = new Tokenguard("http://127.0.0.1:9", "tgk_none");
  for (const p of table.refused) {
    await assert.rejects(tg.request("conn", "GET", p), (e) => e instanceof TokenguardError && e.code === "bad_path", JSON.stringify(p));
  }
});

test("through a real server: refused paths never reach the token route, accepted ones reach the proxy", { skip }, async () => {
  const tg = new Tokenguard(URL_, KEY);
  for (const p of ["../token", "%2e%2e/token", "..%2ftoken", "./../token"]) {
    await assert.rejects(tg.request("acme", "GET", p), (e) => e instanceof TokenguardError && e.code === "bad_path", p);
  }
  for (const p of table.accepted) {
    const res = await tg.request("acme", "GET", p);
    await res.arrayBuffer();
    assert.equal(res.headers.get("tokenguard-error"), null, `accepted path ${p}: tokenguard answered ${res.status}`);
  }
});

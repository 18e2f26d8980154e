// The polyglot end-to-end test's Node process (cmd/e2e/polyglot_test.go):
// CONCURRENCY loops call the provider's API for DURATION seconds with
// tokens from clients/typescript (a 401 goes to refreshAfter401 and the
// call is made once more); every fifth call goes through the server's
// proxy instead. Prints one JSON summary line.
import { Tokenguard } from "../../../../../clients/typescript/index.mjs";

const { SANDBOX_URL, CONNECTION, DURATION, TOKENGUARD_URL, TOKENGUARD_API_KEY } = process.env;
const AGENT = "polyglot-node/1";
const summary = { direct_ok: 0, proxied_ok: 0, failed: 0, recovered_401: 0, errors: [] };
const fail = (err) => {
  summary.failed++;
  if (summary.errors.length < 5) summary.errors.push(String(err));
};

async function callAPI(accessToken) {
  const res = await fetch(`${SANDBOX_URL}/resource`, { headers: { Authorization: `Bearer ${accessToken}`, "User-Agent": AGENT } });
  await res.arrayBuffer();
  return res.status;
}

async function loop(tg, end) {
  for (let n = 1; Date.now() < end; n++) {
    try {
      if (n % 5 === 0) {
        const res = await tg.request(CONNECTION, "GET", "/resource");
        await res.arrayBuffer();
        res.status === 200 ? summary.proxied_ok++ : fail(`proxy ${res.status}`);
      } else {
        const tok = await tg.token(CONNECTION);
        let status = await callAPI(tok.accessToken);
        if (status === 401) {
          summary.recovered_401++;
          status = await callAPI((await tg.refreshAfter401(CONNECTION, tok.version)).accessToken);
        }
        status === 200 ? summary.direct_ok++ : fail(`direct ${status}`);
      }
    } catch (e) {
      fail(e);
    }
    await new Promise((r) => setTimeout(r, 10));
  }
}

const tg = new Tokenguard(TOKENGUARD_URL, TOKENGUARD_API_KEY);
const end = Date.now() + Number(DURATION) * 1000;
await Promise.all(Array.from({ length: Number(process.env.CONCURRENCY || 8) }, () => loop(tg, end)));
console.log(JSON.stringify(summary));

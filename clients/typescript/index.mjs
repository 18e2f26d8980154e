// A client of the tokenguard server's token API and proxy. No runtime
// dependencies: Node >= 18's fetch. Types: index.d.ts.
//
//   import { Tokenguard } from "@tokenguard/client";
//   const tg = new Tokenguard("https://tokenguard.example.com", apiKey);
//   const tok = await tg.token("acme");               // cached until expiry - skew
//   // ... the API answered 401 to tok.accessToken:
//   const next = await tg.refreshAfter401("acme", tok.version);
//   const res = await tg.request("acme", "GET", "/v1/me"); // through the proxy
//
// The process never sees a refresh token: the server refreshes each
// connection once per expiry for every process that shares it.

export const VERSION = "1.1.0";

/** An error of tokenguard itself (not of the API behind the proxy). */
export class TokenguardError extends Error {
  constructor(status, code, message, connection = "", retryAfter = undefined) {
    super(`tokenguard: ${status} ${code}: ${message}`);
    this.name = "TokenguardError";
    this.status = status;
    this.code = code;
    this.connection = connection;
    this.retryAfter = retryAfter;
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * Why path could be read as another path by some parser on the way, or ""
 * when it cannot: after any number of percent-decodings, a "." or ".."
 * segment (also before a ";" parameter), a backslash, a control byte, or
 * bytes that are not valid UTF-8 (overlong forms included). The server's
 * check (domain.CheckPath) is the same.
 */
export function unsafePath(path) {
  let bytes = new TextEncoder().encode(String(path));
  for (let round = 0; round < 8; round++) {
    let text;
    try {
      text = utf8.decode(bytes);
    } catch {
      return "not valid UTF-8";
    }
    for (const b of bytes) {
      if (b < 0x20 || b === 0x7f) return "a control byte";
      if (b === 0x5c) return "a backslash";
    }
    for (const seg of text.split("/")) {
      const name = seg.split(";")[0];
      if (name === "." || name === "..") return "a dot segment";
    }
    const out = [];
    let changed = false;
    for (let i = 0; i < bytes.length; i++) {
      if (bytes[i] !== 0x25) {
        out.push(bytes[i]);
        continue;
      }
      const hex = String.fromCharCode(bytes[i + 1] ?? 0, bytes[i + 2] ?? 0);
      if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return "a malformed percent-escape";
      out.push(parseInt(hex, 16));
      i += 2;
      changed = true;
    }
    if (!changed) return "";
    bytes = Uint8Array.from(out);
  }
  return "percent-encoded more than 8 times";
}

export class Tokenguard {
  #base;
  #key;
  #skewMs;
  #timeoutMs;
  #retries;
  #maxRetryWaitMs;
  #cache = new Map(); // connection -> Token
  #flights = new Map(); // connection -> Promise<Token>: one fetch at a time
  #bound = new Set(); // connections found sender-constrained (DPoP)

  /**
   * @param {string} baseURL the server, e.g. https://tokenguard.example.com
   * @param {string} apiKey an API key of tokenctl apikey create
   * @param {{skewMs?: number, timeoutMs?: number, retries?: number, maxRetryWaitMs?: number}} [options]
   *   retries: how many times tokenguard's own 429 or 503 (never the API's, through the proxy) is tried
   *   again, after its Retry-After (at most maxRetryWaitMs; 1 s without one). Default 0.
   */
  constructor(baseURL, apiKey, { skewMs = 500, timeoutMs = 30000, retries = 0, maxRetryWaitMs = 30000 } = {}) {
    if (!/^https?:\/\//.test(baseURL)) throw new TypeError("baseURL must be an http(s) URL");
    if (!Number.isInteger(retries) || retries < 0) throw new TypeError("retries must be a non-negative integer");
    this.#retries = retries;
    this.#maxRetryWaitMs = maxRetryWaitMs;
    this.#base = baseURL.replace(/\/+$/, "");
    this.#key = apiKey;
    this.#skewMs = skewMs;
    this.#timeoutMs = timeoutMs;
  }

  /** The connection's access token: cached until expiry - skew, one fetch per connection at a time. */
  async token(connection) {
    const fresh = this.#fresh(connection);
    if (fresh) return fresh;
    // A fetch already running answers this call too, fresh by the skew or
    // not: the server handed it out as valid, and asking again would only
    // bring the same token.
    return this.#flights.get(connection) ?? this.#flight(connection, async () => this.#store(await this.#callToken("GET", connection, "/token")));
  }

  /** A token newer than version, which the API refused: the server refreshes only if nobody did yet. */
  async refreshAfter401(connection, version) {
    const cur = this.#cache.get(connection);
    if (cur && cur.version > version) return cur;
    return this.#flight(connection, async () => {
      const now = this.#cache.get(connection);
      if (now && now.version > version) return now;
      try {
        return this.#store(await this.#callToken("POST", connection, "/token/refresh", JSON.stringify({ stale_version: version })));
      } catch (e) {
        if (!(e instanceof TokenguardError) || e.code !== "unknown_version") throw e;
        // This server instance has not seen that version yet: take its token.
        this.#cache.delete(connection);
        return this.#store(await this.#callToken("GET", connection, "/token"));
      }
    });
  }

  /**
   * Calls the connection's API through the server's proxy, which injects the
   * token and recovers a 401 itself. Resolves to the API's answer whatever
   * its status; rejects with TokenguardError for tokenguard's own errors.
   */
  async request(connection, method, path, { body, headers, query, timeoutMs } = {}) {
    // fetch resolves dot segments before sending: "../token" would leave
    // the proxy for the token route. Refused here, as the server refuses.
    const why = unsafePath(path);
    if (why) throw new TokenguardError(400, "bad_path", `the path could be read as another path: ${why}`, connection);
    let url = this.#connURL(connection, "/proxy/" + path.replace(/^\/+/, ""));
    if (query) url += "?" + new URLSearchParams(query).toString();
    const res = await this.#fetch(method, url, body, headers, timeoutMs);
    if (res.headers.has("tokenguard-error")) throw await errorOf(res);
    return res;
  }

  /**
   * A proof of the connection's DPoP key for one request (method, absolute
   * url under the provider's API base) with its access token; nonce: the
   * API's DPoP-Nonce after it answered 401 use_dpop_nonce. The key never
   * leaves the server.
   */
  async dpopProof(connection, method, url, nonce = undefined) {
    const body = { method: method.toUpperCase(), url };
    if (nonce) body.nonce = nonce;
    const res = await this.#fetch("POST", this.#connURL(connection, "/dpop-proof"), JSON.stringify(body),
      { Accept: "application/json", "Content-Type": "application/json" });
    if (res.status !== 200) throw await errorOf(res);
    const d = await res.json();
    return Object.freeze({
      accessToken: d.access_token,
      tokenType: d.token_type,
      dpop: d.dpop,
      expiresAt: d.expires_at ? new Date(d.expires_at) : null,
      headers() {
        return { Authorization: `DPoP ${d.access_token}`, DPoP: d.dpop };
      },
      toString() {
        return "Proof(DPoP)"; // never the token or the proof
      },
    });
  }

  /**
   * The headers of one call to the connection's API: its bearer token, or
   * for a sender-constrained (DPoP-bound) connection its token with a
   * fresh proof for this request.
   */
  async authorizationHeaders(connection, method, url, nonce = undefined) {
    if (!this.#bound.has(connection)) {
      try {
        const t = await this.token(connection);
        return { Authorization: `Bearer ${t.accessToken}` };
      } catch (e) {
        if (!(e instanceof TokenguardError) || e.code !== "sender_constrained") throw e;
        this.#bound.add(connection);
      }
    }
    return (await this.dpopProof(connection, method, url, nonce)).headers();
  }

  #fresh(connection) {
    const t = this.#cache.get(connection);
    if (t && (t.expiry === null || Date.now() < t.expiry.getTime() - this.#skewMs)) return t;
    return undefined;
  }

  #store(t) {
    const cur = this.#cache.get(t.connection);
    if (!cur || t.version >= cur.version) this.#cache.set(t.connection, t);
    return t;
  }

  // #flight runs fn as connection's one call to the server, after the one
  // running (if any) has ended.
  async #flight(connection, fn) {
    for (let running; (running = this.#flights.get(connection)); ) {
      await running.catch(() => {}); // the caller of that flight has its error
    }
    const p = fn().finally(() => {
      if (this.#flights.get(connection) === p) this.#flights.delete(connection);
    });
    this.#flights.set(connection, p);
    return p;
  }

  #connURL(connection, rest) {
    return `${this.#base}/connections/${encodeURIComponent(connection)}${rest}`;
  }

  async #callToken(method, connection, rest, body) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await this.#fetch(method, this.#connURL(connection, rest), body, headers);
    if (res.status !== 200) throw await errorOf(res);
    const d = await res.json();
    return Object.freeze({
      accessToken: d.access_token,
      tokenType: d.token_type,
      expiry: d.expiry ? new Date(d.expiry) : null,
      connection: d.connection,
      provider: d.provider,
      version: d.version,
      authorization() {
        return `Bearer ${this.accessToken}`;
      },
    });
  }

  async #fetch(method, url, body, headers = {}, timeoutMs = this.#timeoutMs) {
    for (let attempt = 0; ; attempt++) {
      const res = await this.#fetchOnce(method, url, body, headers, timeoutMs);
      const own = !url.includes("/proxy/") || res.headers.has("tokenguard-error"); // the API's own 429 is the caller's
      if ((res.status !== 429 && res.status !== 503) || !own || attempt >= this.#retries) return res;
      await res.body?.cancel();
      await new Promise((r) => setTimeout(r, Math.min(retryAfterMs(res.headers.get("retry-after")), this.#maxRetryWaitMs)));
    }
  }

  #fetchOnce(method, url, body, headers, timeoutMs) {
    return fetch(url, {
      method: method.toUpperCase(),
      body,
      headers: { ...headers, Authorization: `Bearer ${this.#key}`, "User-Agent": `tokenguard-node/${VERSION}` },
      redirect: "manual",
      signal: AbortSignal.timeout(timeoutMs),
    });
  }

  toString() {
    return `Tokenguard(${this.#base})`; // never the key
  }
}

// retryAfterMs reads a Retry-After header: delay-seconds or an HTTP date.
function retryAfterMs(v) {
  if (!v) return 1000;
  if (/^\s*\d+\s*$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? 1000 : Math.max(0, at - Date.now());
}

/** The Authorization header value for a token: "Bearer <access token>". */
export function authorization(token) {
  return `Bearer ${token.accessToken}`;
}

async function errorOf(res) {
  let d = {};
  try {
    d = await res.json();
  } catch {
    // not JSON
  }
  const ra = res.headers.get("retry-after");
  return new TokenguardError(res.status, d.code || res.headers.get("tokenguard-error") || `http_${res.status}`,
    d.error || "", d.connection || "", ra && /^\d+$/.test(ra) ? Number(ra) : undefined);
}

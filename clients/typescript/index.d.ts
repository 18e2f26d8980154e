/** A connection's access token, as GET /connections/{name}/token gives it. */
export interface Token {
  readonly accessToken: string;
  readonly tokenType: string;
  /** When tokenguard stops handing it out (the provider's expiry minus the skew); null: no expiry. */
  readonly expiry: Date | null;
  readonly connection: string;
  /** "" for the server's OAUTH_* provider. */
  readonly provider: string;
  /** Pass it to refreshAfter401 when the API answers 401 to this token. */
  readonly version: number;
  /** The Authorization header value for the API: "Bearer <access token>". */
  authorization(): string;
}

/** The Authorization header value for token: "Bearer <access token>". */
export function authorization(token: Token): string;

export interface TokenguardOptions {
  /** Milliseconds before expiry at which a token is fetched again (default 500). */
  skewMs?: number;
  /** Deadline of each call to the server (default 30000). */
  timeoutMs?: number;
  /** How many times tokenguard's own 429 or 503 (never the API's, through the proxy) is tried again, after its Retry-After (default 0). */
  retries?: number;
  /** The longest wait before a retry (default 30000). */
  maxRetryWaitMs?: number;
}

export interface RequestOptions {
  body?: BodyInit;
  headers?: Record<string, string>;
  query?: Record<string, string>;
  timeoutMs?: number;
}

/** An error of tokenguard itself (not of the API behind the proxy). */
export class TokenguardError extends Error {
  readonly status: number;
  /** Stable: unauthorized, not_found, needs_reauth, refresh_rate_limited, provider_unavailable, ... */
  readonly code: string;
  readonly connection: string;
  /** Seconds, when the server said. */
  readonly retryAfter: number | undefined;
}

export const VERSION: string;

export class Tokenguard {
  constructor(baseURL: string, apiKey: string, options?: TokenguardOptions);
  /** The connection's access token: cached until expiry - skew, one fetch per connection at a time. */
  token(connection: string): Promise<Token>;
  /** A token newer than version, which the API refused: the server refreshes only if nobody did yet. */
  refreshAfter401(connection: string, version: number): Promise<Token>;
  /** The connection's API through the server's proxy: the API's answer whatever its status. */
  request(connection: string, method: string, path: string, options?: RequestOptions): Promise<Response>;
  /** A proof of a sender-constrained connection's DPoP key for one request. */
  dpopProof(connection: string, method: string, url: string, nonce?: string): Promise<Proof>;
  /** Bearer token, or for a DPoP-bound connection its token with a fresh proof. */
  authorizationHeaders(connection: string, method: string, url: string, nonce?: string): Promise<Record<string, string>>;
}

export interface Proof {
  readonly accessToken: string;
  readonly tokenType: "DPoP";
  readonly dpop: string;
  readonly expiresAt: Date | null;
  headers(): { Authorization: string; DPoP: string };
}

/**
 * Why path could be read as another path (a dot segment however often
 * percent-encoded, also before a ";" parameter, a backslash, a control
 * byte, invalid or overlong UTF-8), or "" when it cannot. request()
 * refuses such a path with TokenguardError code "bad_path", as the server does.
 */
export function unsafePath(path: string): string;

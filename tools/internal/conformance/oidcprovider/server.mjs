// A real, separate-process authorization server for tokenguard's
// conformance suite: panva's oidc-provider (certified OpenID Provider) with
// refresh-token rotation on every refresh. The Go side starts it with
// `node server.mjs` (oidc-provider 8 supports Node 18 and later; 9 wants
// 22), reads the first line of stdout ({"listening": URL}) and then one
// JSON line per token-endpoint event. No token value is ever logged.
//
// Clients (the secret comes from CLIENT_SECRET):
//   tokenguard        registered with token_endpoint_auth_method
//                     client_secret_post; oidc-provider accepts HTTP Basic
//                     for it as well (lib/shared/token_auth.js treats the
//                     two as one family)
//   resource-server   introspection only (the test's protected API)
//
// ACCESS_TOKEN_TTL (seconds, default 2) is the access-token lifetime.
// oidc-provider has no rotation grace period: presenting a rotated refresh
// token again revokes the whole grant (lib/actions/grants/refresh_token.js).
import http from 'node:http';
import Provider from 'oidc-provider';

const env = process.env;
const redirect = env.REDIRECT_URI || 'http://127.0.0.1/callback';
const secret = env.CLIENT_SECRET || 'tokenguard-secret';
const ttl = Number.parseInt(env.ACCESS_TOKEN_TTL || '2', 10);

function log(line) {
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), ...line })}\n`);
}

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  const client = (id, method) => ({
    client_id: id,
    client_secret: secret,
    redirect_uris: [redirect],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: method,
  });
  const provider = new Provider(issuer, {
    clients: [
      client('tokenguard', 'client_secret_post'),
      {
        client_id: 'resource-server',
        client_secret: secret,
        redirect_uris: [],
        grant_types: [],
        response_types: [],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    cookies: { keys: ['conformance-only-cookie-key'] },
    features: {
      devInteractions: { enabled: true }, // login and consent pages the test drives over HTTP
      introspection: { enabled: true, allowedPolicy: async () => true },
      revocation: { enabled: true },
    },
    scopes: ['openid', 'offline_access'],
    ttl: { AccessToken: ttl, RefreshToken: 3600, Grant: 3600, Session: 3600, Interaction: 600 },
    rotateRefreshToken: true,
  });
  provider.proxy = false;

  provider.on('grant.success', (ctx) => {
    log({ event: 'grant.success', grant_type: ctx.oidc.params.grant_type, client_id: ctx.oidc.client?.clientId });
  });
  provider.on('grant.error', (ctx, err) => {
    log({
      event: 'grant.error',
      grant_type: ctx.oidc.params?.grant_type,
      error: err.error,
      error_detail: err.error_detail,
      // lib/actions/grants/refresh_token.js: a rotated (consumed) refresh
      // token presented again; the server then revokes the whole grant.
      reuse: err.error_detail === 'refresh token already used',
    });
  });
  provider.on('grant.revoked', (ctx, grantId) => {
    log({ event: 'grant.revoked', route: ctx.oidc?.route, grant: Boolean(grantId) });
  });
  server.on('request', provider.callback());
  log({ event: 'listening', listening: issuer });
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));

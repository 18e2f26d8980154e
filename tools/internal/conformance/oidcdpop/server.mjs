// panva's oidc-provider (its current major) as a separate-process
// authorization server that requires sender-constrained grants, for
// tokenguard's DPoP conformance test. The Go side starts it with
// `node server.mjs`, reads the first stdout line ({"listening": URL}) and
// then one JSON line per token-endpoint event. No token value is logged.
//
// Clients:
//   dpop-public      a public client (token_endpoint_auth_method none)
//                    with dpop_bound_access_tokens: its access AND refresh
//                    tokens are bound to the DPoP key (RFC 9449 §5: only
//                    a public client's refresh tokens are bound)
//   pkjwt            a confidential client authenticating with
//                    private_key_jwt; its public keys come from CLIENT_JWKS
//   resource-server  introspection only (the test's protected API)
//
// DPoP is required with server nonces (use_dpop_nonce), refresh tokens
// rotate on every refresh, and a rotated refresh token presented again
// revokes the grant. ACCESS_TOKEN_TTL (seconds, default 2). RESOURCE: the
// resource indicator (RFC 8707) access tokens may be issued for.
import crypto from 'node:crypto';
import http from 'node:http';
import Provider, { errors } from 'oidc-provider';

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
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: 'dpop-public',
        redirect_uris: [redirect],
        grant_types: ['authorization_code', 'refresh_token'],
        response_types: ['code'],
        token_endpoint_auth_method: 'none',
        dpop_bound_access_tokens: true,
      },
      ...(env.CLIENT_JWKS ? [{
        // private_key_jwt (RFC 7523 §2.2): the test's key, public half in CLIENT_JWKS
        client_id: 'pkjwt',
        redirect_uris: [redirect],
        grant_types: ['authorization_code', 'refresh_token'],
        response_types: ['code'],
        token_endpoint_auth_method: 'private_key_jwt',
        jwks: JSON.parse(env.CLIENT_JWKS),
      }] : []),
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
      devInteractions: { enabled: true },
      introspection: { enabled: true, allowedPolicy: async () => true },
      revocation: { enabled: true },
      dPoP: { enabled: true, nonceSecret: crypto.randomBytes(32), requireNonce: () => true },
      // RFC 8707: RESOURCE is the one resource server access tokens may be for.
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resource) => {
          if (env.RESOURCE && resource === env.RESOURCE) {
            return { scope: 'api:read', audience: resource, accessTokenFormat: 'opaque' };
          }
          throw new errors.InvalidTarget();
        },
      },
    },
    scopes: ['openid', 'offline_access', 'api:read'],
    ttl: { AccessToken: ttl, RefreshToken: 3600, Grant: 3600, Session: 3600, Interaction: 600 },
    rotateRefreshToken: true,
    issueRefreshToken: async () => true,
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

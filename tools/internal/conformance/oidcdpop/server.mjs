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
// PAR_REQUIRED=1: authorization requests must be pushed (RFC 9126), as the
// metadata then says (require_pushed_authorization_requests). Events name
// the aud of a request's client assertion, whether it carried a DPoP
// proof, and the dpop_jkt a pushed request named (a public thumbprint).
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
      pushedAuthorizationRequests: { enabled: true, requirePushedAuthorizationRequests: env.PAR_REQUIRED === '1' },
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

  const assertionAud = (ctx) => {
    const a = ctx.oidc?.body?.client_assertion ?? ctx.oidc?.params?.client_assertion;
    if (!a) return undefined;
    try {
      return JSON.parse(Buffer.from(a.split('.')[1], 'base64url').toString()).aud;
    } catch {
      return undefined;
    }
  };
  provider.on('grant.success', (ctx) => {
    log({
      event: 'grant.success', grant_type: ctx.oidc.params.grant_type, client_id: ctx.oidc.client?.clientId,
      assertion_aud: assertionAud(ctx), token_type: ctx.body?.token_type,
    });
  });
  provider.on('pushed_authorization_request.success', (ctx) => {
    log({
      event: 'par.success', client_id: ctx.oidc.client?.clientId, assertion_aud: assertionAud(ctx),
      dpop_jkt: ctx.oidc.params?.dpop_jkt, code_challenge_method: ctx.oidc.params?.code_challenge_method,
    });
  });
  provider.on('authorization.error', (ctx, err) => {
    log({ event: 'authorization.error', error: err.error, error_description: err.error_description, request_uri: Boolean(ctx.oidc?.params?.request_uri) });
  });
  provider.use(async (ctx, next) => {
    await next();
    if (ctx.oidc?.route === 'revocation') {
      log({ event: 'revocation', status: ctx.status, dpop: Boolean(ctx.get('DPoP')), client_id: ctx.oidc.client?.clientId, assertion_aud: assertionAud(ctx) });
    }
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

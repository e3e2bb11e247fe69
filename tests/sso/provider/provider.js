// A real OpenID Connect provider for the single sign-on tests (npm's oidc-provider), on 127.0.0.1:$PORT.
// Clients: the console (authorization code + PKCE) and the CLI (device authorization grant, RFC 8628).
// Accounts: alice (groups [ml-editors]) and carol (groups [nobody]); any password signs in (dev interactions).
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
const consoleRedirect = process.env.CONSOLE_REDIRECT_URI;
const issuer = `http://127.0.0.1:${port}`;

const ACCOUNTS = {
  alice: { email: 'alice@example.org', name: 'Alice Example', groups: ['ml-editors'] },
  carol: { email: 'carol@example.org', name: 'Carol Example', groups: ['nobody', 'interns'] },
};

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: 'astraeus-console', client_secret: 'console-secret',
      redirect_uris: [consoleRedirect], post_logout_redirect_uris: [consoleRedirect.replace('/sso/callback', '/sign-in')],
      grant_types: ['authorization_code'], response_types: ['code'],
    },
    {
      client_id: 'astraeus-cli', token_endpoint_auth_method: 'none', application_type: 'native',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'refresh_token'], response_types: [],
      redirect_uris: [],
    },
  ],
  pkce: { required: () => true },
  features: { devInteractions: { enabled: true }, deviceFlow: { enabled: true }, rpInitiatedLogout: { enabled: true } },
  claims: { openid: ['sub'], email: ['email'], profile: ['name', 'preferred_username'], groups: ['groups'] },
  conformIdTokenClaims: false, // the ID token carries the scopes' claims (groups) as well as userinfo does
  cookies: { keys: ['astraeus-test-only'] },
  async findAccount(ctx, id) {
    const a = ACCOUNTS[id];
    if (!a) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: a.email, name: a.name, preferred_username: id, groups: a.groups };
      },
    };
  },
});

provider.listen(port, '127.0.0.1', () => console.log(`oidc-provider listening on ${issuer}`));

"""Tests of the Python client against a real tokenguard server and sandbox provider.

tools/cmd/e2e's TestApps/ClientsOwnTests starts them and runs:
    TOKENGUARD_URL=... TOKENGUARD_API_KEY=... SANDBOX_URL=... python3 -m unittest discover -s tests
with a connection "acme" whose tokens live 3 s and are handed out until 1 s before expiry.
"""

import json
import os
import threading
import time
import unittest
import urllib.error
import urllib.request

from tokenguard import Tokenguard, TokenguardError

URL = os.environ.get("TOKENGUARD_URL")
KEY = os.environ.get("TOKENGUARD_API_KEY")
SANDBOX = os.environ.get("SANDBOX_URL")


def at_api(token):
    """The status of GET /resource at the provider's API with token."""
    req = urllib.request.Request(SANDBOX + "/resource", headers={"Authorization": token.authorization()})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def with_time_left(seconds):
    """The server hands a token out until its expiry, so the one it has may be in
    its last moments; a test that counts cached calls first waits that token out,
    so that the next one has its whole lifetime ahead."""
    tok = Tokenguard(URL, KEY).token("acme")
    left = tok.expiry - time.time()
    if left < seconds:
        time.sleep(left + 0.1)


@unittest.skipUnless(URL and KEY and SANDBOX, "needs a tokenguard server: cd tools && go test ./cmd/e2e -run TestApps/ClientsOwnTests")
class ClientTest(unittest.TestCase):
    def setUp(self):
        self.tg = Tokenguard(URL, KEY)

    def test_token_is_valid_at_the_api_and_has_no_refresh_token(self):
        tok = self.tg.token("acme")
        self.assertEqual(tok.connection, "acme")
        self.assertEqual(tok.provider, "")
        self.assertGreaterEqual(tok.version, 1)
        self.assertGreater(tok.expiry, time.time())
        self.assertFalse(hasattr(tok, "refresh_token"))
        self.assertNotIn(tok.access_token, repr(tok))
        self.assertNotIn(KEY, repr(self.tg))
        self.assertEqual(at_api(tok), 200)

    def test_cached_and_one_fetch_at_a_time(self):
        with_time_left(1.5)
        fetches = []
        real = self.tg._call_token

        def counting(*a):
            fetches.append(a)
            time.sleep(0.05)  # a slow server: the other threads arrive meanwhile
            return real(*a)

        self.tg._call_token = counting
        got = []
        threads = [threading.Thread(target=lambda: got.append(self.tg.token("acme"))) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(got), 20)
        self.assertEqual(len({t.access_token for t in got}), 1)
        self.assertEqual(len(fetches), 1, "20 threads on an empty cache")
        self.tg.token("acme")
        self.assertEqual(len(fetches), 1, "a fresh cached token costs no call")

    def test_threads_that_arrive_during_a_fetch_share_it(self):
        # With an hour of skew no token is fresh to this client: only the
        # sharing of the running fetch keeps 20 threads at one call.
        tg = Tokenguard(URL, KEY, skew=3600)
        fetches = []
        real = tg._call_token
        real_lock = tg._lock
        asked = threading.Semaphore(0)  # a release per thread past its look at the cache

        def lock(connection):
            asked.release()  # token() takes the lock right after it noted the fetches so far
            return real_lock(connection)

        def counting(*a):
            fetches.append(a)
            # The fetch lasts until every thread has arrived, however slowly
            # the machine starts them: the test is about the sharing.
            for _ in range(20):
                self.assertTrue(asked.acquire(timeout=30), "a thread never arrived")
            return real(*a)

        tg._lock = lock
        tg._call_token = counting
        got = []
        threads = [threading.Thread(target=lambda: got.append(tg.token("acme"))) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len({t.access_token for t in got}), 1)
        self.assertEqual(len(fetches), 1, "20 threads during one fetch")

    def test_expiry_minus_skew_is_honoured(self):
        first = self.tg.token("acme")
        time.sleep(max(0, first.expiry - time.time()) + 0.1)
        later = self.tg.token("acme")
        self.assertGreater(later.version, first.version)
        self.assertEqual(at_api(later), 200)

    def test_refresh_after_401(self):
        tok = self.tg.token("acme")
        new = self.tg.refresh_after_401("acme", tok.version)
        self.assertGreater(new.version, tok.version)
        self.assertEqual(at_api(new), 200)
        self.assertEqual(at_api(tok), 401, "a refresh revokes the previous access token")
        self.assertEqual(self.tg.token("acme"), new)
        # A late report of the old version costs nothing: the cache is newer.
        self.assertIs(self.tg.refresh_after_401("acme", tok.version), new)
        # Another process's late report is answered by the server without a refresh.
        other = Tokenguard(URL, KEY).refresh_after_401("acme", tok.version)
        self.assertGreaterEqual(other.version, new.version)
        # A version this server never handed out (another instance's): its current token.
        ahead = Tokenguard(URL, KEY).refresh_after_401("acme", new.version + 100)
        self.assertGreaterEqual(ahead.version, new.version)

    def test_request_through_the_proxy(self):
        r = self.tg.request("acme", "GET", "/resource")
        self.assertEqual(r.status, 200)
        self.assertTrue(r.json()["ok"])
        r = self.tg.request("acme", "GET", "/no-such-path")
        self.assertEqual(r.status, 404, "the API's answer, not an exception")

    def test_tokenguard_errors(self):
        with self.assertRaises(TokenguardError) as c:
            self.tg.token("nobody")
        self.assertEqual((c.exception.status, c.exception.code), (404, "not_found"))
        with self.assertRaises(TokenguardError) as c:
            Tokenguard(URL, "tgk_wrong").request("acme", "GET", "/resource")
        self.assertEqual((c.exception.status, c.exception.code), (401, "unauthorized"))
        with self.assertRaises(ValueError):
            Tokenguard("ftp://x", KEY)


if __name__ == "__main__":
    unittest.main()

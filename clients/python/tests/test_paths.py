"""The hostile-path table (testdata/hostile_paths.json) the server's and the
TypeScript client's tests share: request() refuses each refused path before
anything is sent, and sends each accepted one to the proxy of a real server
(the control) when TOKENGUARD_URL is set."""

import json
import os
import pathlib
import unittest

from tokenguard import Tokenguard, TokenguardError, unsafe_path

TABLE = json.loads((pathlib.Path(__file__).resolve().parents[3] / "testdata" / "hostile_paths.json").read_text())
URL = os.environ.get("TOKENGUARD_URL")
KEY = os.environ.get("TOKENGUARD_API_KEY")


class HostilePaths(unittest.TestCase):
    def test_table(self):
        for p in TABLE["refused"]:
            self.assertNotEqual(unsafe_path(p), "", "refused path %r accepted" % p)
        for p in TABLE["accepted"]:
            self.assertEqual(unsafe_path(p), "", "accepted path %r refused" % p)

    def test_request_refuses_before_sending(self):
        # A server that is not there: a request that was sent would fail otherwise.
        tg = Tokenguard("http://127.0.0.1:9", "tgk_none")
        for p in TABLE["refused"]:
            with self.assertRaises(TokenguardError, msg=repr(p)) as cm:
                tg.request("conn", "GET", p)
            self.assertEqual(cm.exception.code, "bad_path")

    @unittest.skipUnless(URL and KEY, "needs a tokenguard server: cd tools && go test ./cmd/e2e -run TestApps/ClientsOwnTests")
    def test_through_a_real_server(self):
        tg = Tokenguard(URL, KEY)
        for p in ("../token", "%2e%2e/token", "..%2ftoken", "./../token"):
            with self.assertRaises(TokenguardError) as cm:
                tg.request("acme", "GET", p)
            self.assertEqual(cm.exception.code, "bad_path")
        for p in TABLE["accepted"]:
            res = tg.request("acme", "GET", p)
            self.assertNotIn("Tokenguard-Error", res.headers, "accepted path %r: tokenguard answered %d" % (p, res.status))


if __name__ == "__main__":
    unittest.main()

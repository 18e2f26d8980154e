"""The opt-in retry of tokenguard's 429 and 503, against a local HTTP server
(no tokenguard needed): Retry-After honoured, the API's own 429 through the
proxy left to the caller, no retry by default."""

import json
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tokenguard import Tokenguard, TokenguardError

TOKEN = {"access_token": "a", "token_type": "Bearer", "expiry": "2099-01-01T00:00:00Z",
         "connection": "acme", "provider": "", "version": 1}


class _Server:
    """Answers each path's queued (status, headers) in turn, then 200."""

    def __init__(self):
        self.plan, self.hits = {}, []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits.append((self.path, time.monotonic()))
                queue = outer.plan.get(self.path, [])
                status, headers = queue.pop(0) if queue else (200, {})
                body = json.dumps(TOKEN if status == 200 else {"code": "rate_limited", "error": "slow down"}).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class RetryTest(unittest.TestCase):
    def setUp(self):
        self.srv = _Server()
        self.addCleanup(self.srv.close)

    def test_token_retried_after_retry_after(self):
        self.srv.plan["/connections/acme/token"] = [(429, {"Retry-After": "1", "Tokenguard-Error": "rate_limited"}),
                                                    (503, {"Tokenguard-Error": "provider_unavailable"})]
        tok = Tokenguard(self.srv.url, "k", retries=2).token("acme")
        self.assertEqual(tok.access_token, "a")
        times = [t for _, t in self.srv.hits]
        self.assertEqual(len(times), 3)
        self.assertGreaterEqual(times[1] - times[0], 1.0)  # Retry-After: 1

    def test_no_retry_by_default_and_retries_bounded(self):
        self.srv.plan["/connections/acme/token"] = [(429, {"Retry-After": "0"})] * 5
        with self.assertRaises(TokenguardError) as e:
            Tokenguard(self.srv.url, "k").token("acme")
        self.assertEqual((e.exception.status, e.exception.retry_after), (429, 0))
        with self.assertRaises(TokenguardError):
            Tokenguard(self.srv.url, "k", retries=2).token("acme")
        self.assertEqual(len(self.srv.hits), 4)  # 1, then 1 + 2

    def test_the_apis_own_429_through_the_proxy_is_returned(self):
        self.srv.plan["/connections/acme/proxy/v1/me"] = [(429, {"Retry-After": "0"})]
        resp = Tokenguard(self.srv.url, "k", retries=3).request("acme", "GET", "/v1/me")
        self.assertEqual(resp.status, 429)
        self.assertEqual(len(self.srv.hits), 1)


if __name__ == "__main__":
    unittest.main()

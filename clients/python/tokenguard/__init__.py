"""A client of the tokenguard server's token API and proxy (standard library only).

    from tokenguard import Tokenguard
    tg = Tokenguard("https://tokenguard.example.com", api_key)
    tok = tg.token("acme")                    # cached until expiry - skew
    # ... the API answered 401 to tok.access_token:
    tok = tg.refresh_after_401("acme", tok.version)
    resp = tg.request("acme", "GET", "/v1/me")  # through the proxy
    # a DPoP-bound (sender-constrained) connection: a proof per request
    hdrs = tg.authorization_headers("acme", "GET", "https://api.example.com/v1/me")
    tg = Tokenguard(url, api_key, retries=3)  # 429/503 tried again after Retry-After

The process never sees a refresh token: the server refreshes each
connection once per expiry for every process that shares it.
"""

from __future__ import annotations

import email.utils
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Dict, Mapping, Optional, Union

__all__ = ["Tokenguard", "Token", "Proof", "Response", "TokenguardError", "unsafe_path"]
__version__ = "1.0.0"


@dataclass(frozen=True)
class Token:
    """A connection's access token, as GET /connections/{name}/token gives it."""

    access_token: str = field(repr=False)
    token_type: str
    expiry: Optional[float]  # Unix time tokenguard stops handing it out; None: no expiry
    connection: str
    provider: str
    version: int

    def authorization(self) -> str:
        """The Authorization header value for the API."""
        return "Bearer " + self.access_token


@dataclass(frozen=True)
class Proof:
    """A DPoP proof for one request of a sender-constrained connection, as
    POST /connections/{name}/dpop-proof gives it: the key never leaves the server."""

    access_token: str = field(repr=False)
    token_type: str
    dpop: str = field(repr=False)
    expires_at: Optional[float]

    def headers(self) -> Dict[str, str]:
        """The request's Authorization and DPoP headers."""
        return {"Authorization": "DPoP " + self.access_token, "DPoP": self.dpop}


@dataclass(frozen=True)
class Response:
    """An answer of the connection's API through the proxy."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


_HEX = re.compile(rb"%([0-9A-Fa-f]{2})")


def unsafe_path(path: str) -> str:
    """Why path could be read as another path by some parser on the way, or ""
    when it cannot: after any number of percent-decodings, a "." or ".." segment
    (also before a ";" parameter), a backslash, a control byte, or bytes that are
    not valid UTF-8 (overlong forms included). The server's check is the same."""
    raw = path.encode("utf-8", "surrogatepass")
    for _ in range(8):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return "not valid UTF-8"
        if any(b < 0x20 or b == 0x7F for b in raw):
            return "a control byte"
        if b"\\" in raw:
            return "a backslash"
        if any(seg.split(";")[0] in (".", "..") for seg in text.split("/")):
            return "a dot segment"
        if raw.count(b"%") != len(_HEX.findall(raw)):
            return "a malformed percent-escape"
        dec = _HEX.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
        if dec == raw:
            return ""
        raw = dec
    return "percent-encoded more than 8 times"


class TokenguardError(Exception):
    """An error of tokenguard itself (not of the API behind the proxy)."""

    def __init__(self, status: int, code: str, message: str, connection: str = "",
                 retry_after: Optional[int] = None):
        super().__init__(f"tokenguard: {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.connection = connection
        self.retry_after = retry_after


class Tokenguard:
    """Thread-safe; make one per process and share it.

    skew: seconds before a token's expiry at which it is fetched again
    (the server's expiry already leaves its own skew before the provider's).
    retries: how many times a 429 or 503 of tokenguard's own (not one the
    API answered through the proxy) is tried again, after its Retry-After
    (at most max_retry_wait seconds; 1 s without one). Default 0: raised at once.
    """

    def __init__(self, base_url: str, api_key: str, *, skew: float = 0.5, timeout: float = 30.0,
                 retries: int = 0, max_retry_wait: float = 30.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must be an http(s) URL")
        self._base = base_url.rstrip("/")
        self._key = api_key
        self._skew = skew
        self._timeout = timeout
        if retries < 0:
            raise ValueError("retries must not be negative")
        self._retries = retries
        self._max_retry_wait = max_retry_wait
        self._cache: Dict[str, Token] = {}
        self._locks: Dict[str, threading.Lock] = {}
        self._fetched: Dict[str, int] = {}  # connection -> answers stored so far
        self._mu = threading.Lock()
        self._bound: Dict[str, bool] = {}  # connections found sender-constrained

    def __repr__(self) -> str:  # never the key
        return f"Tokenguard({self._base!r})"

    def token(self, connection: str) -> Token:
        """The connection's access token: cached until expiry - skew, one fetch per
        connection at a time however many threads ask."""
        tok = self._fresh(connection)
        if tok is not None:
            return tok
        arrived = self._fetched.get(connection, 0)
        with self._lock(connection):
            if self._fetched.get(connection, 0) != arrived:
                # Another thread fetched while this one waited: its answer is
                # this call's too, fresh by the skew or not (the server handed
                # it out as valid; asking again would bring the same token).
                tok = self._cache.get(connection)
                if tok is not None:
                    return tok
            return self._store(self._call_token("GET", connection, "/token"))

    def refresh_after_401(self, connection: str, version: int) -> Token:
        """A token newer than version, which the API refused: the server refreshes
        only if nobody did yet, so a burst of 401s costs one refresh."""
        with self._lock(connection):
            cur = self._cache.get(connection)
            if cur is not None and cur.version > version:
                return cur
            try:
                return self._store(self._call_token(
                    "POST", connection, "/token/refresh", json.dumps({"stale_version": version}).encode()))
            except TokenguardError as e:
                if e.code != "unknown_version":
                    raise
                # This server instance has not seen that version yet: take its token.
                self._cache.pop(connection, None)
                return self._store(self._call_token("GET", connection, "/token"))

    def request(self, connection: str, method: str, path: str, *, body: Union[bytes, str, None] = None,
                headers: Optional[Mapping[str, str]] = None, query: Optional[Mapping[str, str]] = None,
                timeout: Optional[float] = None) -> Response:
        """Calls the connection's API through the server's proxy, which injects the
        token and recovers a 401 by itself. Returns the API's answer whatever its
        status; raises TokenguardError for tokenguard's own errors."""
        why = unsafe_path(path)
        if why:
            raise TokenguardError(400, "bad_path", "the path could be read as another path: " + why, connection)
        url = self._conn_url(connection, "/proxy/" + path.lstrip("/"))
        if query:
            url += "?" + urllib.parse.urlencode(query)
        if isinstance(body, str):
            body = body.encode()
        status, hdrs, data = self._do(method, url, body, dict(headers or {}), timeout)
        if "Tokenguard-Error" in hdrs:
            raise _error(status, hdrs, data)
        return Response(status, hdrs, data)

    def dpop_proof(self, connection: str, method: str, url: str, nonce: Optional[str] = None) -> Proof:
        """A proof of the connection's DPoP key for one request (method, absolute url
        under the provider's API base), with its access token; nonce: the API's
        DPoP-Nonce after it answered 401 use_dpop_nonce."""
        body = {"method": method.upper(), "url": url}
        if nonce:
            body["nonce"] = nonce
        status, hdrs, data = self._do("POST", self._conn_url(connection, "/dpop-proof"), json.dumps(body).encode(),
                                      {"Accept": "application/json", "Content-Type": "application/json"}, None)
        if status != 200:
            raise _error(status, hdrs, data)
        d = json.loads(data)
        return Proof(d["access_token"], d["token_type"], d["dpop"], _unix(d["expires_at"]) if d.get("expires_at") else None)

    def authorization_headers(self, connection: str, method: str, url: str,
                              nonce: Optional[str] = None) -> Dict[str, str]:
        """The headers of one call to the connection's API: its bearer token, or for
        a sender-constrained (DPoP-bound) connection its token with a fresh proof."""
        if not self._bound.get(connection):
            try:
                return {"Authorization": self.token(connection).authorization()}
            except TokenguardError as e:
                if e.code != "sender_constrained":
                    raise
                self._bound[connection] = True
        return self.dpop_proof(connection, method, url, nonce).headers()

    # internals

    def _fresh(self, connection: str) -> Optional[Token]:
        tok = self._cache.get(connection)
        if tok is not None and (tok.expiry is None or time.time() < tok.expiry - self._skew):
            return tok
        return None

    def _store(self, tok: Token) -> Token:
        cur = self._cache.get(tok.connection)
        if cur is None or tok.version >= cur.version:
            self._cache[tok.connection] = tok
        self._fetched[tok.connection] = self._fetched.get(tok.connection, 0) + 1
        return tok

    def _lock(self, connection: str) -> threading.Lock:
        with self._mu:
            return self._locks.setdefault(connection, threading.Lock())

    def _conn_url(self, connection: str, rest: str) -> str:
        return f"{self._base}/connections/{urllib.parse.quote(connection, safe='')}{rest}"

    def _call_token(self, method: str, connection: str, rest: str, body: Optional[bytes] = None) -> Token:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        status, hdrs, data = self._do(method, self._conn_url(connection, rest), body, headers, None)
        if status != 200:
            raise _error(status, hdrs, data)
        d = json.loads(data)
        expiry = _unix(d["expiry"]) if d.get("expiry") else None
        return Token(d["access_token"], d["token_type"], expiry, d["connection"], d["provider"], int(d["version"]))

    def _do(self, method, url, body, headers, timeout):
        for attempt in range(self._retries + 1):
            status, hdrs, data = self._once(method, url, body, headers, timeout)
            own = "/proxy/" not in url or "Tokenguard-Error" in hdrs  # the API's own 429 is the caller's
            if status not in (429, 503) or not own or attempt == self._retries:
                return status, hdrs, data
            time.sleep(min(_retry_after(hdrs.get("Retry-After")), self._max_retry_wait))
        raise AssertionError("unreachable")

    def _once(self, method, url, body, headers, timeout):
        req = urllib.request.Request(url, data=body, method=method.upper(), headers=headers)
        req.add_header("Authorization", "Bearer " + self._key)
        req.add_header("User-Agent", "tokenguard-python/" + __version__)
        try:
            with _opener.open(req, timeout=timeout or self._timeout) as resp:
                return resp.status, dict(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as e:
            with e:
                return e.code, dict(e.headers.items()), e.read()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The API's redirects reach the caller as they are."""

    def redirect_request(self, *args, **kwargs):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def _unix(rfc3339: str) -> float:
    # Python < 3.11 reads at most 6 fractional digits and no "Z"; Go writes up to 9.
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", rfc3339)
    if not m:
        raise ValueError("expiry is not an RFC 3339 time: %r" % rfc3339)
    frac = (m.group(2) or "")[:6].ljust(6, "0")
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(f"{m.group(1)}.{frac}{tz}").timestamp()


def _retry_after(value: Optional[str]) -> float:
    """Seconds to wait by a Retry-After header: delay-seconds or an HTTP date."""
    if not value:
        return 1.0
    if value.strip().isdigit():
        return float(value.strip())
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return 1.0


def _error(status: int, headers: Mapping[str, str], data: bytes) -> TokenguardError:
    try:
        d = json.loads(data)
    except ValueError:
        d = {}
    retry = headers.get("Retry-After")
    return TokenguardError(status, d.get("code") or headers.get("Tokenguard-Error") or "http_%d" % status,
                           d.get("error") or "", d.get("connection") or "",
                           int(retry) if retry and retry.isdigit() else None)

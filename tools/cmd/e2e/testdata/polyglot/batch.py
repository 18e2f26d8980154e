"""The polyglot end-to-end test's Python batch process (cmd/e2e/polyglot_test.go).

Mode "client": THREADS threads call the provider's API for DURATION seconds
with tokens from clients/python (a 401 goes to refresh_after_401 and the
call is made once more); every fifth call goes through the server's proxy
instead. Mode "self-refresh" (the control): the process refreshes the
connection by itself with the stored refresh token, as a batch job that
does not go through tokenguard would, then calls with its own token.
Prints one JSON summary line.
"""

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from tokenguard import Tokenguard

SANDBOX = os.environ["SANDBOX_URL"]
CONN = os.environ["CONNECTION"]
DURATION = float(os.environ["DURATION"])
AGENT = "polyglot-python/1"

lock = threading.Lock()
summary = {"direct_ok": 0, "proxied_ok": 0, "failed": 0, "recovered_401": 0, "errors": []}


def count(key, err=None):
    with lock:
        summary[key] += 1
        if err and len(summary["errors"]) < 5:
            summary["errors"].append(err)


def call_api(access_token):
    req = urllib.request.Request(SANDBOX + "/resource",
                                 headers={"Authorization": "Bearer " + access_token, "User-Agent": AGENT})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def client_loop(tg, end):
    n = 0
    while time.time() < end:
        n += 1
        try:
            if n % 5 == 0:
                r = tg.request(CONN, "GET", "/resource")
                count("proxied_ok") if r.status == 200 else count("failed", "proxy %d" % r.status)
            else:
                tok = tg.token(CONN)
                status = call_api(tok.access_token)
                if status == 401:
                    count("recovered_401")
                    status = call_api(tg.refresh_after_401(CONN, tok.version).access_token)
                count("direct_ok") if status == 200 else count("failed", "direct %d" % status)
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            count("failed", repr(e))
        time.sleep(0.01)


def self_refresh(end):
    """What tokenguard exists to prevent: a second refresher of the same grant."""
    form = urllib.parse.urlencode({"grant_type": "refresh_token", "refresh_token": os.environ["REFRESH_TOKEN"]}).encode()
    basic = base64.b64encode((os.environ["CLIENT_ID"] + ":" + os.environ["CLIENT_SECRET"]).encode()).decode()
    req = urllib.request.Request(os.environ["TOKEN_URL"], data=form, headers={
        "Authorization": "Basic " + basic, "Content-Type": "application/x-www-form-urlencoded", "User-Agent": AGENT})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            access = json.loads(r.read())["access_token"]
    except urllib.error.HTTPError as e:
        count("failed", "own refresh %d" % e.code)
        return
    summary["self_refreshed"] = True
    while time.time() < end:
        status = call_api(access)
        count("direct_ok") if status == 200 else count("failed", "direct %d" % status)
        time.sleep(0.05)


def main():
    end = time.time() + DURATION
    if os.environ.get("MODE") == "self-refresh":
        self_refresh(end)
    else:
        tg = Tokenguard(os.environ["TOKENGUARD_URL"], os.environ["TOKENGUARD_API_KEY"])
        threads = [threading.Thread(target=client_loop, args=(tg, end)) for _ in range(int(os.environ.get("THREADS", "4")))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

"""A PEP 517 build backend in the standard library: the package is one
pure-Python directory, and pip installs it offline from a fresh virtualenv
with no setuptools or wheel to fetch."""

import base64
import hashlib
import os
import tarfile
import zipfile

NAME, VERSION = "tokenguard", "1.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_INFO = "%s-%s.dist-info" % (NAME, VERSION)


def _metadata():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
            "Summary: Client of the tokenguard server's token API and proxy (standard library only)\n"
            "Requires-Python: >=3.8\nDescription-Content-Type: text/markdown\n\n%s" % (NAME, VERSION, readme))


def _files():
    pkg = os.path.join(ROOT, NAME)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            with open(os.path.join(pkg, name), "rb") as f:
                yield "%s/%s" % (NAME, name), f.read()
    yield DIST_INFO + "/METADATA", _metadata().encode()
    yield DIST_INFO + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: tokenguard-backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel = "%s-%s-py3-none-any.whl" % (NAME, VERSION)
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in _files():
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
        record.append(DIST_INFO + "/RECORD,,")
        z.writestr(DIST_INFO + "/RECORD", "\n".join(record) + "\n")
    return wheel


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.makedirs(os.path.join(metadata_directory, DIST_INFO), exist_ok=True)
    with open(os.path.join(metadata_directory, DIST_INFO, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return DIST_INFO


def build_sdist(sdist_directory, config_settings=None):
    sdist = "%s-%s.tar.gz" % (NAME, VERSION)
    with tarfile.open(os.path.join(sdist_directory, sdist), "w:gz") as t:
        for name in ("pyproject.toml", "README.md", "_build/backend.py", NAME):
            t.add(os.path.join(ROOT, name), "%s-%s/%s" % (NAME, VERSION, name),
                  filter=lambda i: None if "__pycache__" in i.name else i)
    return sdist


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []

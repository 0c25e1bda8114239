"""A stand-in for a Keycloak realm, for the label server's authentication test (run with the label environment's
python, which has PyJWT and cryptography): on a free 127.0.0.1 port it answers every GET with the realm's JSON,
whose ``public_key`` is what MONAI Label fetches from ``MONAI_LABEL_AUTH_REALM_URI``.

    python keycloak_standin.py

prints one JSON line ``{"realm": URI, "tokens": {...}}`` and serves until it is terminated. Tokens (RS256, as
Keycloak signs them): ``user`` (role monailabel-user), ``annotator`` (monailabel-user and monailabel-annotator),
``expired``, ``foreign_key`` (signed by another key) and ``hs256`` (HMAC with the public key as secret).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_with(secret: bytes, claims: dict) -> str:
    """An HMAC token keyed with ``secret`` (PyJWT refuses to sign with a PEM key, an attacker need not)."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "." + _b64(json.dumps(claims).encode())
    return head + "." + _b64(hmac.new(secret, head.encode(), hashlib.sha256).digest())


def main() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    public_key = base64.b64encode(der).decode()
    pem = f"-----BEGIN PUBLIC KEY-----\n{public_key}\n-----END PUBLIC KEY-----".encode()
    body = json.dumps({"realm": "glam-test", "public_key": public_key}).encode()

    def claims(*roles: str, exp: float = 3600) -> dict:
        return {"preferred_username": "reader", "exp": int(time.time() + exp), "realm_access": {"roles": list(roles)}}

    tokens = {
        "user": jwt.encode(claims("monailabel-user"), key, algorithm="RS256"),
        "annotator": jwt.encode(claims("monailabel-user", "monailabel-annotator"), key, algorithm="RS256"),
        "expired": jwt.encode(claims("monailabel-user", exp=-60), key, algorithm="RS256"),
        "foreign_key": jwt.encode(claims("monailabel-user", "monailabel-annotator"), other, algorithm="RS256"),
        "hs256": _hs256_with(pem, claims("monailabel-user", "monailabel-annotator")),
    }

    class Realm(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Realm)
    realm = f"http://127.0.0.1:{server.server_address[1]}/realms/glam-test"
    print(json.dumps({"realm": realm, "tokens": tokens}), flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()

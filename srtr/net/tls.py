"""TLS for srtr's own channels (the control channel, the agent channel), stdlib only.

Each job has one self-signed certificate (`certs.JobCert`, made with `cryptography` by the
controller). Nothing here trusts a CA: a client pins the SHA-256 fingerprint of the job's
certificate, which it got next to the job's token (the agent's environment, the run dir's
0600 control file), and checks it against what the server presented
(`getpeercert(binary_form=True)`), so a name, a CA or a clock cannot be wrong. The token's
HMAC proofs still authenticate both ends inside the encrypted channel.

Stdlib only (`ssl`, `hashlib`): the node agent imports this module (pyproject's
import-linter contract), and must stay small.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
from pathlib import Path

FINGERPRINT_ENV = "SRTR_AGENT_FINGERPRINT"  # next to protocol.TOKEN_ENV
PREFIX = "sha256:"


class PinError(ssl.SSLError):
    """The server's certificate is not the job's: a man in the middle, or another job."""


def fingerprint(der: bytes) -> str:
    """`sha256:<hex>` of a DER certificate: what clients pin."""
    return PREFIX + hashlib.sha256(der).hexdigest()


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS 1.3 server context presenting the job's certificate (asks no client cert:
    clients prove the token instead)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert, key)
    # No session tickets: no client resumes a session (each agent dials once; a control
    # client per command), and a job's 10,000 joins would each encrypt and send two.
    context.num_tickets = 0
    return context


def client_context() -> ssl.SSLContext:
    """A TLS 1.3 client context that checks nothing by itself: `check_pin` does, after the
    handshake (a self-signed per-job certificate has no CA, and nodes dial an IP)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def check_pin(peer_der: bytes | None, pinned: str) -> None:
    """Raise PinError unless `peer_der` (the server's certificate) has fingerprint `pinned`.

    Call it on every connection before anything secret is sent."""
    if not peer_der:
        raise PinError("the server presented no certificate")
    seen = fingerprint(peer_der)
    if not hmac.compare_digest(seen, pinned.strip().lower()):
        raise PinError(f"the server's certificate is {seen}, not the job's {pinned}")


def check_ssl_object(sslobj: ssl.SSLObject | ssl.SSLSocket | None, pinned: str) -> None:
    """`check_pin` on a connection's SSL object (asyncio: `get_extra_info('ssl_object')`)."""
    if sslobj is None:
        raise PinError("the connection is not TLS")
    check_pin(sslobj.getpeercert(binary_form=True), pinned)


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by its owner only and never half-written: the
    file is born 0600 (no window where others could open it). For the job's key, its
    control credential and the agents' token."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old file of that name kept its mode through O_TRUNC
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)

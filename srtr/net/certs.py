"""The job's certificate: one EC P-256 key and self-signed certificate per job.

`srtr up` makes it when the job starts (`for_job`) and both of srtr's channels present it:
the control channel (`srtr.runtime.control`) and the agent channel (`agent/channel.py`).
Clients pin its SHA-256 fingerprint (`tls.check_pin`), so nothing about it needs a CA, a
host name or a trusted clock; its validity is short anyway (`VALIDITY`), so a key that
leaks from an old run dir is worth nothing to a later job's clients, which pin their own.

The key and certificate are kept in the run dir (`KEY_FILE`, `CERT_FILE`, mode 0600, in the
0700 run dir) because a controller that adopts the job (`srtr up --adopt`) must present the
same certificate: the agents it inherits pinned its fingerprint and cannot be told another.
"""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

from srtr.net import tls

KEY_FILE = "job-tls.key"
CERT_FILE = "job-tls.crt"
VALIDITY = datetime.timedelta(days=8)  # past SLURM's usual 7-day limit on a job's time
_SKEW = datetime.timedelta(minutes=10)  # a node's clock a little behind ours


@dataclass(frozen=True)
class JobCert:
    """Where the job's key and certificate are, and the certificate's fingerprint."""

    cert: Path
    key: Path
    fingerprint: str

    def server_context(self) -> ssl.SSLContext:
        return tls.server_context(self.cert, self.key)


def for_job(run_dir: Path, *, adopt: bool = False) -> JobCert:
    """The certificate of the job in `run_dir`: a new one, or (`adopt`) the one its crashed
    controller made. Raises OSError (or ValueError for a damaged file) when adopting
    without one."""
    cert, key = run_dir / CERT_FILE, run_dir / KEY_FILE
    if adopt:
        return load(cert, key)
    return create(cert, key)


def load(cert: Path, key: Path) -> JobCert:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    der = x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    key.stat()  # missing: the OSError says which file
    return JobCert(cert, key, tls.fingerprint(der))


def create(cert: Path, key: Path, *, name: str = "srtr job") -> JobCert:
    """Make a new key and certificate at `key` and `cert` (both 0600, replaced atomically)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _SKEW)
        .not_valid_after(now + VALIDITY)
        .sign(private, hashes.SHA256())
    )
    key_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tls.write_private(key, key_pem)
    tls.write_private(cert, certificate.public_bytes(serialization.Encoding.PEM))
    der = certificate.public_bytes(serialization.Encoding.DER)
    return JobCert(cert, key, tls.fingerprint(der))

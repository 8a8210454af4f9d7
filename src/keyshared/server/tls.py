"""Server-side TLS contexts from Pulsar's ``tls*`` settings (binary and web ports alike)."""

from __future__ import annotations

import ssl


class TlsConfigError(ValueError):
    """The certificate, key or trust store could not be loaded."""


def server_ssl_context(
    cert_file: str,
    key_file: str,
    trust_certs_file: str = "",
    *,
    require_client_cert: bool = False,
    protocols: str = "",
    ciphers: str = "",
) -> ssl.SSLContext:
    """A TLS >= 1.2 server context for ``cert_file``/``key_file`` (PEM).

    With ``trust_certs_file``, client certificates are checked against it when offered
    (``tlsRequireTrustedClientCertOnConnect`` makes one mandatory, as in Pulsar).
    """
    if not cert_file or not key_file:
        raise TlsConfigError("TLS needs tlsCertificateFilePath and tlsKeyFilePath")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if protocols:
        versions = sorted(_protocol_version(p) for p in protocols.split(",") if p.strip())
        ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    if ciphers:
        try:
            ctx.set_ciphers(":".join(c.strip() for c in ciphers.split(",") if c.strip()))
        except ssl.SSLError as exc:
            raise TlsConfigError(
                f"tlsCiphers {ciphers!r}: no cipher OpenSSL knows ({exc})"
            ) from exc
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load {cert_file} / {key_file}: {exc}") from exc
    if trust_certs_file:
        try:
            ctx.load_verify_locations(cafile=trust_certs_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load {trust_certs_file}: {exc}") from exc
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    elif require_client_cert:
        raise TlsConfigError("tlsRequireTrustedClientCertOnConnect needs tlsTrustCertsFilePath")
    return ctx


_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def _protocol_version(name: str) -> ssl.TLSVersion:
    """Pulsar's ``tlsProtocols`` name as a TLS version; older protocols are refused."""
    try:
        return _PROTOCOLS[name.strip()]
    except KeyError:
        raise TlsConfigError(
            f"tlsProtocols: {name.strip()!r} is not supported (use TLSv1.2 and/or TLSv1.3)"
        ) from None

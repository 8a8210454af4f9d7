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
) -> ssl.SSLContext:
    """A TLS >= 1.2 server context for ``cert_file``/``key_file`` (PEM).

    With ``trust_certs_file``, client certificates are checked against it when offered
    (``tlsRequireTrustedClientCertOnConnect`` makes one mandatory, as in Pulsar).
    """
    if not cert_file or not key_file:
        raise TlsConfigError("TLS needs tlsCertificateFilePath and tlsKeyFilePath")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
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

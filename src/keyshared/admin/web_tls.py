"""The client certificate of an HTTPS request, for AuthenticationProviderTls on the web port.

uvicorn does not put TLS details in the ASGI scope. Its HTTP protocol objects are one per
connection and call ``self.app`` for each request, so a subclass can wrap ``app`` once the
handshake is done (asyncio calls ``connection_made`` after it) and add the ASGI TLS extension
(``scope["extensions"]["tls"]``) to every request of that connection: ``client_cert_chain`` (the
peer's verified certificate, PEM) and ``client_cert_name`` (its subject, RFC 4514), plus
``client_cert_cn``, the common name Pulsar's TLS provider takes as the role.
"""

from __future__ import annotations

import ssl
from typing import Any

from keyshared.server.auth_service import certificate_common_name


def client_certificate_extension(transport: Any) -> dict[str, Any] | None:
    """The TLS extension for a connection's transport (None when it has no client certificate)."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    return {
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)],
        "client_cert_name": cert.subject.rfc4514_string(),
        "client_cert_cn": certificate_common_name(ssl_object.getpeercert()),
        "client_cert_error": None,
    }


def tls_aware(protocol_class: type[Any]) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol class that adds the TLS extension to each scope."""

    class TlsAwareProtocol(protocol_class):  # type: ignore[misc]
        def connection_made(self, transport: Any, *args: Any) -> None:
            super().connection_made(transport, *args)
            tls = client_certificate_extension(transport)
            if tls is None:
                return
            inner: Any = getattr(self, "app")  # noqa: B009 - set by uvicorn, untyped here

            async def app(scope: Any, receive: Any, send: Any) -> None:
                scope.setdefault("extensions", {})["tls"] = tls
                await inner(scope, receive, send)

            self.app = app

    TlsAwareProtocol.__name__ = f"TlsAware{protocol_class.__name__}"
    return TlsAwareProtocol

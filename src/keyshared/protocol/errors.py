"""Exceptions raised by the protocol codec, each carrying the Pulsar ``ServerError`` to report."""

from __future__ import annotations

from keyshared.protocol import pulsar_api_pb2 as pb


class ProtocolError(Exception):
    """Base of every error the codec raises; ``code`` is the ``ServerError`` that fits it.

    Catching ``ProtocolError`` is enough to handle anything bad a peer can send: the decoder
    never lets another exception type escape for malformed input.
    """

    code: pb.ServerError = pb.UnknownError

    def __init__(self, message: str, *, code: pb.ServerError | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class FrameTooLarge(ProtocolError):
    """A frame header announced more bytes than the decoder's ``max_frame_size``."""

    code = pb.NotAllowedError


class MalformedFrame(ProtocolError):
    """Bytes that are not a valid Pulsar frame: bad sizes, unparseable or incomplete command."""

    code = pb.UnknownError


class ProtocolViolation(ProtocolError):
    """A well-formed command that is not allowed in the connection's current state."""

    code = pb.NotAllowedError


class UnsupportedCompression(ProtocolError):
    """A batch payload uses a codec whose Python module is not installed."""

    code = pb.UnknownError

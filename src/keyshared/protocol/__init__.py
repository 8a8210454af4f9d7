"""Sans-IO codec for Apache Pulsar's binary protocol: bytes in, frames out; commands in, bytes out.

``pb`` is the generated protobuf module for keyshared's own ``pulsar_api.proto``.
"""

from keyshared.protocol import pulsar_api_pb2 as pb

__all__ = ["pb"]

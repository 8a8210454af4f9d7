"""Server: asyncio connections speaking the binary protocol, authentication and TLS."""

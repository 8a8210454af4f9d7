"""keyshared: a Pulsar-protocol message broker with a correct Key_Shared subscription."""

__version__ = "0.1.0"

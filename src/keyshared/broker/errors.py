"""Errors the broker reports to clients, with the ServerError codes the Pulsar client expects."""

from __future__ import annotations

from enum import IntEnum


class ServerError(IntEnum):
    """Pulsar's ``ServerError`` values (the client's proto stops at 25: never send a higher one)."""

    UnknownError = 0
    MetadataError = 1
    PersistenceError = 2
    AuthenticationError = 3
    AuthorizationError = 4
    ConsumerBusy = 5
    ServiceNotReady = 6
    ProducerBlockedQuotaExceededError = 7
    ProducerBlockedQuotaExceededException = 8
    ChecksumError = 9
    UnsupportedVersionError = 10
    TopicNotFound = 11
    SubscriptionNotFound = 12
    ConsumerNotFound = 13
    TooManyRequests = 14
    TopicTerminatedError = 15
    ProducerBusy = 16
    InvalidTopicName = 17
    IncompatibleSchema = 18
    ConsumerAssignError = 19
    TransactionCoordinatorNotFound = 20
    InvalidTxnStatus = 21
    NotAllowedError = 22
    TransactionConflict = 23
    TransactionNotFound = 24
    ProducerFenced = 25


class BrokerError(Exception):
    """An error with the code and message to send to the client that caused it."""

    def __init__(self, code: ServerError, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"BrokerError({self.code.name}, {self.message!r})"

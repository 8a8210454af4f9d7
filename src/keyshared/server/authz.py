"""Pulsar's authorization model: super users, tenant admins, namespace permissions per role.

Who may do what, as ``PulsarAuthorizationProvider`` decides it:

- a role in ``superUserRoles`` may do everything;
- a role in a tenant's ``adminRoles`` may administer that tenant and use all its topics;
- otherwise a role needs the namespace permission: ``produce`` to publish, ``consume`` to
  subscribe (and to read a subscription's messages), either one to look a topic up or read its
  stats (``lookup``).

Permissions live in the namespace policies in the metadata store, so a grant or revoke through the
admin API applies to the next request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.topic_name import InvalidTopicName, TopicName

LOOKUP = "lookup"
PRODUCE = "produce"
CONSUME = "consume"
TOPIC_ACTIONS = (LOOKUP, PRODUCE, CONSUME)


class PermissionStore(Protocol):
    """Where namespace permissions and tenant admins are read from (the broker service)."""

    def namespace_permissions(self, namespace: str) -> dict[str, list[str]]:
        """``role -> actions`` granted on ``tenant/namespace``."""

    def tenant_admin_roles(self, tenant: str) -> list[str]:
        """The ``adminRoles`` of ``tenant`` (empty when it does not exist)."""

    def namespace_exists(self, namespace: str) -> bool:
        """True if ``tenant/namespace`` exists."""


def parse_roles(text: str) -> frozenset[str]:
    """A comma-separated role list (``superUserRoles``)."""
    return frozenset(r.strip() for r in text.split(",") if r.strip())


class NamespaceAuthorizer:
    """Answers "may this role do this" for topics, namespaces and tenants."""

    def __init__(self, store: PermissionStore, super_users: Iterable[str]) -> None:
        self.store = store
        self.super_users = frozenset(super_users)

    # --- the binary protocol's check (server.listener.Authorizer) ------------------------
    def check(self, role: str | None, topic: str, action: str) -> None:
        """Raise BrokerError(AuthorizationError) unless ``role`` may ``action`` on ``topic``."""
        try:
            name = TopicName.parse(topic)
        except InvalidTopicName as exc:
            raise BrokerError(ServerError.InvalidTopicName, str(exc)) from exc
        # A topic of a namespace that does not exist is not found, whoever asks: Pulsar's
        # clients expect TopicNotFound there (its client suite asserts it for an anonymous
        # producer on tenant/ns), and there is nothing in it to protect.
        if not self.store.namespace_exists(name.namespace_name):
            raise BrokerError(
                ServerError.TopicNotFound, f"Namespace {name.namespace_name} does not exist"
            )
        if not self.can(role, name.tenant, name.namespace_name, action):
            # The message names only what the client itself asked for.
            raise BrokerError(
                ServerError.AuthorizationError,
                f"Client is not authorized to {action.capitalize()} on {name.full}",
            )

    def check_namespace(self, role: str | None, namespace: str, action: str) -> None:
        """Raise BrokerError(AuthorizationError) unless ``role`` may ``action`` in ``namespace``.

        For requests about a whole namespace, such as GET_TOPICS_OF_NAMESPACE (``lookup``).
        """
        tenant, sep, local = namespace.partition("/")
        if not sep or not tenant or not local or "/" in local:
            raise BrokerError(ServerError.InvalidTopicName, f"Invalid namespace {namespace!r}")
        if not self.can(role, tenant, namespace, action):
            raise BrokerError(
                ServerError.AuthorizationError,
                f"Client is not authorized to {action.capitalize()} on {namespace}",
            )

    # --- decisions -----------------------------------------------------------------------
    def is_super_user(self, role: str | None) -> bool:
        """True for a role in ``superUserRoles``."""
        return role is not None and role in self.super_users

    def is_tenant_admin(self, role: str | None, tenant: str) -> bool:
        """True for a super user or a role in ``tenant``'s ``adminRoles``."""
        if role is None:
            return False
        return self.is_super_user(role) or role in self.store.tenant_admin_roles(tenant)

    def can(self, role: str | None, tenant: str, namespace: str, action: str) -> bool:
        """May ``role`` do the topic ``action`` (lookup, produce, consume) in ``namespace``?"""
        if action not in TOPIC_ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        if role is None:
            return False
        if self.is_super_user(role):
            return True
        granted = self.store.namespace_permissions(namespace).get(role, ())
        if action == LOOKUP:
            allowed = PRODUCE in granted or CONSUME in granted
        else:
            allowed = action in granted
        return allowed or self.is_tenant_admin(role, tenant)

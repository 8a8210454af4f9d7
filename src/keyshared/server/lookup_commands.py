"""The discovery commands of a connection: lookups, partitions, topic lists, schemas."""

from __future__ import annotations

from typing import Any

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.protocol import commands, pb
from keyshared.server import schema_commands
from keyshared.server.connection_core import ConnectionCore, T, _wire_error


class LookupCommands(ConnectionCore):
    """Lookups and schema requests, which touch no producer or consumer."""

    def _on_partitioned_metadata(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.partitionMetadata
        resp = pb.CommandPartitionedTopicMetadataResponse(request_id=r.request_id)
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "lookup")
            partitions = self.service.partitions_of(name)
            if (
                partitions == 0
                and not self.service.topic_exists(name)
                and not self.config.allowAutoTopicCreation
                and name.partition_index < 0
            ):
                raise BrokerError(ServerError.TopicNotFound, f"Topic {name} does not exist")
            resp.partitions = partitions
            resp.response = pb.CommandPartitionedTopicMetadataResponse.Success
        except BrokerError as exc:
            resp.response = pb.CommandPartitionedTopicMetadataResponse.Failed
            resp.error = _wire_error(exc.code)
            resp.message = exc.message
        self.send_command(T(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=resp))

    def _on_lookup(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.lookupTopic
        resp = pb.CommandLookupTopicResponse(request_id=r.request_id)
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "lookup")
            self.service.check_partition_name(name)
            resp.response = pb.CommandLookupTopicResponse.Connect
            resp.authoritative = True
            url, tls_url = self.server.lookup_urls(self.transport, r.advertised_listener_name)
            resp.brokerServiceUrl = url
            if tls_url:
                resp.brokerServiceUrlTls = tls_url
        except BrokerError as exc:
            resp.response = pb.CommandLookupTopicResponse.Failed
            resp.error = _wire_error(exc.code)
            resp.message = exc.message
        self.send_command(T(type=T.LOOKUP_RESPONSE, lookupTopicResponse=resp))

    def _on_get_topics_of_namespace(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getTopicsOfNamespace
        authz = self.server.authorizer
        if authz is not None:
            try:
                authz.check_namespace(self.principal, r.namespace, "lookup")
            except BrokerError as exc:
                self._error(r.request_id, exc.code, exc.message)
                return
        mode = r.mode if r.HasField("mode") else pb.CommandGetTopicsOfNamespace.PERSISTENT
        topics = []
        if mode != pb.CommandGetTopicsOfNamespace.NON_PERSISTENT:
            topics += self.service.list_topics(r.namespace)
        if mode != pb.CommandGetTopicsOfNamespace.PERSISTENT:
            topics += self.service.nonpersistent.names(r.namespace)
        self.send_command(
            T(
                type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                getTopicsOfNamespaceResponse=pb.CommandGetTopicsOfNamespaceResponse(
                    request_id=r.request_id, topics=topics
                ),
            )
        )

    def _on_get_schema(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getSchema
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "lookup")
        except BrokerError as exc:
            self.write(
                commands.get_schema_response(
                    request_id=r.request_id, error=exc.code, error_message=exc.message
                )
            )
            return
        self.send_command(schema_commands.get_schema(self.service.schemas, name, r))

    def _on_get_or_create_schema(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getOrCreateSchema
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "produce")
        except BrokerError as exc:
            resp = pb.CommandGetOrCreateSchemaResponse(
                request_id=r.request_id, error_code=_wire_error(exc.code), error_message=exc.message
            )
            self.send_command(
                T(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=resp)
            )
            return
        self.send_command(schema_commands.get_or_create_schema(self.service.schemas, name, r))

"""The committed generated module must be exactly what protoc makes from the committed schema."""

from pathlib import Path

import pytest
from google.protobuf.message import Message

from keyshared.protocol import pb, regen


def test_regenerated_module_matches_committed_files(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    fresh = regen.generate(tmp_path)
    assert [p.name for p in fresh] == list(regen.GENERATED_NAMES)
    for path in fresh:
        committed = regen.PROTO_DIR / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{path.name} is stale: run python -m keyshared.protocol.regen"
        )


def test_check_mode_reports_up_to_date() -> None:
    pytest.importorskip("grpc_tools")
    assert regen.main(["--check"]) == 0


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    regen.generate(tmp_path)
    (tmp_path / "pulsar_api_pb2.pyi").write_text("# edited by hand\n")
    assert regen.stale_files(tmp_path) == ["pulsar_api_pb2.pyi"]


def test_server_error_enum_stops_at_25() -> None:
    # A value above 25 in a required field makes the C++ client drop the connection.
    values = sorted(pb.ServerError.values())
    assert values == list(range(26))
    assert pb.ServerError.Name(25) == "ProducerFenced"


def test_base_command_sub_message_field_numbers_equal_type_values() -> None:
    desc = pb.BaseCommand.DESCRIPTOR
    for value in desc.enum_types_by_name["Type"].values:
        field = desc.fields_by_number[value.number]
        assert field.message_type is not None, value.name


def test_required_fields_match_pulsar() -> None:
    def required(msg: type[Message]) -> set[str]:
        return {f.name for f in msg.DESCRIPTOR.fields if f.is_required}

    assert required(pb.MessageIdData) == {"ledgerId", "entryId"}
    assert required(pb.CommandConnected) == {"server_version"}
    assert required(pb.CommandProducerSuccess) == {"request_id", "producer_name"}
    assert required(pb.CommandSendError) == {"producer_id", "sequence_id", "error", "message"}
    assert required(pb.CommandError) == {"request_id", "error", "message"}
    assert required(pb.CommandLookupTopicResponse) == {"request_id"}
    assert required(pb.CommandPartitionedTopicMetadataResponse) == {"request_id"}
    assert required(pb.CommandMessage) == {"consumer_id", "message_id"}
    assert required(pb.MessageMetadata) == {"producer_name", "sequence_id", "publish_time"}
    assert required(pb.SingleMessageMetadata) == {"payload_size"}
    assert required(pb.CommandGetLastMessageIdResponse) == {"last_message_id", "request_id"}
    assert required(pb.KeySharedMeta) == {"keySharedMode"}

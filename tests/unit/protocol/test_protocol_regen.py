"""The committed generated module must be exactly what protoc makes from the committed schema."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from keyshared.protocol import pb, regen

if importlib.util.find_spec("grpc_tools") is None:
    pytest.skip("grpcio-tools (dev dependency) is not installed", allow_module_level=True)

_VERSION_PREFIX = "# Protobuf Python Version:"


def _gencode_version(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(_VERSION_PREFIX):
            return line.removeprefix(_VERSION_PREFIX).strip()
    raise AssertionError(f"no version line in {path}")


@pytest.fixture(scope="module")
def fresh_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("regen")
    fresh = regen.generate(out)
    assert [p.name for p in fresh] == list(regen.GENERATED_NAMES)
    return out


def _same_protoc(fresh_dir: Path) -> bool:
    committed = _gencode_version(regen.PROTO_DIR / "pulsar_api_pb2.py")
    return _gencode_version(fresh_dir / "pulsar_api_pb2.py") == committed


def test_regenerated_module_matches_committed_files(fresh_dir: Path) -> None:
    if not _same_protoc(fresh_dir):
        pytest.skip(
            "the installed protoc version differs from the one that made the committed module; "
            "test_committed_descriptor_matches_the_schema still checks the schema"
        )
    for name in regen.GENERATED_NAMES:
        assert (regen.PROTO_DIR / name).read_bytes() == (fresh_dir / name).read_bytes(), (
            f"{name} is stale: run python -m keyshared.protocol.regen"
        )


def _strip_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        field.ClearField("json_name")
    for nested in message.nested_type:
        _strip_json_names(nested)


def test_committed_descriptor_matches_the_schema(tmp_path: Path) -> None:
    # Independent of the protoc version: the schema compiled now must equal the one embedded in
    # the committed module (protoc adds json_name to descriptor sets, the gencode does not).
    out = tmp_path / "set.bin"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={regen.PROTO_DIR}",
            f"--descriptor_set_out={out}",
            regen.PROTO_NAME,
        ],
        check=True,
    )
    (compiled,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    for message in compiled.message_type:
        _strip_json_names(message)
    embedded = descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)
    assert compiled == embedded, "pulsar_api_pb2 is stale: run python -m keyshared.protocol.regen"


def test_check_mode(fresh_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert regen.stale_files(fresh_dir) == []
    (fresh_dir / "pulsar_api_pb2.pyi").write_text("# edited by hand\n")
    assert regen.stale_files(fresh_dir) == ["pulsar_api_pb2.pyi"]
    if _same_protoc(fresh_dir):
        assert regen.main(["--check"]) == 0
        assert "up to date" in capsys.readouterr().out


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
    assert required(pb.CommandSubscribe) == {
        "topic",
        "subscription",
        "subType",
        "consumer_id",
        "request_id",
    }
    assert required(pb.CommandAck) == {"consumer_id", "ack_type"}
    assert required(pb.CommandFlow) == {"consumer_id", "messagePermits"}
    assert required(pb.CommandSend) == {"producer_id", "sequence_id"}


def test_field_numbers_of_message_metadata() -> None:
    numbers = {f.name: f.number for f in pb.MessageMetadata.DESCRIPTOR.fields}
    assert numbers["partition_key"] == 6
    assert numbers["compression"] == 8
    assert numbers["num_messages_in_batch"] == 11
    assert numbers["ordering_key"] == 18
    assert numbers["deliver_at_time"] == 19
    assert numbers["highest_sequence_id"] == 24
    assert numbers["null_value"] == 25
    assert (numbers["uuid"], numbers["chunk_id"], numbers["null_partition_key"]) == (26, 29, 30)

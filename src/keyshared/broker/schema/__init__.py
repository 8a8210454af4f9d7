"""The schema registry: versioned schemas per topic and Pulsar's compatibility rules."""

from keyshared.broker.schema.compatibility import STRATEGIES, check_compatible
from keyshared.broker.schema.registry import SchemaRegistry, StoredSchema, version_bytes

__all__ = ["STRATEGIES", "SchemaRegistry", "StoredSchema", "check_compatible", "version_bytes"]

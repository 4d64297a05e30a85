"""The one partitions definition: a dynamic partition per source shard (drop), ``<tier>/<drop_id>``."""

from dagster import DynamicPartitionsDefinition

source_shards = DynamicPartitionsDefinition(name="source_shard")

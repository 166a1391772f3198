"""The device mesh (`data`, `fsdp`, `tensor`), the partition rules of params and batches, and the
multi-host helpers. Below the model: it names no model class, so every floor above can shard its arrays."""

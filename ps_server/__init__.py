"""Parameter-server shard: stores, servicer and server of heraldps.v1.ParameterServer."""

"""Broker: topics, subscriptions, consumers and the dispatchers that feed them."""

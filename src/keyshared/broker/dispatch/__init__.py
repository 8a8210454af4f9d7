"""Dispatchers: which entry goes to which consumer, as plain synchronous decisions."""

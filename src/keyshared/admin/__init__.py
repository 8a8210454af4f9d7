"""Admin: REST routes with Pulsar's paths and field names, metrics, the dashboard."""

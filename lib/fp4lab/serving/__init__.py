"""SGLang serving: server configuration, launch, readiness and teardown, log classification,
benchmark drivers and a tiny local model."""

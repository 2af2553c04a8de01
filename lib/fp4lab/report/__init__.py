"""Reporting: figure provenance and the decision table built from records. Runs nothing."""

"""Runs over many records: configuration in, tidy records and a manifest out."""

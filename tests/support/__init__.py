"""Helpers the tests share (and benches import): nothing here is a test."""

"""Tests of the NFP overlay (issue 5): codec, store, election, workers, clients, broker."""

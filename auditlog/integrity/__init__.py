"""Integrity: verifying the hash chains and snapshot files, signing keys, signed heads."""

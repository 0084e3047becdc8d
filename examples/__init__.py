"""Small real training scripts used by the README, `make demo` and the tests."""

"""The `epick` command line."""

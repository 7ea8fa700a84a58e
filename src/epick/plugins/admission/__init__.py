"""Admission plugins: refuse a request before it is scheduled."""
